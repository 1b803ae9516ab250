package lab

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ControlPlaneOptions describes one lab cluster's control plane.
type ControlPlaneOptions struct {
	// Name of the cluster ("host" or "guest"); used in certificates and log file names.
	Name string
	// Address the kube-apiserver binds to and advertises.
	Address string
	// ServiceCIDR of the cluster.
	ServiceCIDR string
	// ServiceCIDR6 is the cluster's IPv6 service CIDR, when it serves dual-stack Services.
	ServiceCIDR6 string
	// ControllerManager also runs a kube-controller-manager with the controllers the lab
	// relies on (EndpointSlices from selectors, garbage collection, namespace deletion).
	ControllerManager bool
	// Dir holds certificates, etcd data and logs.
	Dir string
	// ResolvConf, when set, is bind-mounted over /etc/resolv.conf for the kube-apiserver
	// process only (in a mount namespace of its own), so that it resolves names the way a
	// hosted control plane pod does with its cluster's DNS (see hostDNS).
	ResolvConf string
	// Audit writes the apiserver's audit log (every request's verb, resource, user and user
	// agent, at Metadata level) to AuditLogPath: what tests count a client's requests from.
	Audit bool
	// PublishEndpoints runs the apiserver's endpoint reconciler (lease, as on real clusters):
	// the EndpointSlice of default/kubernetes names Address, which guestnet reads as a host
	// address no tenant gets (internal/hostaddrs). Off, nothing writes it (the guest's).
	PublishEndpoints bool
	// EgressSelectorConfig, when set, is the kube-apiserver's --egress-selector-config-file
	// (the guest flavour with konnectivity, see konnectivity.go).
	EgressSelectorConfig string
	// ExternalIPs are more IP addresses the apiserver's serving certificate is valid for:
	// addresses in front of it, as k0smotron adds a control plane's external address.
	ExternalIPs []string
	// ExternalEtcd, when set, is the client URL of an etcd another control plane runs: no etcd
	// of its own starts, and the apiserver keeps its cluster there under EtcdPrefix (a guest
	// shard, StartGuestShards). The other control plane must outlive this one.
	ExternalEtcd string
	// EtcdPrefix is the apiserver's --etcd-prefix, the key prefix of its cluster's state in
	// etcd; Kubernetes' default "/registry" when empty.
	EtcdPrefix string
}

// ControlPlane is a running etcd + kube-apiserver (+ kube-controller-manager).
type ControlPlane struct {
	Options ControlPlaneOptions
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// KubeconfigPath is the admin kubeconfig on disk; Kubeconfig is its content.
	KubeconfigPath string
	Kubeconfig     []byte
	// CA signs the apiserver's serving certificate and the client certificates.
	CA *CA
	// FrontProxyCA signs the aggregator's client certificate (aggregated APIs trust it).
	FrontProxyCA *CA

	etcd, apiserver, controllerManager *process
	// etcdURL is the client URL of the etcd the apiserver stores in (its own or ExternalEtcd).
	etcdURL string
}

// Kubernetes component names of the controllers the lab's kube-controller-manager runs.
var labControllers = []string{
	// Aggregates guestnet's tenant roles into admin/edit/view, as in production
	// (e2e/security_test.go acts as a tenant holding only those).
	"clusterrole-aggregation-controller",
	"endpoints-controller",
	"endpointslice-controller",
	"endpointslice-mirroring-controller",
	"garbage-collector-controller",
	"namespace-controller",
}

// StartControlPlane starts etcd, kube-apiserver and, if asked, kube-controller-manager, and
// waits until the apiserver is ready. Call Stop when done.
func StartControlPlane(ctx context.Context, assets *Assets, opts ControlPlaneOptions) (_ *ControlPlane, err error) {
	cp := &ControlPlane{Options: opts}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	if err := cp.writePKI(); err != nil {
		return nil, fmt.Errorf("%s PKI: %w", opts.Name, err)
	}
	if opts.ExternalEtcd != "" {
		cp.etcdURL = opts.ExternalEtcd
	} else if err := cp.startEtcd(ctx, assets); err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx, assets); err != nil {
		return nil, err
	}
	if opts.ControllerManager {
		if err := cp.startControllerManager(assets); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// Stop stops every component, the controller manager first.
func (cp *ControlPlane) Stop() {
	cp.controllerManager.stop()
	cp.apiserver.stop()
	cp.etcd.stop()
}

// Server is the apiserver's URL.
func (cp *ControlPlane) Server() string {
	return "https://" + hostPort(cp.Options.Address, APIServerPort)
}

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.Options.Dir, name) }

// EtcdURL is the client URL of the etcd the apiserver stores its cluster in.
func (cp *ControlPlane) EtcdURL() string { return cp.etcdURL }

// PID is the kube-apiserver's process id (its /proc tells its memory and CPU time).
func (cp *ControlPlane) PID() int { return cp.apiserver.cmd.Process.Pid }

// AuditLogPath is the apiserver's audit log (JSON lines, one audit.k8s.io/v1 Event per
// request) when the control plane runs with Audit.
func (cp *ControlPlane) AuditLogPath() string { return cp.path("audit.log") }

// auditPolicy records every request once, when its response is complete, without bodies.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

func (cp *ControlPlane) writePKI() error {
	dir := cp.Options.Dir
	ca, err := NewCA(cp.Options.Name + "-ca")
	if err != nil {
		return err
	}
	frontProxyCA, err := NewCA(cp.Options.Name + "-front-proxy-ca")
	if err != nil {
		return err
	}
	cp.CA, cp.FrontProxyCA = ca, frontProxyCA
	if err := ca.WriteFiles(dir, "ca"); err != nil {
		return err
	}
	if err := frontProxyCA.WriteFiles(dir, "front-proxy-ca"); err != nil {
		return err
	}
	_, serviceNet, err := net.ParseCIDR(cp.Options.ServiceCIDR)
	if err != nil {
		return err
	}
	kubernetesServiceIP := append(net.IP(nil), serviceNet.IP.To4()...)
	kubernetesServiceIP[3]++
	ips := []net.IP{net.ParseIP(cp.Options.Address), kubernetesServiceIP, net.ParseIP("127.0.0.1")}
	for _, a := range cp.Options.ExternalIPs {
		ip := net.ParseIP(a)
		if ip == nil {
			return fmt.Errorf("external IP %q is not an IP address", a)
		}
		ips = append(ips, ip)
	}
	if err := ca.IssueFiles(dir, "apiserver", CertRequest{
		CommonName: "kube-apiserver",
		DNSNames:   []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
		IPs:        ips,
		Server:     true,
	}); err != nil {
		return err
	}
	if err := ca.IssueFiles(dir, "admin", CertRequest{CommonName: "lab-admin", Organizations: []string{"system:masters"}, Client: true}); err != nil {
		return err
	}
	if err := frontProxyCA.IssueFiles(dir, "front-proxy-client", CertRequest{CommonName: "front-proxy-client", Client: true}); err != nil {
		return err
	}
	if err := writeServiceAccountKey(dir); err != nil {
		return err
	}
	return cp.writeKubeconfig()
}

func writeServiceAccountKey(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	return writeFiles(dir, map[string][]byte{
		"sa.key": keyPEM,
		"sa.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}),
	})
}

func (cp *ControlPlane) writeKubeconfig() error {
	certPEM, err := os.ReadFile(cp.path("admin.crt"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(cp.path("admin.key"))
	if err != nil {
		return err
	}
	if cp.Kubeconfig, err = cp.kubeconfigWith("admin", certPEM, keyPEM); err != nil {
		return err
	}
	cp.KubeconfigPath = cp.path("kubeconfig")
	if err := os.WriteFile(cp.KubeconfigPath, cp.Kubeconfig, 0o600); err != nil {
		return err
	}
	cp.Config, err = clientcmd.RESTConfigFromKubeConfig(cp.Kubeconfig)
	if err != nil {
		return err
	}
	cp.Config.QPS, cp.Config.Burst = 200, 400
	return nil
}

// kubeconfigWith is a kubeconfig for the apiserver with the client certificate certPEM.
func (cp *ControlPlane) kubeconfigWith(user string, certPEM, keyPEM []byte) ([]byte, error) {
	name := cp.Options.Name
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: cp.Server(), CertificateAuthorityData: cp.CA.CertPEM()}
	cfg.AuthInfos[name+"-"+user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name + "-" + user}
	cfg.CurrentContext = name
	return clientcmd.Write(*cfg)
}

// KubeconfigAs is a kubeconfig for the apiserver with a new client certificate of its own for
// user in groups. Cluster API writes each Cluster's kubeconfig with credentials of its own;
// clients built from identical kubeconfigs share one transport (client-go's TLS transport
// cache), so a fleet whose members share a kubeconfig would cost less per member than in
// production.
func (cp *ControlPlane) KubeconfigAs(user string, groups ...string) ([]byte, error) {
	certPEM, keyPEM, err := cp.CA.Issue(CertRequest{CommonName: user, Organizations: groups, Client: true})
	if err != nil {
		return nil, err
	}
	return cp.kubeconfigWith(user, certPEM, keyPEM)
}

func (cp *ControlPlane) startEtcd(ctx context.Context, assets *Assets) error {
	// Each etcd gets a loopback address of its own, so its well-known ports never clash with
	// another control plane's, not even when two start at once.
	addr := nextEtcdAddress()
	clientURL := "http://" + hostPort(addr, 2379)
	peerURL := "http://" + hostPort(addr, 2380)
	var err error
	cp.etcd, err = startProcess(cp.Options.Dir, "etcd", assets.Etcd,
		"--name="+cp.Options.Name,
		"--data-dir="+cp.path("etcd"),
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster="+cp.Options.Name+"="+peerURL,
		"--unsafe-no-fsync=true",
		"--quota-backend-bytes=1073741824",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	cp.etcdURL = clientURL
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return cp.etcd.waitReady(ctx, func(ctx context.Context) error {
		return httpOK(ctx, http.DefaultClient, clientURL+"/health")
	})
}

func (cp *ControlPlane) startAPIServer(ctx context.Context, assets *Assets) error {
	p := cp.path
	bin, args := assets.KubeAPIServer, []string{
		"--etcd-servers=" + cp.etcdURL,
		"--etcd-prefix=" + cmp.Or(cp.Options.EtcdPrefix, "/registry"),
		"--bind-address=" + cp.Options.Address,
		"--advertise-address=" + cp.Options.Address,
		"--secure-port=" + strconv.Itoa(APIServerPort),
		"--endpoint-reconciler-type=" + map[bool]string{true: "lease", false: "none"}[cp.Options.PublishEndpoints],
		"--service-cluster-ip-range=" + strings.TrimSuffix(cp.Options.ServiceCIDR+","+cp.Options.ServiceCIDR6, ","),
		"--tls-cert-file=" + p("apiserver.crt"),
		"--tls-private-key-file=" + p("apiserver.key"),
		"--client-ca-file=" + p("ca.crt"),
		"--service-account-key-file=" + p("sa.pub"),
		"--service-account-signing-key-file=" + p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		// No kubelet mounts tokens here, and no controller creates "default" ServiceAccounts in
		// the guest: the admission plugin would only reject the lab's stand-in Pods.
		"--disable-admission-plugins=ServiceAccount",
		// Aggregation layer, set up as on real clusters (kubeadm's flags).
		"--requestheader-client-ca-file=" + p("front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--proxy-client-cert-file=" + p("front-proxy-client.crt"),
		"--proxy-client-key-file=" + p("front-proxy-client.key"),
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	if cp.Options.Audit {
		if err := os.WriteFile(p("audit-policy.yaml"), []byte(auditPolicy), 0o600); err != nil {
			return err
		}
		// Blocking mode: an event is in the file before the response is sent.
		args = append(args, "--audit-policy-file="+p("audit-policy.yaml"), "--audit-log-path="+cp.AuditLogPath(),
			"--audit-log-format=json", "--audit-log-mode=blocking", "--audit-log-maxsize=0")
	}
	if cp.Options.EgressSelectorConfig != "" {
		args = append(args, "--egress-selector-config-file="+cp.Options.EgressSelectorConfig)
	}
	var err error
	if cp.Options.ResolvConf != "" {
		if bin, args, err = withResolvConf(cp.Options.ResolvConf, bin, args); err != nil {
			return err
		}
	}
	cp.apiserver, err = startProcess(cp.Options.Dir, "kube-apiserver", bin, args...)
	if err != nil {
		return err
	}
	client, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return cp.apiserver.waitReady(ctx, func(ctx context.Context) error {
		return httpOK(ctx, client, cp.Server()+"/readyz")
	})
}

func (cp *ControlPlane) startControllerManager(assets *Assets) error {
	var err error
	cp.controllerManager, err = startProcess(cp.Options.Dir, "kube-controller-manager", assets.KubeControllerManager,
		"--kubeconfig="+cp.KubeconfigPath,
		"--controllers="+strings.Join(labControllers, ","),
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		// No serving endpoint: nothing in the lab scrapes it, and it must not bind 0.0.0.0.
		"--secure-port=0",
		"--concurrent-service-endpoint-syncs=5",
		"--concurrent-gc-syncs=5",
	)
	return err
}

// withResolvConf wraps bin and args so that the process runs in a mount namespace of its own
// (a child of the lab's) where resolvConf is bind-mounted over /etc/resolv.conf. unshare and
// sh exec in place, so the process keeps its pid and its parent-death signal.
func withResolvConf(resolvConf, bin string, args []string) (string, []string, error) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return "", nil, err
	}
	return unshare, append([]string{
		"--mount", "--propagation", "private", "--", "/bin/sh", "-c",
		`mount --bind "$0" /etc/resolv.conf && exec "$@"`, resolvConf, bin,
	}, args...), nil
}

var etcdAddresses atomic.Uint32

// nextEtcdAddress returns 127.0.<n>.1 for the n-th etcd this process starts.
func nextEtcdAddress() string {
	n := etcdAddresses.Add(1)
	return fmt.Sprintf("127.0.%d.%d", n/250, n%250+1)
}

func httpOK(ctx context.Context, client *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}
