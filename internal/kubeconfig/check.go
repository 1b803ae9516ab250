package kubeconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// entryName names the cluster, user and context of every kubeconfig Check returns.
const entryName = "guest"

// Problem is one part of a kubeconfig that guestnet does not use.
type Problem struct {
	// Field names it as a kubeconfig names it (users[tenant].exec), or the Cluster's field
	// (Cluster spec.controlPlaneEndpoint).
	Field string
	// Why says what it is, or what it would make guestnet do.
	Why string
	// Fix says what to write instead.
	Fix string
}

func (p Problem) String() string { return p.Field + " " + p.Why + ": " + p.Fix }

// RefusedError is a kubeconfig guestnet does not use, with every problem Check found in it.
type RefusedError struct {
	// Source names where the kubeconfig came from ("Secret <namespace>/<name>"), when known.
	Source   string
	Problems []Problem
}

func (e *RefusedError) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source + ": ")
	}
	b.WriteString("guestnet refuses the kubeconfig: ")
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// AsRefused returns the *RefusedError that err is or wraps, if any.
func AsRefused(err error) (*RefusedError, bool) {
	var refused *RefusedError
	ok := errors.As(err, &refused)
	return refused, ok
}

// Fixes shared by several problems.
const (
	fixInlineCredential = "write the credential itself into the kubeconfig (client-certificate-data and client-key-data, or token)"
	fixInlineCA         = "put the guest apiserver's CA certificate itself (PEM) into certificate-authority-data"
	whyFile             = "names a file, and guestnet never reads a file a kubeconfig names"
)

// Check returns the kubeconfig guestnet connects with, made from data (a kubeconfig as the
// <cluster>-kubeconfig Secret holds it) for a Cluster whose spec.controlPlaneEndpoint is
// endpoint; or a *RefusedError naming everything in it that guestnet does not use. Only the
// current context, its cluster and its user are read; the other entries are ignored.
//
// Refused: exec plugins, auth providers, every field that names a file (tokenFile,
// client-certificate, client-key, certificate-authority), proxy-url,
// insecure-skip-tls-verify, basic authentication (username, password), impersonation (as,
// as-uid, as-groups, as-user-extra); a missing current context, cluster, user, credential
// or inline CA; a server that is not https://<host>:<port> of the endpoint; an unset
// endpoint, or one whose host is a special-purpose address (loopback, link-local including
// the cloud metadata address 169.254.169.254, unspecified, multicast, broadcast) or a name
// of loopback.
//
// The result holds the endpoint as its server and, of the kubeconfig, only
// certificate-authority-data, tls-server-name, client-certificate-data, client-key-data and
// token: nothing that runs, reads a file, or goes anywhere but the endpoint. Check itself
// dials, runs and reads nothing.
func Check(data []byte, endpoint clusterv1.APIEndpoint) ([]byte, error) {
	c := &checker{}
	out := c.check(data, endpoint)
	if len(c.problems) > 0 {
		return nil, &RefusedError{Problems: c.problems}
	}
	return clientcmd.Write(*out)
}

// RESTConfig returns the rest.Config of the kubeconfig Check returns for data and endpoint.
func RESTConfig(data []byte, endpoint clusterv1.APIEndpoint) (*rest.Config, error) {
	checked, err := Check(data, endpoint)
	if err != nil {
		return nil, err
	}
	return clientcmd.RESTConfigFromKubeConfig(checked)
}

// checker collects the problems of one kubeconfig.
type checker struct{ problems []Problem }

func (c *checker) add(field, why, fix string) {
	c.problems = append(c.problems, Problem{Field: field, Why: why, Fix: fix})
}

func (c *checker) check(data []byte, endpoint clusterv1.APIEndpoint) *clientcmdapi.Config {
	ep, epOK := c.endpoint(endpoint)
	cfg, err := clientcmd.Load(data)
	if err != nil {
		c.add("kubeconfig", "cannot be read ("+bound(err.Error())+")", "write a kubeconfig (YAML or JSON, kind Config)")
		return nil
	}
	name := cfg.CurrentContext
	kctx := cfg.Contexts[name]
	switch {
	case name == "":
		c.add("current-context", "is not set, and guestnet uses the current context only", "set it to the context of the guest cluster")
		return nil
	case kctx == nil:
		c.add("current-context", "names the context "+quote(name)+", which the kubeconfig does not have", "set it to the context of the guest cluster")
		return nil
	}
	contextField := entry("contexts", name)
	var cluster *clientcmdapi.Cluster
	var user *clientcmdapi.AuthInfo
	switch {
	case kctx.Cluster == "":
		c.add(contextField+".cluster", "is not set", "name the cluster entry of the guest apiserver")
	case cfg.Clusters[kctx.Cluster] == nil:
		c.add(contextField+".cluster", "names the cluster "+quote(kctx.Cluster)+", which the kubeconfig does not have", "name the cluster entry of the guest apiserver")
	default:
		cluster = cfg.Clusters[kctx.Cluster]
	}
	switch {
	case kctx.AuthInfo == "":
		c.add(contextField+".user", "is not set", "name the user entry that holds guestnet's credential")
	case cfg.AuthInfos[kctx.AuthInfo] == nil:
		c.add(contextField+".user", "names the user "+quote(kctx.AuthInfo)+", which the kubeconfig does not have", "name the user entry that holds guestnet's credential")
	default:
		user = cfg.AuthInfos[kctx.AuthInfo]
	}

	out := clientcmdapi.NewConfig()
	if user != nil {
		out.AuthInfos[entryName] = c.user(entry("users", kctx.AuthInfo), user)
	}
	if cluster != nil {
		out.Clusters[entryName] = c.cluster(entry("clusters", kctx.Cluster), cluster, ep, epOK)
	}
	out.Contexts[entryName] = &clientcmdapi.Context{Cluster: entryName, AuthInfo: entryName}
	out.CurrentContext = entryName
	return out
}

// user checks a user entry and returns what guestnet keeps of it.
func (c *checker) user(field string, u *clientcmdapi.AuthInfo) *clientcmdapi.AuthInfo {
	before := len(c.problems)
	if u.Exec != nil {
		c.add(field+".exec", "runs a command (an exec plugin), and guestnet never runs what a kubeconfig names", fixInlineCredential)
	}
	if u.AuthProvider != nil {
		c.add(field+".auth-provider", "needs an auth provider plugin, and guestnet loads none", fixInlineCredential)
	}
	if u.TokenFile != "" {
		c.add(field+".tokenFile", whyFile, "put the token itself into token")
	}
	if u.ClientCertificate != "" {
		c.add(field+".client-certificate", whyFile, "put the certificate itself (PEM) into client-certificate-data")
	}
	if u.ClientKey != "" {
		c.add(field+".client-key", whyFile, "put the key itself (PEM) into client-key-data")
	}
	if u.Username != "" {
		c.add(field+".username", "is basic authentication, which kube-apiserver does not support", fixInlineCredential)
	}
	if u.Password != "" {
		c.add(field+".password", "is basic authentication, which kube-apiserver does not support", fixInlineCredential)
	}
	credentialRefused := len(c.problems) > before
	const whyImpersonation = "makes guestnet act as another identity of the guest (impersonation)"
	const fixImpersonation = "remove it: guestnet acts as the credential's own user"
	if u.Impersonate != "" {
		c.add(field+".as", whyImpersonation, fixImpersonation)
	}
	if u.ImpersonateUID != "" {
		c.add(field+".as-uid", whyImpersonation, fixImpersonation)
	}
	if len(u.ImpersonateGroups) > 0 {
		c.add(field+".as-groups", whyImpersonation, fixImpersonation)
	}
	if len(u.ImpersonateUserExtra) > 0 {
		c.add(field+".as-user-extra", whyImpersonation, fixImpersonation)
	}

	cert, key, token := u.ClientCertificateData, u.ClientKeyData, u.Token
	switch {
	case len(cert) > 0 && len(key) == 0:
		c.add(field+".client-key-data", "is missing, and client-certificate-data is set", "put the certificate's key (PEM) into client-key-data")
	case len(key) > 0 && len(cert) == 0:
		c.add(field+".client-certificate-data", "is missing, and client-key-data is set", "put the key's certificate (PEM) into client-certificate-data")
	case len(cert) > 0:
		if _, err := tls.X509KeyPair(cert, key); err != nil {
			c.add(field+".client-certificate-data", "and client-key-data are not a certificate and its key ("+bound(err.Error())+")",
				"put the client certificate and its own key (PEM) into them")
		}
	}
	if token != "" && !validToken(token) {
		c.add(field+".token", "holds characters a bearer token cannot have", "write the token alone, without spaces or line breaks")
	}
	if len(cert) == 0 && len(key) == 0 && token == "" && !credentialRefused {
		c.add(field, "holds no credential", "add client-certificate-data and client-key-data, or token")
	}
	return &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key, Token: token}
}

// cluster checks a cluster entry against the Cluster's endpoint ep (epOK: the endpoint is
// usable) and returns what guestnet keeps of it, with the endpoint as server.
func (c *checker) cluster(field string, cl *clientcmdapi.Cluster, ep hostPort, epOK bool) *clientcmdapi.Cluster {
	caFixed := false
	if cl.CertificateAuthority != "" {
		c.add(field+".certificate-authority", whyFile, fixInlineCA)
		caFixed = true
	}
	if cl.InsecureSkipTLSVerify {
		c.add(field+".insecure-skip-tls-verify", "turns off the verification of the guest apiserver's certificate",
			"remove it, and "+fixInlineCA)
		caFixed = true
	}
	if cl.ProxyURL != "" {
		c.add(field+".proxy-url", "sends guestnet's requests through a proxy",
			"remove it: guestnet connects to the Cluster's spec.controlPlaneEndpoint directly")
	}
	switch {
	case len(cl.CertificateAuthorityData) == 0:
		if !caFixed {
			c.add(field+".certificate-authority-data", "is missing, and guestnet verifies the guest apiserver against the CA the kubeconfig holds", fixInlineCA)
		}
	case !x509.NewCertPool().AppendCertsFromPEM(cl.CertificateAuthorityData):
		c.add(field+".certificate-authority-data", "holds no PEM certificate", fixInlineCA)
	}

	serverFix := "set it to https://<host>:<port> of the Cluster's spec.controlPlaneEndpoint"
	if epOK {
		serverFix = "set it to " + ep.url() + ", the Cluster's spec.controlPlaneEndpoint"
	}
	if server, why := parseServer(cl.Server); why != "" {
		c.add(field+".server", why, serverFix)
	} else if epOK && !server.equal(ep) {
		c.add(field+".server", quote(cl.Server)+" is not the Cluster's spec.controlPlaneEndpoint ("+ep.String()+")", serverFix)
	}
	tlsServerName := ""
	if cl.TLSServerName != "" {
		h, why := parseHost(cl.TLSServerName)
		if why != "" {
			c.add(field+".tls-server-name", why, "set it to the name the guest apiserver's certificate holds, or remove it")
		}
		tlsServerName = h.host
	}
	server := ""
	if epOK {
		server = ep.url()
	}
	return &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cl.CertificateAuthorityData, TLSServerName: tlsServerName}
}

// endpoint checks the Cluster's spec.controlPlaneEndpoint.
func (c *checker) endpoint(e clusterv1.APIEndpoint) (hostPort, bool) {
	const field = "Cluster spec.controlPlaneEndpoint"
	if e.Host == "" && e.Port == 0 {
		c.add(field, "is not set, and guestnet connects only to the endpoint the Cluster names",
			"wait for the control plane or infrastructure provider to set it (Cluster API copies it into the Cluster), or set it to the guest apiserver's address and port")
		return hostPort{}, false
	}
	ok := true
	if e.Port < 1 || e.Port > 65535 {
		c.add(field+".port", strconv.Itoa(int(e.Port))+" is not a port", "set it to the guest apiserver's port")
		ok = false
	}
	h, why := parseHost(strings.TrimSuffix(strings.TrimPrefix(e.Host, "["), "]"))
	if why == "" {
		why = specialPurpose(h)
	}
	if why != "" {
		c.add(field+".host", why, "set it to the guest apiserver's own address")
		return hostPort{}, false
	}
	h.port = uint16(e.Port)
	return h, ok
}

// validToken: a bearer token is visible ASCII without spaces (RFC 6750's b64token is a subset).
func validToken(token string) bool {
	for i := range len(token) {
		if token[i] < 0x21 || token[i] > 0x7e {
			return false
		}
	}
	return true
}

// entry names a kubeconfig entry as kind[name], quoting a name that is not plain.
func entry(kind, name string) string {
	return kind + "[" + quoteIfNeeded(name) + "]"
}

// quote returns s quoted and bounded, for a message.
func quote(s string) string { return strconv.Quote(bound(s)) }

func quoteIfNeeded(s string) string {
	for _, r := range s {
		plain := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.@:/", r)
		if !plain {
			return quote(s)
		}
	}
	if s == "" || len(s) > maxQuoted {
		return quote(s)
	}
	return s
}

// maxQuoted bounds what a message repeats of the kubeconfig (names, errors).
const maxQuoted = 100

func bound(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	r := []rune(s)
	if len(r) > maxQuoted {
		r = r[:maxQuoted]
	}
	return string(r) + "..."
}
