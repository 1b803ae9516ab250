package guestingress_test

// Lab test of guestnet's metrics (internal/metrics, docs/metrics.md) for a GuestIngress: a
// repair is counted under its kind, building the chain is not, and the Ready gauge follows the
// object's state until it is deleted.
//
// Run with: make test TEST_PKGS=./controllers/guestingress/... TEST_ARGS='-run Metrics -v'

import (
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/test/metricstest"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// Not parallel: the counters are the process's, and parallel tests of this package repair
// host Services too. (Parallel tests wait until the sequential ones are done.)
func TestGuestIngressMetrics_RepairsAndReadyReason(t *testing.T) {
	e := newPhaseEnv(t, envOptions{manual: true})
	mgr := lab.StartManager(t, e.l, manager.Options{WatchNamespace: e.ns}, setupGuestIngress)
	// The gauges as main.go registers them, from this manager's cache (this namespace only).
	gauges := prometheus.NewRegistry()
	gauges.MustRegister(&metrics.Collector{Reader: mgr.GetCache(), Elected: mgr.Elected()})
	readyGauge := func(g Gomega) map[string]float64 {
		return metricstest.Series(g, gauges, metrics.GuestIngressesName, "status", "reason")
	}
	before := metricstest.Series(e.g, ctrlmetrics.Registry, metrics.RepairsName, "kind")

	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)
	e.g.Eventually(readyGauge).WithTimeout(waitTimeout).WithPolling(poll).Should(Equal(map[string]float64{"True/Ready": 1}))
	e.g.Expect(metricstest.Series(e.g, ctrlmetrics.Registry, metrics.RepairsName, "kind")).To(Equal(before),
		"building the host objects and the guest Service is no repair")

	// Someone edits the host Service's selector by hand: guestnet puts it back, and counts
	// one repair of a HostService, nothing else.
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := e.getHostService("tenant-a-web")
		svc.Spec.Selector = map[string]string{lab.VMTemplateLabel: gc.WorkerTemplate}
		return e.host.Update(e.ctx, svc, client.FieldOwner("kubectl-edit"))
	})).To(Succeed())
	e.g.Eventually(func() map[string]string { return e.getHostService("tenant-a-web").Spec.Selector }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(Equal(virtlauncher.WorkerSelector(e.ns, "tenant-a")))
	after := metricstest.Series(e.g, ctrlmetrics.Registry, metrics.RepairsName, "kind")
	e.g.Expect(after[string(metrics.RepairHostService)] - before[string(metrics.RepairHostService)]).To(BeNumerically(">=", 1))
	for _, k := range metrics.RepairKinds {
		if k != metrics.RepairHostService {
			e.g.Expect(after[string(k)]).To(Equal(before[string(k)]), "repairs of %s", k)
		}
	}

	// The guest Service goes (the ingress controller is uninstalled): the gauge follows Ready.
	// (Ready may pass through NoEndpoints first: the repaired selector makes the EndpointSlice
	// controller rewrite the slices. GuestServiceReady comes first in Ready's summary.)
	e.g.Expect(e.guest.Delete(e.ctx, e.getGuestService())).To(Succeed())
	e.g.Eventually(func(g Gomega) {
		ready := conditions.Get(e.getGuestIngress(gi), guestnetv1.ReadyCondition)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(ready.Reason).To(Equal(guestnetv1.GuestServiceNotFoundReason))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	e.g.Eventually(readyGauge).WithTimeout(waitTimeout).WithPolling(poll).Should(Equal(map[string]float64{"False/" + guestnetv1.GuestServiceNotFoundReason: 1}))

	// Deleted: gone from the gauge, with nothing to take back.
	e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
	e.g.Eventually(readyGauge).WithTimeout(waitTimeout).WithPolling(poll).Should(BeEmpty())
}
