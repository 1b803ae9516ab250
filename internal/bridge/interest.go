package bridge

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// GuestServiceKeys are the guest Services ("<namespace>/<name>") the plan looked up by name:
// its targets' Services (as the guest holds them and as recorded) and the names of the
// bridge's own Services, whose holder it checks. Any other guest Service changes the plan
// only through a nodePort in the bridge's range, or by being a bridge's (ServiceMatters).
func (p *Plan) GuestServiceKeys() sets.Set[string] {
	keys := sets.New[string]()
	addRef := func(ref *ServiceRef) {
		if ref != nil {
			keys.Insert(ref.Namespace + "/" + ref.Name)
		}
	}
	for _, tps := range [][]TargetPlan{p.Targets, p.Restores} {
		for i := range tps {
			addRef(tps[i].Service)
			addRef(tps[i].observed.Service)
		}
	}
	for _, b := range p.Backends {
		keys.Insert(b.Key())
		for _, name := range b.guestServiceNames() {
			keys.Insert(b.Service.Namespace + "/" + name)
		}
	}
	return keys
}

// ServiceMatters reports whether a change of the guest Service svc can change the plan of
// gwb, whose last plan looked up keys (GuestServiceKeys; nil: no plan yet, everything
// matters): it is one of keys, a bridge's own Service, or it holds a nodePort in gwb's
// range. In a guest with many Services (or a lab whose guests share an apiserver) the
// others would each replan every bridge of the guest.
func ServiceMatters(svc *corev1.Service, gwb *guestnetv1.GuestWebhookBridge, keys sets.Set[string]) bool {
	if keys == nil || keys.Has(svc.Namespace+"/"+svc.Name) {
		return true
	}
	if _, bridged := svc.Annotations[ownership.BridgeAnnotation]; bridged {
		return true // a bridge's, or one that says so: a claim the plan weighs
	}
	for _, p := range svc.Spec.Ports {
		if inRange(gwb.Spec.NodePortRange, p.NodePort) {
			return true
		}
	}
	return false
}

// inRange reports whether nodePort n is in r.
func inRange(r guestnetv1.NodePortRange, n int32) bool { return n >= r.Start && n < r.Start+r.Size }
