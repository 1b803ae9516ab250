package guestwebhookbridge_test

// Lab test of guestnet's metrics (internal/metrics, docs/metrics.md) for a
// GuestWebhookBridge: a Helm revert of a bridged webhook is counted as a repair of a
// ValidatingWebhookConfiguration, and the target gauge follows the bridge.
//
// Run with: make test TEST_PKGS=./controllers/guestwebhookbridge/... TEST_ARGS='-run Metrics -v'

import (
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/test/metricstest"
)

// Not parallel: the counters are the process's, and parallel tests of this package repair
// targets too. (Parallel tests wait until the sequential ones are done.)
func TestGuestWebhookBridgeMetrics_ARevertIsCountedAsARepair(t *testing.T) {
	e := newBridgeEnvWithoutManager(t)
	mgr := lab.StartManager(t, e.l, manager.Options{WatchNamespace: e.ns}, setupGuestWebhookBridge)
	gauges := prometheus.NewRegistry()
	gauges.MustRegister(&metrics.Collector{Reader: mgr.GetCache()})
	targets := func(g Gomega) map[string]float64 {
		return metricstest.Series(g, gauges, metrics.BridgeTargetsName, "state", "reason")
	}
	repairs := func() map[string]float64 {
		return metricstest.Series(e.g, ctrlmetrics.Registry, metrics.RepairsName, "kind")
	}
	before := repairs()

	wh := e.createWebhook()
	gc := e.createCluster("tenant-a", 1)
	original := e.getWebhookConfig(wh.Config.Name)
	gwb := e.createBridge("bridge", gc.Name)
	e.eventuallyCondition(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason)
	e.g.Eventually(targets).WithTimeout(waitTimeout).Should(HaveKeyWithValue(metrics.TargetBridged+"/"+guestnetv1.TargetsBridgedReason, 1.0))
	e.g.Expect(repairs()).To(Equal(before), "the first rewrite is no repair")

	// helm upgrade puts the chart's service reference back.
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		live := e.getWebhookConfig(wh.Config.Name)
		chart := original.DeepCopy()
		chart.ResourceVersion = live.ResourceVersion
		chart.ManagedFields = nil
		return e.guest.Update(e.ctx, chart, client.FieldOwner("helm"))
	})).To(Succeed())
	e.g.Eventually(func() map[string]float64 { return repairs() }).WithTimeout(waitTimeout).
		Should(HaveKeyWithValue(string(metrics.RepairValidatingWebhook), BeNumerically(">", before[string(metrics.RepairValidatingWebhook)])))
	after := repairs()
	for _, k := range []metrics.RepairKind{metrics.RepairBridgeHostService, metrics.RepairBridgeGuestService, metrics.RepairAPIService, metrics.RepairMutatingWebhook} {
		e.g.Expect(after[string(k)]).To(Equal(before[string(k)]), "repairs of %s", k)
	}

	// Deleted: the bridge's targets are gone from the gauge.
	e.g.Expect(e.host.Delete(e.ctx, gwb)).To(Succeed())
	e.eventuallyGone(gwb)
	e.g.Eventually(targets).WithTimeout(waitTimeout).Should(BeEmpty())
}
