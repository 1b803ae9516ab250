package e2e

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestcache"
)

// guestnet maps the built-in kinds it reads in a guest without asking the guest's discovery
// (internal/guestcache, docs/decisions/0013-guest-connections.md): what it knows must be
// what a real apiserver serves, resource name and scope.
func TestGuestConnections_BuiltinKindsAreWhatTheApiserverServes(t *testing.T) {
	l := startLab(t)
	g := NewWithT(t)
	d, err := discovery.NewDiscoveryClientForConfig(l.Guest.Config)
	g.Expect(err).NotTo(HaveOccurred())
	for _, m := range guestcache.BuiltinMappings() {
		resources, err := d.ServerResourcesForGroupVersion(m.GroupVersionKind.GroupVersion().String())
		g.Expect(err).NotTo(HaveOccurred(), "the guest serves %s", m.GroupVersionKind.GroupVersion())
		found := false
		for _, r := range resources.APIResources {
			if r.Kind != m.GroupVersionKind.Kind || r.Name != m.Resource.Resource {
				continue
			}
			found = true
			g.Expect(r.Namespaced).To(Equal(m.Scope.Name() == meta.RESTScopeNameNamespace), "scope of %s", m.Resource)
		}
		g.Expect(found).To(BeTrue(), "the guest serves %s as %s", m.GroupVersionKind, m.Resource)
	}
}
