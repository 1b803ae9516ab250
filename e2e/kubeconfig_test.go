package e2e

// Kubeconfigs are untrusted input (docs/decisions/0006-untrusted-kubeconfigs.md): a tenant
// can write its Cluster's <cluster>-kubeconfig Secret (without the optional admission policy
// guestnet-kubeconfig-secrets, which these tests do not install), and guestnet must not run,
// read or dial what it names. Each attack is a Secret the tenant writes before its Cluster
// exists (the ClusterCache reads the Secret when it connects, and keeps a healthy connection),
// against guestnet's manager binary running as a ServiceAccount with the generated RBAC. The
// tests check what must not have happened: no connection reached the tenant's listeners
// (TLS listeners on lab addresses, and a proxy), the exec plugin's command never ran; and
// that the refusal is visible (ClusterAvailable=False, KubeconfigRefused, naming the field)
// once the ClusterCache has tried and refused.
//
// Run with: /work/bin/labtest ./e2e/ -run 'TestSecurity_HostileKubeconfigs|TestDiagnose_Kubeconfig' -v

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/diagnose"
)

// kubeconfigTimeout bounds the wait for a refusal or a connection: the ClusterCache retries a
// failed connection every 30 s.
const kubeconfigTimeout = 90 * time.Second

// The attacks of docs/security.md's kubeconfig rows. Each subtest is a Cluster of its own
// whose Secret the tenant wrote; its GuestIngress and GuestWebhookBridge report the refusal.
func TestSecurity_HostileKubeconfigsAreRefused(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("kc")
	g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	tenant := tenantClient(t, l, ns)
	m := runManagerAsServiceAccount(t, l, ns, lab.ManagerFlags{Namespace: ns})

	tenantCA, err := lab.NewCA("tenant")
	g.Expect(err).NotTo(HaveOccurred())
	// Files of the machine guestnet's manager runs on, which a kubeconfig could name: a
	// token, and a client certificate of the guest's admins (as a node's kubelet has one).
	files := t.TempDir()
	const hostToken = "host-secret-token-do-not-send"
	tokenFile := filepath.Join(files, "token")
	g.Expect(os.WriteFile(tokenFile, []byte(hostToken), 0o600)).To(Succeed())
	certPEM, keyPEM, err := l.Guest.CA.Issue(lab.CertRequest{CommonName: "host-admin", Organizations: []string{"system:masters"}, Client: true})
	g.Expect(err).NotTo(HaveOccurred())
	certFile, keyFile := filepath.Join(files, "admin.crt"), filepath.Join(files, "admin.key")
	g.Expect(os.WriteFile(certFile, certPEM, 0o600)).To(Succeed())
	g.Expect(os.WriteFile(keyFile, keyPEM, 0o600)).To(Succeed())
	guest, err := clientcmd.Load(l.Guest.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	guestUser := *guest.AuthInfos[guest.Contexts[guest.CurrentContext].AuthInfo]

	inline := clientcmdapi.AuthInfo{Token: "tenant-token"}
	for i, tc := range []struct {
		name string
		// atGuest: the Cluster's endpoint is the lab guest apiserver, else the tenant's
		// listener (a tenant creates its Cluster with any endpoint; the admission policy
		// guestnet-control-plane-endpoint only pins it once set).
		atGuest bool
		// kubeconfig builds the Secret's kubeconfig: listener is the URL of the tenant's TLS
		// listener, proxy the address of its plain one, marker the file the exec plugin's
		// command would create.
		kubeconfig func(listener, proxy, marker string) *clientcmdapi.Config
		fields     []string
	}{
		{name: "exec", fields: []string{"users[tenant].exec"}, kubeconfig: func(listener, _, marker string) *clientcmdapi.Config {
			return tenantKubeconfig(listener, tenantCA.CertPEM(), clientcmdapi.AuthInfo{Exec: execPlugin(marker)})
		}},
		{name: "token-file", fields: []string{"users[tenant].tokenFile"}, kubeconfig: func(listener, _, _ string) *clientcmdapi.Config {
			return tenantKubeconfig(listener, tenantCA.CertPEM(), clientcmdapi.AuthInfo{TokenFile: tokenFile})
		}},
		{name: "client-certificate-file", fields: []string{"users[tenant].client-certificate", "users[tenant].client-key"}, kubeconfig: func(listener, _, _ string) *clientcmdapi.Config {
			return tenantKubeconfig(listener, tenantCA.CertPEM(), clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile})
		}},
		{name: "auth-provider", fields: []string{"users[tenant].auth-provider"}, kubeconfig: func(listener, _, _ string) *clientcmdapi.Config {
			return tenantKubeconfig(listener, tenantCA.CertPEM(), clientcmdapi.AuthInfo{AuthProvider: &clientcmdapi.AuthProviderConfig{
				Name: "oidc", Config: map[string]string{"idp-issuer-url": listener, "client-id": "guestnet", "id-token": "x"},
			}})
		}},
		{name: "insecure", fields: []string{"clusters[tenant].insecure-skip-tls-verify"}, kubeconfig: func(listener, _, _ string) *clientcmdapi.Config {
			kc := tenantKubeconfig(listener, nil, inline)
			kc.Clusters["tenant"].InsecureSkipTLSVerify = true
			return kc
		}},
		{name: "proxy-url", atGuest: true, fields: []string{"clusters[tenant].proxy-url"}, kubeconfig: func(_, proxy, _ string) *clientcmdapi.Config {
			kc := tenantKubeconfig(l.Guest.Server(), l.Guest.CA.CertPEM(), guestUser)
			kc.Clusters["tenant"].ProxyURL = "http://" + proxy
			return kc
		}},
		{name: "server-elsewhere", atGuest: true, fields: []string{"clusters[tenant].server"}, kubeconfig: func(listener, _, _ string) *clientcmdapi.Config {
			return tenantKubeconfig(listener, tenantCA.CertPEM(), inline)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ctx := testContext(t)
			// One listener of each kind per attack, on a lab address of its own (10.244.x is
			// local inside the lab's network namespace only).
			ip := fmt.Sprintf("10.244.77.%d", i+1)
			listener := startTenantTLSListener(t, tenantCA, ip)
			proxy := startTenantListener(t, ip)
			marker := filepath.Join(t.TempDir(), "exec-ran")
			value, err := clientcmd.Write(*tc.kubeconfig("https://"+listener.addr, proxy.addr, marker))
			g.Expect(err).NotTo(HaveOccurred())
			endpoint := lab.GuestControlPlaneEndpoint()
			if !tc.atGuest {
				endpoint = listener.endpoint()
			}
			gc, err := l.CreateGuestCluster(ctx, ns, tc.name, lab.WorkerTemplateOptions{},
				lab.WithControlPlaneEndpoint(endpoint), lab.WithKubeconfig(tenant, value))
			g.Expect(err).NotTo(HaveOccurred())
			gi, gwb := createGuestnetObjects(t, tenant, ns, gc.Name)

			// Once the ClusterCache has tried to connect with the Secret: nothing reached the
			// tenant's listeners, the exec plugin did not run.
			key := ns + "/" + gc.Name
			g.Eventually(func() []string { return connectAttempts(m.Log(), key) }).
				WithTimeout(kubeconfigTimeout).WithPolling(time.Second).ShouldNot(BeEmpty(), "the ClusterCache tried to connect to Cluster %s", key)
			g.Expect(listener.connections()).To(BeEmpty(), "a connection reached the tenant's TLS listener")
			g.Expect(proxy.connections()).To(BeEmpty(), "a connection reached the tenant's proxy")
			_, err = os.Stat(marker)
			g.Expect(os.IsNotExist(err)).To(BeTrue(), "the exec plugin ran: %v", err)

			// The ClusterCache read the Secret through guestnet's check, and gave up; the
			// refusal names the fields, on the GuestIngress and the bridge.
			secretName := fmt.Sprintf("Secret %s/%s-kubeconfig", ns, gc.Name)
			g.Expect(connectAttempts(m.Log(), key)).To(ContainElement(And(ContainSubstring("Connect failed"), ContainSubstring(secretName), ContainSubstring(tc.fields[0]))))
			for _, obj := range []client.Object{gi, gwb} {
				c := eventuallyClusterAvailable(t, l, obj, guestnetv1.KubeconfigRefusedReason)
				g.Expect(c.Message).To(ContainSubstring(secretName), "%T", obj)
				for _, f := range tc.fields {
					g.Expect(c.Message).To(ContainSubstring(f), "%T", obj)
				}
			}
			if tc.name != "server-elsewhere" {
				return
			}
			// Corrected (the lab guest's own kubeconfig), the Cluster connects on the
			// ClusterCache's next try, and the refusal clears.
			secret := &corev1.Secret{}
			g.Expect(tenant.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.Name + "-kubeconfig"}, secret)).To(Succeed())
			secret.Data["value"] = l.Guest.Kubeconfig
			g.Expect(tenant.Update(ctx, secret)).To(Succeed())
			for _, obj := range []client.Object{gi, gwb} {
				eventuallyClusterAvailable(t, l, obj, guestnetv1.ClusterAvailableReason)
			}
			g.Expect(listener.connections()).To(BeEmpty(), "a connection reached the tenant's TLS listener")
		})
	}
}

// `manager diagnose`, which the runbook has the provider admin run with the admin's rights,
// reads the Secret through the same check as the manager: the exec plugin of a tenant's
// kubeconfig never runs, and the report says why the guest is not read and what to do.
func TestDiagnose_KubeconfigWithAnExecPluginIsRefused(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("kc-diag")
	g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	tenant := tenantClient(t, l, ns)
	marker := filepath.Join(t.TempDir(), "exec-ran")
	// The lab guest's apiserver and CA, the credential from a command.
	kc := tenantKubeconfig(l.Guest.Server(), l.Guest.CA.CertPEM(), clientcmdapi.AuthInfo{Exec: execPlugin(marker)})
	value, err := clientcmd.Write(*kc)
	g.Expect(err).NotTo(HaveOccurred())
	gc, err := l.CreateGuestCluster(ctx, ns, "tenant-a", lab.WorkerTemplateOptions{}, lab.WithKubeconfig(tenant, value))
	g.Expect(err).NotTo(HaveOccurred())

	bin, err := lab.ManagerBinaryPath()
	g.Expect(err).NotTo(HaveOccurred())
	cmd := exec.CommandContext(ctx, bin, "diagnose", "--kubeconfig", l.Host.KubeconfigPath, "--namespace", ns, "--cluster", gc.Name, "--output", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("manager diagnose: %v\n%s%s", err, stdout.String(), stderr.String())
	_, statErr := os.Stat(marker)
	g.Expect(os.IsNotExist(statErr)).To(BeTrue(), "the exec plugin ran with the admin's rights: %v", statErr)
	var exitErr *exec.ExitError
	g.Expect(errors.As(err, &exitErr)).To(BeTrue(), "%v", err)
	g.Expect(exitErr.ExitCode()).To(Equal(diagnose.ExitFail))
	rep := &diagnose.Report{}
	g.Expect(json.Unmarshal(stdout.Bytes(), rep)).To(Succeed())
	r := result(t, rep, diagnose.CheckGuest, "")
	g.Expect(r.Verdict).To(Equal(diagnose.Fail))
	g.Expect(r.Detail).To(And(ContainSubstring("Secret %s/tenant-a-kubeconfig", ns), ContainSubstring("users[tenant].exec")))
	g.Expect(r.Fix).To(And(ContainSubstring("client-certificate-data"), ContainSubstring("--guest-kubeconfig")))
	g.Expect(r.Runbook).To(Equal("docs/runbook.md#kubeconfig-refused"))
}

// --- helpers ------------------------------------------------------------------------------

// tenantKubeconfig is a kubeconfig whose cluster, user and context are all named "tenant".
func tenantKubeconfig(server string, ca []byte, user clientcmdapi.AuthInfo) *clientcmdapi.Config {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["tenant"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	kc.AuthInfos["tenant"] = &user
	kc.Contexts["tenant"] = &clientcmdapi.Context{Cluster: "tenant", AuthInfo: "tenant"}
	kc.CurrentContext = "tenant"
	return kc
}

// execPlugin is a client-go exec plugin whose command creates the file marker.
func execPlugin(marker string) *clientcmdapi.ExecConfig {
	return &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh", Args: []string{"-c", "touch " + marker},
		InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}
}

// createGuestnetObjects creates, as the tenant, a GuestIngress and a GuestWebhookBridge of the
// Cluster (no policy admits the GuestIngress: its ClusterAvailable is reported all the same).
func createGuestnetObjects(t *testing.T, tenant client.Client, ns, cluster string) (*guestnetv1.GuestIngress, *guestnetv1.GuestWebhookBridge) {
	t.Helper()
	g := NewWithT(t)
	ctx := testContext(t)
	gi := newGuestIngress(ns, cluster, cluster, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "projectcontour", Name: "envoy"}}, "10.98.77.1", nil, nil)
	g.Expect(tenant.Create(ctx, gi)).To(Succeed())
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        cluster,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{"cert-manager-webhook"}},
			NodePortRange:      guestnetv1.NodePortRange{Start: 32700, Size: 1},
		},
	}
	g.Expect(tenant.Create(ctx, gwb)).To(Succeed())
	return gi, gwb
}

// eventuallyClusterAvailable waits until obj's ClusterAvailable has reason (False for every
// reason but ClusterAvailable) and returns it.
func eventuallyClusterAvailable(t *testing.T, l *lab.Lab, obj client.Object, reason string) metav1.Condition {
	t.Helper()
	status := metav1.ConditionFalse
	if reason == guestnetv1.ClusterAvailableReason {
		status = metav1.ConditionTrue
	}
	var got metav1.Condition
	NewWithT(t).Eventually(func(g Gomega) {
		live := obj.DeepCopyObject().(client.Object)
		g.Expect(l.Host.Client.Get(testContext(t), client.ObjectKeyFromObject(obj), live)).To(Succeed())
		c := conditions.Get(live.(conditions.Getter), guestnetv1.ClusterAvailableCondition)
		g.Expect(c).NotTo(BeNil())
		got = *c
		g.Expect(c.Status).To(Equal(status), c.Message)
		g.Expect(c.Reason).To(Equal(reason), c.Message)
	}).WithTimeout(kubeconfigTimeout).WithPolling(500*time.Millisecond).Should(Succeed(), "ClusterAvailable of %T %s", obj, obj.GetName())
	return got
}

// connectAttempts are the lines of the manager's log where the ClusterCache connected, or
// failed to, to the Cluster key (namespace/name).
func connectAttempts(log, key string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if (strings.Contains(line, `"Connect failed"`) || strings.Contains(line, `"Connected"`)) && strings.Contains(line, `Cluster="`+key+`"`) {
			out = append(out, line)
		}
	}
	return out
}

// tenantListener accepts TCP connections on a lab address and records who connected.
type tenantListener struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func (tl *tenantListener) record(what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.seen = append(tl.seen, what)
}

// connections returns what reached the listener: one entry per connection, and what each
// TLS one presented (client certificate, Authorization header).
func (tl *tenantListener) connections() []string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]string(nil), tl.seen...)
}

func (tl *tenantListener) endpoint() clusterv1.APIEndpoint {
	host, port, _ := net.SplitHostPort(tl.addr)
	var p int32
	_, _ = fmt.Sscanf(port, "%d", &p)
	return clusterv1.APIEndpoint{Host: host, Port: p}
}

// countingListener records every accepted connection in tl.
type countingListener struct {
	net.Listener
	tl *tenantListener
}

func (c countingListener) Accept() (net.Conn, error) {
	conn, err := c.Listener.Accept()
	if err == nil {
		c.tl.record("connection from " + conn.RemoteAddr().String())
	}
	return conn, err
}

// startTenantListener is a plain TCP listener (a proxy a kubeconfig could name) on ip, which
// closes whatever connects.
func startTenantListener(t *testing.T, ip string) *tenantListener {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	tl := &tenantListener{addr: ln.Addr().String()}
	cl := countingListener{Listener: ln, tl: tl}
	go func() {
		for {
			conn, err := cl.Accept()
			if err != nil {
				return
			}
			_ = conn.Close()
		}
	}()
	return tl
}

// startTenantTLSListener is an HTTPS server on ip with a certificate of the tenant's CA, as a
// tenant would run to collect what guestnet sends: it asks for a client certificate and
// records it and the Authorization header of every request.
func startTenantTLSListener(t *testing.T, ca *lab.CA, ip string) *tenantListener {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(lab.CertRequest{CommonName: "tenant-listener", IPs: []net.IP{net.ParseIP(ip)}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	tl := &tenantListener{addr: ln.Addr().String()}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			what := "request " + r.Method + " " + r.URL.Path
			if a := r.Header.Get("Authorization"); a != "" {
				what += " with Authorization " + a
			}
			if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
				what += " with client certificate " + r.TLS.PeerCertificates[0].Subject.String()
			}
			tl.record(what)
			w.WriteHeader(http.StatusUnauthorized)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	tlsLn := tls.NewListener(countingListener{Listener: ln, tl: tl}, &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12,
	})
	go func() { _ = srv.Serve(tlsLn) }()
	t.Cleanup(func() { _ = srv.Close() })
	return tl
}
