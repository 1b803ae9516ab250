package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The kernel load balancer plays, with nftables in the lab's network namespace, what Cilium
// v1.20.2's eBPF kube-proxy replacement does on the host node where a load-balancer IP's
// traffic enters (bpf/lib/nodeport.h nodeport_svc_lb4/6 and tail_nodeport_nat_egress_ipv4/6,
// bpf/lib/lb.h lb4_local, pkg/loadbalancer/writer/writer.go DefaultSelectBackends; the
// default loadBalancer.mode snat, native routing), for packets that come from the external
// network (ExternalClient) to a LoadBalancer Service's load-balancer IP:
//
//   - the frontend is each status.loadBalancer.ingress IP (IPv4 in LoadBalancerCIDR, IPv6 in
//     LoadBalancerCIDR6) and Service port; the backends are the ready endpoints of the
//     Service's real EndpointSlices of that family, at the EndpointSlice port named like the
//     Service port, on the kernel datapath (pod IPs behind the lab-pods bridge);
//   - externalTrafficPolicy Cluster: every backend; one on another host node than the entry
//     node (EndpointSlice nodeName) is reached with the client's address SNATed to the entry
//     node's address (IPV4_DIRECT_ROUTING: HostNodeAddress), one on the entry node keeps the
//     client's address (nodeport_svc_lb4: a local backend is delivered without SNAT);
//   - externalTrafficPolicy Local: only the backends on the entry node, never SNATed; with
//     none the frontend has no backend (writer.go keeps only node-local backends for the
//     external scope);
//   - a frontend without backends rejects with ICMP port unreachable: Cilium's defaults
//     (enable-no-service-endpoints-routable true, service-no-backend-response reject) send
//     tail_no_service_ipv4/6's ICMP port unreachable; a TCP client sees "connection refused";
//   - backends are picked at random per connection (Cilium's default algorithm is random
//     too; Maglev is an option).
//
// The entry node is the host node that the external network's traffic for load-balancer IPs
// reaches: the L2 announcement's lease holder, or the next hop a BGP router chose. The lab has
// one network namespace for every host node, so the entry node is a setting
// (KernelLoadBalancer.SetEntryNode) and not a place: announcements are not evaluated here.
// Traffic from the lab namespace itself (the host network: tests, the guest apiserver) does
// not enter through the external network: it stays with the Cilium stand-in's userspace
// proxy (Cilium's socket load balancer, to which externalTrafficPolicy does not apply).

// The lab's external network: the bridge lab-ext in the lab namespace, where clients outside
// the cluster live (documentation prefixes, nothing real), and every host node's address on it.
const (
	externalBridge = "lab-ext"
	// ExternalCIDR and ExternalCIDR6 are the external network's prefixes.
	ExternalCIDR  = "203.0.113.0/24"
	ExternalCIDR6 = "2001:db8:113::/64"
	// LoadBalancerCIDR6 is the lab's IPv6 load-balancer range: local in the lab namespace
	// once the external network is up. The lab's LB-IPAM is IPv4 only: a test sets an IPv6
	// status.loadBalancer.ingress itself.
	LoadBalancerCIDR6 = "fd00:10:98::/64"
	// kernelLBTable is the nftables table of the kernel load balancer (family inet).
	kernelLBTable = "cilium-lb-stand-in"
	// kernelLBSNATMark marks a connection's first packet for SNAT to the entry node's address.
	kernelLBSNATMark = "0x200"
	// firstExternalClientHost is the last byte (IPv4) of the first external client's address.
	firstExternalClientHost = 100
)

// HostNodeAddress returns a host node's IPv4 and IPv6 address on the external network: the
// address Cilium SNATs to on that node. The lab's host Node objects carry no address (the
// host-address tests read them); these are the lab's word for it.
func HostNodeAddress(node string) (v4, v6 string) {
	i := slices.Index(HostNodes, node)
	if i < 0 {
		return "", ""
	}
	return fmt.Sprintf("203.0.113.%d", i+1), fmt.Sprintf("2001:db8:113::%d", i+1)
}

// externalNetwork is the lab-ext bridge, made on first use.
type externalNetwork struct {
	mu      sync.Mutex
	up      bool
	clients int
}

// ensureExternalNetwork makes the bridge lab-ext with every host node's addresses, and the
// IPv6 load-balancer range local (the IPv4 one is, by hack/labns).
func (l *Lab) ensureExternalNetwork() error {
	e := &l.extNet
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.up {
		return nil
	}
	if ok, why := InPrivateNetwork(); !ok {
		return fmt.Errorf("refusing to build the external network outside the lab's namespace: %s", why)
	}
	if err := os.MkdirAll(filepath.Join(l.Dir, "kernel"), 0o700); err != nil {
		return err
	}
	if err := writeSysctls("0", "ipv6/conf/all/accept_dad", "ipv6/conf/default/accept_dad"); err != nil {
		return err
	}
	cmds := []string{"link add " + externalBridge + " type bridge", "link set " + externalBridge + " up"}
	for _, n := range HostNodes {
		v4, v6 := HostNodeAddress(n)
		cmds = append(cmds, "addr add "+v4+"/24 dev "+externalBridge, "addr add "+v6+"/64 dev "+externalBridge+" nodad")
	}
	cmds = append(cmds, "route add local "+LoadBalancerCIDR6+" dev lo table local")
	if err := runIP(cmds...); err != nil {
		return fmt.Errorf("external network: %w", err)
	}
	if err := writeSysctls("1", "ipv4/ip_forward", "ipv6/conf/all/forwarding"); err != nil {
		return err
	}
	l.podNet.track(externalBridge, true)
	e.up = true
	return nil
}

// ExternalClient is a client outside the host cluster: a network namespace on the external
// network with an address of ExternalCIDR (and ExternalCIDR6), its routes via the first host
// node's address. Close it when done (the lab does at Stop).
type ExternalClient struct {
	ns       *netNamespace
	hostVeth string
	// IP and IPv6 are its addresses.
	IP, IPv6 string
}

// AddExternalClient adds a client on the external network: 203.0.113.100 and
// 2001:db8:113::100 for the first, the next addresses for the next.
func (l *Lab) AddExternalClient() (_ *ExternalClient, err error) {
	if err := l.ensureExternalNetwork(); err != nil {
		return nil, err
	}
	l.extNet.mu.Lock()
	n := firstExternalClientHost + l.extNet.clients
	l.extNet.clients++
	l.extNet.mu.Unlock()
	if n > 250 {
		return nil, fmt.Errorf("too many external clients")
	}
	c := &ExternalClient{IP: fmt.Sprintf("203.0.113.%d", n), IPv6: fmt.Sprintf("2001:db8:113::%d", n), hostVeth: fmt.Sprintf("lx%d", n)}
	if c.ns, err = newNetNamespace(filepath.Join(l.Dir, "kernel"), fmt.Sprintf("external-client-%d", n)); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	l.podNet.track(c.hostVeth, true)
	if err := runIP(
		"link add "+c.hostVeth+" type veth peer name eth0 netns "+c.ns.path,
		"link set "+c.hostVeth+" master "+externalBridge,
		"link set "+c.hostVeth+" up",
	); err != nil {
		return nil, fmt.Errorf("external client: %w", err)
	}
	gw, gw6 := HostNodeAddress(HostNodes[0])
	if err := c.ns.ip(
		"addr add "+c.IP+"/24 dev eth0",
		"addr add "+c.IPv6+"/64 dev eth0 nodad",
		"link set eth0 up",
		"route add default via "+gw,
		"route add ::/0 via "+gw6,
	); err != nil {
		return nil, err
	}
	l.onStop(c.Close)
	return c, nil
}

// Dial connects to address over network from the external client.
func (c *ExternalClient) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	return c.ns.dialNetwork(ctx, network, address)
}

// Close takes the client off the external network.
func (c *ExternalClient) Close() {
	c.ns.close()
	_ = runIP("link del " + c.hostVeth)
}

// KernelLoadBalancer is the kernel load balancer (see above) for the host cluster's
// LoadBalancer Services. Stop it with Stop: its table goes with it.
type KernelLoadBalancer struct {
	*standIn
	lb *kernelLB
}

// StartKernelLoadBalancer starts the kernel load balancer with entryNode (one of HostNodes)
// as the node where external traffic enters; it logs to <lab>/kernel-lb-stand-in.log.
func (l *Lab) StartKernelLoadBalancer(ctx context.Context, entryNode string) (*KernelLoadBalancer, error) {
	if !slices.Contains(HostNodes, entryNode) {
		return nil, fmt.Errorf("entry node %q is not a host node (%v)", entryNode, HostNodes)
	}
	if err := l.ensureExternalNetwork(); err != nil {
		return nil, err
	}
	lb := &kernelLB{l: l, entry: entryNode}
	s, err := startStandIn(ctx, l, "kernel-lb-stand-in", l.Host.Config, func(mgr ctrl.Manager, logger logr.Logger) (func(), error) {
		lb.c, lb.log = mgr.GetClient(), logger
		all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "kernel-lb"}}}
		})
		if err := ctrl.NewControllerManagedBy(mgr).Named("kernel-lb-stand-in").
			Watches(&corev1.Service{}, all).
			Watches(&discoveryv1.EndpointSlice{}, all).
			Complete(lb); err != nil {
			return nil, err
		}
		return lb.remove, nil
	})
	if err != nil {
		return nil, err
	}
	return &KernelLoadBalancer{standIn: s, lb: lb}, nil
}

// SetEntryNode makes node the host node where external traffic enters, and rewrites the rules.
func (k *KernelLoadBalancer) SetEntryNode(ctx context.Context, node string) error {
	if !slices.Contains(HostNodes, node) {
		return fmt.Errorf("entry node %q is not a host node (%v)", node, HostNodes)
	}
	k.lb.mu.Lock()
	k.lb.entry = node
	k.lb.mu.Unlock()
	_, err := k.lb.Reconcile(ctx, reconcile.Request{})
	return err
}

// Ruleset returns the load balancer's table as nft lists it.
func (k *KernelLoadBalancer) Ruleset() (string, error) {
	out, err := exec.Command("nft", "list", "table", "inet", kernelLBTable).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft list table: %w: %s", err, out)
	}
	return string(out), nil
}

type kernelLB struct {
	l   *Lab
	c   client.Client
	log logr.Logger

	mu      sync.Mutex
	entry   string
	applied string
}

// lbFrontend is one load-balancer IP and port with its backends.
type lbFrontend struct {
	service  types.NamespacedName
	ip       netip.Addr
	protocol string // tcp, udp
	port     int32
	backends []lbBackend
}

type lbBackend struct {
	addr netip.AddrPort
	snat bool
}

// Reconcile renders the whole table from every Service and EndpointSlice and replaces it in
// one nft transaction when it changed.
func (r *kernelLB) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	services := &corev1.ServiceList{}
	if err := r.c.List(ctx, services); err != nil {
		return reconcile.Result{}, err
	}
	endpointSlices := &discoveryv1.EndpointSliceList{}
	if err := r.c.List(ctx, endpointSlices); err != nil {
		return reconcile.Result{}, err
	}
	var fes []lbFrontend
	for i := range services.Items {
		fes = append(fes, r.frontends(&services.Items[i], endpointSlices.Items)...)
	}
	table := renderKernelLB(r.entry, fes)
	if table == r.applied {
		return reconcile.Result{}, nil
	}
	if err := applyNFT(table); err != nil {
		return reconcile.Result{}, err
	}
	r.applied = table
	r.log.Info("Rules written", "entryNode", r.entry, "frontends", len(fes))
	return reconcile.Result{}, nil
}

// frontends are the Service's frontends with the backends the entry node uses.
func (r *kernelLB) frontends(svc *corev1.Service, eps []discoveryv1.EndpointSlice) []lbFrontend {
	if !isCiliumLoadBalancer(svc) {
		return nil
	}
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	var out []lbFrontend
	for _, in := range svc.Status.LoadBalancer.Ingress {
		ip, err := netip.ParseAddr(in.IP)
		if err != nil || (!netip.MustParsePrefix(LoadBalancerCIDR).Contains(ip) && !netip.MustParsePrefix(LoadBalancerCIDR6).Contains(ip)) {
			continue
		}
		family := discoveryv1.AddressTypeIPv4
		if ip.Is6() {
			family = discoveryv1.AddressTypeIPv6
		}
		for _, sp := range svc.Spec.Ports {
			fe := lbFrontend{service: client.ObjectKeyFromObject(svc), ip: ip, protocol: strings.ToLower(string(sp.Protocol)), port: sp.Port}
			if fe.protocol == "" {
				fe.protocol = "tcp"
			}
			for _, s := range eps {
				if s.Namespace != svc.Namespace || s.Labels[discoveryv1.LabelServiceName] != svc.Name || s.AddressType != family {
					continue
				}
				var target int32
				for _, p := range s.Ports {
					if ptr.Deref(p.Name, "") == sp.Name {
						target = ptr.Deref(p.Port, 0)
					}
				}
				if target == 0 {
					continue
				}
				for _, e := range s.Endpoints {
					if !ptr.Deref(e.Conditions.Ready, true) || len(e.Addresses) == 0 {
						continue
					}
					addr, err := netip.ParseAddr(e.Addresses[0])
					if err != nil || !r.l.onKernelPodNetwork(addr) {
						continue
					}
					onEntry := ptr.Deref(e.NodeName, "") == r.entry
					if local && !onEntry {
						continue
					}
					fe.backends = append(fe.backends, lbBackend{addr: netip.AddrPortFrom(addr, uint16(target)), snat: !onEntry})
				}
			}
			slicesSortBackends(fe.backends)
			out = append(out, fe)
		}
	}
	return out
}

func slicesSortBackends(bes []lbBackend) {
	slices.SortFunc(bes, func(a, b lbBackend) int { return a.addr.Compare(b.addr) })
}

// onKernelPodNetwork reports whether addr is a pod address behind the lab-pods bridge.
func (l *Lab) onKernelPodNetwork(addr netip.Addr) bool {
	if addr.Is4() {
		return l.onKernelSubnet(addr.String())
	}
	// fd00:10:244:X::Y is the IPv6 address of 10.244.X.Y, the numbers written as they read
	// (podIPv6): group 0x122 is X = 122.
	b := addr.As16()
	if !netip.MustParsePrefix("fd00:10:244::/48").Contains(addr) {
		return false
	}
	x, errX := strconv.Atoi(fmt.Sprintf("%x", uint16(b[6])<<8|uint16(b[7])))
	y, errY := strconv.Atoi(fmt.Sprintf("%x", uint16(b[14])<<8|uint16(b[15])))
	if errX != nil || errY != nil || podIPv6(net.IPv4(10, 244, byte(x), byte(y))) != addr.String() {
		return false
	}
	return l.onKernelSubnet(fmt.Sprintf("10.244.%d.%d", x, y))
}

// renderKernelLB renders the table for entry and the frontends, as an nft script that
// replaces it whole.
func renderKernelLB(entry string, fes []lbFrontend) string {
	v4, v6 := HostNodeAddress(entry)
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\ntable inet %s {\n", kernelLBTable, kernelLBTable, kernelLBTable)
	var pre, input, chains strings.Builder
	for i, fe := range fes {
		ipX := "ip"
		if fe.ip.Is6() {
			ipX = "ip6"
		}
		match := fmt.Sprintf("iifname %q %s daddr %s %s dport %d", externalBridge, ipX, fe.ip, fe.protocol, fe.port)
		comment := fmt.Sprintf("comment %q", fmt.Sprintf("%s:%d", fe.service, fe.port))
		if len(fe.backends) == 0 {
			// Not DNATed: delivered to the local load-balancer IP, rejected on input.
			fmt.Fprintf(&input, "\t\t%s counter reject with icmpx type port-unreachable %s\n", match, comment)
			continue
		}
		svcChain := fmt.Sprintf("svc-%d", i)
		fmt.Fprintf(&pre, "\t\t%s jump %s %s\n", match, svcChain, comment)
		var vmap []string
		for j, be := range fe.backends {
			beChain := fmt.Sprintf("%s-be-%d", svcChain, j)
			vmap = append(vmap, fmt.Sprintf("%d : jump %s", j, beChain))
			fmt.Fprintf(&chains, "\tchain %s {\n", beChain)
			if be.snat {
				fmt.Fprintf(&chains, "\t\tmeta mark set meta mark | %s\n", kernelLBSNATMark)
			}
			fmt.Fprintf(&chains, "\t\tmeta l4proto %s dnat %s to %s\n\t}\n", fe.protocol, ipX, be.addr)
		}
		fmt.Fprintf(&chains, "\tchain %s {\n\t\tnumgen random mod %d vmap { %s }\n\t}\n", svcChain, len(fe.backends), strings.Join(vmap, ", "))
	}
	b.WriteString(chains.String())
	fmt.Fprintf(&b, "\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n%s\t}\n", pre.String())
	fmt.Fprintf(&b, "\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n")
	fmt.Fprintf(&b, "\t\tmeta nfproto ipv4 meta mark & %s == %s snat ip to %s\n", kernelLBSNATMark, kernelLBSNATMark, v4)
	fmt.Fprintf(&b, "\t\tmeta nfproto ipv6 meta mark & %s == %s snat ip6 to %s\n\t}\n", kernelLBSNATMark, kernelLBSNATMark, v6)
	fmt.Fprintf(&b, "\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n%s\t}\n}\n", input.String())
	return b.String()
}

// applyNFT runs an nft script in the lab namespace, in one transaction.
func applyNFT(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s\n%s", err, out, script)
	}
	return nil
}

// remove deletes the table (on Stop).
func (r *kernelLB) remove() {
	_ = applyNFT(fmt.Sprintf("table inet %s\ndelete table inet %s\n", kernelLBTable, kernelLBTable))
}
