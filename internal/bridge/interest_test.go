package bridge

import (
	"fmt"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// A guest Service change that ServiceMatters filters out never changes the plan: for each
// scenario, every Service added, removed or changed in a few ways either matters to the
// last plan or leaves MakePlan's answer as it was.
func TestAServiceThatDoesNotMatterLeavesThePlanAsItIs(t *testing.T) {
	own := func(gwb *guestnetv1.GuestWebhookBridge, name string, nodePort int32) corev1.Service {
		return bridgeNodePortService(t, gwb, chartService("apps", name, 443), map[int32]int32{443: nodePort})
	}
	small := func(gwb *guestnetv1.GuestWebhookBridge) { gwb.Spec.NodePortRange.Size = 2 }
	scenarios := []struct {
		name     string
		gwb      *guestnetv1.GuestWebhookBridge
		targets  []string
		services func(gwb *guestnetv1.GuestWebhookBridge, chart []corev1.Service) []corev1.Service
	}{
		{name: "new targets", gwb: newBridge(), targets: []string{"a", "b"}},
		{name: "bridged, a port held by another Service", gwb: newBridge(), targets: []string{"a", "b"},
			services: func(gwb *guestnetv1.GuestWebhookBridge, chart []corev1.Service) []corev1.Service {
				return append(chart, own(gwb, "a", 32703), nodePortService("projectcontour", "envoy", 32700, 30080))
			}},
		{name: "range exhausted", gwb: newBridge(small), targets: []string{"a"},
			services: func(_ *guestnetv1.GuestWebhookBridge, chart []corev1.Service) []corev1.Service {
				return append(chart, nodePortService("projectcontour", "envoy", 32700), nodePortService("monitoring", "grafana", 32701))
			}},
		{name: "a target's Service is missing", gwb: newBridge(), targets: []string{"a", "b"},
			services: func(_ *guestnetv1.GuestWebhookBridge, chart []corev1.Service) []corev1.Service { return chart[:1] }},
		{name: "a Service of the bridge's name is someone else's", gwb: newBridge(), targets: []string{"a"},
			services: func(_ *guestnetv1.GuestWebhookBridge, chart []corev1.Service) []corev1.Service {
				return append(chart, nodePortService("apps", hostnames.BridgeNodePortService("a"), 30090))
			}},
		{name: "another bridge's Service", gwb: newBridge(), targets: []string{"a"},
			services: func(_ *guestnetv1.GuestWebhookBridge, chart []corev1.Service) []corev1.Service {
				other := newBridge(func(b *guestnetv1.GuestWebhookBridge) { b.Name = "other" })
				return append(chart, own(other, "x", 32701))
			}},
	}
	filtered, mattered := 0, 0
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			g := NewWithT(t)
			targets, services := nodePortTargets(sc.targets...)
			if sc.services != nil {
				services = sc.services(sc.gwb, services)
			}
			plan := func(services []corev1.Service) *Plan {
				return MakePlan(Input{Bridge: sc.gwb, Targets: targets, GuestServices: services})
			}
			before := plan(services)
			keys := before.GuestServiceKeys()
			r := sc.gwb.Spec.NodePortRange
			for _, change := range serviceChanges(services, r.Start) {
				matters := (change.old != nil && ServiceMatters(change.old, sc.gwb, keys)) ||
					(change.new != nil && ServiceMatters(change.new, sc.gwb, keys))
				if matters {
					mattered++
					continue
				}
				filtered++
				g.Expect(plan(change.services)).To(Equal(before), "%s: filtered out, and the plan changed", change.name)
			}
		})
	}
	// Both answers were given: the property was checked, and the filter does filter.
	NewWithT(t).Expect([]int{filtered, mattered}).To(HaveEach(BeNumerically(">", 10)))
}

// serviceChange is the guest's Services after one Service was added, removed or changed.
type serviceChange struct {
	name     string
	old, new *corev1.Service
	services []corev1.Service
}

// serviceChanges adds Services of several kinds (inside and outside the bridge's range at
// start), and removes and changes each of services.
func serviceChanges(services []corev1.Service, start int32) []serviceChange {
	var out []serviceChange
	added := []corev1.Service{
		chartService("other", "x", 443),
		chartService("apps", "unrelated", 443),
		nodePortService("other", "np", 30080),
		nodePortService("other", "np-in-range", start+1),
		nodePortService("apps", hostnames.BridgeNodePortService("b"), 30091),
	}
	for i := range added {
		svc := added[i]
		out = append(out, serviceChange{name: "add " + svc.Namespace + "/" + svc.Name, new: &svc,
			services: append(clone(services), svc)})
	}
	mutations := map[string]func(*corev1.Service){
		"selector":     func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "changed"} },
		"targetPort":   func(s *corev1.Service) { s.Spec.Ports[0].TargetPort = intstr.FromInt32(9443) },
		"into range":   func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = start },
		"out of range": func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = 30099 },
		"annotation":   func(s *corev1.Service) { s.Annotations = map[string]string{"example.io/x": "y"} },
	}
	for i := range services {
		old := services[i]
		rest := append(clone(services[:i]), services[i+1:]...)
		out = append(out, serviceChange{name: "remove " + old.Namespace + "/" + old.Name, old: &old, services: rest})
		for what, mutate := range mutations {
			if len(old.Spec.Ports) == 0 {
				continue
			}
			changed := clone(services)
			mutate(&changed[i])
			out = append(out, serviceChange{name: fmt.Sprintf("%s of %s/%s", what, old.Namespace, old.Name),
				old: &old, new: &changed[i], services: changed})
		}
	}
	return out
}

func clone(services []corev1.Service) []corev1.Service {
	out := make([]corev1.Service, len(services))
	for i := range services {
		out[i] = *services[i].DeepCopy()
	}
	return out
}

func TestServiceMatters(t *testing.T) {
	gwb := newBridge() // range 32700-32715
	keys := (&Plan{}).GuestServiceKeys()
	keys.Insert("apps/a")
	tests := []struct {
		name string
		svc  corev1.Service
		keys bool
		want bool
	}{
		{name: "no plan yet: everything matters", svc: chartService("other", "x", 443), want: true},
		{name: "a Service the plan looked up", svc: chartService("apps", "a", 443), keys: true, want: true},
		{name: "any other ClusterIP Service", svc: chartService("other", "x", 443), keys: true, want: false},
		{name: "a nodePort in the range", svc: nodePortService("other", "np", 30080, 32715), keys: true, want: true},
		{name: "nodePorts outside the range", svc: nodePortService("other", "np", 30080, 32716, 32699), keys: true, want: false},
		{name: "a bridge's Service, of any bridge", svc: bridgeNodePortService(t, newBridge(func(b *guestnetv1.GuestWebhookBridge) { b.Name = "other" }),
			chartService("apps", "x", 443), map[int32]int32{443: 30000}), keys: true, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := keys
			if !tt.keys {
				k = nil
			}
			NewWithT(t).Expect(ServiceMatters(&tt.svc, gwb, k)).To(Equal(tt.want))
		})
	}
}

// A guest APIService or webhook configuration matters to a bridge when the bridge selects it
// (by name, by label or with all), when it carries a record (any bridge's) or when the
// bridge's host copy of the records names it; any other leaves the bridge asleep. Whatever
// Select picks from a guest holding only that object, TargetMatters says matters.
func TestTargetMatters(t *testing.T) {
	byName := func(gwb *guestnetv1.GuestWebhookBridge) {
		gwb.Spec.ValidatingWebhooks = &guestnetv1.TargetSelector{Names: []string{"mine"}}
		gwb.Spec.APIServices = &guestnetv1.TargetSelector{Names: []string{"v1beta1.mine.io"}}
	}
	byLabel := func(gwb *guestnetv1.GuestWebhookBridge) {
		gwb.Spec.MutatingWebhooks = &guestnetv1.TargetSelector{Selector: &guestnetv1.TargetLabelSelector{MatchLabels: map[string]guestnetv1.LabelValue{"app": "webhook"}}}
	}
	all := func(gwb *guestnetv1.GuestWebhookBridge) {
		gwb.Spec.ValidatingWebhooks = &guestnetv1.TargetSelector{All: true}
		gwb.Spec.APIServices = &guestnetv1.TargetSelector{All: true}
	}
	hostRecord := func(gwb *guestnetv1.GuestWebhookBridge) {
		gwb.Spec.ValidatingWebhooks = &guestnetv1.TargetSelector{Names: []string{"mine"}}
		gwb.Status.Records = []guestnetv1.BridgeRecord{{Kind: guestnetv1.ValidatingWebhookTarget, Name: "was-mine", Webhook: "w"}}
	}
	withService := func(name string, labels map[string]string) client.Object {
		c := vwc(name, labels, vwh("w", whRef("apps", "svc", 443, "/")))
		return &c
	}
	withURL := func(name string) client.Object {
		c := vwc(name, nil, vwh("w", nil))
		c.Webhooks[0].ClientConfig.URL = ptr.To("https://example.invalid/")
		return &c
	}
	recorded := func(o client.Object, record string) client.Object {
		o.SetAnnotations(map[string]string{guestnetv1.BridgeOriginalAnnotation: record})
		return o
	}
	recordOf := func(bridge string) string {
		return `{"w":{"bridge":"` + bridge + `","original":{"namespace":"apps","name":"svc"},"written":"https://x.k0smotron.svc/"}}`
	}
	mutating := func(name string, labels map[string]string) client.Object {
		c := mwc(name, labels, mwh("w", whRef("apps", "svc", 443, "/")))
		return &c
	}
	tests := []struct {
		name string
		gwb  *guestnetv1.GuestWebhookBridge
		obj  client.Object
		want bool
	}{
		{name: "named webhook configuration", gwb: newBridge(byName), obj: withService("mine", nil), want: true},
		{name: "named, reverted to a url", gwb: newBridge(byName), obj: withURL("mine"), want: true},
		{name: "another webhook configuration", gwb: newBridge(byName), obj: withService("theirs", nil), want: false},
		{name: "named APIService", gwb: newBridge(byName), obj: apiService("v1beta1.mine.io", apiRef("apps", "svc", 443)), want: true},
		{name: "another APIService", gwb: newBridge(byName), obj: apiService("v1beta1.metrics.k8s.io", apiRef("apps", "svc", 443)), want: false},
		{name: "a kind the spec does not select", gwb: newBridge(byName), obj: mutating("mine", nil), want: false},
		{name: "matching label", gwb: newBridge(byLabel), obj: mutating("any", map[string]string{"app": "webhook"}), want: true},
		{name: "other label", gwb: newBridge(byLabel), obj: mutating("any", map[string]string{"app": "other"}), want: false},
		{name: "all: one that calls a Service", gwb: newBridge(all), obj: withService("any", nil), want: true},
		{name: "all: one with a url", gwb: newBridge(all), obj: withURL("any"), want: false},
		{name: "all: an APIService of the apiserver itself", gwb: newBridge(all), obj: apiService("v1.apps", nil), want: false},
		{name: "a record of this bridge", gwb: newBridge(byName), obj: recorded(withURL("theirs"), recordOf("k0smotron/bridge")), want: true},
		{name: "another bridge's record, not selected", gwb: newBridge(byName), obj: recorded(withURL("theirs"), recordOf("k0smotron/other")), want: false},
		{name: "another bridge's record, selected", gwb: newBridge(byName), obj: recorded(withURL("mine"), recordOf("k0smotron/other")), want: true},
		{name: "all: another bridge's record on a url webhook", gwb: newBridge(all), obj: recorded(withURL("theirs"), recordOf("k0smotron/other")), want: true},
		{name: "a record nobody can read", gwb: newBridge(byName), obj: recorded(withURL("theirs"), `{"w":`), want: true},
		{name: "a damaged entry", gwb: newBridge(byName), obj: recorded(withURL("theirs"), `{"w":{"bridge":""}}`), want: true},
		{name: "named in the host copy of the records", gwb: newBridge(hostRecord), obj: withURL("was-mine"), want: true},
		{name: "a selector that cannot be used", gwb: newBridge(func(gwb *guestnetv1.GuestWebhookBridge) {
			gwb.Spec.ValidatingWebhooks = &guestnetv1.TargetSelector{Selector: &guestnetv1.TargetLabelSelector{MatchExpressions: []guestnetv1.TargetLabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}}
		}), obj: withService("any", nil), want: true},
		{name: "another kind of object", gwb: newBridge(byName), obj: &corev1.ConfigMap{}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(TargetMatters(tt.obj, tt.gwb)).To(Equal(tt.want))
			// Select never picks what TargetMatters leaves out.
			var obs Observed
			switch o := tt.obj.(type) {
			case *apiregistrationv1.APIService:
				obs.APIServices = append(obs.APIServices, *o)
			case *admissionregistrationv1.ValidatingWebhookConfiguration:
				obs.ValidatingWebhooks = append(obs.ValidatingWebhooks, *o)
			case *admissionregistrationv1.MutatingWebhookConfiguration:
				obs.MutatingWebhooks = append(obs.MutatingWebhooks, *o)
			}
			targets, err := Select(&tt.gwb.Spec, obs, ReadHostRecords("k0smotron/bridge", tt.gwb.Status.Records))
			picked := slices.ContainsFunc(targets, func(t Target) bool { return t.Found && t.Name == tt.obj.GetName() })
			if err != nil || picked {
				g.Expect(tt.want).To(BeTrue(), "Select picks it (or fails), so it must matter")
			}
		})
	}
}
