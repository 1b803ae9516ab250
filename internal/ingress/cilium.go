package ingress

import (
	"fmt"
	"net/netip"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
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

// PoolPrefixes are the ranges of the pool guestnet creates for gi: the cidrs, or the lone ip
// as a /32 (/128). None with poolRef. Entries that do not parse (the CRD validates them) are
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
	if ip, err := netip.ParseAddr(lb.IP); err == nil {
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out
}

// ServiceSelector pins a pool or policy to the one host Service of gi.
func ServiceSelector(gi *guestnetv1.GuestIngress) map[string]any {
	return map[string]any{"matchLabels": map[string]any{
		ServiceNamespaceKey: gi.Namespace,
		ServiceNameKey:      hostnames.HostService(gi),
	}}
}

// Pool is the CiliumLoadBalancerIPPool guestnet applies for gi, nil with poolRef. Its
// serviceSelector matches only gi's host Service, so no other Service takes its IPs.
func Pool(gi *guestnetv1.GuestIngress) *unstructured.Unstructured {
	if !OwnsPool(gi) {
		return nil
	}
	var blocks []any
	for _, p := range PoolPrefixes(gi) {
		blocks = append(blocks, map[string]any{"cidr": p.String()})
	}
	u := hostObject(PoolGVK, hostnames.Pool(gi), gi)
	u.Object["spec"] = map[string]any{
		"blocks":          blocks,
		"serviceSelector": ServiceSelector(gi),
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
// IPs from the nodes and interfaces of the admitted announcement a.
func L2Policy(gi *guestnetv1.GuestIngress, a Announcement) (*unstructured.Unstructured, error) {
	if !AnnouncesL2(gi) {
		return nil, nil
	}
	spec := map[string]any{
		"serviceSelector": ServiceSelector(gi),
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
	u := hostObject(L2PolicyGVK, hostnames.L2Policy(gi), gi)
	u.Object["spec"] = spec
	return u, nil
}

func hostObject(gvk schema.GroupVersionKind, name string, gi *guestnetv1.GuestIngress) *unstructured.Unstructured {
	u := newObject(gvk)
	u.SetName(name)
	u.SetLabels(hostnames.Labels(gi))
	u.SetAnnotations(hostnames.Annotations(gi))
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
