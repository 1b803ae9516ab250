// Package hostaddrs knows the addresses the host cluster uses for itself, which no
// GuestIngress ever gets, whatever a GuestIngressPolicy admits
// (docs/decisions/0012-host-addresses-are-never-a-tenants.md): the host apiserver's endpoints,
// every host Node's addresses and pod CIDRs, and the Service CIDRs. Read computes them from
// any reader (the Watcher's cache in the manager, the API server in `manager diagnose`);
// admission (internal/policy) adds the ranges admins reserve in policies, and refuses and
// withdraws what overlaps them.
package hostaddrs

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// Kind is a kind of host address. Tenants are told the kind of a host address they asked for,
// never whose it is (which Node, which apiserver).
type Kind string

// The kinds of host addresses, in the order messages name them.
const (
	// APIServer: an endpoint of the default/kubernetes Service (the apiservers' advertised
	// addresses).
	APIServer Kind = "APIServer"
	// NodeAddress: an InternalIP or ExternalIP of a host Node.
	NodeAddress Kind = "NodeAddress"
	// PodCIDR: a host Node's spec.podCIDRs.
	PodCIDR Kind = "PodCIDR"
	// ServiceCIDR: a ServiceCIDR of the host (networking.k8s.io/v1).
	ServiceCIDR Kind = "ServiceCIDR"
	// Reserved: a range an admin lists in a GuestIngressPolicy's spec.reservedAddresses (a
	// control-plane VIP, which the API does not tell, among them).
	Reserved Kind = "Reserved"
)

var kindOrder = []Kind{APIServer, NodeAddress, PodCIDR, ServiceCIDR, Reserved}

// Describe says what an address of kind k is, for messages ("a host Node's address").
func (k Kind) Describe() string {
	switch k {
	case APIServer:
		return "an address of the host apiserver"
	case NodeAddress:
		return "a host Node's address"
	case PodCIDR:
		return "in the host's pod network"
	case ServiceCIDR:
		return "in the host's Service network"
	default:
		return "in a range the host admin reserved"
	}
}

// Entry is one host address or range, of one kind.
type Entry struct {
	Kind   Kind
	Prefix netip.Prefix
}

func (e Entry) String() string {
	if e.Prefix.IsSingleIP() {
		return fmt.Sprintf("%s (%s)", e.Prefix.Addr(), e.Kind)
	}
	return fmt.Sprintf("%s (%s)", e.Prefix, e.Kind)
}

// Set is a set of host addresses. The zero Set holds none. A Set is never changed once
// built (With returns a new one), so one may be shared between goroutines.
type Set struct {
	entries []Entry
}

// New returns the Set of entries (masked, sorted, without duplicates).
func New(entries ...Entry) Set {
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		if e.Prefix.IsValid() {
			out = append(out, Entry{Kind: e.Kind, Prefix: e.Prefix.Masked()})
		}
	}
	slices.SortFunc(out, compareEntries)
	return Set{entries: slices.Compact(out)}
}

func compareEntries(a, b Entry) int {
	return cmp.Or(a.Prefix.Addr().Compare(b.Prefix.Addr()), cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits()),
		cmp.Compare(slices.Index(kindOrder, a.Kind), slices.Index(kindOrder, b.Kind)))
}

// With returns s and prefixes of kind k.
func (s Set) With(k Kind, prefixes ...netip.Prefix) Set {
	if len(prefixes) == 0 {
		return s
	}
	entries := slices.Clone(s.entries)
	for _, p := range prefixes {
		entries = append(entries, Entry{Kind: k, Prefix: p})
	}
	return New(entries...)
}

// Entries are the Set's entries, by address.
func (s Set) Entries() []Entry { return slices.Clone(s.entries) }

// Len is the number of entries.
func (s Set) Len() int { return len(s.entries) }

// Equal reports whether s and o hold the same entries.
func (s Set) Equal(o Set) bool { return slices.Equal(s.entries, o.entries) }

// InRange lists the entries that share an address with r, by address.
func (s Set) InRange(r ingress.AddrRange) []Entry {
	var out []Entry
	for _, e := range s.entries {
		if r.Overlaps(e.Prefix) {
			out = append(out, e)
		}
	}
	return out
}

// InPrefix lists the entries that share an address with p.
func (s Set) InPrefix(p netip.Prefix) []Entry {
	if !p.IsValid() {
		return nil
	}
	return s.InRange(ingress.PrefixRange(p))
}

// Has lists the entries that hold ip.
func (s Set) Has(ip netip.Addr) []Entry {
	if !ip.IsValid() {
		return nil
	}
	return s.InRange(ingress.AddrRange{From: ip, To: ip})
}

// Kinds names the kinds of entries, each once, in kindOrder ("a host Node's address, in the
// host's pod network").
func Kinds(entries []Entry) string {
	var kinds []string
	for _, k := range kindOrder {
		if slices.ContainsFunc(entries, func(e Entry) bool { return e.Kind == k }) {
			kinds = append(kinds, k.Describe())
		}
	}
	return strings.Join(kinds, ", ")
}

// The objects Read lists; the Watcher caches exactly these.
const (
	// apiServerService is default/kubernetes, whose endpoints are the apiservers.
	apiServerServiceNamespace = "default"
	apiServerServiceName      = "kubernetes"
)

// Read computes the host's own addresses from reader: the endpoints of default/kubernetes,
// every Node's InternalIP, ExternalIP and pod CIDRs, and the ServiceCIDRs. A kind the host
// does not serve (ServiceCIDRs before Kubernetes 1.33) adds nothing; any other error is
// returned, and then nothing is known (admission fails closed).
func Read(ctx context.Context, reader client.Reader) (Set, error) {
	var entries []Entry
	add := func(k Kind, s string) {
		if p, ok := Parse(s); ok {
			entries = append(entries, Entry{Kind: k, Prefix: p})
		}
	}

	endpoints := &discoveryv1.EndpointSliceList{}
	if err := reader.List(ctx, endpoints, client.InNamespace(apiServerServiceNamespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: apiServerServiceName}); err != nil {
		return Set{}, fmt.Errorf("listing the EndpointSlices of Service %s/%s: %w", apiServerServiceNamespace, apiServerServiceName, err)
	}
	for _, s := range endpoints.Items {
		for _, ep := range s.Endpoints {
			for _, a := range ep.Addresses {
				add(APIServer, a)
			}
		}
	}

	nodes := &corev1.NodeList{}
	if err := reader.List(ctx, nodes); err != nil {
		return Set{}, fmt.Errorf("listing Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				add(NodeAddress, a.Address)
			}
		}
		for _, c := range append([]string{n.Spec.PodCIDR}, n.Spec.PodCIDRs...) {
			add(PodCIDR, c)
		}
	}

	cidrs := &networkingv1.ServiceCIDRList{}
	if err := reader.List(ctx, cidrs); err != nil && !meta.IsNoMatchError(err) {
		return Set{}, fmt.Errorf("listing ServiceCIDRs: %w", err)
	}
	for _, c := range cidrs.Items {
		for _, s := range c.Spec.CIDRs {
			add(ServiceCIDR, s)
		}
	}
	return New(entries...), nil
}

// Parse reads an address ("10.0.0.1", "fd00::1") as a single-address prefix, or a CIDR (a
// policy's reserved range); ok is false when it does not parse. IPv4-mapped IPv6 addresses
// are read as the IPv4 address.
func Parse(s string) (netip.Prefix, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Prefix{}, false
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, false
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), true
}
