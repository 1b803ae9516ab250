package ingress

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// Cilium's kinds guestnet writes (cluster-scoped).
var (
	PoolGVK     = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumLoadBalancerIPPool"}
	L2PolicyGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2alpha1", Kind: "CiliumL2AnnouncementPolicy"}
)

// Cilium's names on Services and pools.
const (
	// LBIPAMIPsAnnotation requests fixed IPs from Cilium LB-IPAM (spec.loadBalancerIP is legacy).
	LBIPAMIPsAnnotation = "lbipam.cilium.io/ips"
	// ServiceNamespaceKey and ServiceNameKey are the pseudo-labels Cilium adds to a Service's
	// labels when it matches pool and policy serviceSelectors: a selector can pin one Service.
	ServiceNamespaceKey = "io.kubernetes.service.namespace"
	ServiceNameKey      = "io.kubernetes.service.name"
	// IPAMRequestSatisfiedCondition is the condition Cilium LB-IPAM sets on a Service.
	IPAMRequestSatisfiedCondition = "cilium.io/IPAMRequestSatisfied"
	// PoolConflictCondition is the condition Cilium sets on a pool that overlaps another
	// pool; such a pool allocates nothing.
	PoolConflictCondition = "cilium.io/PoolConflict"
)

// NewPool returns an empty CiliumLoadBalancerIPPool to read into.
func NewPool() *unstructured.Unstructured { return newObject(PoolGVK) }

// NewL2Policy returns an empty CiliumL2AnnouncementPolicy to read into.
func NewL2Policy() *unstructured.Unstructured { return newObject(L2PolicyGVK) }

func newObject(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

// OwnsPool reports whether guestnet creates the pool of gi itself (from spec.loadBalancer.ip
// or .cidrs); with poolRef the IP comes from a pool guestnet does not own.
func OwnsPool(gi *guestnetv1.GuestIngress) bool { return gi.Spec.LoadBalancer.PoolRef == nil }

// AnnouncesL2 reports whether gi needs a CiliumL2AnnouncementPolicy: only Cilium's L2
// announcer answers ARP/NDP for the class it owns.
func AnnouncesL2(gi *guestnetv1.GuestIngress) bool {
	return LoadBalancerClass(gi) == guestnetv1.DefaultLoadBalancerClass
}

// LoadBalancerClass is the host Service's loadBalancerClass (spec, or the default).
func LoadBalancerClass(gi *guestnetv1.GuestIngress) string {
	if gi.Spec.LoadBalancer.Class != "" {
		return gi.Spec.LoadBalancer.Class
	}
	return guestnetv1.DefaultLoadBalancerClass
}

// PoolPrefixes are the ranges of the pool guestnet creates for gi (Cilium's or MetalLB's): the
// cidrs, or each fixed IP as a /32 (/128). None with poolRef. Entries that do not parse (the CRD validates them) are
// skipped.
func PoolPrefixes(gi *guestnetv1.GuestIngress) []netip.Prefix {
	lb := gi.Spec.LoadBalancer
	if lb.PoolRef != nil {
		return nil
	}
	var out []netip.Prefix
	if len(lb.CIDRs) > 0 {
		for _, c := range lb.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			}
		}
		return out
	}
	for _, ip := range RequestedAddrs(gi) {
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out
}

// ServiceSelector pins a pool or policy to the one host Service of gi.
func ServiceSelector(gi *guestnetv1.GuestIngress) map[string]any {
	return ServiceSelectorOf(gi.Namespace, hostnames.HostService(gi))
}

// ServiceSelectorOf pins a pool or policy to the one Service namespace/name, by the
// pseudo-labels Cilium matches selectors against.
func ServiceSelectorOf(namespace, name string) map[string]any {
	return map[string]any{"matchLabels": map[string]any{
		ServiceNamespaceKey: namespace,
		ServiceNameKey:      name,
	}}
}

// Marks are the name, labels and annotations of a host object guestnet makes.
type Marks struct {
	Name        string
	Labels      map[string]string
	Annotations map[string]string
}

// Pool is the CiliumLoadBalancerIPPool guestnet applies for gi, nil with poolRef. Its
// serviceSelector matches only gi's host Service, so no other Service takes its IPs.
func Pool(gi *guestnetv1.GuestIngress) *unstructured.Unstructured {
	if !OwnsPool(gi) {
		return nil
	}
	return PoolFor(marksOf(hostnames.Pool(gi), gi), PoolPrefixes(gi), ServiceSelector(gi))
}

// PoolFor is a CiliumLoadBalancerIPPool holding prefixes for the Services of selector
// (ServiceSelectorOf: one Service), marked with m. Every pool guestnet creates is built here.
func PoolFor(m Marks, prefixes []netip.Prefix, selector map[string]any) *unstructured.Unstructured {
	var blocks []any
	for _, p := range prefixes {
		blocks = append(blocks, map[string]any{"cidr": p.String()})
	}
	u := marked(PoolGVK, m)
	u.Object["spec"] = map[string]any{
		"blocks":          blocks,
		"serviceSelector": selector,
	}
	return u
}

// Announcement is where an admitted GuestIngress's IP is announced from: the host interface
// regular expressions and the host node selector, as the admitting GuestIngressPolicy
// bounds them (internal/policy decides it; the builders only apply it).
type Announcement struct {
	// Interfaces are regular expressions of host interface names; never empty for an
	// admitted GuestIngress of the L2 announcer class.
	Interfaces []string
	// NodeSelector selects the announcing host nodes; nil selects every node.
	NodeSelector *metav1.LabelSelector
}

// L2Policy is the CiliumL2AnnouncementPolicy guestnet applies for gi, nil when the host
// Service's class is not Cilium's L2 announcer. It announces the Service's load-balancer
// IPs (never external IPs) from the nodes and interfaces of the admitted announcement a,
// and is an error when a names no interface.
func L2Policy(gi *guestnetv1.GuestIngress, a Announcement) (*unstructured.Unstructured, error) {
	if !AnnouncesL2(gi) {
		return nil, nil
	}
	return L2PolicyFor(marksOf(hostnames.L2Policy(gi), gi), a, ServiceSelector(gi), "GuestIngress "+gi.Namespace+"/"+gi.Name)
}

// L2PolicyFor is a CiliumL2AnnouncementPolicy announcing the load-balancer IPs of the
// Services of selector from the nodes and interfaces of a, marked with m; an error when a
// names no interface (what names the claim in it). Every L2 policy guestnet creates is built
// here.
func L2PolicyFor(m Marks, a Announcement, selector map[string]any, what string) (*unstructured.Unstructured, error) {
	if len(a.Interfaces) == 0 {
		// Cilium reads no interfaces as "every interface": never built, whatever the caller.
		return nil, fmt.Errorf("no host interface is admitted to announce %s: refusing an L2 announcement policy on every interface", what)
	}
	spec := map[string]any{
		"serviceSelector": selector,
		"loadBalancerIPs": true,
	}
	if len(a.Interfaces) > 0 {
		interfaces := make([]any, len(a.Interfaces))
		for i, s := range a.Interfaces {
			interfaces[i] = s
		}
		spec["interfaces"] = interfaces
	}
	if a.NodeSelector != nil {
		sel, err := runtime.DefaultUnstructuredConverter.ToUnstructured(a.NodeSelector)
		if err != nil {
			return nil, fmt.Errorf("converting the announcement's nodeSelector: %w", err)
		}
		if len(sel) > 0 {
			spec["nodeSelector"] = sel
		}
	}
	u := marked(L2PolicyGVK, m)
	u.Object["spec"] = spec
	return u, nil
}

func marksOf(name string, gi *guestnetv1.GuestIngress) Marks {
	return Marks{Name: name, Labels: ownership.Labels(gi), Annotations: ownership.Annotations(gi)}
}

func marked(gvk schema.GroupVersionKind, m Marks) *unstructured.Unstructured {
	u := newObject(gvk)
	u.SetName(m.Name)
	u.SetLabels(m.Labels)
	u.SetAnnotations(m.Annotations)
	return u
}

// ObjectCondition reads a metav1.Condition from the status.conditions of an unstructured
// object (a pool); nil when it is not there.
func ObjectCondition(u *unstructured.Unstructured, conditionType string) *metav1.Condition {
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, item := range list {
		m, ok := item.(map[string]any)
		if !ok || m["type"] != conditionType {
			continue
		}
		c := &metav1.Condition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, c); err != nil {
			return nil
		}
		return c
	}
	return nil
}

// SelectorMatchesService reports whether a pool's or policy's serviceSelector (as stored in
// its spec) selects a Service with these labels, namespace and name, the way Cilium matches:
// on the Service's labels plus the io.kubernetes.service.{namespace,name} pseudo-labels. An
// absent selector selects every Service.
func SelectorMatchesService(obj *unstructured.Unstructured, svcLabels map[string]string, namespace, name string) (bool, error) {
	raw, found, err := unstructured.NestedMap(obj.Object, "spec", "serviceSelector")
	if err != nil {
		return false, err
	}
	if !found {
		return true, nil
	}
	ls := &metav1.LabelSelector{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, ls); err != nil {
		return false, err
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return false, err
	}
	set := labels.Set{}
	for k, v := range svcLabels {
		set[k] = v
	}
	set[ServiceNamespaceKey] = namespace
	set[ServiceNameKey] = name
	return sel.Matches(set), nil
}

// PrefixesOverlap reports whether any prefix of a overlaps any prefix of b.
func PrefixesOverlap(a, b []netip.Prefix) bool {
	return slices.ContainsFunc(a, func(p netip.Prefix) bool {
		return slices.ContainsFunc(b, p.Overlaps)
	})
}

// PoolNamespaces reads which namespaces a pool's serviceSelector pins the Services it
// selects to: pinned is true when the selector requires io.kubernetes.service.namespace to be
// one of namespaces (matchLabels, or matchExpressions with In; several requirements
// intersect). Cilium sets that pseudo-label from the Service's real namespace, over any label
// of that name, so no tenant can match such a pool from another namespace. Any other
// selector (none, labels only, a name alone, NotIn, Exists) selects by what a tenant can set
// or choose, and is not pinned.
func PoolNamespaces(pool *unstructured.Unstructured) (namespaces []string, pinned bool, err error) {
	raw, found, err := unstructured.NestedMap(pool.Object, "spec", "serviceSelector")
	if err != nil || !found {
		return nil, false, err
	}
	ls := &metav1.LabelSelector{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, ls); err != nil {
		return nil, false, err
	}
	var allowed []string
	restrict := func(values []string) {
		sorted := slices.Sorted(slices.Values(values))
		sorted = slices.Compact(sorted)
		if !pinned {
			allowed, pinned = sorted, true
			return
		}
		allowed = slices.DeleteFunc(allowed, func(ns string) bool { return !slices.Contains(sorted, ns) })
	}
	if ns, ok := ls.MatchLabels[ServiceNamespaceKey]; ok {
		restrict([]string{ns})
	}
	for _, r := range ls.MatchExpressions {
		if r.Key == ServiceNamespaceKey && r.Operator == metav1.LabelSelectorOpIn {
			restrict(r.Values)
		}
	}
	if !pinned {
		return nil, false, nil
	}
	return allowed, true, nil
}

// AddrRange is an inclusive range of addresses, one block of a Cilium pool.
type AddrRange struct{ From, To netip.Addr }

// Contains reports whether ip lies in r.
func (r AddrRange) Contains(ip netip.Addr) bool {
	return ip.BitLen() == r.From.BitLen() && r.From.Compare(ip) <= 0 && ip.Compare(r.To) <= 0
}

// Overlaps reports whether r and the prefix p share an address.
func (r AddrRange) Overlaps(p netip.Prefix) bool {
	first := p.Masked().Addr()
	if first.BitLen() != r.From.BitLen() {
		return false
	}
	return r.From.Compare(lastAddr(p)) <= 0 && first.Compare(r.To) <= 0
}

// PrefixRange is the range of addresses of p.
func PrefixRange(p netip.Prefix) AddrRange {
	return AddrRange{From: p.Masked().Addr(), To: lastAddr(p)}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// PoolRanges reads the blocks of a Cilium pool (cidr, or start with an optional stop) as
// address ranges; blocks that do not parse are skipped (Cilium refuses them too).
func PoolRanges(pool *unstructured.Unstructured) []AddrRange {
	blocks, _, _ := unstructured.NestedSlice(pool.Object, "spec", "blocks")
	var out []AddrRange
	for _, b := range blocks {
		m, ok := b.(map[string]any)
		if !ok {
			continue
		}
		if c, ok := m["cidr"].(string); ok && c != "" {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, PrefixRange(p))
			}
			continue
		}
		start, err := netip.ParseAddr(fmt.Sprint(m["start"]))
		if err != nil {
			continue
		}
		stop := start
		if s, ok := m["stop"].(string); ok && s != "" {
			if stop, err = netip.ParseAddr(s); err != nil || stop.BitLen() != start.BitLen() || stop.Less(start) {
				continue
			}
		}
		out = append(out, AddrRange{From: start, To: stop})
	}
	return out
}

// RangesContain reports whether ip lies in one of ranges.
func RangesContain(ranges []AddrRange, ip netip.Addr) bool {
	return slices.ContainsFunc(ranges, func(r AddrRange) bool { return r.Contains(ip) })
}

// RangesOverlap reports whether p shares an address with one of ranges.
func RangesOverlap(ranges []AddrRange, p netip.Prefix) bool {
	return slices.ContainsFunc(ranges, func(r AddrRange) bool { return r.Overlaps(p) })
}

// PoolSelectorHint explains why a poolRef pool gives the host Service svc no IP, when the
// pool's serviceSelector does not select it ("" when it does, or pool is nil). The advice is
// the safe one: select by namespace (and name), never by a label of the Service, whose value
// (the cluster name, a GuestIngress's labels) a tenant chooses.
func PoolSelectorHint(pool *unstructured.Unstructured, svc *corev1.Service) string {
	if pool == nil || svc == nil {
		return ""
	}
	if ok, err := SelectorMatchesService(pool, svc.Labels, svc.Namespace, svc.Name); err != nil || ok {
		return ""
	}
	return fmt.Sprintf("the serviceSelector of CiliumLoadBalancerIPPool %s does not select Service %s/%s; the host admin selects it by "+
		"namespace (matchLabels %s: %s), or by namespace and name (and %s: %s), never by a label of the Service such as %s, "+
		"whose value a tenant chooses", pool.GetName(), svc.Namespace, svc.Name, ServiceNamespaceKey, svc.Namespace,
		ServiceNameKey, svc.Name, ownership.ClusterNameLabel)
}
