package bridge

import (
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// TargetMatters reports whether a change of the guest APIService or webhook configuration o
// can change the plan of gwb: gwb's spec selects it (Select's rules, on o alone), it carries
// a record of gwb (to restore or repair) or one guestnet cannot read, or gwb's host copy of
// the records names it. Any other object is no target of gwb: another bridge's record on it
// weighs only in the plans of the bridges that select it (by name, label, or all). In a guest with many webhooks
// (cert-manager's cainjector rewrites each caBundle) or a lab whose guests share an
// apiserver, the others would each replan every bridge of the guest. An object of another
// kind, or a selector that cannot be used, matters.
func TargetMatters(o client.Object, gwb *guestnetv1.GuestWebhookBridge) bool {
	var (
		kind guestnetv1.TargetKind
		sel  *guestnetv1.TargetSelector
	)
	switch o.(type) {
	case *apiregistrationv1.APIService:
		kind, sel = guestnetv1.APIServiceTarget, gwb.Spec.APIServices
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		kind, sel = guestnetv1.ValidatingWebhookTarget, gwb.Spec.ValidatingWebhooks
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		kind, sel = guestnetv1.MutatingWebhookTarget, gwb.Spec.MutatingWebhooks
	default:
		return true
	}
	if carriesRecordOf(o, ownership.BridgeID(gwb)) || slices.ContainsFunc(gwb.Status.Records, func(r guestnetv1.BridgeRecord) bool {
		return r.Kind == kind && r.Name == o.GetName()
	}) {
		return true
	}
	// With all, Select also picks what carries anyone's record (a claim to weigh or take over).
	picked, err := selectObjects(sel, kind, []client.Object{o}, func(o client.Object) bool { return referencesService(o) || hasRecord(o) })
	return err != nil || slices.ContainsFunc(picked, func(p selected[client.Object]) bool { return p.obj != nil })
}

// carriesRecordOf reports whether o's record annotation holds an entry of bridge (or one that
// cannot be read: whose it is is unknown).
func carriesRecordOf(o client.Object, bridge string) bool {
	set := readRecordSet(o)
	if set.unreadable != nil {
		return true
	}
	for key := range set.entries {
		r, err := set.get(key)
		if err != nil || r.Bridge == bridge {
			return true
		}
	}
	return false
}
