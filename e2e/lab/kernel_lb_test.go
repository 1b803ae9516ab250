package lab

import (
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// The kernel load balancer's table for the entry node host-node-2: a remote backend is marked
// for SNAT to the entry node's address, a local one is not, and a frontend without backends
// is rejected on input instead of DNATed.
func TestRenderKernelLB(t *testing.T) {
	svc := types.NamespacedName{Namespace: "ns", Name: "web"}
	table := renderKernelLB("host-node-2", []lbFrontend{
		{service: svc, ip: netip.MustParseAddr("10.98.1.1"), protocol: "tcp", port: 80, backends: []lbBackend{
			{addr: netip.MustParseAddrPort("10.244.122.1:30480"), snat: true},
			{addr: netip.MustParseAddrPort("10.244.122.2:30480")},
		}},
		{service: svc, ip: netip.MustParseAddr("fd00:10:98::1"), protocol: "tcp", port: 80},
	})
	for _, want := range []string{
		`iifname "lab-ext" ip daddr 10.98.1.1 tcp dport 80 jump svc-0`,
		"numgen random mod 2 vmap { 0 : jump svc-0-be-0, 1 : jump svc-0-be-1 }",
		"chain svc-0-be-0 {\n\t\tmeta mark set meta mark | 0x200\n\t\tmeta l4proto tcp dnat ip to 10.244.122.1:30480\n\t}",
		"chain svc-0-be-1 {\n\t\tmeta l4proto tcp dnat ip to 10.244.122.2:30480\n\t}",
		"meta nfproto ipv4 meta mark & 0x200 == 0x200 snat ip to 203.0.113.2",
		"meta nfproto ipv6 meta mark & 0x200 == 0x200 snat ip6 to 2001:db8:113::2",
		`iifname "lab-ext" ip6 daddr fd00:10:98::1 tcp dport 80 counter reject with icmpx type port-unreachable`,
	} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
}
