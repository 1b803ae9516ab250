package ingress

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// Claim is what address space a GuestIngress takes on the host network.
type Claim struct {
	// IP is spec.loadBalancer.ip (invalid when unset).
	IP netip.Addr
	// Prefixes are the ranges of the pool guestnet creates for it (none with poolRef).
	Prefixes []netip.Prefix
}

// ClaimOf returns gi's claim.
func ClaimOf(gi *guestnetv1.GuestIngress) Claim {
	c := Claim{Prefixes: PoolPrefixes(gi)}
	if ip, err := netip.ParseAddr(gi.Spec.LoadBalancer.IP); err == nil {
		c.IP = ip
	}
	return c
}

// Empty reports whether the claim takes nothing.
func (c Claim) Empty() bool { return !c.IP.IsValid() && len(c.Prefixes) == 0 }

// Conflict is why a GuestIngress may not have its host objects.
type Conflict struct {
	// Reason is IPConflictReason or PoolConflictReason.
	Reason string
	// Holder is the GuestIngress that keeps the address ("namespace/name").
	Holder  string
	Message string
}

// Precedes reports whether a's claim takes precedence over b's: the one that holds its
// address (it has its load-balancer IP and was not refused) first, so a working GuestIngress
// is never displaced; then the older creationTimestamp; then namespace/name in lexical
// order (timestamps have a resolution of a second). Every reconcile of every GuestIngress
// decides the same.
func Precedes(a, b *guestnetv1.GuestIngress) bool {
	if ha, hb := Holds(a), Holds(b); ha != hb {
		return ha
	}
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c < 0
	}
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name)) < 0
}

// Holds reports whether gi has its load-balancer IP and was not refused for a conflict.
func Holds(gi *guestnetv1.GuestIngress) bool {
	if gi.Status.LoadBalancerIP == "" {
		return false
	}
	reason := conditions.GetReason(gi, guestnetv1.LoadBalancerReadyCondition)
	return reason != guestnetv1.IPConflictReason && reason != guestnetv1.PoolConflictReason
}

// conflictBetween says how claim a collides with claim b (b holds), "" when it does not.
func conflictBetween(a, b Claim) string {
	if a.IP.IsValid() {
		if b.IP == a.IP || slices.ContainsFunc(b.Prefixes, func(p netip.Prefix) bool { return p.Contains(a.IP) }) {
			return guestnetv1.IPConflictReason
		}
	}
	if PrefixesOverlap(a.Prefixes, b.Prefixes) {
		return guestnetv1.PoolConflictReason
	}
	return ""
}

// Overlap reports whether two GuestIngresses' claims collide either way.
func Overlap(a, b *guestnetv1.GuestIngress) bool {
	ca, cb := ClaimOf(a), ClaimOf(b)
	return conflictBetween(ca, cb) != "" || conflictBetween(cb, ca) != ""
}

// FindConflict decides whether gi may use its address space, given every GuestIngress
// guestnet sees (gi may be among them). GuestIngresses are considered in Precedes order: each
// keeps its claim unless one before it that kept its own collides with it. So of two
// GuestIngresses asking for the same IP (in any namespace) the one that has it, or else the
// older, keeps working, and the other is refused, naming it; when that one goes away, the
// other gets the IP. Only collisions
// between GuestIngresses are decided here; Cilium reports overlaps with other pools
// (cilium.io/PoolConflict).
func FindConflict(gi *guestnetv1.GuestIngress, all []guestnetv1.GuestIngress) *Conflict {
	own := ClaimOf(gi)
	if own.Empty() {
		return nil
	}
	var older []*guestnetv1.GuestIngress
	for i := range all {
		other := &all[i]
		if other.Namespace == gi.Namespace && other.Name == gi.Name {
			continue
		}
		if Precedes(other, gi) && Overlap(other, gi) {
			older = append(older, other)
		}
	}
	if len(older) == 0 {
		return nil
	}
	// Only the older GuestIngresses that keep their claim count: walk everything older than
	// gi that overlaps anything relevant, oldest first.
	var candidates []*guestnetv1.GuestIngress
	for i := range all {
		other := &all[i]
		if (other.Namespace != gi.Namespace || other.Name != gi.Name) && Precedes(other, gi) && !ClaimOf(other).Empty() {
			candidates = append(candidates, other)
		}
	}
	slices.SortFunc(candidates, func(a, b *guestnetv1.GuestIngress) int {
		if Precedes(a, b) {
			return -1
		}
		return 1
	})
	var kept []*guestnetv1.GuestIngress
	for _, c := range candidates {
		if !slices.ContainsFunc(kept, func(k *guestnetv1.GuestIngress) bool { return Overlap(k, c) }) {
			kept = append(kept, c)
		}
	}
	for _, holder := range kept {
		reason := conflictBetween(own, ClaimOf(holder))
		if reason == "" {
			if conflictBetween(ClaimOf(holder), own) == "" {
				continue
			}
			reason = guestnetv1.PoolConflictReason
		}
		return &Conflict{Reason: reason, Holder: holder.Namespace + "/" + holder.Name, Message: conflictMessage(reason, gi, holder)}
	}
	return nil
}

func conflictMessage(reason string, gi, holder *guestnetv1.GuestIngress) string {
	since := "created earlier"
	if Holds(holder) {
		since = "it has the IP " + holder.Status.LoadBalancerIP
	}
	h := fmt.Sprintf("GuestIngress %s/%s (cluster %s, %s)", holder.Namespace, holder.Name, holder.Spec.ClusterName, since)
	what := describeClaim(ClaimOf(holder))
	if reason == guestnetv1.IPConflictReason {
		return fmt.Sprintf("IP %s is already claimed by %s, which asks for %s and keeps it; guestnet created no host objects for this GuestIngress. "+
			"Choose another spec.loadBalancer.ip, or delete %s/%s",
			gi.Spec.LoadBalancer.IP, h, what, holder.Namespace, holder.Name)
	}
	return fmt.Sprintf("The pool ranges %s overlap %s of %s (pool %s), which keeps them; Cilium would stop allocating from both pools, "+
		"so guestnet created no host objects for this GuestIngress. Choose ranges that do not overlap",
		describeClaim(ClaimOf(gi)), what, h, hostnames.Pool(holder))
}

func describeClaim(c Claim) string {
	var parts []string
	for _, p := range c.Prefixes {
		parts = append(parts, p.String())
	}
	if c.IP.IsValid() && !slices.ContainsFunc(c.Prefixes, func(p netip.Prefix) bool { return p.Bits() == c.IP.BitLen() && p.Addr() == c.IP }) {
		parts = append(parts, c.IP.String())
	}
	return strings.Join(parts, ", ")
}
