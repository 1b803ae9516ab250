package e2e

// The generated RBAC (config/rbac, from the controllers' markers) is all the manager needs:
// it runs here as a ServiceAccount bound to exactly those roles, does a GuestIngress and a
// GuestWebhookBridge from creation to deletion, and its log shows no request refused.
// docs/rbac.md explains every rule; TestDocsRBAC checks the page lists them all.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

func TestRBAC_TheGeneratedRolesAreEnoughForTheManager(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	host := l.Host.Client
	ns := uniqueName("rbac")
	g.Expect(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())

	// The ServiceAccount, the ClusterRole exactly as generated, and the leader election Role
	// (the manager here does not elect a leader; the Role is bound anyway, as deployed).
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guestnet-manager"}}
	g.Expect(host.Create(ctx, sa)).To(Succeed())
	root, err := lab.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	clusterRole := &rbacv1.ClusterRole{}
	readYAML(g, filepath.Join(root, "config/rbac/role.yaml"), clusterRole)
	clusterRole.Name = ns + "-manager"
	g.Expect(host.Create(ctx, clusterRole)).To(Succeed())
	t.Cleanup(func() { _ = host.Delete(context.Background(), clusterRole) })
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa.Name}},
	}
	g.Expect(host.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() { _ = host.Delete(context.Background(), binding) })
	electionRole := &rbacv1.Role{}
	readYAML(g, filepath.Join(root, "config/rbac/leader_election_role.yaml"), electionRole)
	electionRole.Namespace = ns
	g.Expect(host.Create(ctx, electionRole)).To(Succeed())

	// The manager, as the ServiceAccount (a token from the TokenRequest API), logging to a
	// buffer that the test reads.
	clientset, err := kubernetes.NewForConfig(l.Host.Config)
	g.Expect(err).NotTo(HaveOccurred())
	token, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	asManager := rest.AnonymousClientConfig(l.Host.Config)
	asManager.BearerToken = token.Status.Token
	var log syncBuffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&log), textlogger.Verbosity(2)))
	_, stop, err := lab.RunManagerAs(ctx, l, asManager, manager.Options{WatchNamespace: ns}, manager.SetupReconcilers, logger)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		_ = stop()
		if t.Failed() {
			for _, line := range strings.Split(log.String(), "\n") {
				if strings.Contains(line, "forbidden") {
					t.Logf("manager: %s", line)
				}
			}
		}
	})

	// A GuestIngress, Ready: Services, Cilium pool and policy, EndpointSlices, events.
	startCiliumStandIn(t, l)
	gc := createIngressCluster(t, l, ns, "tenant-a", 31580, 31581)
	addEnvoyWorker(t, l, gc, ns+"-md-0-a", "10.244.70.11", 31580, 31581)
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	gi := createGuestIngress(t, l, ns, "web", gc.Name, guestSvc, "10.98.70.10", ptr.To[int32](31580), ptr.To[int32](31581))
	eventuallyGuestIngressReady(t, l, gi)

	// A GuestWebhookBridge that bridges a webhook: its host Service, owned by the bridge.
	webhookNS := uniqueName("cert-manager")
	wh, err := lab.CreateServiceWebhook(ctx, l.Guest.Client, l.Guest.CA.CertPEM(), webhookNS, "target-"+webhookNS)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = l.Guest.Client.Delete(context.Background(), wh.Config) })
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bridge"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        gc.Name,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{wh.Config.Name}},
			NodePortRange:      guestnetv1.NodePortRange{Start: 31580, Size: 1},
			Mode:               guestnetv1.BridgeModeAlways,
		},
	}
	// The range's only port is the GuestIngress's: the bridge says so (a condition patch).
	g.Expect(host.Create(ctx, gwb)).To(Succeed())
	g.Eventually(func() string {
		got := &guestnetv1.GuestWebhookBridge{}
		_ = host.Get(ctx, client.ObjectKeyFromObject(gwb), got)
		return conditions.GetReason(got, guestnetv1.TargetsBridgedCondition)
	}).WithTimeout(giTimeout).Should(Equal(guestnetv1.NodePortRangeExhaustedReason))
	g.Expect(updateBridge(ctx, host, gwb, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.NodePortRange = guestnetv1.NodePortRange{Start: 31590, Size: 2}
	})).To(Succeed())
	g.Eventually(func() bool {
		got := &guestnetv1.GuestWebhookBridge{}
		_ = host.Get(ctx, client.ObjectKeyFromObject(gwb), got)
		return conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)
	}).WithTimeout(giTimeout).Should(BeTrue())

	// Deletion: finalizers released, host objects gone.
	g.Expect(host.Delete(ctx, gwb)).To(Succeed())
	g.Expect(host.Delete(ctx, gi)).To(Succeed())
	for _, obj := range []client.Object{gwb, gi} {
		g.Eventually(func() bool { return apierrors.IsNotFound(host.Get(ctx, client.ObjectKeyFromObject(obj), obj)) }).
			WithTimeout(giTimeout).Should(BeTrue(), "%T %s is deleted", obj, obj.GetName())
	}

	g.Expect(stop()).To(Succeed())
	for _, line := range strings.Split(log.String(), "\n") {
		g.Expect(line).NotTo(ContainSubstring("forbidden"), "the manager was refused a request: the generated RBAC lacks a rule")
	}
	g.Expect(log.String()).To(ContainSubstring("Reconcile"), "the log is the manager's")
}

func readYAML(g Gomega, path string, into any) {
	data, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.Unmarshal(data, into)).To(Succeed())
}

func updateBridge(ctx context.Context, c client.Client, gwb *guestnetv1.GuestWebhookBridge, mutate func(*guestnetv1.GuestWebhookBridge)) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := &guestnetv1.GuestWebhookBridge{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(gwb), got); err != nil {
			return err
		}
		mutate(got)
		err := c.Update(ctx, got)
		if !apierrors.IsConflict(err) || time.Now().After(deadline) {
			return err
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the manager's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
