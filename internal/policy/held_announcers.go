package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// Held within admitted, for the BGP and MetalLB announcers' objects: each must be one the
// admitting policy still makes for the GuestIngress (its class's announcer), announce only
// its host Service or pool, carry only communities and labels the policy allows and
// addresses in its ranges. Nothing of them is narrowed: an object with anything outside is
// deleted (the next reconcile that may build it applies it again, within the policy).

// announcerCut is the cut of one held announcer object under b (nil held: nothing).
func (b bounds) announcerCut(held *unstructured.Unstructured) Cut[*unstructured.Unstructured] {
	if held == nil {
		return Cut[*unstructured.Unstructured]{}
	}
	what := held.GetKind() + " " + held.GetName()
	var outside []string
	announcer := announcerOf(b.policy, b.gi)
	switch held.GroupVersionKind().GroupKind() {
	case ingress.BGPAdvertisementGVK.GroupKind():
		if announcer != ingress.AnnouncerCiliumBGP || b.policy.Spec.BGPAdvertisement == nil {
			outside = append(outside, fmt.Sprintf("%s: GuestIngressPolicy %s allows no announcement with %s", what, b.policy.Name, ingress.CiliumBGPClass))
			break
		}
		outside = append(outside, b.ciliumBGPAdvertisement(held)...)
	case ingress.MetalLBPoolGVK.GroupKind(), ingress.MetalLBL2AdvertisementGVK.GroupKind(), ingress.MetalLBBGPAdvertisementGVK.GroupKind():
		if announcer != ingress.AnnouncerMetalLB {
			outside = append(outside, fmt.Sprintf("%s: GuestIngressPolicy %s allows no announcement with MetalLB for class %s",
				what, b.policy.Name, ingress.LoadBalancerClass(b.gi)))
			break
		}
		outside = append(outside, b.metalLBObject(held)...)
	}
	return deleteIf[*unstructured.Unstructured](len(outside) > 0, strings.Join(outside, "; "))
}

// ciliumBGPAdvertisement: the host Service alone, its LoadBalancer IP only, the policy's
// communities and labels.
func (b bounds) ciliumBGPAdvertisement(held *unstructured.Unstructured) []string {
	p := b.policy.Spec.BGPAdvertisement
	var out []string
	adverts, _, _ := unstructured.NestedSlice(held.Object, "spec", "advertisements")
	for _, raw := range adverts {
		a, _ := raw.(map[string]any)
		if a["advertisementType"] != "Service" || !equality.Semantic.DeepEqual(a["service"], map[string]any{"addresses": []any{"LoadBalancerIP"}}) {
			out = append(out, fmt.Sprintf("an advertisement of CiliumBGPAdvertisement %s other than its host Service's LoadBalancer IP", held.GetName()))
			continue
		}
		if !equality.Semantic.DeepEqual(a["selector"], ingress.ServiceSelector(b.gi)) {
			out = append(out, fmt.Sprintf("the selector of CiliumBGPAdvertisement %s, which does not select Service %s/%s alone",
				held.GetName(), b.gi.Namespace, hostnames.HostService(b.gi)))
		}
		var c guestnetv1.BGPCommunities
		if raw, ok, _ := unstructured.NestedMap(a, "attributes", "communities"); ok {
			_ = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &c)
		}
		if attrs, ok := a["attributes"].(map[string]any); ok && len(attrs) > 0 && (len(attrs) != 1 || attrs["communities"] == nil) {
			out = append(out, fmt.Sprintf("attributes of CiliumBGPAdvertisement %s other than communities", held.GetName()))
		}
		out = append(out, communityViolations(&c, p.Communities)...)
	}
	own := ownership.Labels(b.gi)
	for _, k := range slices.Sorted(maps.Keys(held.GetLabels())) {
		v := held.GetLabels()[k]
		if own[k] == v || p.AdvertisementLabels[k] == v || (!hasKey(p.AdvertisementLabels, k) && slices.Contains(p.AllowedAdvertisementLabels, k+"="+v)) {
			continue
		}
		out = append(out, fmt.Sprintf("label %s=%s of CiliumBGPAdvertisement %s", k, v, held.GetName()))
	}
	return out
}

// metalLBObject: the pool holds the policy's addresses only and admits the host Service
// alone; an advertisement advertises that pool alone, as the policy's section says, with the
// policy's communities.
func (b bounds) metalLBObject(held *unstructured.Unstructured) []string {
	m := b.policy.Spec.MetalLB
	name := held.GetKind() + " " + held.GetNamespace() + "/" + held.GetName()
	spec, _, _ := unstructured.NestedMap(held.Object, "spec")
	var out []string
	if held.GetNamespace() != (ingress.MetalLBAnnouncement{Policy: *m}).MetalLBNamespace() {
		out = append(out, fmt.Sprintf("%s, outside MetalLB's namespace of GuestIngressPolicy %s", name, b.policy.Name))
	}
	if held.GroupVersionKind().GroupKind() == ingress.MetalLBPoolGVK.GroupKind() {
		addresses, _, _ := unstructured.NestedStringSlice(spec, "addresses")
		for _, a := range addresses {
			p, err := netip.ParsePrefix(a)
			if err != nil || !b.rangeWithin(ingress.PrefixRange(p)) {
				out = append(out, fmt.Sprintf("address %s of %s (its addresses: %s)", a, name, b.addressList()))
			}
		}
		want := ingress.MetalLBPool(b.gi, ingress.MetalLBAnnouncement{Policy: *m}).Object["spec"].(map[string]any)
		if !equality.Semantic.DeepEqual(spec["serviceAllocation"], want["serviceAllocation"]) || spec["autoAssign"] != any(false) {
			out = append(out, fmt.Sprintf("the serviceAllocation of %s, which does not admit Service %s/%s alone", name, b.gi.Namespace, hostnames.HostService(b.gi)))
		}
		return out
	}
	pools, _, _ := unstructured.NestedStringSlice(spec, "ipAddressPools")
	if !slices.Equal(pools, []string{hostnames.Pool(b.gi)}) || spec["ipAddressPoolSelectors"] != nil || spec["serviceSelectors"] != nil {
		out = append(out, fmt.Sprintf("%s, which advertises more than IPAddressPool %s", name, hostnames.Pool(b.gi)))
	}
	var section any
	fields := []string{"interfaces", "nodeSelectors"}
	if held.GroupVersionKind().GroupKind() == ingress.MetalLBL2AdvertisementGVK.GroupKind() {
		if m.L2Advertisement != nil {
			section = m.L2Advertisement
		}
	} else {
		fields = []string{"peers", "nodeSelectors", "aggregationLength", "aggregationLengthV6", "localPref"}
		if m.BGPAdvertisement != nil {
			section = m.BGPAdvertisement
			var c guestnetv1.BGPCommunities
			list, _, _ := unstructured.NestedStringSlice(spec, "communities")
			for _, s := range list {
				if large, ok := strings.CutPrefix(s, "large:"); ok {
					c.Large = append(c.Large, large)
				} else {
					c.Standard = append(c.Standard, s)
				}
			}
			out = append(out, communityViolations(&c, m.BGPAdvertisement.Communities)...)
		}
	}
	if section == nil {
		return append(out, fmt.Sprintf("%s: GuestIngressPolicy %s names no such MetalLB advertisement", name, b.policy.Name))
	}
	// What the policy's section builds is the bound: the same interfaces, nodes, peers.
	built, err := ingress.BuildAnnouncers(b.gi, ingress.Admission{Announcer: ingress.AnnouncerMetalLB, MetalLB: ingress.MetalLBAnnouncement{Policy: *m}})
	var want *unstructured.Unstructured
	if err == nil {
		want = built.MetalLBL2Advertisement
		if held.GroupVersionKind().GroupKind() == ingress.MetalLBBGPAdvertisementGVK.GroupKind() {
			want = built.MetalLBBGPAdvertisement
		}
	}
	for _, f := range fields {
		var w any
		if want != nil {
			w = want.Object["spec"].(map[string]any)[f]
		}
		if !equality.Semantic.DeepEqual(normalize(spec[f]), normalize(w)) {
			out = append(out, fmt.Sprintf("the %s of %s (GuestIngressPolicy %s says %v)", f, name, b.policy.Name, w))
		}
	}
	return out
}

// normalize makes JSON numbers and absent values comparable.
func normalize(v any) any {
	switch n := v.(type) {
	case int64:
		return float64(n)
	case int:
		return float64(n)
	case int32:
		return float64(n)
	case []any:
		if len(n) == 0 {
			return nil
		}
	case []metav1.LabelSelector:
		if len(n) == 0 {
			return nil
		}
	}
	return v
}
