package guestingress_test

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
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
	applied := ingress.HostService(e.getGuestIngress(gi), map[string]int32{"http": e.nodePort(0), "https": e.nodePort(1)}, ingress.Admission{})
	applied.Spec.Selector = older
	e.g.Expect(e.host.Apply(e.ctx, applied, client.FieldOwner(ownership.FieldManager), client.ForceOwnership)).To(Succeed())
	e.g.Expect(applied.Spec.Selector).To(Equal(older), "the apply's answer: the Service as an older guestnet left it")

	e.g.Eventually(func(g Gomega) {
		svc := e.getHostService("tenant-a-web")
		g.Expect(svc.ResourceVersion).NotTo(Equal(*applied.ResourceVersion))
		g.Expect(svc.Spec.Selector).To(Equal(virtlauncher.WorkerSelector(e.ns, gc.Name)))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
}
