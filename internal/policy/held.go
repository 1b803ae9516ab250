package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// Held within admitted (docs/decisions/0008-held-within-admitted.md). What guestnet's host
// objects of a GuestIngress hold on the host is compared, on every reconcile, with what the
// GuestIngressPolicy admits now, whatever else is true of the GuestIngress (paused, an invalid
// spec, a refused change, an unreachable guest, being deleted): what falls outside is taken
// off. Admit decides whether the GuestIngress's spec may get host objects; HeldBeyondAdmitted
// decides whether the objects it has may stay as they are. The bounds are the admitting
// policy's (its addresses, classes, announcement, keys, traffic policies), not the spec's: a
// paused GuestIngress whose spec changed keeps what the policy still allows, and gets nothing
// new.

// Held is what guestnet's host objects of one GuestIngress are on the host now: its host
// Service, pool and L2 announcement policy (nil: none), as read. HeldBeyondAdmitted never
// changes them (they may be a cache's own objects).
type Held struct {
	HostService *corev1.Service
	Pool        *unstructured.Unstructured
	L2Policy    *unstructured.Unstructured
	// Announcers are the BGP and MetalLB objects (held_announcers.go).
	Announcers ingress.AnnouncerObjects
}

// Cut is what to do with one held object: nothing when Outside is empty; else delete it
// (Delete), or write Narrowed, a copy of it with what is outside taken off.
type Cut[T any] struct {
	// Outside says what of the object is not admitted now, one phrase each
	// ("interface ^eth1$ (it allows ^eth0$)"), in a stable order.
	Outside []string
	// Delete: nothing of the object may stay, or what may not cannot be taken off it.
	Delete bool
	// Narrowed is set when Outside is not empty and Delete is false.
	Narrowed T
}

// Within reports whether everything the object holds is admitted.
func (c Cut[T]) Within() bool { return len(c.Outside) == 0 }

// Excess is what to take off each held object.
type Excess struct {
	HostService Cut[*corev1.Service]
	Pool        Cut[*unstructured.Unstructured]
	L2Policy    Cut[*unstructured.Unstructured]
	// Announcers are the cuts of Held.Announcers, in the order of AnnouncerObjects.Slots.
	Announcers []Cut[*unstructured.Unstructured]
}

// None reports whether everything held is admitted.
func (e Excess) None() bool {
	return e.HostService.Within() && e.Pool.Within() && e.L2Policy.Within() &&
		!slices.ContainsFunc(e.Announcers, func(c Cut[*unstructured.Unstructured]) bool { return !c.Within() })
}

// HeldBeyondAdmitted compares what in.GuestIngress's host objects hold (held) with what the
// policy that admits it now allows (d, Admit's decision for in), and says what to take off:
//   - not admitted (no policy, narrowed, deleted, the namespace relabelled, over the cap):
//     every object is deleted;
//   - the pool: blocks outside the policy's addresses are dropped (no block left: deleted),
//     and its serviceSelector must select the GuestIngress's own host Service only;
//   - the L2 announcement policy: announcing needs the policy's l2Announcement and Cilium's
//     L2 announcer class; interfaces not the policy's are dropped (none left, or none listed,
//     which Cilium reads as every interface: deleted), the node selector must hold the
//     policy's (else it is ANDed in), the serviceSelector is pinned, external IPs are never
//     announced;
//   - the host Service: a type other than LoadBalancer (or ClusterIP, the step between two
//     classes), a class the policy does not allow, a nodePort, or a load-balancer IP outside
//     the policy's addresses (and the blocks of its admitted shared pool) in its status delete
//     it; externalTrafficPolicy outside the policy's becomes Cluster; IP requests
//     (lbipam.cilium.io/ips, spec.loadBalancerIP) outside the addresses, externalIPs,
//     annotation and label keys the policy does not allow or guestnet never passes are
//     removed, whoever wrote them; guestnet's own labels get their values back.
func HeldBeyondAdmitted(in Input, d Decision, held Held) Excess {
	var p *guestnetv1.GuestIngressPolicy
	if d.Admitted {
		if i := slices.IndexFunc(in.Policies, func(p guestnetv1.GuestIngressPolicy) bool { return p.Name == d.Policy }); i >= 0 {
			p = &in.Policies[i]
		}
	}
	if p == nil {
		why := fmt.Sprintf("everything: the GuestIngress is not admitted (%s)", cmpOr(d.Reason, guestnetv1.NotAllowedReason))
		if d.Admitted {
			why = fmt.Sprintf("everything: GuestIngressPolicy %s, said to admit it, is not there", d.Policy)
		}
		e := Excess{
			HostService: deleteIf[*corev1.Service](held.HostService != nil, why),
			Pool:        deleteIf[*unstructured.Unstructured](held.Pool != nil, why),
			L2Policy:    deleteIf[*unstructured.Unstructured](held.L2Policy != nil, why),
		}
		for _, obj := range held.Announcers.List() {
			e.Announcers = append(e.Announcers, deleteIf[*unstructured.Unstructured](obj != nil, why))
		}
		return e
	}
	b := newBounds(in, p)
	var e Excess
	for _, obj := range held.Announcers.List() {
		e.Announcers = append(e.Announcers, b.announcerCut(obj))
	}
	if held.Pool != nil {
		e.Pool = b.pool(held.Pool)
	}
	if held.L2Policy != nil {
		e.L2Policy = b.l2Policy(held.L2Policy)
	}
	if held.HostService != nil {
		e.HostService = b.hostService(held.HostService)
	}
	return e
}

func deleteIf[T any](held bool, why string) Cut[T] {
	if !held {
		return Cut[T]{}
	}
	return Cut[T]{Outside: []string{why}, Delete: true}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// bounds are what the admitting policy allows a GuestIngress to hold.
type bounds struct {
	gi     *guestnetv1.GuestIngress
	policy *guestnetv1.GuestIngressPolicy
	// addresses are the policy's ranges; shared the blocks of the admitted shared pool
	// (spec.loadBalancer.poolRef), which a host Service may request an IP from.
	addresses []netip.Prefix
	shared    []ingress.AddrRange
	// reserved are the host's own addresses: never held, whatever the policy's addresses.
	reserved hostaddrs.Set
}

func newBounds(in Input, p *guestnetv1.GuestIngressPolicy) bounds {
	b := bounds{gi: in.GuestIngress, policy: p, addresses: Addresses(p), reserved: reserved(in)}
	if ref := in.GuestIngress.Spec.LoadBalancer.PoolRef; ref != nil && slices.Contains(p.Spec.SharedPools, ref.Name) {
		if pool := in.pools().Get(ref.Name); pool != nil && UnsafeSharedPool(pool) == "" {
			b.shared = ingress.PoolRanges(pool)
		}
	}
	return b
}

// addressList names the policy's addresses for messages.
func (b bounds) addressList() string {
	if len(b.policy.Spec.Addresses) == 0 {
		return "none"
	}
	return strings.Join(b.policy.Spec.Addresses, ", ")
}

// rangeWithin reports whether every address of r lies in one of the policy's addresses and
// none is the host's own.
func (b bounds) rangeWithin(r ingress.AddrRange) bool {
	return slices.ContainsFunc(b.addresses, func(a netip.Prefix) bool { return a.Contains(r.From) && a.Contains(r.To) }) &&
		len(b.reserved.InRange(r)) == 0
}

// ipWithin reports whether a host Service may request or have ip: it lies in the policy's
// addresses or in the admitted shared pool, and is not the host's own.
func (b bounds) ipWithin(ip netip.Addr) bool {
	return (slices.ContainsFunc(b.addresses, func(a netip.Prefix) bool { return a.Contains(ip) }) || ingress.RangesContain(b.shared, ip)) &&
		len(b.reserved.Has(ip)) == 0
}

// pool: every block in the policy's addresses, pinned to the host Service.
func (b bounds) pool(live *unstructured.Unstructured) Cut[*unstructured.Unstructured] {
	var c Cut[*unstructured.Unstructured]
	blocks, _, _ := unstructured.NestedSlice(live.Object, "spec", "blocks")
	var kept []any
	for _, block := range blocks {
		r, text, ok := blockRange(block)
		if ok && b.rangeWithin(r) {
			kept = append(kept, block)
			continue
		}
		c.Outside = append(c.Outside, fmt.Sprintf("block %s of CiliumLoadBalancerIPPool %s (%s)", text, live.GetName(), b.why(r)))
	}
	pinned := b.pinned(live)
	if !pinned {
		c.Outside = append(c.Outside, fmt.Sprintf("the serviceSelector of CiliumLoadBalancerIPPool %s, which does not select Service %s/%s alone",
			live.GetName(), b.gi.Namespace, hostnames.HostService(b.gi)))
	}
	if c.Within() {
		return c
	}
	if len(kept) == 0 {
		c.Delete = true
		return c
	}
	n := live.DeepCopy()
	_ = unstructured.SetNestedSlice(n.Object, kept, "spec", "blocks")
	_ = unstructured.SetNestedMap(n.Object, ingress.ServiceSelector(b.gi), "spec", "serviceSelector")
	c.Narrowed = n
	return c
}

// blockRange reads one block of a pool (cidr, or start with an optional stop) as a range,
// with its text for messages; ok is false for a block that does not parse.
func blockRange(block any) (ingress.AddrRange, string, bool) {
	m, _ := block.(map[string]any)
	pool := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"blocks": []any{block}}}}
	ranges := ingress.PoolRanges(pool)
	text := fmt.Sprint(m["cidr"])
	if _, ok := m["cidr"]; !ok {
		text = fmt.Sprintf("%v-%v", m["start"], m["stop"])
	}
	if len(ranges) != 1 {
		return ingress.AddrRange{}, text, false
	}
	return ranges[0], text, true
}

// pinned reports whether a pool's or L2 policy's serviceSelector selects the GuestIngress's
// host Service alone: exactly its namespace and name (Cilium's pseudo-labels).
func (b bounds) pinned(live *unstructured.Unstructured) bool {
	raw, found, err := unstructured.NestedMap(live.Object, "spec", "serviceSelector")
	if err != nil || !found {
		return false
	}
	sel := &metav1.LabelSelector{}
	if runtime.DefaultUnstructuredConverter.FromUnstructured(raw, sel) != nil {
		return false
	}
	want := map[string]string{ingress.ServiceNamespaceKey: b.gi.Namespace, ingress.ServiceNameKey: hostnames.HostService(b.gi)}
	return len(sel.MatchExpressions) == 0 && maps.Equal(sel.MatchLabels, want)
}

// l2Policy: announcing at all is the policy's to allow; interfaces, nodes and what is
// announced within its l2Announcement.
func (b bounds) l2Policy(live *unstructured.Unstructured) Cut[*unstructured.Unstructured] {
	var c Cut[*unstructured.Unstructured]
	allowed := b.policy.Spec.L2Announcement
	if allowed == nil || !slices.Contains(Classes(b.policy), guestnetv1.DefaultLoadBalancerClass) {
		c.Outside, c.Delete = []string{fmt.Sprintf("CiliumL2AnnouncementPolicy %s: GuestIngressPolicy %s allows no announcement with %s",
			live.GetName(), b.policy.Name, guestnetv1.DefaultLoadBalancerClass)}, true
		return c
	}
	interfaces, _, _ := unstructured.NestedStringSlice(live.Object, "spec", "interfaces")
	var kept []string
	for _, i := range interfaces {
		if slices.Contains(allowed.Interfaces, i) {
			kept = append(kept, i)
			continue
		}
		c.Outside = append(c.Outside, fmt.Sprintf("announcing on interface %s (GuestIngressPolicy %s allows %s)", i, b.policy.Name, strings.Join(allowed.Interfaces, ", ")))
	}
	if len(interfaces) == 0 {
		c.Outside = append(c.Outside, fmt.Sprintf("announcing on every interface (GuestIngressPolicy %s allows %s)", b.policy.Name, strings.Join(allowed.Interfaces, ", ")))
	}
	var nodes *metav1.LabelSelector
	if raw, found, err := unstructured.NestedMap(live.Object, "spec", "nodeSelector"); err != nil {
		return Cut[*unstructured.Unstructured]{Outside: []string{"an unreadable nodeSelector of CiliumL2AnnouncementPolicy " + live.GetName()}, Delete: true}
	} else if found {
		nodes = &metav1.LabelSelector{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(raw, nodes) != nil {
			return Cut[*unstructured.Unstructured]{Outside: []string{"an unreadable nodeSelector of CiliumL2AnnouncementPolicy " + live.GetName()}, Delete: true}
		}
	}
	narrowNodes := !SelectorWithin(nodes, &allowed.NodeSelector)
	if narrowNodes {
		c.Outside = append(c.Outside, fmt.Sprintf("announcing from nodes outside the nodeSelector %s of GuestIngressPolicy %s",
			SelectorString(&allowed.NodeSelector), b.policy.Name))
	}
	if !b.pinned(live) {
		c.Outside = append(c.Outside, fmt.Sprintf("the serviceSelector of CiliumL2AnnouncementPolicy %s, which does not select Service %s/%s alone",
			live.GetName(), b.gi.Namespace, hostnames.HostService(b.gi)))
	}
	if external, _, _ := unstructured.NestedBool(live.Object, "spec", "externalIPs"); external {
		c.Outside = append(c.Outside, "announcing external IPs (guestnet announces load-balancer IPs only)")
	}
	if c.Within() {
		return c
	}
	if len(kept) == 0 {
		c.Delete = true
		return c
	}
	n := live.DeepCopy()
	_ = unstructured.SetNestedStringSlice(n.Object, kept, "spec", "interfaces")
	_ = unstructured.SetNestedMap(n.Object, ingress.ServiceSelector(b.gi), "spec", "serviceSelector")
	unstructured.RemoveNestedField(n.Object, "spec", "externalIPs")
	if narrowNodes {
		sel, err := runtime.DefaultUnstructuredConverter.ToUnstructured(SelectorAnd(&allowed.NodeSelector, nodes))
		if err != nil {
			return Cut[*unstructured.Unstructured]{Outside: c.Outside, Delete: true}
		}
		_ = unstructured.SetNestedMap(n.Object, sel, "spec", "nodeSelector")
	}
	c.Narrowed = n
	return c
}

// SelectorWithin reports whether the label selector held selects only what bound selects:
// it carries every requirement of bound (as SelectorAnd builds it; nil held selects
// everything). A selector that does not parse is not within anything.
func SelectorWithin(held, bound *metav1.LabelSelector) bool {
	boundSel, err := metav1.LabelSelectorAsSelector(bound)
	if err != nil {
		return false
	}
	want, _ := boundSel.Requirements()
	if len(want) == 0 {
		return true
	}
	if held == nil {
		return false
	}
	heldSel, err := metav1.LabelSelectorAsSelector(held)
	if err != nil {
		return false
	}
	have, _ := heldSel.Requirements()
	for _, w := range want {
		if !slices.ContainsFunc(have, w.Equal) {
			return false
		}
	}
	return true
}

// hostService: what the host Service requests, has and carries, within the policy.
func (b bounds) hostService(live *corev1.Service) Cut[*corev1.Service] {
	var c Cut[*corev1.Service]
	n := live.DeepCopy()
	outside := func(format string, args ...any) { c.Outside = append(c.Outside, fmt.Sprintf(format, args...)) }
	p := b.policy

	switch live.Spec.Type {
	case corev1.ServiceTypeLoadBalancer:
		if class := ptr.Deref(live.Spec.LoadBalancerClass, ""); !slices.Contains(Classes(p), class) {
			outside("loadBalancerClass %q (GuestIngressPolicy %s allows %s)", class, p.Name, strings.Join(Classes(p), ", "))
			c.Delete = true
		}
		etp := orDefault(live.Spec.ExternalTrafficPolicy, corev1.ServiceExternalTrafficPolicyCluster)
		if allowed := TrafficPolicies(p); !slices.Contains(allowed, etp) {
			outside("externalTrafficPolicy %s (GuestIngressPolicy %s does not allow it)", etp, p.Name)
			if slices.Contains(allowed, corev1.ServiceExternalTrafficPolicyCluster) {
				n.Spec.ExternalTrafficPolicy, n.Spec.HealthCheckNodePort = corev1.ServiceExternalTrafficPolicyCluster, 0
			} else {
				c.Delete = true
			}
		}
	case corev1.ServiceTypeClusterIP:
		// The step between two loadBalancerClasses (ingress.ReclassHostService).
	default:
		outside("type %s (guestnet's host Service is a LoadBalancer)", live.Spec.Type)
		c.Delete = true
	}
	for _, port := range live.Spec.Ports {
		if port.NodePort != 0 {
			outside("nodePort %d of port %s (guestnet opens none on the host nodes)", port.NodePort, port.Name)
			c.Delete = true // an allocated nodePort is only released by removing it, port by port
		}
	}
	for _, in := range live.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(in.IP); err == nil && !b.ipWithin(ip) {
			outside("load-balancer IP %s (%s)", in.IP, b.why(ingress.AddrRange{From: ip, To: ip}))
			c.Delete = true // Cilium holds it in status until the Service no longer gets it
		}
	}
	if len(live.Spec.ExternalIPs) > 0 {
		outside("externalIPs %s (guestnet sets none)", strings.Join(live.Spec.ExternalIPs, ", "))
		n.Spec.ExternalIPs = nil
	}
	if ip := live.Spec.LoadBalancerIP; ip != "" && !b.ipAllowed(ip) {
		outside("spec.loadBalancerIP %s (%s)", ip, b.whyText(ip))
		n.Spec.LoadBalancerIP = ""
	}

	for _, k := range slices.Sorted(maps.Keys(live.Annotations)) {
		switch {
		case k == ownership.WatchFilterAnnotation:
			// guestnet's mark of the instance that made it
		case k == ingress.LBIPAMIPsAnnotation:
			var kept []string
			for _, s := range strings.Split(live.Annotations[k], ",") {
				if s = strings.TrimSpace(s); b.ipAllowed(s) {
					kept = append(kept, s)
				} else if s != "" {
					outside("IP request %s (annotation %s; %s)", s, k, b.whyText(s))
				}
			}
			if value := strings.Join(kept, ","); value != live.Annotations[k] {
				n.Annotations[k] = value
				if len(kept) == 0 {
					delete(n.Annotations, k)
				}
			}
		case ingress.ForbiddenHostServiceKey(k):
			outside("annotation %s (guestnet never passes it to a host Service)", k)
			delete(n.Annotations, k)
		case !KeyAllowed(k, p.Spec.HostService.AllowedAnnotationKeys):
			outside("annotation %s (GuestIngressPolicy %s allows %s)", k, p.Name, keyList(p.Spec.HostService.AllowedAnnotationKeys))
			delete(n.Annotations, k)
		}
	}
	own := ownership.Labels(b.gi)
	for _, k := range slices.Sorted(maps.Keys(live.Labels)) {
		v := live.Labels[k]
		if want, ok := own[k]; ok {
			if v != want {
				outside("label %s=%s (guestnet's own label, which is %s)", k, v, want)
				n.Labels[k] = want
			}
			continue
		}
		switch {
		case ingress.ForbiddenHostServiceKey(k):
			outside("label %s (guestnet never passes it to a host Service)", k)
			delete(n.Labels, k)
		case !KeyAllowed(k, p.Spec.HostService.AllowedLabelKeys):
			outside("label %s (GuestIngressPolicy %s allows %s)", k, p.Name, keyList(p.Spec.HostService.AllowedLabelKeys))
			delete(n.Labels, k)
		}
	}
	if !c.Within() && !c.Delete {
		c.Narrowed = n
	}
	return c
}

// why says why the addresses r are not held: the host's own, or outside the policy.
func (b bounds) why(r ingress.AddrRange) string {
	if hit := b.reserved.InRange(r); len(hit) > 0 {
		return "the host cluster uses it for itself: " + hostaddrs.Kinds(hit)
	}
	return fmt.Sprintf("GuestIngressPolicy %s allows %s", b.policy.Name, b.addressList())
}

// whyText is why for an IP as written in a request.
func (b bounds) whyText(s string) string {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return fmt.Sprintf("GuestIngressPolicy %s allows %s", b.policy.Name, b.addressList())
	}
	return b.why(ingress.AddrRange{From: ip, To: ip})
}

// ipAllowed is ipWithin for an IP as written in a request; one that does not parse is not.
func (b bounds) ipAllowed(s string) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && b.ipWithin(ip)
}

func keyList(allowed []string) string {
	if len(allowed) == 0 {
		return "none"
	}
	return strings.Join(allowed, ", ")
}
