package guestwebhookbridge_test

// The bridge half of the fault test (docs/guestwebhookbridge.md, invariants): a bridge's life (create: bridge a webhook and
// an APIService; delete: restore them) runs with the manager "crashing" at its 1st, 2nd, ...
// Nth write (internal/test/faultclient: every further write fails and the manager is stopped),
// then a new manager takes over. Whatever the crash point, the bridge must converge to the
// same guest and host (nothing lost, nothing duplicated) and its deletion must restore every
// original exactly and leave no Service behind. N is learnt from a run without a crash.
//
// Run with: make test TEST_PKGS=./controllers/guestwebhookbridge/... TEST_ARGS='-run Faults -v'

import (
	"fmt"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/test/faultclient"
)

func TestGuestWebhookBridgeFaults(t *testing.T) {
	t.Parallel()
	recording := runBridgeLife(t, -1)
	n := len(recording)
	t.Logf("a bridge's life takes %d writes: %v", n, recording)
	if n < 10 {
		t.Fatalf("only %d writes recorded: the recording run did not do what the crash runs test", n)
	}
	for crashAfter := 1; crashAfter < n; crashAfter++ {
		t.Run(fmt.Sprintf("crash after write %d of %d (%s)", crashAfter, n, recording[crashAfter-1]), func(t *testing.T) {
			t.Parallel()
			runBridgeLife(t, crashAfter)
		})
	}
}

// runBridgeLife runs a bridge's life with a manager that crashes after crashAfter writes
// (never when negative), restarting one that does not, and checks the invariants after
// each phase. It returns the writes of the first manager.
func runBridgeLife(t *testing.T, crashAfter int) []string {
	e := newBridgeEnvWithoutManager(t)
	g := e.g
	wh := e.createWebhook()
	api := e.createMetricsAPI()
	gc := e.createCluster("tenant-a", 1)
	originalWebhooks := e.getWebhookConfig(wh.Config.Name)
	originalAPIService := e.getAPIService(api.APIService.Name)

	m := &crashingManager{e: e}
	first := m.start(crashAfter)
	defer m.stopAll()

	gwb := e.createBridge("bridge", gc.Name, func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.APIServices = &guestnetv1.TargetSelector{Names: []string{api.APIService.Name}}
	})
	bridged := func() bool {
		got := &guestnetv1.GuestWebhookBridge{}
		if err := e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), got); err != nil {
			return false
		}
		return conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition) && got.Status.BridgedTargets == 2 &&
			got.Status.ObservedGeneration == got.Generation && len(got.Status.Records) == 2
	}
	m.until(bridged)

	// Converged: both targets rewritten once, each with one record in each copy, one set of
	// Services (no duplicate, no leftover of a crashed reconcile).
	got := e.getBridge(gwb)
	g.Expect(got.Status.Records).To(ConsistOf(
		HaveField("Kind", guestnetv1.APIServiceTarget),
		HaveField("Kind", guestnetv1.ValidatingWebhookTarget),
	))
	vwc := e.getWebhookConfig(wh.Config.Name)
	g.Expect(vwc.Webhooks[0].ClientConfig.Service).To(BeNil())
	g.Expect(vwc.Annotations[guestnetv1.BridgeOriginalAnnotation]).To(MatchJSON(fmt.Sprintf(
		`{%q: {"bridge": %q, "original": %s, "written": %q}}`, vwc.Webhooks[0].Name, e.ns+"/bridge",
		jsonOf(originalWebhooks.Webhooks[0].ClientConfig.Service), *vwc.Webhooks[0].ClientConfig.URL)), "the chart's original, recorded once")
	apiSvc := e.getAPIService(api.APIService.Name)
	g.Expect(apiSvc.Spec.Service.Name).To(Equal("metrics-server-guestnet"))
	g.Expect(apiSvc.Annotations).To(HaveKey(guestnetv1.BridgeOriginalAnnotation))
	g.Expect(e.guestServices(e.webhookNS)).To(ConsistOf("cert-manager-webhook", "cert-manager-webhook-guestnet-nodeport"))
	g.Expect(e.guestServices(e.metricsNS)).To(ConsistOf("metrics-server", "metrics-server-guestnet-nodeport", "metrics-server-guestnet"))
	g.Eventually(e.hostServiceNames).WithTimeout(waitTimeout).Should(ConsistOf(
		"tenant-a-"+e.webhookNS+"-cert-manager-webhook", "tenant-a-"+e.metricsNS+"-metrics-server"))

	g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	m.until(func() bool {
		return apierrors.IsNotFound(e.host.Get(e.ctx, client.ObjectKeyFromObject(gwb), &guestnetv1.GuestWebhookBridge{}))
	})

	// Every original back, exactly; nothing of the bridge left anywhere.
	restored := e.getWebhookConfig(wh.Config.Name)
	g.Expect(jsonOf(restored.Webhooks)).To(MatchJSON(jsonOf(originalWebhooks.Webhooks)))
	g.Expect(restored.Annotations).To(Equal(originalWebhooks.Annotations))
	restoredAPI := e.getAPIService(api.APIService.Name)
	g.Expect(jsonOf(restoredAPI.Spec)).To(MatchJSON(jsonOf(originalAPIService.Spec)))
	g.Expect(restoredAPI.Annotations).To(Equal(originalAPIService.Annotations))
	g.Expect(e.guestServices(e.webhookNS)).To(ConsistOf("cert-manager-webhook"))
	g.Expect(e.guestServices(e.metricsNS)).To(ConsistOf("metrics-server"))
	g.Eventually(e.hostServiceNames).WithTimeout(waitTimeout).Should(BeEmpty(), "no orphan host Service")
	if crashAfter > 0 && !first.Crashed() {
		// How many status patches a life takes depends on when the watches fire: this run
		// wrote less than the recording run did, and never came to the crash.
		g.Expect(len(first.Writes)).To(BeNumerically("<=", crashAfter), "no crash, yet more writes than the budget")
		t.Logf("this run made only %d writes: no crash", len(first.Writes))
	}
	return first.Writes
}

// crashingManager runs the bridge controller with a write budget; once a manager crashed,
// until starts the next one, which does not.
type crashingManager struct {
	e       *bridgeEnv
	mu      sync.Mutex
	budget  *faultclient.Budget
	stop    func() error
	stopped chan struct{}
}

func (m *crashingManager) start(crashAfter int) *faultclient.Budget {
	stopped := make(chan struct{})
	stopping := make(chan func() error, 1)
	budget := faultclient.NewBudget(crashAfter, func() {
		// The crash may come before runManagerWith returned the stop function.
		stop := <-stopping
		_ = stop()
		close(stopped)
	})
	m.mu.Lock()
	m.budget, m.stopped, m.stop = budget, stopped, nil
	m.mu.Unlock()
	stop := m.e.runManagerWith(budget, nil, nil)
	stopping <- stop
	m.mu.Lock()
	m.stop = stop
	m.mu.Unlock()
	return budget
}

// until waits for done, restarting the manager (once) if it crashes meanwhile.
func (m *crashingManager) until(done func() bool) {
	m.e.t.Helper()
	m.e.g.Eventually(func() bool { return done() || m.current().Crashed() }).
		WithTimeout(2 * waitTimeout).WithPolling(poll).Should(BeTrue())
	if b := m.current(); b.Crashed() {
		<-m.stopped
		m.e.t.Logf("crashed after %d writes (%v), restarting", len(b.Writes), b.Writes)
		m.start(-1)
		m.e.g.Eventually(done).WithTimeout(2 * waitTimeout).WithPolling(poll).Should(BeTrue())
	}
}

func (m *crashingManager) current() *faultclient.Budget {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.budget
}

func (m *crashingManager) stopAll() {
	m.mu.Lock()
	stop, budget := m.stop, m.budget
	m.mu.Unlock()
	if budget != nil && !budget.Crashed() && stop != nil {
		_ = stop()
	}
}

func (e *bridgeEnv) hostServiceNames() []string {
	list := &corev1.ServiceList{}
	e.g.Expect(e.host.List(e.ctx, list, client.InNamespace(e.ns))).To(Succeed())
	var names []string
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	return names
}
