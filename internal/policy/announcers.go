package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// announcerOf is the announcer p makes of gi's class: Cilium's L2 and BGP classes are
// Cilium's, the class p.metalLB names is MetalLB's, any other is someone else's.
func announcerOf(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress) ingress.Announcer {
	metalLBClass := ""
	if p.Spec.MetalLB != nil {
		metalLBClass = p.Spec.MetalLB.LoadBalancerClass
	}
	return ingress.ClassAnnouncer(ingress.LoadBalancerClass(gi), metalLBClass)
}

// announcerViolations: the announcer gi's class makes under p is one p configures, and what gi
// attaches to its BGP route (communities, advertisement labels) is what p allows for it.
// Client source IPs (Local) never go with Cilium's L2 announcer (the CRD refuses it too).
func announcerViolations(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress) []string {
	lb := gi.Spec.LoadBalancer
	announcer := announcerOf(p, gi)
	var out []string
	if announcer == ingress.AnnouncerCiliumL2 && lb.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		out = append(out, "externalTrafficPolicy Local with Cilium's L2 announcer (Cilium documents L2 announcements as incompatible with it: "+
			"the announcing node may have no local endpoint and drops the traffic; use a BGP or MetalLB class for client source IPs)")
	}
	var bgp guestnetv1.BGPAnnouncementSpec
	if lb.BGP != nil {
		bgp = *lb.BGP
	}
	var allowed *guestnetv1.BGPCommunities
	switch announcer {
	case ingress.AnnouncerCiliumBGP:
		if p.Spec.BGPAdvertisement == nil {
			return append(out, fmt.Sprintf("announcing with %s (it has no bgpAdvertisement saying how guestnet's CiliumBGPAdvertisements are labelled)",
				ingress.CiliumBGPClass))
		}
		allowed = p.Spec.BGPAdvertisement.Communities
		out = append(out, advertisementLabelViolations(p.Spec.BGPAdvertisement, bgp.AdvertisementLabels)...)
	case ingress.AnnouncerMetalLB:
		m := p.Spec.MetalLB
		if m.L2Advertisement == nil && m.BGPAdvertisement == nil {
			out = append(out, "announcing with MetalLB (its metalLB names neither an l2Advertisement nor a bgpAdvertisement)")
		}
		if m.BGPAdvertisement != nil {
			allowed = m.BGPAdvertisement.Communities
		}
		if lb.PoolRef != nil {
			out = append(out, fmt.Sprintf("poolRef %s with MetalLB's class %s (a shared pool is Cilium's; MetalLB gives the IP from guestnet's own IPAddressPool)",
				lb.PoolRef.Name, m.LoadBalancerClass))
		}
		if len(bgp.AdvertisementLabels) > 0 {
			out = append(out, "bgp.advertisementLabels with MetalLB (only Cilium's BGP control plane selects advertisements by label)")
		}
	default:
		if !isEmptyBGP(bgp) {
			out = append(out, fmt.Sprintf("bgp with class %s, which guestnet does not announce with BGP", ingress.LoadBalancerClass(gi)))
		}
		return out
	}
	return append(out, communityViolations(bgp.Communities, allowed)...)
}

func isEmptyBGP(b guestnetv1.BGPAnnouncementSpec) bool {
	return len(b.AdvertisementLabels) == 0 && (b.Communities == nil ||
		len(b.Communities.Standard)+len(b.Communities.WellKnown)+len(b.Communities.Large) == 0)
}

// advertisementLabelViolations: each label gi adds is "key=value" of p's allowed list, a valid
// label, not one of p's fixed labels nor guestnet's own.
func advertisementLabelViolations(p *guestnetv1.BGPAdvertisementPolicy, asked map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(asked)) {
		v := asked[k]
		pair := k + "=" + v
		switch {
		case len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0:
			out = append(out, fmt.Sprintf("advertisement label %s (not a valid label)", pair))
		case ingress.ForbiddenHostServiceKey(k) || k == ownership.ManagedByLabel:
			out = append(out, fmt.Sprintf("advertisement label %s (guestnet's own)", pair))
		case hasKey(p.AdvertisementLabels, k):
			out = append(out, fmt.Sprintf("advertisement label %s (the policy sets %s itself)", pair, k))
		case !slices.Contains(p.AllowedAdvertisementLabels, pair):
			list := "none"
			if len(p.AllowedAdvertisementLabels) > 0 {
				list = strings.Join(p.AllowedAdvertisementLabels, ", ")
			}
			out = append(out, fmt.Sprintf("advertisement label %s (it allows %s)", pair, list))
		}
	}
	return out
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// communityViolations: each community gi asks for has the value of one allowed lists, in any
// of the forms a community can be written in (standard and well-known ones compare as 32-bit
// values, large ones as three numbers), so that no spelling gets around the list.
func communityViolations(asked, allowed *guestnetv1.BGPCommunities) []string {
	if asked == nil {
		return nil
	}
	var allowedStd []uint32
	var allowedLarge []string
	var names []string
	if allowed != nil {
		for _, s := range append(slices.Clone(allowed.Standard), allowed.WellKnown...) {
			if v, ok := ingress.StandardCommunityValue(s); ok {
				allowedStd = append(allowedStd, v)
				names = append(names, s)
			}
		}
		for _, s := range allowed.Large {
			if v, ok := ingress.LargeCommunityValue(s); ok {
				allowedLarge = append(allowedLarge, v)
				names = append(names, s)
			}
		}
	}
	list := "none"
	if len(names) > 0 {
		list = strings.Join(names, ", ")
	}
	var out []string
	for _, s := range append(slices.Clone(asked.Standard), asked.WellKnown...) {
		v, ok := ingress.StandardCommunityValue(s)
		if !ok || !slices.Contains(allowedStd, v) {
			out = append(out, fmt.Sprintf("BGP community %s (it allows %s)", s, list))
		}
	}
	for _, s := range asked.Large {
		v, ok := ingress.LargeCommunityValue(s)
		if !ok || !slices.Contains(allowedLarge, v) {
			out = append(out, fmt.Sprintf("BGP large community %s (it allows %s)", s, list))
		}
	}
	return out
}

// bgpAnnouncement is what gi's CiliumBGPAdvertisement carries under p: p's labels and those gi
// adds (admitted), and gi's communities.
func bgpAnnouncement(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress) ingress.BGPAnnouncement {
	var b ingress.BGPAnnouncement
	if announcerOf(p, gi) != ingress.AnnouncerCiliumBGP || p.Spec.BGPAdvertisement == nil {
		return b
	}
	b.AdvertisementLabels = maps.Clone(p.Spec.BGPAdvertisement.AdvertisementLabels)
	if own := gi.Spec.LoadBalancer.BGP; own != nil {
		if b.AdvertisementLabels == nil {
			b.AdvertisementLabels = map[string]string{}
		}
		maps.Copy(b.AdvertisementLabels, own.AdvertisementLabels)
		if own.Communities != nil {
			b.Communities = *own.Communities.DeepCopy()
		}
	}
	return b
}

// metalLBAnnouncement is how MetalLB gives and announces gi's IP under p.
func metalLBAnnouncement(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress) ingress.MetalLBAnnouncement {
	var m ingress.MetalLBAnnouncement
	if announcerOf(p, gi) != ingress.AnnouncerMetalLB {
		return m
	}
	m.Policy = *p.Spec.MetalLB.DeepCopy()
	if own := gi.Spec.LoadBalancer.BGP; own != nil && own.Communities != nil && p.Spec.MetalLB.BGPAdvertisement != nil {
		m.Communities = *own.Communities.DeepCopy()
	}
	return m
}

// metalLBPoolViolations: gi asks for no address of a MetalLB IPAddressPool not made for it.
// MetalLB v0.16.1 refuses its whole configuration when two pools overlap
// (internal/config/config.go, "overlaps with already defined CIDR") and keeps the last good
// one (config_controller.go: configStale): a tenant's pool overlapping the platform's would
// freeze every MetalLB change on the host, and with Cilium two announcers would answer for one
// address. The tenant learns the pool is the platform's, not its name.
func metalLBPoolViolations(gi *guestnetv1.GuestIngress, pools []*unstructured.Unstructured) []string {
	claim := ingress.ClaimOf(gi)
	var out []string
	for _, pool := range pools {
		if ownership.IsOwnedBy(pool, gi) {
			continue
		}
		for _, r := range ingress.MetalLBPoolRanges(pool) {
			if claim.OverlapsRange(r) {
				out = append(out, fmt.Sprintf("%s (it overlaps a MetalLB IPAddressPool of the platform, and MetalLB refuses its whole configuration when pools overlap)", claim))
				return out
			}
		}
	}
	return out
}
