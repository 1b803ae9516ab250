package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// violations lists what p does not allow of what gi asks for, each as a phrase ("IP
// 10.2.6.5 (its addresses: 10.98.0.0/16)"), in a stable order; empty when p allows all of
// it (namespace selection and the cap aside).
func violations(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress, pools Pools) []string {
	var out []string
	lb := gi.Spec.LoadBalancer

	class := ingress.LoadBalancerClass(gi)
	if classes := Classes(p); !slices.Contains(classes, class) {
		out = append(out, fmt.Sprintf("loadBalancerClass %s (it allows %s)", class, strings.Join(classes, ", ")))
	}
	if ingress.AnnouncesL2(gi) {
		out = append(out, l2Violations(p, gi)...)
	}
	out = append(out, announcerViolations(p, gi)...)

	if lb.PoolRef == nil {
		out = append(out, addressViolations(p, gi)...)
	} else {
		out = append(out, sharedPoolViolations(p, gi, pools)...)
	}

	out = append(out, keyViolations("annotation", lb.Annotations, p.Spec.HostService.AllowedAnnotationKeys)...)
	out = append(out, keyViolations("label", lb.Labels, p.Spec.HostService.AllowedLabelKeys)...)

	etp := orDefault(lb.ExternalTrafficPolicy, corev1.ServiceExternalTrafficPolicyCluster)
	if allowed := TrafficPolicies(p); !slices.Contains(allowed, etp) {
		names := make([]string, len(allowed))
		for i, a := range allowed {
			names[i] = string(a)
		}
		out = append(out, fmt.Sprintf("externalTrafficPolicy %s (it allows %s; Local opens a health-check nodePort on every host node)",
			etp, strings.Join(names, ", ")))
	}

	if !announcerOf(p, gi).UsesCiliumLBIPAM() {
		return out // LB-IPAM leaves a Service of MetalLB's class alone: Cilium's pools do not matter
	}
	return append(out, poolSelectionViolations(gi, pools)...)
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Classes are the loadBalancerClasses p allows (Cilium's L2 announcer when it lists none,
// as the CRD defaults it).
func Classes(p *guestnetv1.GuestIngressPolicy) []string {
	if len(p.Spec.LoadBalancerClasses) == 0 {
		return []string{guestnetv1.DefaultLoadBalancerClass}
	}
	return p.Spec.LoadBalancerClasses
}

// TrafficPolicies are the externalTrafficPolicies p allows (Cluster when it lists none).
func TrafficPolicies(p *guestnetv1.GuestIngressPolicy) []corev1.ServiceExternalTrafficPolicy {
	if len(p.Spec.HostService.ExternalTrafficPolicies) == 0 {
		return []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster}
	}
	return p.Spec.HostService.ExternalTrafficPolicies
}

func l2Violations(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress) []string {
	l2 := p.Spec.L2Announcement
	if l2 == nil {
		return []string{fmt.Sprintf("announcing with %s (it has no l2Announcement saying which nodes and interfaces may announce)",
			guestnetv1.DefaultLoadBalancerClass)}
	}
	var out []string
	if own := gi.Spec.LoadBalancer.L2; own != nil {
		for _, i := range own.Interfaces {
			if !slices.Contains(l2.Interfaces, i) {
				out = append(out, fmt.Sprintf("announcing on interface %s (it allows %s)", i, strings.Join(l2.Interfaces, ", ")))
			}
		}
		if own.NodeSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(own.NodeSelector); err != nil {
				out = append(out, fmt.Sprintf("the invalid spec.loadBalancer.l2.nodeSelector (%v)", err))
			}
		}
	}
	return out
}

// addressViolations: spec.loadBalancer.ip and every cidr lie in p's addresses.
func addressViolations(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress) []string {
	lb := gi.Spec.LoadBalancer
	allowed := Addresses(p)
	what := "none"
	if len(p.Spec.Addresses) > 0 {
		what = strings.Join(p.Spec.Addresses, ", ")
	}
	var out []string
	for _, s := range ingress.RequestedIPs(gi) {
		ip, err := netip.ParseAddr(s)
		switch {
		case err == nil && ip.Is4In6():
			out = append(out, fmt.Sprintf("IP %s (an IPv4-mapped IPv6 address: write the IPv4 address)", s))
		case err != nil || !slices.ContainsFunc(allowed, func(a netip.Prefix) bool { return a.Contains(ip) }):
			out = append(out, fmt.Sprintf("IP %s (its addresses: %s)", s, what))
		}
	}
	for _, c := range lb.CIDRs {
		pr, err := netip.ParsePrefix(c)
		switch {
		case err == nil && pr.Overlaps(mapped4in6):
			out = append(out, fmt.Sprintf("range %s (IPv4-mapped IPv6 addresses: write IPv4 ranges)", c))
		case err != nil || !slices.ContainsFunc(allowed, func(a netip.Prefix) bool { return Within(pr, a) }):
			out = append(out, fmt.Sprintf("range %s (its addresses: %s)", c, what))
		}
	}
	if len(ingress.RequestedIPs(gi)) == 0 && len(lb.CIDRs) == 0 {
		out = append(out, "a GuestIngress without ip, ips, cidrs or poolRef")
	}
	return out
}

// mapped4in6 are the IPv4-mapped IPv6 addresses, refused: software that unmaps them would
// announce an IPv4 address no policy range names.
var mapped4in6 = netip.MustParsePrefix("::ffff:0:0/96")

// Addresses are p's address ranges that parse (the CRD validates them).
func Addresses(p *guestnetv1.GuestIngressPolicy) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range p.Spec.Addresses {
		if pr, err := netip.ParsePrefix(a); err == nil && pr.Bits() > 0 {
			out = append(out, pr.Masked())
		}
	}
	return out
}

// Within reports whether every address of inner lies in outer.
func Within(inner, outer netip.Prefix) bool {
	inner = inner.Masked()
	return inner.Addr().BitLen() == outer.Addr().BitLen() && inner.Bits() >= outer.Bits() && outer.Contains(inner.Addr())
}

// sharedPoolViolations: poolRef names a pool p offers, that exists, selects by namespace,
// and holds the requested IP.
func sharedPoolViolations(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress, pools Pools) []string {
	lb := gi.Spec.LoadBalancer
	name := lb.PoolRef.Name
	if !slices.Contains(p.Spec.SharedPools, name) {
		offered := "none"
		if len(p.Spec.SharedPools) > 0 {
			offered = strings.Join(p.Spec.SharedPools, ", ")
		}
		return []string{fmt.Sprintf("shared pool %s (it offers %s)", name, offered)}
	}
	pool := pools.Get(name)
	if pool == nil {
		return []string{fmt.Sprintf("shared pool %s, which does not exist", name)}
	}
	if why := UnsafeSharedPool(pool); why != "" {
		return []string{fmt.Sprintf("shared pool %s, %s", name, why)}
	}
	for _, s := range ingress.RequestedIPs(gi) {
		ip, err := netip.ParseAddr(s)
		if err != nil || !ingress.RangesContain(ingress.PoolRanges(pool), ip) {
			return []string{fmt.Sprintf("IP %s, outside the blocks of shared pool %s", s, name)}
		}
	}
	return nil
}

// UnsafeSharedPool says why a pool offered as shared cannot be used ("" when it can): its
// serviceSelector must pin the Services it selects to namespaces (Cilium's
// io.kubernetes.service.namespace pseudo-label); anything else a tenant could match with
// labels it sets on a Service (guestnet's own cluster-name label carries a name the tenant
// chose).
func UnsafeSharedPool(pool *unstructured.Unstructured) string {
	_, pinned, err := ingress.PoolNamespaces(pool)
	if err != nil {
		return fmt.Sprintf("whose serviceSelector cannot be read (%v)", err)
	}
	if !pinned {
		return fmt.Sprintf("whose serviceSelector does not select Services by namespace (%s In [...]): a tenant could match it with labels it sets",
			ingress.ServiceNamespaceKey)
	}
	return ""
}

// keyViolations: every key passes p's allow list and none is one guestnet never passes.
func keyViolations(kind string, m map[string]string, allowed []string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch {
		case ingress.ForbiddenHostServiceKey(k):
			out = append(out, fmt.Sprintf("%s %s (guestnet never passes it to a host Service)", kind, k))
		case !KeyAllowed(k, allowed):
			list := "none"
			if len(allowed) > 0 {
				list = strings.Join(allowed, ", ")
			}
			out = append(out, fmt.Sprintf("%s %s (it allows %s)", kind, k, list))
		}
	}
	return out
}

// KeyAllowed reports whether key matches an allow-list entry: the same key, or a prefix
// entry "<prefix>/*" of which key starts with "<prefix>/".
func KeyAllowed(key string, allowed []string) bool {
	for _, a := range allowed {
		if prefix, ok := strings.CutSuffix(a, "*"); ok && strings.HasSuffix(prefix, "/") {
			if strings.HasPrefix(key, prefix) {
				return true
			}
		} else if a == key {
			return true
		}
	}
	return false
}

// poolSelectionViolations: LB-IPAM gives a Service without a fixed IP an address from any
// pool that selects it, so a GuestIngress without spec.loadBalancer.ip is admitted only when
// no pool but its own (and its admitted poolRef pool) selects its host Service. A fixed IP is
// requested explicitly and must lie in an admitted range or the shared pool. The pools are
// the platform's: the tenant is told how many, the admin which (poolsDetail, in the log).
func poolSelectionViolations(gi *guestnetv1.GuestIngress, pools Pools) []string {
	n := len(poolsHandingOut(gi, pools))
	if n == 0 {
		return nil
	}
	which := "a pool of the platform selects"
	if n > 1 {
		which = fmt.Sprintf("%d pools of the platform select", n)
	}
	return []string{fmt.Sprintf("an IP chosen by LB-IPAM (no spec.loadBalancer.ip) while %s its host Service and could hand it out "+
		"(set spec.loadBalancer.ip, or ask the host admin to narrow those pools, e.g. with %s NotIn [%s])",
		which, ownership.ManagedByLabel, ownership.ManagedByValue)}
}

// poolsHandingOut lists the pools, other than gi's own and its poolRef pool, whose
// serviceSelector selects gi's host Service, each with how ("<name> (it has no
// serviceSelector...)"), in name order; none when gi has a fixed IP.
func poolsHandingOut(gi *guestnetv1.GuestIngress, pools Pools) []string {
	lb := gi.Spec.LoadBalancer
	if len(ingress.RequestedIPs(gi)) > 0 {
		return nil
	}
	svcLabels := ingress.HostServiceLabels(gi)
	svcName := hostnames.HostService(gi)
	var out []string
	for _, pool := range pools.All() {
		name := pool.GetName()
		if (lb.PoolRef != nil && name == lb.PoolRef.Name) || ownership.IsOwnedBy(pool, gi) {
			continue
		}
		if disabled, _, _ := unstructured.NestedBool(pool.Object, "spec", "disabled"); disabled {
			continue
		}
		matches, err := ingress.SelectorMatchesService(pool, svcLabels, gi.Namespace, svcName)
		if err != nil || !matches {
			continue
		}
		how := "its serviceSelector selects the host Service"
		if _, found, _ := unstructured.NestedMap(pool.Object, "spec", "serviceSelector"); !found {
			how = "it has no serviceSelector, so it selects every Service"
		}
		out = append(out, fmt.Sprintf("%s (%s)", name, how))
	}
	return out
}

// announcement is where p lets gi's IP be announced: gi's interfaces (each one of p's) or
// else all of p's, and p's node selector AND gi's. Empty when gi's class is not Cilium's
// L2 announcer.
func announcement(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress) (ingress.Announcement, error) {
	if !ingress.AnnouncesL2(gi) {
		return ingress.Announcement{}, nil
	}
	l2 := p.Spec.L2Announcement
	a := ingress.Announcement{Interfaces: slices.Clone(l2.Interfaces)}
	own := gi.Spec.LoadBalancer.L2
	if own != nil && len(own.Interfaces) > 0 {
		a.Interfaces = slices.Clone(own.Interfaces)
	}
	for _, i := range a.Interfaces {
		if _, err := regexp.Compile(i); err != nil {
			return ingress.Announcement{}, fmt.Errorf("announcing on interface %s, which is not a valid regular expression", i)
		}
	}
	if _, err := metav1.LabelSelectorAsSelector(&l2.NodeSelector); err != nil {
		return ingress.Announcement{}, fmt.Errorf("any announcement: its l2Announcement.nodeSelector is invalid (%w)", err)
	}
	var ownSel *metav1.LabelSelector
	if own != nil {
		ownSel = own.NodeSelector
	}
	a.NodeSelector = SelectorAnd(&l2.NodeSelector, ownSel)
	return a, nil
}

// SelectorAnd is the label selector that matches what both a and b match (nil b: a). nil when the
// result selects everything.
func SelectorAnd(a, b *metav1.LabelSelector) *metav1.LabelSelector {
	out := &metav1.LabelSelector{}
	add := func(s *metav1.LabelSelector) {
		if s == nil {
			return
		}
		for _, k := range slices.Sorted(maps.Keys(s.MatchLabels)) {
			v := s.MatchLabels[k]
			if have, ok := out.MatchLabels[k]; ok && have != v {
				// k=have AND k=v: nothing matches, as the two policies say.
				out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
					Key: k, Operator: metav1.LabelSelectorOpIn, Values: []string{v}})
				continue
			}
			if out.MatchLabels == nil {
				out.MatchLabels = map[string]string{}
			}
			out.MatchLabels[k] = v
		}
		for _, r := range s.MatchExpressions {
			out.MatchExpressions = append(out.MatchExpressions, *r.DeepCopy())
		}
	}
	add(a)
	add(b)
	if len(out.MatchLabels) == 0 && len(out.MatchExpressions) == 0 {
		return nil
	}
	return out
}
