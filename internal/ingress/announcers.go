package ingress

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// Announcer is what gives an admitted GuestIngress's host Service its IP and announces it on
// the physical network. The admitting policy decides it from the Service's class
// (internal/policy): each announcer has its own host objects, built here.
type Announcer string

const (
	// AnnouncerCiliumL2 is Cilium's L2 announcer: Cilium LB-IPAM gives the IP from guestnet's CiliumLoadBalancerIPPool,
	// a CiliumL2AnnouncementPolicy answers ARP/NDP for it (class io.cilium/l2-announcer).
	AnnouncerCiliumL2 Announcer = "CiliumL2"
	// AnnouncerCiliumBGP is Cilium's BGP control plane: Cilium LB-IPAM gives the IP, a CiliumBGPAdvertisement selecting only
	// the host Service makes the platform's BGP peers learn it (class io.cilium/bgp-control-plane).
	AnnouncerCiliumBGP Announcer = "CiliumBGP"
	// AnnouncerMetalLB is MetalLB: it gives the IP from guestnet's IPAddressPool and announces it
	// with the L2Advertisement and/or BGPAdvertisement the policy names (the class MetalLB
	// serves, MetalLBPolicy.loadBalancerClass).
	AnnouncerMetalLB Announcer = "MetalLB"
	// AnnouncerOther is someone else, for another class the policy admits; guestnet creates the Cilium pool and
	// the Service, and someone else announces.
	AnnouncerOther Announcer = "Other"
)

// CiliumBGPClass is the loadBalancerClass Cilium's BGP control plane advertises (with no class
// at all): pkg/bgp/manager/reconciler/service.go in Cilium v1.20.2 skips a Service of any
// other class.
const CiliumBGPClass = "io.cilium/bgp-control-plane"

// The announcers' kinds guestnet writes. CiliumBGPAdvertisement is cluster-scoped and served as
// cilium.io/v2 since Cilium 1.18 (v2alpha1 before, and still served by 1.20 for old clients);
// MetalLB's are namespaced, in MetalLB's namespace, metallb.io/v1beta1 in v0.13 to v0.16.
var (
	BGPAdvertisementGVK        = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumBGPAdvertisement"}
	MetalLBPoolGVK             = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "IPAddressPool"}
	MetalLBL2AdvertisementGVK  = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "L2Advertisement"}
	MetalLBBGPAdvertisementGVK = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "BGPAdvertisement"}
)

// BGPAdvertisementVersions are the versions of CiliumBGPAdvertisement guestnet writes, the
// preferred first: v2 (Cilium 1.18 and later), v2alpha1 (1.16 and 1.17), whose schema holds
// every field guestnet sets (advertisementType Service, service.addresses, selector,
// attributes.communities standard, wellKnown and large).
var BGPAdvertisementVersions = []string{"v2", "v2alpha1"}

// UseBGPAdvertisementVersion makes guestnet read and write CiliumBGPAdvertisements in version
// (one of BGPAdvertisementVersions), the one the host serves; called once, at start, before
// any controller runs.
func UseBGPAdvertisementVersion(version string) {
	if slices.Contains(BGPAdvertisementVersions, version) {
		BGPAdvertisementGVK.Version = version
	}
}

// MetalLB's annotations on a Service (controller/service.go in MetalLB v0.16.1).
const (
	// MetalLBLoadBalancerIPsAnnotation requests fixed IPs, comma-separated, one per family.
	MetalLBLoadBalancerIPsAnnotation = "metallb.io/loadBalancerIPs"
	// MetalLBAddressPoolAnnotation pins the Service to one IPAddressPool: no other pool,
	// the platform's auto-assigning ones included, hands it an address.
	MetalLBAddressPoolAnnotation = "metallb.io/address-pool"
)

// NewBGPAdvertisement returns an empty CiliumBGPAdvertisement to read into.
func NewBGPAdvertisement() *unstructured.Unstructured { return newObject(BGPAdvertisementGVK) }

// NewMetalLBPool returns an empty MetalLB IPAddressPool to read into.
func NewMetalLBPool() *unstructured.Unstructured { return newObject(MetalLBPoolGVK) }

// NewMetalLBL2Advertisement returns an empty MetalLB L2Advertisement to read into.
func NewMetalLBL2Advertisement() *unstructured.Unstructured {
	return newObject(MetalLBL2AdvertisementGVK)
}

// NewMetalLBBGPAdvertisement returns an empty MetalLB BGPAdvertisement to read into.
func NewMetalLBBGPAdvertisement() *unstructured.Unstructured {
	return newObject(MetalLBBGPAdvertisementGVK)
}

// ClassAnnouncer is the announcer of a Service class when the policy's MetalLB section names
// metalLBClass ("" when it has none).
func ClassAnnouncer(class, metalLBClass string) Announcer {
	switch {
	case class == guestnetv1.DefaultLoadBalancerClass:
		return AnnouncerCiliumL2
	case class == CiliumBGPClass:
		return AnnouncerCiliumBGP
	case metalLBClass != "" && class == metalLBClass:
		return AnnouncerMetalLB
	}
	return AnnouncerOther
}

// UsesCiliumLBIPAM reports whether Cilium LB-IPAM gives the IP (every announcer but MetalLB):
// guestnet then creates a CiliumLoadBalancerIPPool and requests the IP with lbipam.cilium.io/ips.
func (a Announcer) UsesCiliumLBIPAM() bool { return a != AnnouncerMetalLB }

// RequestedIPs are the fixed IPs gi asks for: spec.loadBalancer.ip, or its ips.
func RequestedIPs(gi *guestnetv1.GuestIngress) []string {
	lb := gi.Spec.LoadBalancer
	if lb.IP != "" {
		return []string{lb.IP}
	}
	return slices.Clone(lb.IPs)
}

// RequestedAddrs are RequestedIPs that parse (the CRD validates them).
func RequestedAddrs(gi *guestnetv1.GuestIngress) []netip.Addr {
	var out []netip.Addr
	for _, s := range RequestedIPs(gi) {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// FamilyOf is the IP family of an address.
func FamilyOf(ip netip.Addr) corev1.IPFamily {
	if ip.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// IPFamilies are the host Service's families, primary first: spec.loadBalancer.ipFamilies,
// else those of its fixed IPs, else of its cidrs in their order, else IPv4.
func IPFamilies(gi *guestnetv1.GuestIngress) []corev1.IPFamily {
	lb := gi.Spec.LoadBalancer
	if len(lb.IPFamilies) > 0 {
		return slices.Clone(lb.IPFamilies)
	}
	var out []corev1.IPFamily
	add := func(f corev1.IPFamily) {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	for _, ip := range RequestedAddrs(gi) {
		add(FamilyOf(ip))
	}
	if len(out) == 0 {
		for _, c := range lb.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				add(FamilyOf(p.Addr()))
			}
		}
	}
	if len(out) == 0 {
		out = []corev1.IPFamily{corev1.IPv4Protocol}
	}
	return out
}

// IPFamilyPolicy is the host Service's ipFamilyPolicy for families: one is SingleStack, two
// RequireDualStack (guestnet never leaves the choice to the host's defaults).
func IPFamilyPolicy(families []corev1.IPFamily) corev1.IPFamilyPolicy {
	if len(families) > 1 {
		return corev1.IPFamilyPolicyRequireDualStack
	}
	return corev1.IPFamilyPolicySingleStack
}

// BGPAnnouncement is what an admitted GuestIngress's BGP route carries, as the policy bounds it.
type BGPAnnouncement struct {
	// AdvertisementLabels are the CiliumBGPAdvertisement's labels besides guestnet's marks:
	// the policy's and those the GuestIngress chose among the allowed ones.
	AdvertisementLabels map[string]string
	// Communities are the GuestIngress's, all allowed.
	Communities guestnetv1.BGPCommunities
}

// CiliumBGPAdvertisement is the CiliumBGPAdvertisement guestnet applies for gi: it
// advertises the LoadBalancer IPs of gi's host Service alone (Cilium matches the selector
// against the Service's labels plus io.kubernetes.service.{namespace,name}:
// serviceLabelSet in pkg/bgp/manager/reconciler/service.go), with the admitted communities,
// and is labelled so that the platform's peer configs select it.
func CiliumBGPAdvertisement(gi *guestnetv1.GuestIngress, b BGPAnnouncement) *unstructured.Unstructured {
	m := marksOf(hostnames.Pool(gi), gi)
	lbls := maps.Clone(b.AdvertisementLabels)
	if lbls == nil {
		lbls = map[string]string{}
	}
	maps.Copy(lbls, m.Labels) // guestnet's marks win
	m.Labels = lbls
	advert := map[string]any{
		"advertisementType": "Service",
		"service":           map[string]any{"addresses": []any{"LoadBalancerIP"}},
		"selector":          ServiceSelector(gi),
	}
	if c := ciliumCommunities(b.Communities); len(c) > 0 {
		advert["attributes"] = map[string]any{"communities": c}
	}
	u := marked(BGPAdvertisementGVK, m)
	u.Object["spec"] = map[string]any{"advertisements": []any{advert}}
	return u
}

func ciliumCommunities(c guestnetv1.BGPCommunities) map[string]any {
	out := map[string]any{}
	for key, list := range map[string][]string{"standard": c.Standard, "wellKnown": c.WellKnown, "large": c.Large} {
		if len(list) > 0 {
			out[key] = toAny(slices.Sorted(slices.Values(list)))
		}
	}
	return out
}

func toAny(list []string) []any {
	out := make([]any, len(list))
	for i, s := range list {
		out[i] = s
	}
	return out
}

// MetalLBAnnouncement is how MetalLB gives and announces an admitted GuestIngress's IP: the
// admitting policy's metalLB section, and the GuestIngress's admitted communities.
type MetalLBAnnouncement struct {
	Policy      guestnetv1.MetalLBPolicy
	Communities guestnetv1.BGPCommunities
}

// MetalLBNamespace is the namespace of the MetalLB objects of a (metallb-system by default).
func (a MetalLBAnnouncement) MetalLBNamespace() string {
	if a.Policy.Namespace != "" {
		return a.Policy.Namespace
	}
	return "metallb-system"
}

// MetalLBPool is the IPAddressPool guestnet applies for gi: its addresses are gi's (the fixed
// IPs, or its cidrs); it hands out nothing on its own (autoAssign false: only a Service that
// names it with metallb.io/address-pool or asks for one of its IPs gets one), and its
// serviceAllocation admits only gi's host Service, by namespace and guestnet's marks. MetalLB
// v0.16.1 checks serviceAllocation on both paths (Allocator.Assign, isPoolCompatibleWithService).
func MetalLBPool(gi *guestnetv1.GuestIngress, a MetalLBAnnouncement) *unstructured.Unstructured {
	m := marksOf(hostnames.Pool(gi), gi)
	var addresses []any
	for _, p := range PoolPrefixes(gi) {
		addresses = append(addresses, p.String())
	}
	u := marked(MetalLBPoolGVK, m)
	u.SetNamespace(a.MetalLBNamespace())
	u.Object["spec"] = map[string]any{
		"addresses":  addresses,
		"autoAssign": false,
		"serviceAllocation": map[string]any{
			"namespaces":       []any{gi.Namespace},
			"serviceSelectors": []any{map[string]any{"matchLabels": stringMap(ownership.SelectGuestIngress(gi))}},
		},
	}
	return u
}

// MetalLBL2Advertisement is the L2Advertisement guestnet applies for gi's pool alone, from
// the interfaces and nodes the policy names; nil when the policy names no L2 advertisement.
func MetalLBL2Advertisement(gi *guestnetv1.GuestIngress, a MetalLBAnnouncement) (*unstructured.Unstructured, error) {
	l2 := a.Policy.L2Advertisement
	if l2 == nil {
		return nil, nil
	}
	spec := map[string]any{"ipAddressPools": []any{hostnames.Pool(gi)}}
	if len(l2.Interfaces) > 0 {
		spec["interfaces"] = toAny(l2.Interfaces)
	}
	if err := setSelectors(spec, "nodeSelectors", l2.NodeSelectors); err != nil {
		return nil, err
	}
	u := marked(MetalLBL2AdvertisementGVK, marksOf(hostnames.Pool(gi), gi))
	u.SetNamespace(a.MetalLBNamespace())
	u.Object["spec"] = spec
	return u, nil
}

// MetalLBBGPAdvertisement is the BGPAdvertisement guestnet applies for gi's pool alone: each
// address as a /32 (/128), to the peers and from the nodes the policy names, with gi's
// admitted communities in MetalLB's notation; nil when the policy names no BGP advertisement.
func MetalLBBGPAdvertisement(gi *guestnetv1.GuestIngress, a MetalLBAnnouncement) (*unstructured.Unstructured, error) {
	bgp := a.Policy.BGPAdvertisement
	if bgp == nil {
		return nil, nil
	}
	spec := map[string]any{
		"ipAddressPools":      []any{hostnames.Pool(gi)},
		"aggregationLength":   int64(32),
		"aggregationLengthV6": int64(128),
	}
	if len(bgp.Peers) > 0 {
		spec["peers"] = toAny(bgp.Peers)
	}
	if err := setSelectors(spec, "nodeSelectors", bgp.NodeSelectors); err != nil {
		return nil, err
	}
	if c := MetalLBCommunities(a.Communities); len(c) > 0 {
		spec["communities"] = toAny(c)
	}
	u := marked(MetalLBBGPAdvertisementGVK, marksOf(hostnames.Pool(gi), gi))
	u.SetNamespace(a.MetalLBNamespace())
	u.Object["spec"] = spec
	return u, nil
}

func setSelectors(spec map[string]any, field string, selectors []metav1.LabelSelector) error {
	if len(selectors) == 0 {
		return nil
	}
	out := make([]any, len(selectors))
	for i := range selectors {
		sel, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&selectors[i])
		if err != nil {
			return fmt.Errorf("converting %s[%d]: %w", field, i, err)
		}
		out[i] = sel
	}
	spec[field] = out
	return nil
}

func stringMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// MetalLBCommunities writes communities as MetalLB v0.16.1 parses them
// (internal/bgp/community): standard and well-known ones as "<high>:<low>", large ones as
// "large:<a>:<b>:<c>". Values that do not parse are left out (the policy refused them).
func MetalLBCommunities(c guestnetv1.BGPCommunities) []string {
	var out []string
	for _, s := range append(slices.Clone(c.Standard), c.WellKnown...) {
		if v, ok := StandardCommunityValue(s); ok {
			out = append(out, fmt.Sprintf("%d:%d", v>>16, v&0xffff))
		}
	}
	for _, s := range c.Large {
		if v, ok := LargeCommunityValue(s); ok {
			out = append(out, "large:"+v)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// wellKnownCommunities are the well-known communities by the names Cilium's
// CiliumBGPAdvertisement accepts, with their values (RFC 1997 and IANA's registry).
var wellKnownCommunities = map[string]uint32{
	"internet":                   0x00000000,
	"planned-shut":               0xffff0000,
	"accept-own":                 0xffff0001,
	"route-filter-translated-v4": 0xffff0002,
	"route-filter-v4":            0xffff0003,
	"route-filter-translated-v6": 0xffff0004,
	"route-filter-v6":            0xffff0005,
	"llgr-stale":                 0xffff0006,
	"no-llgr":                    0xffff0007,
	"blackhole":                  0xffff029a,
	"no-export":                  0xffffff01,
	"no-advertise":               0xffffff02,
	"no-export-subconfed":        0xffffff03,
	"no-peer":                    0xffffff04,
}

// StandardCommunityValue is the 32-bit value of a standard community written as a decimal
// number, as "<high>:<low>", or as a well-known name; ok is false when it is none of them.
func StandardCommunityValue(s string) (uint32, bool) {
	if v, ok := wellKnownCommunities[s]; ok {
		return v, true
	}
	if high, low, found := strings.Cut(s, ":"); found {
		h, err1 := strconv.ParseUint(high, 10, 16)
		l, err2 := strconv.ParseUint(low, 10, 16)
		if err1 != nil || err2 != nil {
			return 0, false
		}
		return uint32(h<<16 | l), true
	}
	v, err := strconv.ParseUint(s, 10, 32)
	return uint32(v), err == nil
}

// LargeCommunityValue is a large community in its canonical "<a>:<b>:<c>" form (no leading
// zeros); ok is false when it is not three 32-bit decimal numbers.
func LargeCommunityValue(s string) (string, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return "", false
	}
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return "", false
		}
		parts[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(parts, ":"), true
}

// AnnouncerObjects are the host objects of the BGP and MetalLB announcers of one
// GuestIngress, by kind: in a plan what is applied (nil: guestnet's is deleted), in what was
// observed what exists. (The Cilium pool and L2 policy have their own fields.)
type AnnouncerObjects struct {
	CiliumBGPAdvertisement  *unstructured.Unstructured
	MetalLBPool             *unstructured.Unstructured
	MetalLBL2Advertisement  *unstructured.Unstructured
	MetalLBBGPAdvertisement *unstructured.Unstructured
}

// Slots are the four kinds' fields of a, in the order they are applied (a MetalLB pool before
// what advertises it): one order for everything that goes through them kind by kind.
func (a *AnnouncerObjects) Slots() []**unstructured.Unstructured {
	return []**unstructured.Unstructured{&a.MetalLBPool, &a.MetalLBL2Advertisement, &a.MetalLBBGPAdvertisement, &a.CiliumBGPAdvertisement}
}

// List is a's objects in the order of Slots (nil for a kind it has none of).
func (a AnnouncerObjects) List() []*unstructured.Unstructured {
	slots := a.Slots()
	out := make([]*unstructured.Unstructured, len(slots))
	for i, slot := range slots {
		out[i] = *slot
	}
	return out
}

// AnnouncerKinds are the announcers' kinds, each with an empty object to read into.
func AnnouncerKinds() AnnouncerObjects {
	return AnnouncerObjects{
		CiliumBGPAdvertisement:  NewBGPAdvertisement(),
		MetalLBPool:             NewMetalLBPool(),
		MetalLBL2Advertisement:  NewMetalLBL2Advertisement(),
		MetalLBBGPAdvertisement: NewMetalLBBGPAdvertisement(),
	}
}

// BuildAnnouncers are the announcer objects gi needs as admitted by a: a
// CiliumBGPAdvertisement for Cilium's BGP class, a MetalLB pool and the advertisements the
// policy names for MetalLB's, none for the others.
func BuildAnnouncers(gi *guestnetv1.GuestIngress, a Admission) (AnnouncerObjects, error) {
	var out AnnouncerObjects
	switch a.Announcer {
	case AnnouncerCiliumBGP:
		out.CiliumBGPAdvertisement = CiliumBGPAdvertisement(gi, a.BGP)
	case AnnouncerMetalLB:
		out.MetalLBPool = MetalLBPool(gi, a.MetalLB)
		var err error
		if out.MetalLBL2Advertisement, err = MetalLBL2Advertisement(gi, a.MetalLB); err != nil {
			return out, err
		}
		if out.MetalLBBGPAdvertisement, err = MetalLBBGPAdvertisement(gi, a.MetalLB); err != nil {
			return out, err
		}
	}
	return out, nil
}

// MetalLBPoolRanges reads the addresses of a MetalLB IPAddressPool (CIDRs, or "<from>-<to>"
// ranges) as address ranges; entries that do not parse are skipped (MetalLB refuses them).
func MetalLBPoolRanges(pool *unstructured.Unstructured) []AddrRange {
	addresses, _, _ := unstructured.NestedStringSlice(pool.Object, "spec", "addresses")
	var out []AddrRange
	for _, a := range addresses {
		if p, err := netip.ParsePrefix(strings.TrimSpace(a)); err == nil {
			out = append(out, PrefixRange(p))
			continue
		}
		from, to, ok := strings.Cut(a, "-")
		if !ok {
			continue
		}
		f, err1 := netip.ParseAddr(strings.TrimSpace(from))
		t, err2 := netip.ParseAddr(strings.TrimSpace(to))
		if err1 == nil && err2 == nil && f.BitLen() == t.BitLen() && !t.Less(f) {
			out = append(out, AddrRange{From: f, To: t})
		}
	}
	return out
}
