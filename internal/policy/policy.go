// Package policy decides what a GuestIngress may claim on the host network, from the
// GuestIngressPolicies a host admin wrote (docs/security.md). Admit is pure: the GuestIngress
// controller observes the inputs (Observe and World.Input read them), calls Admit, and
// creates nothing on the host for a GuestIngress that is not admitted (guestnet fails
// closed).
//
// A GuestIngress is admitted when ONE policy that selects its namespace allows everything it
// asks for; policies are never combined, so what a GuestIngress gets is always what one
// policy wrote. Of several such policies, the first by name admits it.
package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// Input is everything admission reads.
type Input struct {
	// GuestIngress is the GuestIngress to admit.
	GuestIngress *guestnetv1.GuestIngress
	// Namespace is the GuestIngress's namespace (its labels are matched against the
	// policies' namespaceSelectors); nil when it cannot be read, and then nothing is admitted.
	Namespace *corev1.Namespace
	// Policies are all GuestIngressPolicies.
	Policies []guestnetv1.GuestIngressPolicy
	// Siblings are the other GuestIngresses of the namespace (for the per-namespace cap);
	// GuestIngress itself may be among them.
	Siblings []guestnetv1.GuestIngress
	// Pools are ALL CiliumLoadBalancerIPPools, by name: the one spec.loadBalancer.poolRef
	// names, and every other pool, because LB-IPAM gives a Service without a fixed IP an IP
	// from any pool whose serviceSelector selects it. None when nil.
	Pools Pools
	// Host are the host cluster's own addresses (internal/hostaddrs), which no GuestIngress
	// gets whatever a policy admits; the ranges the policies reserve are added to them.
	Host hostaddrs.Set
	// MetalLBPools are every MetalLB IPAddressPool (none when MetalLB is not installed).
	MetalLBPools []*unstructured.Unstructured
}

// reserved is what no GuestIngress of in may hold: the host's own addresses and every range
// a policy reserves (any policy: the host's addresses are not a namespace's business).
func reserved(in Input) hostaddrs.Set {
	var admin []netip.Prefix
	for i := range in.Policies {
		for _, r := range in.Policies[i].Spec.ReservedAddresses {
			if p, ok := hostaddrs.Parse(r); ok {
				admin = append(admin, p)
			}
		}
	}
	return in.Host.With(hostaddrs.Reserved, admin...)
}

// Decision is what admission decided for one GuestIngress: whether it is admitted, by which
// policy, the Admitted condition's reason and message (what is not allowed and which policy
// would allow it), and the L2 announcement the admitting policy bounds. It is the Admission
// the GuestIngress plan reads (internal/ingress), so the two never drift apart.
type Decision = ingress.Admission

// Bounds of the messages: a refusal names at most this many policies, and this many
// things per policy.
const (
	maxPoliciesInMessage   = 3
	maxViolationsInMessage = 3
)

// Admit decides whether in.GuestIngress is admitted. Everything not allowed by a policy
// that selects the namespace is refused: no policy, an unreadable namespace, a policy that
// cannot be evaluated all mean "not admitted".
func Admit(in Input) Decision { return admit(in, guestIngressWords) }

// words name, in the messages of a decision, what is admitted and the field the tenant
// changes; counted says whether it takes room under maxGuestIngressesPerNamespace.
type words struct {
	subject, field string
	counted        bool
}

var guestIngressWords = words{subject: "this GuestIngress", field: "spec.loadBalancer", counted: true}

func admit(in Input, w words) Decision {
	gi := in.GuestIngress
	policies := slices.Clone(in.Policies)
	slices.SortFunc(policies, func(a, b guestnetv1.GuestIngressPolicy) int { return cmp.Compare(a.Name, b.Name) })

	if in.Namespace == nil {
		return Decision{Reason: guestnetv1.NoPolicyReason, Message: fmt.Sprintf(
			"guestnet could not read namespace %s, so no GuestIngressPolicy can be matched to it; nothing is created on the host "+
				"for %s until it can", gi.Namespace, w.subject)}
	}

	var refusals []refusal
	var overQuota []refusal
	var wouldAllow *guestnetv1.GuestIngressPolicy
	host := reserved(in)
	for i := range policies {
		p := &policies[i]
		v := violations(p, gi, in.pools())
		if !selects(p, in.Namespace) {
			if len(v) == 0 && wouldAllow == nil {
				wouldAllow = p
			}
			continue
		}
		if len(v) == 0 {
			v = metalLBPoolViolations(gi, in.MetalLBPools)
		}
		if len(v) > 0 {
			refusals = append(refusals, refusal{policy: p, what: v})
			continue
		}
		if older, ok := withinQuota(p, gi, in.Siblings, in.pools(), host); w.counted && !ok {
			overQuota = append(overQuota, refusal{policy: p, older: older})
			continue
		}
		a, err := announcement(p, gi)
		if err != nil {
			refusals = append(refusals, refusal{policy: p, what: []string{err.Error()}})
			continue
		}
		if d, refused := refuseHostAddresses(gi, p, host, in.pools(), w); refused {
			return d
		}
		return Decision{
			Admitted: true, Policy: p.Name, Reason: guestnetv1.AdmittedReason, Announcement: a,
			Announcer: announcerOf(p, gi), BGP: bgpAnnouncement(p, gi), MetalLB: metalLBAnnouncement(p, gi),
			Message: fmt.Sprintf("GuestIngressPolicy %s admits %s", p.Name, describe(gi)),
		}
	}

	// A policy that does not select the namespace is another tenant's business: the tenant
	// learns that one would allow it, never which one or what it selects (the admin reads
	// that in the manager's log, Detail).
	other, detail := "", poolsDetail(gi, in.pools())
	if wouldAllow != nil {
		other = fmt.Sprintf(" A GuestIngressPolicy that does not select namespace %s would allow it: ask the host admin to select the namespace.", gi.Namespace)
		detail = strings.TrimSpace(fmt.Sprintf("GuestIngressPolicy %s would allow it but does not select namespace %s (its namespaceSelector: %s). %s",
			wouldAllow.Name, gi.Namespace, SelectorString(&wouldAllow.Spec.NamespaceSelector), detail))
	}
	nothing := " guestnet creates nothing on the host for " + w.subject + "."
	switch {
	case len(refusals) == 0 && len(overQuota) == 0:
		msg := fmt.Sprintf("No GuestIngressPolicy selects namespace %s.%s", gi.Namespace, nothing) + other
		if wouldAllow == nil {
			msg += fmt.Sprintf(" Ask the host admin for a GuestIngressPolicy that selects namespace %s and allows %s.", gi.Namespace, describe(gi))
		}
		return Decision{Reason: guestnetv1.NoPolicyReason, Message: msg, Detail: detail}
	case len(overQuota) > 0:
		parts := make([]string, 0, len(overQuota)+len(refusals))
		for _, r := range overQuota {
			parts = append(parts, fmt.Sprintf("GuestIngressPolicy %s admits at most %d GuestIngresses in namespace %s and admits the older %s",
				r.policy.Name, *r.policy.Spec.MaxGuestIngressesPerNamespace, gi.Namespace, listed(r.older, maxViolationsInMessage)))
		}
		for _, r := range refusals {
			parts = append(parts, r.String())
		}
		return Decision{Reason: guestnetv1.QuotaExceededReason, Message: bounded(parts) + "." + nothing + other +
			" Delete a GuestIngress of the namespace, or ask the host admin to raise maxGuestIngressesPerNamespace.", Detail: detail}
	default:
		parts := make([]string, 0, len(refusals))
		for _, r := range refusals {
			parts = append(parts, r.String())
		}
		return Decision{Reason: guestnetv1.NotAllowedReason, Message: bounded(parts) + "." + nothing + other +
			" Change " + w.field + " to what the policy allows, or ask the host admin.", Detail: detail}
	}
}

// poolsDetail names, for the manager's log, the pools that keep gi from letting LB-IPAM
// choose its IP (poolSelectionViolations names none of them to the tenant); "" when none.
func poolsDetail(gi *guestnetv1.GuestIngress, pools Pools) string {
	handing := poolsHandingOut(gi, pools)
	if len(handing) == 0 {
		return ""
	}
	return fmt.Sprintf("CiliumLoadBalancerIPPools that could hand out its IP: %s.", strings.Join(handing, "; "))
}

// refusal is why one policy that selects the namespace does not admit the GuestIngress.
type refusal struct {
	policy *guestnetv1.GuestIngressPolicy
	// what it does not allow, or (over its cap) the older GuestIngresses it admits.
	what  []string
	older []string
}

func (r refusal) String() string {
	return fmt.Sprintf("GuestIngressPolicy %s does not allow %s", r.policy.Name, listed(r.what, maxViolationsInMessage))
}

// bounded joins at most maxPoliciesInMessage parts.
func bounded(parts []string) string {
	if len(parts) > maxPoliciesInMessage {
		return strings.Join(parts[:maxPoliciesInMessage], "; ") + fmt.Sprintf("; and %d more policies", len(parts)-maxPoliciesInMessage)
	}
	return strings.Join(parts, "; ")
}

// listed joins at most n items, saying how many more there are.
func listed(items []string, n int) string {
	if len(items) > n {
		return strings.Join(items[:n], ", ") + fmt.Sprintf(" and %d more", len(items)-n)
	}
	return strings.Join(items, ", ")
}

// selects reports whether p selects the namespace ns. An invalid selector selects nothing
// (the policy's Ready condition says so).
func selects(p *guestnetv1.GuestIngressPolicy, ns *corev1.Namespace) bool {
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.NamespaceSelector)
	if err != nil {
		return false
	}
	return sel.Matches(labels.Set(ns.Labels))
}

// Selects reports whether p selects the namespace ns (for status and diagnostics).
func Selects(p *guestnetv1.GuestIngressPolicy, ns *corev1.Namespace) bool { return selects(p, ns) }

// SelectorString is a label selector in kubectl's syntax, "<all>" for {} and "<invalid>"
// for one that does not parse.
func SelectorString(ls *metav1.LabelSelector) string {
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return "<invalid>"
	}
	if sel.Empty() {
		return "<all>"
	}
	return sel.String()
}

// withinQuota reports whether p's per-namespace cap leaves room for gi: fewer than the cap
// of the namespace's older GuestIngresses (creationTimestamp, then name) are ones p allows
// (one refused for a host address takes no room).
// older names those it counted when there is no room.
func withinQuota(p *guestnetv1.GuestIngressPolicy, gi *guestnetv1.GuestIngress, siblings []guestnetv1.GuestIngress,
	pools Pools, host hostaddrs.Set) ([]string, bool) {
	limit := p.Spec.MaxGuestIngressesPerNamespace
	if limit == nil {
		return nil, true
	}
	var older []string
	for i := range siblings {
		s := &siblings[i]
		if s.Namespace != gi.Namespace || s.Name == gi.Name || !olderThan(s, gi) {
			continue
		}
		if _, onHost := refuseHostAddresses(s, p, host, pools, guestIngressWords); len(violations(p, s, pools)) == 0 && !onHost {
			older = append(older, s.Name)
		}
	}
	if int32(len(older)) < *limit {
		return nil, true
	}
	slices.Sort(older)
	return older, false
}

// olderThan orders GuestIngresses by creationTimestamp, then by name (timestamps have a
// resolution of a second), so every reconcile counts the same ones.
func olderThan(a, b *guestnetv1.GuestIngress) bool {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c < 0
	}
	return a.Name < b.Name
}

// describe says what gi claims, for messages and status: "10.2.6.220", "10.2.6.216/29",
// "pool shared", "10.2.6.5 from pool shared".
func describe(gi *guestnetv1.GuestIngress) string {
	lb := gi.Spec.LoadBalancer
	switch {
	case lb.PoolRef != nil && len(ingress.RequestedIPs(gi)) > 0:
		return strings.Join(ingress.RequestedIPs(gi), ", ") + " from pool " + lb.PoolRef.Name
	case lb.PoolRef != nil:
		return "an IP from pool " + lb.PoolRef.Name
	case len(lb.CIDRs) > 0:
		return strings.Join(lb.CIDRs, ", ")
	default:
		return strings.Join(ingress.RequestedIPs(gi), ", ")
	}
}

// Claim is what gi claims, as GuestIngressPolicy status lists it.
func Claim(gi *guestnetv1.GuestIngress) string { return describe(gi) }
