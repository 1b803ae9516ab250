package ingress

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// Who may use which address space on the host network. The decision is made from what exists
// on the host (who holds an address now), never from a GuestIngress's status: a status can be
// empty for a moment (a host Service recreated, Cilium re-allocating, a patch not in the cache
// yet) while the pool and the Service that hold the address are still there.

// Claim is address space on the host network: a load-balancer IP and pool ranges.
type Claim struct {
	// IP is a single load-balancer IP (invalid when none).
	IP netip.Addr
	// Prefixes are pool ranges.
	Prefixes []netip.Prefix
}

// ClaimOf returns what gi asks for: spec.loadBalancer.ip, and the ranges of the pool
// guestnet creates for it (none with poolRef: a poolRef IP is a claim like any other).
func ClaimOf(gi *guestnetv1.GuestIngress) Claim {
	c := Claim{Prefixes: PoolPrefixes(gi)}
	if ips := RequestedAddrs(gi); len(ips) > 0 {
		c.IP = ips[0] // a second (dual-stack) IP is claimed through the pool's prefixes
	}
	return c
}

// OverlapsRange reports whether the claim takes an address of r.
func (c Claim) OverlapsRange(r AddrRange) bool {
	return (c.IP.IsValid() && r.Contains(c.IP)) || slices.ContainsFunc(c.Prefixes, r.Overlaps)
}

// Empty reports whether the claim takes nothing.
func (c Claim) Empty() bool { return !c.IP.IsValid() && len(c.Prefixes) == 0 }

// collision says how claim c runs into claim other, "" when it does not: IPConflictReason
// when c's IP is other's IP or inside other's ranges, PoolConflictReason when c's ranges
// overlap other's ranges or hold other's IP.
func (c Claim) collision(other Claim) string {
	if c.IP.IsValid() && (other.IP == c.IP || slices.ContainsFunc(other.Prefixes, func(p netip.Prefix) bool { return p.Contains(c.IP) })) {
		return guestnetv1.IPConflictReason
	}
	if PrefixesOverlap(c.Prefixes, other.Prefixes) ||
		(other.IP.IsValid() && slices.ContainsFunc(c.Prefixes, func(p netip.Prefix) bool { return p.Contains(other.IP) })) {
		return guestnetv1.PoolConflictReason
	}
	return ""
}

// Collides reports whether two claims share an address.
func (c Claim) Collides(other Claim) bool { return c.collision(other) != "" }

// String renders the claim for messages: "10.2.6.216/29, 10.2.6.220".
func (c Claim) String() string {
	var parts []string
	for _, p := range c.Prefixes {
		parts = append(parts, p.String())
	}
	if c.IP.IsValid() && !slices.ContainsFunc(c.Prefixes, func(p netip.Prefix) bool { return p.Bits() == c.IP.BitLen() && p.Addr() == c.IP }) {
		parts = append(parts, c.IP.String())
	}
	return strings.Join(parts, ", ")
}

// Claimant is a GuestIngress in the contest for address space, as observed on the host.
type Claimant struct {
	GuestIngress *guestnetv1.GuestIngress
	// Held is the address space its objects occupy on the host now: the blocks of its own
	// pool, and the IP its host Service requests or has (when it still asks for that IP).
	Held Claim
	// Eligible: it may hold host objects now. A GuestIngress whose Cluster is missing, paused
	// or being deleted, that is paused, being deleted or not admitted by a policy claims
	// nothing; what it still holds on the host keeps counting until it is gone.
	Eligible bool
}

// Wants is the address space the claimant asks for.
func (c Claimant) Wants() Claim { return ClaimOf(c.GuestIngress) }

// Holds reports whether the claimant's objects on the host occupy some of what it asks for.
func (c Claimant) Holds() bool { return c.Held.Collides(c.Wants()) }

func (c Claimant) key() string { return c.GuestIngress.Namespace + "/" + c.GuestIngress.Name }

// entangled reports whether two claimants' asked or held address spaces share an address.
func entangled(a, b Claimant) bool {
	return a.Wants().Collides(b.Wants()) || a.Wants().Collides(b.Held) || a.Held.Collides(b.Wants()) || a.Held.Collides(b.Held)
}

// Entangled returns the claimants of others whose claims are entangled with self's, directly
// or through a chain of others: every claimant whose fate can decide self's.
func Entangled(self Claimant, others []Claimant) []Claimant {
	in, _ := EntangledVia(self, func(Claimant) ([]Claimant, error) { return others, nil })
	return in
}

// EntangledVia is Entangled with the claimants found by neighbors: for a claimant, a set of
// claimants that holds at least every one entangled with it (an index by address, so that a
// reconcile reads the claims near its own, not every claim of the host). A claimant is
// identified by its GuestIngress's namespace and name; self is never returned.
func EntangledVia(self Claimant, neighbors func(Claimant) ([]Claimant, error)) ([]Claimant, error) {
	in := []Claimant{self}
	seen := map[string]bool{self.key(): true}
	for i := 0; i < len(in); i++ {
		candidates, err := neighbors(in[i])
		if err != nil {
			return nil, err
		}
		for _, o := range candidates {
			if !seen[o.key()] && entangled(in[i], o) {
				seen[o.key()] = true
				in = append(in, o)
			}
		}
	}
	return in[1:], nil
}

// precedes orders claimants: those that hold some of what they ask for first (a working
// GuestIngress is never displaced), then the older creationTimestamp, then namespace/name
// (timestamps have a resolution of a second). Every reconcile of every GuestIngress decides
// the same.
func precedes(a, b Claimant) bool {
	if ha, hb := a.Holds(), b.Holds(); ha != hb {
		return ha
	}
	if c := a.GuestIngress.CreationTimestamp.Compare(b.GuestIngress.CreationTimestamp.Time); c != 0 {
		return c < 0
	}
	return cmp.Or(cmp.Compare(a.GuestIngress.Namespace, b.GuestIngress.Namespace), cmp.Compare(a.GuestIngress.Name, b.GuestIngress.Name)) < 0
}

// Conflict is why a GuestIngress may not use the address space it asks for.
type Conflict struct {
	// Reason is IPConflictReason or PoolConflictReason.
	Reason string
	// Holder names who keeps the address: "<namespace>/<name>" of a GuestIngress, or
	// "CiliumLoadBalancerIPPool <name>".
	Holder string
	// Who says who keeps it in words the tenant may read: "GuestIngress web of this
	// namespace", "another namespace's GuestIngress", "a pool of the platform".
	Who string
	// Message is the tenant's: it names only objects of the tenant's own namespace. Detail
	// is what it leaves out (the holder, its Cluster, pool and ranges), for the manager's log.
	Message, Detail string
	// Release: the refused GuestIngress's own objects occupy address space the holder keeps,
	// so they are deleted. Otherwise its objects (if it has any) stay as they are and nothing
	// of its new spec is applied.
	Release bool
}

// Contest decides whether self (eligible) may use the address space it asks for, given the
// claimants entangled with it (Entangled). Claimants are taken in precedence order; each
// eligible one keeps its claim unless
//   - it asks for an address that one kept before it asks for too, or
//   - it asks for an address another claimant's objects occupy on the host, unless it lost
//     nothing: both hold overlapping space (a race of two creations) and it precedes the
//     other, or the other may not hold anything any more and will release.
//
// So a holder is never displaced by an older claim, nor by another holder's spec reaching
// into its space; of two holders that overlap, the older keeps and the younger releases; an
// ineligible GuestIngress claims nothing, but what it still holds counts until it is gone.
func Contest(self Claimant, others []Claimant) *Conflict {
	if !self.Eligible || self.Wants().Empty() {
		return nil
	}
	all := append([]Claimant{self}, others...)
	slices.SortStableFunc(all, func(a, b Claimant) int {
		if precedes(a, b) {
			return -1
		}
		if precedes(b, a) {
			return 1
		}
		return 0
	})
	var kept []Claimant
	for _, c := range all {
		if !c.Eligible {
			continue
		}
		conflict := refusal(c, kept, all)
		if c.key() == self.key() {
			return conflict
		}
		if conflict == nil {
			kept = append(kept, c)
		}
	}
	return nil
}

// refusal is why c may not keep its claim, nil when it may (see Contest).
func refusal(c Claimant, kept, all []Claimant) *Conflict {
	wants := c.Wants()
	for _, k := range kept {
		reason := cmp.Or(wants.collision(k.Wants()), reverse(k.Wants().collision(wants)))
		if reason != "" {
			return conflictWith(c, k, reason, c.Held.Collides(k.Wants()))
		}
	}
	for _, h := range all {
		if h.key() == c.key() || !wants.Collides(h.Held) {
			continue
		}
		if c.Holds() && c.Held.Collides(h.Held) && (!h.Eligible || precedes(c, h)) {
			continue // a race c wins: h releases
		}
		return conflictWith(c, h, wants.collision(h.Held), c.Held.Collides(h.Held))
	}
	return nil
}

// reverse is the reason for c when the other's claim runs into c's: c's ranges or IP hold
// the other's address, a pool matter for c.
func reverse(reason string) string {
	if reason == "" {
		return ""
	}
	return guestnetv1.PoolConflictReason
}

// conflictWith is c's conflict with holder. A holder of c's namespace is named, with its
// Cluster, pool and what it asks for; one of another namespace is not: the tenant learns that
// another namespace's GuestIngress keeps the addresses of its own claim that collide, and
// the admin reads which one in the manager's log (Detail).
func conflictWith(c, holder Claimant, reason string, release bool) *Conflict {
	gi, h := c.GuestIngress, holder.GuestIngress
	since := "created earlier"
	if holder.Holds() {
		since = "it holds them on the host"
	}
	outcome := outcomeOf(c, release)
	conflict := &Conflict{Reason: reason, Holder: holder.key(), Release: release,
		Detail: fmt.Sprintf("GuestIngress %s/%s (cluster %s, %s) asks for %s and keeps it (pool %s)", h.Namespace, h.Name, h.Spec.ClusterName, since,
			holder.Wants(), hostnames.Pool(h))}
	if h.Namespace == gi.Namespace {
		conflict.Who = fmt.Sprintf("GuestIngress %s of this namespace", h.Name)
		who := fmt.Sprintf("%s (cluster %s, %s)", conflict.Who, h.Spec.ClusterName, since)
		if reason == guestnetv1.IPConflictReason {
			conflict.Message = fmt.Sprintf("IP %s is already claimed by %s, which asks for %s and keeps it; %s. Choose another spec.loadBalancer.ip, or delete GuestIngress %s",
				c.Wants().IP, who, holder.Wants(), outcome, h.Name)
		} else {
			conflict.Message = fmt.Sprintf("The pool ranges %s overlap %s of %s (pool %s), which keeps them; Cilium would stop allocating from both pools, so %s. "+
				"Choose ranges that do not overlap", c.Wants(), holder.Wants(), who, hostnames.Pool(h), outcome)
		}
		return conflict
	}
	conflict.Who = "another namespace's GuestIngress"
	if reason == guestnetv1.IPConflictReason {
		conflict.Message = fmt.Sprintf("IP %s is already claimed by another namespace's GuestIngress (%s), which keeps it; %s. "+
			"Choose another spec.loadBalancer.ip, one your GuestIngressPolicy admits that no one else holds, or ask the host admin",
			c.Wants().IP, since, outcome)
	} else {
		kept := holder.Wants()
		kept.Prefixes = append(kept.Prefixes, holder.Held.Prefixes...)
		conflict.Message = fmt.Sprintf("%s already claimed by another namespace's GuestIngress (%s), which keeps them; "+
			"Cilium would stop allocating from both pools, so %s. Choose ranges that do not overlap them, or ask the host admin",
			takenOf(c.Wants().withIP(), kept.withIP()), since, outcome)
	}
	return conflict
}

// takenOf says which addresses of the tenant's own ranges mine another's overlap, naming
// nothing of the other's outside them: "The pool ranges 10.2.6.0/29 are" when all of them,
// "The addresses 10.2.6.4/30 of the pool ranges 10.2.6.0/24 are" otherwise.
func takenOf(mine, other []netip.Prefix) string {
	taken := Overlapping(mine, other)
	if slices.Equal(taken, mine) {
		return fmt.Sprintf("The pool ranges %s are", addresses(mine))
	}
	return fmt.Sprintf("The addresses %s of the pool ranges %s are", addresses(taken), addresses(mine))
}

// addresses renders prefixes for messages, a single address without its length:
// "10.2.6.216/29, 10.2.6.220".
func addresses(prefixes []netip.Prefix) string {
	parts := make([]string, len(prefixes))
	for i, p := range prefixes {
		parts[i] = p.String()
		if p.IsSingleIP() {
			parts[i] = p.Addr().String()
		}
	}
	return strings.Join(parts, ", ")
}

// withIP is the claim's ranges with its IP as a one-address range.
func (c Claim) withIP() []netip.Prefix {
	out := slices.Clone(c.Prefixes)
	if c.IP.IsValid() {
		out = append(out, netip.PrefixFrom(c.IP, c.IP.BitLen()))
	}
	return out
}

// Overlapping is the part of mine that other overlaps, as prefixes of mine (or the narrower
// of other's inside them): what a message may show a tenant of another's address space,
// nothing outside its own.
func Overlapping(mine, other []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, m := range mine {
		for _, o := range other {
			if !m.Overlaps(o) {
				continue
			}
			p := m
			if o.Bits() > m.Bits() {
				p = o
			}
			if !slices.Contains(out, p.Masked()) {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}

// outcomeOf says what happens to a refused GuestIngress's host objects.
func outcomeOf(c Claimant, release bool) string {
	switch {
	case release:
		return "guestnet deletes this GuestIngress's host objects, which overlap it"
	case c.Held.Empty():
		return "guestnet created no host objects for this GuestIngress"
	default:
		return "guestnet leaves this GuestIngress's host objects as they are and applies none of its changes"
	}
}

// ForeignPoolConflict checks the pool guestnet would create for gi against the pools it does
// not manage (an admin's, a shared one): Cilium disables the newer of two overlapping pools,
// and either one when they were created in the same second, so guestnet never creates (or keeps) a
// pool that overlaps one of them. held is what gi holds on the host. Pools are taken in name
// order; nil when nothing overlaps.
func ForeignPoolConflict(gi *guestnetv1.GuestIngress, held Claim, foreign []*unstructured.Unstructured) *Conflict {
	want := PoolPrefixes(gi)
	if len(want) == 0 {
		return nil
	}
	pools := slices.Clone(foreign)
	slices.SortFunc(pools, func(a, b *unstructured.Unstructured) int { return cmp.Compare(a.GetName(), b.GetName()) })
	for _, pool := range pools {
		blocks := PoolBlocks(pool)
		if !PrefixesOverlap(want, blocks) {
			continue
		}
		release := PrefixesOverlap(held.Prefixes, blocks)
		c := Claimant{GuestIngress: gi, Held: held}
		return &Conflict{
			Reason: guestnetv1.PoolConflictReason,
			Holder: "CiliumLoadBalancerIPPool " + pool.GetName(),
			Who:    "a pool of the platform",
			Message: fmt.Sprintf("%s in a pool of the platform, which guestnet does not manage: Cilium disables the newer "+
				"of two overlapping pools (either one, when they were created in the same second), so %s. Choose spec.loadBalancer.cidrs or .ip outside them, "+
				"or, if the platform offers you a shared pool, name it in spec.loadBalancer.poolRef",
				takenOf(want, blocks), outcomeOf(c, release)),
			Detail:  fmt.Sprintf("CiliumLoadBalancerIPPool %s (%s) overlaps the ranges", pool.GetName(), Claim{Prefixes: blocks}),
			Release: release,
		}
	}
	return nil
}

// PoolBlocks are the blocks of a CiliumLoadBalancerIPPool (PoolRanges) as prefixes.
func PoolBlocks(pool *unstructured.Unstructured) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range PoolRanges(pool) {
		out = append(out, rangePrefixes(r.From, r.To)...)
	}
	return out
}

// rangePrefixes covers the addresses from..to (inclusive) with the fewest prefixes.
func rangePrefixes(from, to netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for from.IsValid() && from.Compare(to) <= 0 {
		bits := from.BitLen()
		// Widen the prefix while it still starts at from and ends at or before to.
		for bits > 0 {
			wider := netip.PrefixFrom(from, bits-1).Masked()
			if wider.Addr() != from || lastAddr(wider).Compare(to) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(from, bits)
		out = append(out, p)
		from = lastAddr(p).Next()
	}
	return out
}

// Overlap reports whether two GuestIngresses ask for address space that collides.
func Overlap(a, b *guestnetv1.GuestIngress) bool {
	return ClaimOf(a).Collides(ClaimOf(b))
}

// lbipamIPsAliasAnnotation is the older name of LBIPAMIPsAnnotation, which Cilium still honours.
const lbipamIPsAliasAnnotation = "io.cilium/lb-ipam-ips"

// ServiceIPs are the load-balancer IPs a Service requests from LB-IPAM (the lbipam.cilium.io/ips
// annotation and its alias, spec.loadBalancerIP) and those it has (status.loadBalancer).
func ServiceIPs(svc *corev1.Service) []netip.Addr {
	var raw []string
	for _, key := range []string{LBIPAMIPsAnnotation, lbipamIPsAliasAnnotation} {
		raw = append(raw, strings.Split(svc.Annotations[key], ",")...)
	}
	raw = append(raw, svc.Spec.LoadBalancerIP)
	for _, in := range svc.Status.LoadBalancer.Ingress {
		raw = append(raw, in.IP)
	}
	var out []netip.Addr
	for _, s := range raw {
		if ip, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
			out = append(out, ip)
		}
	}
	return out
}
