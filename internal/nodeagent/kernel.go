package nodeagent

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// What the agent keeps in a VM's kernel (docs/node-identity.md, "Inside the VM"). KubeVirt's
// masquerade binding gives the VM one address (10.0.2.2) behind a NAT in its virt-launcher
// pod, whose pod IP is the node IP. Three kernel objects make the node IP the VM's own:
//   - the node IP on lo (label lo:guestnet), so that what binds or dials it inside the VM
//     reaches the VM (a hostNetwork probe at the node IP, a tunnel bound to it);
//   - in table ip guestnet, a DNAT of what arrives on the uplink for the VM address to the
//     node IP, so that what the pod's NAT delivered to 10.0.2.2 reaches the VM's sockets as
//     addressed to the node IP (the guest CNI's tunnel, the kubelet's serving certificate);
//   - and a SNAT of what leaves on the uplink from the node IP to the VM address, which the
//     pod's masquerade then turns back into the pod IP (a tunnel sourced from the node IP
//     would otherwise be dropped as a martian by the pod's namespace).
//
// DHCP (udp 68) is left out of the DNAT: the VM's DHCP client talks to KubeVirt's server
// at the VM address.
const (
	// TableName is the nftables table of family ip the agent owns, whole.
	TableName = "guestnet"
	// LoopbackLabel marks the addresses the agent put on lo (an IPv4 label must start with
	// the interface's name).
	LoopbackLabel = "lo:guestnet"
	// dhcpClientPort is where KubeVirt's DHCP server answers the VM (and renews it).
	dhcpClientPort = 68
)

// Kernel is the state the agent wants: NodeIP (IPv4) as a local address of the VM and the
// uplink's VM address translated to it and back.
type Kernel struct {
	// NodeIP is the Node's IPv4 InternalIP: the virt-launcher pod IP.
	NodeIP net.IP
	// Uplink is the interface of the default route, and VMAddress its IPv4 address (KubeVirt's
	// masquerade address, 10.0.2.2 unless the VMI's vmNetworkCIDR says otherwise).
	Uplink    string
	VMAddress net.IP
}

// String renders k for logs.
func (k Kernel) String() string {
	return fmt.Sprintf("node IP %s on lo; %s on %s translated to it and back", k.NodeIP, k.VMAddress, k.Uplink)
}

// Uplink finds the interface of the IPv4 default route and its first global IPv4 address.
func Uplink() (name string, addr net.IP, err error) {
	routes, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return "", nil, fmt.Errorf("listing routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil && (!r.Dst.IP.IsUnspecified() || !isZeroMask(r.Dst.Mask)) {
			continue
		}
		link, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			return "", nil, fmt.Errorf("the default route's link: %w", err)
		}
		addrs, err := netlink.AddrList(link, unix.AF_INET)
		if err != nil {
			return "", nil, fmt.Errorf("addresses of %s: %w", link.Attrs().Name, err)
		}
		for _, a := range addrs {
			if a.Scope == unix.RT_SCOPE_UNIVERSE {
				return link.Attrs().Name, a.IP.To4(), nil
			}
		}
		return "", nil, fmt.Errorf("the default route's interface %s has no IPv4 address", link.Attrs().Name)
	}
	return "", nil, errors.New("no IPv4 default route: cannot tell the VM's uplink")
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

// Apply makes the kernel of the current network namespace hold k, and nothing else of the
// agent's: other node IPs on lo with the agent's label go, the table is replaced whole in one
// transaction (conntrack entries stay). It changes nothing when the kernel holds k already.
func (k Kernel) Apply() (changed bool, err error) {
	if k.NodeIP.To4() == nil || k.VMAddress.To4() == nil || k.Uplink == "" {
		return false, fmt.Errorf("incomplete kernel state: %s", k)
	}
	if k.NodeIP.Equal(k.VMAddress) {
		return false, fmt.Errorf("the node IP %s is the VM's own address: nothing to translate (not a masquerade VM?)", k.NodeIP)
	}
	lo, kept, changed, err := takeOffLoopback(k.NodeIP)
	if err != nil {
		return changed, err
	}
	if !kept {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: k.NodeIP.To4(), Mask: net.CIDRMask(32, 32)}, Label: LoopbackLabel, Scope: unix.RT_SCOPE_HOST}
		if err := netlink.AddrAdd(lo, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return changed, fmt.Errorf("adding %s to lo: %w", k.NodeIP, err)
		}
		changed = true
	}
	c, err := nftables.New()
	if err != nil {
		return changed, err
	}
	want := tableRules(k)
	have, err := currentRules(c)
	if err != nil {
		return changed, err
	}
	if slices.Equal(have, ruleTexts(want)) {
		return changed, nil
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	// add + delete + add: replaces the table whether or not it existed, atomically.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: chainPriorities["prerouting"]})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: chainPriorities["postrouting"]})
	for _, r := range want {
		chain := pre
		if r.chain == post.Name {
			chain = post
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: r.exprs, UserData: []byte(r.text)})
	}
	if err := c.Flush(); err != nil {
		return changed, fmt.Errorf("writing nftables table ip %s: %w", TableName, err)
	}
	return true, nil
}

// RemoveFromKernel takes off everything the agent put in the kernel of the current network namespace.
func RemoveFromKernel() (changed bool, err error) {
	_, _, changed, err = takeOffLoopback(nil)
	if err != nil {
		return changed, err
	}
	c, err := nftables.New()
	if err != nil {
		return changed, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return changed, err
	}
	for _, t := range tables {
		if t.Name == TableName {
			c.DelTable(t)
			if err := c.Flush(); err != nil {
				return changed, fmt.Errorf("deleting nftables table ip %s: %w", TableName, err)
			}
			changed = true
		}
	}
	return changed, nil
}

// takeOffLoopback removes from lo every address with the agent's label but keep (nil: all),
// and says whether keep was there.
func takeOffLoopback(keep net.IP) (lo netlink.Link, kept, changed bool, err error) {
	if lo, err = netlink.LinkByName("lo"); err != nil {
		return nil, false, false, err
	}
	ours, err := loopbackAddresses(lo)
	if err != nil {
		return lo, false, false, err
	}
	for _, a := range ours {
		if keep != nil && a.IP.Equal(keep) {
			kept = true
			continue
		}
		if err := netlink.AddrDel(lo, &a); err != nil {
			return lo, kept, changed, fmt.Errorf("removing %s from lo: %w", a.IP, err)
		}
		changed = true
	}
	return lo, kept, changed, nil
}

// loopbackAddresses lists the addresses on lo that carry the agent's label.
func loopbackAddresses(lo netlink.Link) ([]netlink.Addr, error) {
	addrs, err := netlink.AddrList(lo, unix.AF_INET)
	if err != nil {
		return nil, fmt.Errorf("addresses of lo: %w", err)
	}
	var ours []netlink.Addr
	for _, a := range addrs {
		if a.Label == LoopbackLabel {
			ours = append(ours, a)
		}
	}
	return ours, nil
}

// rule is one rule of the agent's table: its chain, its expressions and a text that says what
// it does, stored with it (the rule's user data, as nft stores a comment) so that the agent can
// tell whether the kernel holds what it wants without decoding expressions back.
type rule struct {
	chain string
	text  string
	exprs []expr.Any
}

// tableRules are the rules of the agent's table for k, in order.
func tableRules(k Kernel) []rule {
	return []rule{
		{"prerouting", fmt.Sprintf("iifname %s ip daddr %s udp dport %d accept", k.Uplink, k.VMAddress, dhcpClientPort), dhcpExemptExprs(k)},
		{"prerouting", fmt.Sprintf("iifname %s ip daddr %s dnat to %s", k.Uplink, k.VMAddress, k.NodeIP), dnatExprs(k)},
		{"postrouting", fmt.Sprintf("oifname %s ip saddr %s snat to %s", k.Uplink, k.NodeIP, k.VMAddress), snatExprs(k)},
	}
}

// ruleTexts renders rules as the kernel gives them back: "<chain>: <text>", chains in
// prerouting, postrouting order.
func ruleTexts(rules []rule) []string {
	out := make([]string, 0, len(rules)+len(chainPriorities))
	for _, name := range []string{"prerouting", "postrouting"} {
		out = append(out, priorityText(name, *chainPriorities[name]))
	}
	for _, r := range rules {
		out = append(out, r.chain+": "+r.text)
	}
	return out
}

// chainPriorities: the agent's chains run just after the dstnat and srcnat chains of the
// guest's kube-proxy (iptables or nftables mode) and of anything else at the standard NAT
// priorities. Linux translates a connection's destination once: the first NAT chain that
// does it wins and the later ones are skipped (nf_nat_inet_fn). Running after kube-proxy
// lets a nodePort arriving at the masquerade address reach the Service's pod (kube-proxy
// translates it), instead of being sent to the node IP, where nothing listens on a nodePort.
var chainPriorities = map[string]*nftables.ChainPriority{
	"prerouting":  nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest + 10),
	"postrouting": nftables.ChainPriorityRef(*nftables.ChainPriorityNATSource + 10),
}

func priorityText(chain string, p nftables.ChainPriority) string {
	return fmt.Sprintf("%s: (chain priority %d)", chain, p)
}

// currentRules reads the texts of the agent's table back (nil when it does not exist).
func currentRules(c *nftables.Conn) ([]string, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables: %w", err)
	}
	i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == TableName })
	if i < 0 {
		return nil, nil
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("listing nftables chains: %w", err)
	}
	var out []string
	for _, name := range []string{"prerouting", "postrouting"} {
		text := name + ": (no chain)"
		for _, ch := range chains {
			if ch.Table.Name == TableName && ch.Name == name && ch.Priority != nil {
				text = priorityText(name, *ch.Priority)
			}
		}
		out = append(out, text)
	}
	for _, name := range []string{"prerouting", "postrouting"} {
		rules, err := c.GetRules(tables[i], &nftables.Chain{Name: name, Table: tables[i]})
		if err != nil {
			return append(out, name+": (unreadable)"), nil //nolint:nilerr // a missing chain: rewrite the table
		}
		for _, r := range rules {
			out = append(out, name+": "+string(r.UserData))
		}
	}
	return out, nil
}

// ifname is an interface name as nftables compares it (IFNAMSIZ, NUL-padded).
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// IPv4 header offsets of the source and destination addresses.
const (
	ipv4SrcOffset = 12
	ipv4DstOffset = 16
)

// dhcpExemptExprs: iifname <uplink> ip daddr <vm> udp dport 68 accept (no NAT for DHCP).
func dhcpExemptExprs(k Kernel) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(k.Uplink)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv4DstOffset, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: k.VMAddress.To4()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, dhcpClientPort}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// dnatExprs: iifname <uplink> ip daddr <vm> udp dport != 68 dnat to <node IP>.
func dnatExprs(k Kernel) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(k.Uplink)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv4DstOffset, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: k.VMAddress.To4()},
		&expr.Immediate{Register: 1, Data: k.NodeIP.To4()},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}

// snatExprs: oifname <uplink> ip saddr <node IP> snat to <vm>.
func snatExprs(k Kernel) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(k.Uplink)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv4SrcOffset, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: k.NodeIP.To4()},
		&expr.Immediate{Register: 1, Data: k.VMAddress.To4()},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}
