package policy

import (
	"fmt"
	"net/netip"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// The host's own addresses (docs/decisions/0012-host-addresses-are-never-a-tenants.md) are
// never a GuestIngress's, whatever the policy that admits it allows: Admit refuses a claim
// that is or contains one (a range as a whole), and HeldBeyondAdmitted takes them off what a
// GuestIngress holds. The tenant is told which kind of host address, never whose; the admin
// reads the addresses in the manager's log (Decision.Detail) and in the policy's status.

// refuseHostAddresses refuses gi, which p admits otherwise, when what it asks for overlaps
// reserved: its IP, a CIDR (refused whole), or, with a poolRef and no IP, the shared pool that
// LB-IPAM would choose its IP from.
func refuseHostAddresses(gi *guestnetv1.GuestIngress, p *guestnetv1.GuestIngressPolicy, reserved hostaddrs.Set,
	pools Pools, w words) (Decision, bool) {
	lb := gi.Spec.LoadBalancer
	var what []string
	var hit []hostaddrs.Entry
	for _, ip := range ingress.RequestedAddrs(gi) {
		if e := reserved.Has(ip); len(e) > 0 {
			what, hit = append(what, fmt.Sprintf("IP %s is %s", ip, hostaddrs.Kinds(e))), append(hit, e...)
		}
	}
	for _, c := range lb.CIDRs {
		pr, _ := netip.ParsePrefix(c)
		if e := reserved.InPrefix(pr); len(e) > 0 {
			what, hit = append(what, fmt.Sprintf("range %s holds host addresses (%s)", c, hostaddrs.Kinds(e))), append(hit, e...)
		}
	}
	if lb.PoolRef != nil && len(ingress.RequestedIPs(gi)) == 0 {
		if pool := pools.Get(lb.PoolRef.Name); pool != nil {
			var e []hostaddrs.Entry
			for _, r := range ingress.PoolRanges(pool) {
				e = append(e, reserved.InRange(r)...)
			}
			if len(e) > 0 {
				what, hit = append(what, fmt.Sprintf("shared pool %s holds host addresses (%s) that LB-IPAM could hand out: set spec.loadBalancer.ip",
					lb.PoolRef.Name, hostaddrs.Kinds(e))), append(hit, e...)
			}
		}
	}
	if len(what) == 0 {
		return Decision{}, false
	}
	return Decision{
		Reason: guestnetv1.HostAddressReason,
		Message: fmt.Sprintf("GuestIngressPolicy %s admits %s, but %s. The host cluster uses these addresses for itself and guestnet "+
			"never hands them to a tenant, whatever a policy admits; a range that holds one is refused as a whole. guestnet "+
			"creates nothing on the host for %s. Ask for addresses that leave them out.",
			p.Name, describe(gi), listed(what, maxViolationsInMessage), w.subject),
		Detail: "Host addresses asked for: " + entriesList(hit),
	}, true
}

// entriesList names entries for the admin (the log, the policy's status), each once, by
// address, at most 8.
func entriesList(entries []hostaddrs.Entry) string {
	entries = hostaddrs.New(entries...).Entries()
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.String()
	}
	return listed(names, 8)
}

// HostAddressesCovered lists the host addresses (reserved ranges of the policies included)
// that lie in p's addresses or in the blocks of its shared pools, for the policy's status:
// guestnet never hands them out.
func HostAddressesCovered(p *guestnetv1.GuestIngressPolicy, in Input) string {
	set := reserved(in)
	var hit []hostaddrs.Entry
	for _, a := range Addresses(p) {
		hit = append(hit, set.InPrefix(a)...)
	}
	for _, name := range p.Spec.SharedPools {
		if pool := in.pools().Get(name); pool != nil {
			for _, r := range ingress.PoolRanges(pool) {
				hit = append(hit, set.InRange(r)...)
			}
		}
	}
	if len(hit) == 0 {
		return ""
	}
	return entriesList(hit)
}
