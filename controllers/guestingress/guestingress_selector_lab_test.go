package guestingress_test

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// A host Service an older guestnet applied, whose selector lacks the label of the
// KubevirtMachines' namespace, gets it through server-side apply: the selector guestnet
// applies is the one it owns, so a key it adds is written on the next reconcile.
func TestGuestIngressPhases_AnOlderSelectorIsUpgraded(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)

	// What an older guestnet applied: the same selector without the namespace's label.
	older := map[string]string{}
	for k, v := range virtlauncher.WorkerSelector(e.ns, gc.Name) {
		if k != virtlauncher.MachineNamespaceLabel {
			older[k] = v
		}
	}
	svc := e.getHostService("tenant-a-web")
	e.g.Expect(e.host.Apply(e.ctx, corev1ac.Service(svc.Name, svc.Namespace).WithSpec(corev1ac.ServiceSpec().WithSelector(older)),
		client.FieldOwner(ownership.FieldManager), client.ForceOwnership)).To(Succeed())
	e.g.Expect(e.getHostService("tenant-a-web").Spec.Selector).NotTo(HaveKey(virtlauncher.MachineNamespaceLabel))

	e.g.Eventually(func() map[string]string { return e.getHostService("tenant-a-web").Spec.Selector }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(Equal(virtlauncher.WorkerSelector(e.ns, gc.Name)))
}
