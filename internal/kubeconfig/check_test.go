package kubeconfig

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

var labEndpoint = clusterv1.APIEndpoint{Host: "10.244.0.2", Port: 6443}

// What guestnet accepts: the kubeconfigs control plane providers write (inline CA, client
// certificate and key, or a token), and only what they hold comes out, with the Cluster's
// endpoint as server.
func TestCheck_Accepts(t *testing.T) {
	p := newPKI(t)
	tests := []struct {
		name     string
		endpoint clusterv1.APIEndpoint
		mutate   func(*clientcmdapi.Config)
		// wantHost is the server of the result.
		wantHost string
		// wantToken is the token of the result (no client certificate then).
		wantToken string
		wantTLS   string
	}{
		{name: "Cluster API's kubeconfig", endpoint: labEndpoint, wantHost: "https://10.244.0.2:6443"},
		{name: "a token instead of a client certificate", endpoint: labEndpoint, wantHost: "https://10.244.0.2:6443", wantToken: "abc.def-ghi_jkl",
			mutate: func(c *clientcmdapi.Config) {
				c.AuthInfos["tenant-admin"] = &clientcmdapi.AuthInfo{Token: "abc.def-ghi_jkl"}
			}},
		{name: "a DNS name, written differently", endpoint: clusterv1.APIEndpoint{Host: "API.guest-1.example.com.", Port: 443}, wantHost: "https://api.guest-1.example.com:443",
			mutate: func(c *clientcmdapi.Config) { c.Clusters["tenant"].Server = "https://api.Guest-1.example.com/" }},
		{name: "an IPv4-mapped IPv6 server for an IPv4 endpoint", endpoint: labEndpoint, wantHost: "https://10.244.0.2:6443",
			mutate: func(c *clientcmdapi.Config) { c.Clusters["tenant"].Server = "https://[::ffff:10.244.0.2]:6443" }},
		{name: "IPv6", endpoint: clusterv1.APIEndpoint{Host: "fd00:10:244::2", Port: 6443}, wantHost: "https://[fd00:10:244::2]:6443",
			mutate: func(c *clientcmdapi.Config) { c.Clusters["tenant"].Server = "https://[fd00:10:244:0::2]:6443" }},
		{name: "tls-server-name is kept", endpoint: labEndpoint, wantHost: "https://10.244.0.2:6443", wantTLS: "kube-apiserver.guest.svc",
			mutate: func(c *clientcmdapi.Config) { c.Clusters["tenant"].TLSServerName = "Kube-Apiserver.guest.svc" }},
		{name: "entries the current context does not use are ignored", endpoint: labEndpoint, wantHost: "https://10.244.0.2:6443",
			mutate: func(c *clientcmdapi.Config) {
				c.AuthInfos["other"] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{Command: "touch"}, TokenFile: "/etc/shadow"}
				c.Clusters["other"] = &clientcmdapi.Cluster{Server: "http://169.254.169.254", ProxyURL: "http://10.0.0.1:3128", InsecureSkipTLSVerify: true}
				c.Contexts["other"] = &clientcmdapi.Context{Cluster: "other", AuthInfo: "other"}
			}},
		{name: "what client-go would do besides is dropped", endpoint: labEndpoint, wantHost: "https://10.244.0.2:6443",
			mutate: func(c *clientcmdapi.Config) {
				c.Clusters["tenant"].DisableCompression = true
				c.Contexts[c.CurrentContext].Namespace = "kube-system"
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			in := capiKubeconfig(p, "https://10.244.0.2:6443")
			if tt.mutate != nil {
				tt.mutate(in)
			}
			out, err := Check(write(t, in), tt.endpoint)
			g.Expect(err).NotTo(HaveOccurred())
			cfg, err := clientcmd.RESTConfigFromKubeConfig(out)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cfg.Host).To(Equal(tt.wantHost))
			g.Expect(cfg.CAData).To(Equal(p.ca))
			g.Expect(cfg.ServerName).To(Equal(tt.wantTLS))
			if tt.wantToken != "" {
				g.Expect(cfg.BearerToken).To(Equal(tt.wantToken))
				g.Expect(cfg.CertData).To(BeEmpty())
			} else {
				g.Expect(cfg.CertData).To(Equal(p.cert))
				g.Expect(cfg.KeyData).To(Equal(p.key))
				g.Expect(cfg.BearerToken).To(BeEmpty())
			}
			expectOnlyInline(g, out, tt.wantHost)

			again, err := Check(out, tt.endpoint)
			g.Expect(err).NotTo(HaveOccurred(), "what Check returns passes Check")
			g.Expect(again).To(Equal(out))
		})
	}
}

// Every field that runs, reads, sends elsewhere or weakens TLS is refused, named as the
// kubeconfig names it, with what to write instead; so is everything missing.
func TestCheck_Refuses(t *testing.T) {
	p := newPKI(t)
	user := func(c *clientcmdapi.Config) *clientcmdapi.AuthInfo { return c.AuthInfos["tenant-admin"] }
	cluster := func(c *clientcmdapi.Config) *clientcmdapi.Cluster { return c.Clusters["tenant"] }
	tests := []struct {
		name     string
		endpoint *clusterv1.APIEndpoint
		mutate   func(*clientcmdapi.Config)
		raw      string
		want     []string
	}{
		{name: "exec plugin", want: []string{"users[tenant-admin].exec"}, mutate: func(c *clientcmdapi.Config) {
			*user(c) = clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh", Args: []string{"-c", "touch /tmp/x"}}}
		}},
		{name: "exec plugin next to a client certificate", want: []string{"users[tenant-admin].exec"}, mutate: func(c *clientcmdapi.Config) {
			user(c).Exec = &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "aws"}
		}},
		{name: "auth provider", want: []string{"users[tenant-admin].auth-provider"}, mutate: func(c *clientcmdapi.Config) {
			*user(c) = clientcmdapi.AuthInfo{AuthProvider: &clientcmdapi.AuthProviderConfig{Name: "oidc", Config: map[string]string{"id-token": "x"}}}
		}},
		{name: "token file", want: []string{"users[tenant-admin].tokenFile"}, mutate: func(c *clientcmdapi.Config) {
			*user(c) = clientcmdapi.AuthInfo{TokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token"}
		}},
		{name: "client certificate and key files", want: []string{"users[tenant-admin].client-certificate", "users[tenant-admin].client-key"}, mutate: func(c *clientcmdapi.Config) {
			*user(c) = clientcmdapi.AuthInfo{ClientCertificate: "/etc/kubernetes/pki/apiserver-kubelet-client.crt", ClientKey: "/etc/kubernetes/pki/apiserver-kubelet-client.key"}
		}},
		{name: "basic authentication", want: []string{"users[tenant-admin].username", "users[tenant-admin].password"}, mutate: func(c *clientcmdapi.Config) {
			*user(c) = clientcmdapi.AuthInfo{Username: "admin", Password: "secret"}
		}},
		{name: "impersonation", want: []string{"users[tenant-admin].as", "users[tenant-admin].as-uid", "users[tenant-admin].as-groups", "users[tenant-admin].as-user-extra"}, mutate: func(c *clientcmdapi.Config) {
			u := user(c)
			u.Impersonate, u.ImpersonateUID, u.ImpersonateGroups = "system:admin", "1", []string{"system:masters"}
			u.ImpersonateUserExtra = map[string][]string{"scopes": {"all"}}
		}},
		{name: "CA file", want: []string{"clusters[tenant].certificate-authority"}, mutate: func(c *clientcmdapi.Config) {
			cluster(c).CertificateAuthority, cluster(c).CertificateAuthorityData = "/etc/kubernetes/pki/ca.crt", nil
		}},
		{name: "proxy", want: []string{"clusters[tenant].proxy-url"}, mutate: func(c *clientcmdapi.Config) { cluster(c).ProxyURL = "http://10.244.9.9:3128" }},
		{name: "insecure TLS", want: []string{"clusters[tenant].insecure-skip-tls-verify"}, mutate: func(c *clientcmdapi.Config) {
			cluster(c).InsecureSkipTLSVerify, cluster(c).CertificateAuthorityData = true, nil
		}},
		{name: "no CA", want: []string{"clusters[tenant].certificate-authority-data"}, mutate: func(c *clientcmdapi.Config) { cluster(c).CertificateAuthorityData = nil }},
		{name: "a CA that is no certificate", want: []string{"clusters[tenant].certificate-authority-data"}, mutate: func(c *clientcmdapi.Config) {
			cluster(c).CertificateAuthorityData = []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
		}},
		{name: "server elsewhere", want: []string{"clusters[tenant].server"}, mutate: func(c *clientcmdapi.Config) { cluster(c).Server = "https://10.244.77.1:6443" }},
		{name: "server on another port", want: []string{"clusters[tenant].server"}, mutate: func(c *clientcmdapi.Config) { cluster(c).Server = "https://10.244.0.2:10250" }},
		{name: "server by name for an IP endpoint", want: []string{"clusters[tenant].server"}, mutate: func(c *clientcmdapi.Config) { cluster(c).Server = "https://guest.example.com:6443" }},
		{name: "plain http", want: []string{"clusters[tenant].server"}, mutate: func(c *clientcmdapi.Config) { cluster(c).Server = "http://10.244.0.2:6443" }},
		{name: "server with a path", want: []string{"clusters[tenant].server"}, mutate: func(c *clientcmdapi.Config) {
			cluster(c).Server = "https://10.244.0.2:6443/api/v1/namespaces/x/services/y/proxy"
		}},
		{name: "server with a user", want: []string{"clusters[tenant].server"}, mutate: func(c *clientcmdapi.Config) { cluster(c).Server = "https://u:p@10.244.0.2:6443" }},
		{name: "server with a query", want: []string{"clusters[tenant].server"}, mutate: func(c *clientcmdapi.Config) { cluster(c).Server = "https://10.244.0.2:6443?x=1" }},
		{name: "no server", want: []string{"clusters[tenant].server"}, mutate: func(c *clientcmdapi.Config) { cluster(c).Server = "" }},
		{name: "tls-server-name that is no name", want: []string{"clusters[tenant].tls-server-name"}, mutate: func(c *clientcmdapi.Config) { cluster(c).TLSServerName = "a b" }},
		{name: "no current context", want: []string{"current-context"}, mutate: func(c *clientcmdapi.Config) { c.CurrentContext = "" }},
		{name: "current context missing", want: []string{"current-context"}, mutate: func(c *clientcmdapi.Config) { c.CurrentContext = "nope" }},
		{name: "context without cluster", want: []string{"contexts[tenant-admin@tenant].cluster"}, mutate: func(c *clientcmdapi.Config) { c.Contexts[c.CurrentContext].Cluster = "" }},
		{name: "context naming a missing user", want: []string{"contexts[tenant-admin@tenant].user"}, mutate: func(c *clientcmdapi.Config) { c.Contexts[c.CurrentContext].AuthInfo = "nobody" }},
		{name: "no credential", want: []string{"users[tenant-admin]"}, mutate: func(c *clientcmdapi.Config) { *user(c) = clientcmdapi.AuthInfo{} }},
		{name: "certificate without key", want: []string{"users[tenant-admin].client-key-data"}, mutate: func(c *clientcmdapi.Config) { user(c).ClientKeyData = nil }},
		{name: "key without certificate", want: []string{"users[tenant-admin].client-certificate-data"}, mutate: func(c *clientcmdapi.Config) { user(c).ClientCertificateData = nil }},
		{name: "certificate of another key", want: []string{"users[tenant-admin].client-certificate-data"}, mutate: func(c *clientcmdapi.Config) { user(c).ClientKeyData = newPKI(t).key }},
		{name: "token with a line break", want: []string{"users[tenant-admin].token"}, mutate: func(c *clientcmdapi.Config) {
			*user(c) = clientcmdapi.AuthInfo{Token: "abc\r\nX-Evil: 1"}
		}},
		{name: "a name that is not plain is quoted", want: []string{`users["a b\n"].exec`}, mutate: func(c *clientcmdapi.Config) {
			c.AuthInfos["a b\n"] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{Command: "x"}}
			c.Contexts[c.CurrentContext].AuthInfo = "a b\n"
		}},
		{name: "not a kubeconfig", raw: "{{{", want: []string{"kubeconfig"}},
		{name: "empty", raw: "", want: []string{"current-context"}},
		{name: "endpoint not set", endpoint: &clusterv1.APIEndpoint{}, want: []string{"Cluster spec.controlPlaneEndpoint"}},
		{name: "endpoint without port", endpoint: &clusterv1.APIEndpoint{Host: "10.244.0.2"}, want: []string{"Cluster spec.controlPlaneEndpoint.port"}},
		{name: "several at once, in the kubeconfig's order", want: []string{"users[tenant-admin].exec", "users[tenant-admin].tokenFile", "clusters[tenant].proxy-url", "clusters[tenant].server"},
			mutate: func(c *clientcmdapi.Config) {
				user(c).Exec, user(c).TokenFile = &clientcmdapi.ExecConfig{Command: "x"}, "/token"
				cluster(c).ProxyURL, cluster(c).Server = "http://10.0.0.1:3128", "https://10.0.0.2:6443"
			}},
	}
	// Endpoints guestnet never connects to, whatever the kubeconfig says (it says the same):
	// special-purpose addresses and names of loopback, and hosts that are no IP address or
	// DNS name (then the server, which names the same host, is refused too).
	for host, want := range map[string][]string{
		"127.0.0.1": nil, "127.1.2.3": nil, "::1": nil, "169.254.169.254": nil, "fe80::1": nil, "0.0.0.0": nil, "::": nil,
		"0.1.2.3": nil, "224.0.0.1": nil, "ff02::1": nil, "255.255.255.255": nil, "::ffff:127.0.0.1": nil,
		"64:ff9b::a9fe:a9fe": nil, "::7f00:1": nil, "100.100.100.200": nil, "fd00:ec2::254": nil,
		"localhost": nil, "api.localhost": nil, "LOCALHOST.": nil,
		"127.1": {"clusters[tenant].server"}, "2130706433": {"clusters[tenant].server"}, "0x7f.0.0.1": {"clusters[tenant].server"},
		"010.244.0.2": {"clusters[tenant].server"}, "fe80::1%eth0": {"clusters[tenant].server"}, "a_b.example.com": {"clusters[tenant].server"},
	} {
		endpoint := clusterv1.APIEndpoint{Host: host, Port: 6443}
		tests = append(tests, struct {
			name     string
			endpoint *clusterv1.APIEndpoint
			mutate   func(*clientcmdapi.Config)
			raw      string
			want     []string
		}{name: "endpoint " + host, endpoint: &endpoint, want: append([]string{"Cluster spec.controlPlaneEndpoint.host"}, want...)})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			data := []byte(tt.raw)
			if tt.raw == "" && tt.name != "empty" {
				in := capiKubeconfig(p, "https://10.244.0.2:6443")
				if tt.endpoint != nil && tt.endpoint.Host != "" && tt.endpoint.Port != 0 {
					in.Clusters["tenant"].Server = "https://" + tt.endpoint.String()
				}
				if tt.mutate != nil {
					tt.mutate(in)
				}
				data = write(t, in)
			}
			endpoint := labEndpoint
			if tt.endpoint != nil {
				endpoint = *tt.endpoint
			}
			out, err := Check(data, endpoint)
			g.Expect(out).To(BeNil())
			g.Expect(fields(err)).To(Equal(tt.want), "%v", err)
			refused, _ := AsRefused(err)
			for _, p := range refused.Problems {
				g.Expect(p.Why).NotTo(BeEmpty())
				g.Expect(p.Fix).NotTo(BeEmpty())
				g.Expect(p.Fix).NotTo(ContainSubstring(";"), "problems are separated by ;")
				g.Expect(err.Error()).To(ContainSubstring(p.String()))
			}
			_, err = RESTConfig(data, endpoint)
			g.Expect(fields(err)).To(Equal(tt.want))
		})
	}
}

// A refusal names everything, with a fix each, in one message.
func TestRefusedError(t *testing.T) {
	g := NewWithT(t)
	err := &RefusedError{Source: "Secret ns/c-kubeconfig", Problems: []Problem{
		{Field: "users[u].exec", Why: "runs a command", Fix: "write the credential itself"},
		{Field: "clusters[c].proxy-url", Why: "sends through a proxy", Fix: "remove it"},
	}}
	g.Expect(err.Error()).To(Equal("Secret ns/c-kubeconfig: guestnet refuses the kubeconfig: users[u].exec runs a command: write the credential itself; " +
		"clusters[c].proxy-url sends through a proxy: remove it"))
	var wrapped error = err
	got, ok := AsRefused(wrapped)
	g.Expect(ok).To(BeTrue())
	g.Expect(got).To(BeIdenticalTo(err))
}

// expectOnlyInline: the kubeconfig has one cluster, user and context, and they hold nothing
// but inline data and the endpoint.
func expectOnlyInline(g Gomega, data []byte, host string) {
	cfg, err := clientcmd.Load(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.Clusters).To(HaveLen(1))
	g.Expect(cfg.AuthInfos).To(HaveLen(1))
	g.Expect(cfg.Contexts).To(HaveLen(1))
	for _, c := range cfg.Clusters {
		g.Expect(c.Server).To(Equal(host))
		g.Expect(c.CertificateAuthority).To(BeEmpty())
		g.Expect(c.ProxyURL).To(BeEmpty())
		g.Expect(c.InsecureSkipTLSVerify).To(BeFalse())
		g.Expect(c.Extensions).To(BeEmpty())
	}
	for _, u := range cfg.AuthInfos {
		g.Expect(u.Extensions).To(BeEmpty())
		u.Extensions = nil
		g.Expect(*u).To(Equal(clientcmdapi.AuthInfo{ClientCertificateData: u.ClientCertificateData, ClientKeyData: u.ClientKeyData, Token: u.Token}))
	}
	for _, c := range cfg.Contexts {
		g.Expect(c.Namespace).To(BeEmpty())
	}
	g.Expect(strings.Count(string(data), "server:")).To(Equal(1))
}
