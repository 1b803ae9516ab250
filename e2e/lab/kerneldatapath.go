package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The kernel datapath plays KubeVirt's masquerade binding with the Linux kernel, as KubeVirt
// v1.9.0 builds it in a virt-launcher pod (docs/node-identity-research.md, 1.1 to 1.3), all
// inside the lab's network namespace (hack/labns), per worker VM:
//
//	lab namespace                 pod namespace (virt-launcher)             VM namespace
//	bridge lab-pods  <- veth ->   eth0 = pod IP, default via gateway
//	10.244.X.254/24               k6t-eth0 10.0.2.1/24 (02:00:00:00:00:00)
//	(route in table local)          tap0 (veth)          <- veth ->        eth0 10.0.2.2/24
//	                              ip_forward, route_localnet on k6t-eth0   default via 10.0.2.1
//	                              KubeVirt's nft table ip nat (and ip6)
//
// Where KubeVirt has a tap and QEMU, the lab has a veth pair; the VM's guest kernel is a
// network namespace; DHCP is replaced by static addresses. Netfilter, routing and the
// kernel's answers (RST, ICMP port-unreachable) are the real ones: an undeclared port is
// refused by the pod's kernel, as in production.

// KubeVirt v1.9.0's constants of the masquerade binding.
const (
	// kubevirtVMCIDR and kubevirtVMCIDR6 are the defaults of a pod network's vmNetworkCIDR
	// and vmIPv6NetworkCIDR (pkg/virt-launcher/virtwrap/api/defaults.go DefaultVMCIDR,
	// DefaultVMIpv6CIDR): the gateway is the first host address, the VM the second
	// (pkg/network/setup/netpod/netpod.go gatewayIP; masquerade.go guestIPByGatewayInterface).
	kubevirtVMCIDR  = "10.0.2.0/24"
	kubevirtVMCIDR6 = "fd10:0:2::/120"
	// kubevirtBridgeMAC is the masquerade bridge's MAC (pkg/network/link/mac.go
	// StaticMasqueradeBridgeMAC).
	kubevirtBridgeMAC = "02:00:00:00:00:00"
	// kubevirtPodIface is the pod's primary interface; the bridge is "k6t-" + its name and the
	// tap of the primary interface is tap0 (pkg/network/link/names.go GenerateBridgeName,
	// GenerateTapDeviceName).
	kubevirtPodIface = "eth0"
	kubevirtBridge   = "k6t-" + kubevirtPodIface
	kubevirtTap      = "tap0"
	// kubevirtMigrationPorts are libvirt's direct and block migration ports, kept out of the
	// NAT for VMIs whose migration transport is not Unix (masquerade.go WithLegacyMigrationPorts).
	kubevirtMigrationPortDirect = 49152
	kubevirtMigrationPortBlock  = 49153
)

// VMAddressMasquerade is the address every VM has behind KubeVirt's masquerade binding
// (with the default vmNetworkCIDR), and VMAddressMasquerade6 its IPv6 one.
const (
	VMAddressMasquerade  = "10.0.2.2"
	VMAddressMasquerade6 = "fd10:0:2::2"
)

// The lab's host pod network: one bridge in the lab namespace, with a gateway address per
// /24 of kernel workers.
const (
	hostPodBridge = "lab-pods"
	// hostPodGatewayHost is the last byte of each /24's gateway on the bridge.
	hostPodGatewayHost = 254
)

// nftCommand is one run of the nft binary: its arguments, as KubeVirt's NFTBin passes them
// (pkg/network/driver/nft/nft.go: `nft add table|chain|rule <family> <table> ...`).
type nftCommand []string

// kubevirtMasqueradeNFT returns, in order, the nft commands KubeVirt v1.9.0's masquerade
// binding runs in the virt-launcher pod for one IP family ("ip" or "ip6") and the VMI's
// masquerade interface iface: pkg/network/setup/netpod/masquerade/masquerade.go,
// MasqPod.setupNATByFamily (commit 79d34c17), without Istio (its rules differ; not our
// case) and with the PortRangesSpec feature gate off (alpha, off by default: portRanges are
// ignored, so an interface with only portRanges forwards every port, as in KubeVirt).
// legacyMigrationPorts is true for a VMI whose status.migrationTransport is not Unix
// (pkg/network/setup/netconf.go newMasqueradeAdapter); virt-controller sets Unix on every VMI
// it schedules (pkg/virt-controller/watch/vmi/lifecycle.go).
func kubevirtMasqueradeNFT(family, podIface, bridge string, gateway, vm net.IP, iface kubevirtv1.Interface, legacyMigrationPorts bool) []nftCommand {
	const table = "nat"
	loopback := "127.0.0.1"
	if family == "ip6" {
		loopback = net.IPv6loopback.String()
	}
	guest, gw := vm.String(), gateway.String()
	add := func(args ...string) nftCommand { return append(nftCommand{"add"}, args...) }
	rule := func(chain string, spec ...string) nftCommand {
		return add(append([]string{"rule", family, table, chain}, spec...)...)
	}
	cmds := []nftCommand{
		add("table", family, table),
		add("chain", family, table, "prerouting", "{ type nat hook prerouting priority -100; }"),
		add("chain", family, table, "input", "{ type nat hook input priority 100; }"),
		add("chain", family, table, "output", "{ type nat hook output priority -100; }"),
		add("chain", family, table, "postrouting", "{ type nat hook postrouting priority 100; }"),
		add("chain", family, table, "KUBEVIRT_PREINBOUND"),
		add("chain", family, table, "KUBEVIRT_POSTINBOUND"),
		rule("postrouting", family, "saddr", guest, "counter", "masquerade"),
		rule("prerouting", "iifname", podIface, "counter", "jump", "KUBEVIRT_PREINBOUND"),
		rule("postrouting", "oifname", bridge, "counter", "jump", "KUBEVIRT_POSTINBOUND"),
	}
	if legacyMigrationPorts {
		ports := fmt.Sprintf("{ %d, %d }", kubevirtMigrationPortDirect, kubevirtMigrationPortBlock)
		cmds = append(cmds,
			rule("output", "tcp", "dport", ports, family, "saddr", loopback, "counter", "return"),
			rule("KUBEVIRT_POSTINBOUND", "tcp", "dport", ports, family, "saddr", loopback, "counter", "return"))
	}
	loopbackSet := "{ " + loopback + " }"
	for _, p := range iface.Ports {
		protocol := strings.ToLower(p.Protocol)
		if protocol == "" {
			protocol = "tcp"
		}
		port := strconv.Itoa(int(p.Port))
		cmds = append(cmds,
			rule("KUBEVIRT_PREINBOUND", protocol, "dport", "{ "+port+" }", "counter", "dnat", "to", guest),
			rule("KUBEVIRT_POSTINBOUND", protocol, "dport", port, family, "saddr", loopbackSet, "counter", "snat", "to", gw),
			rule("output", family, "daddr", loopbackSet, protocol, "dport", port, "counter", "dnat", "to", guest))
	}
	if len(iface.Ports) == 0 {
		cmds = append(cmds,
			rule("KUBEVIRT_PREINBOUND", "counter", "dnat", "to", guest),
			rule("KUBEVIRT_POSTINBOUND", family, "saddr", loopbackSet, "counter", "snat", "to", gw),
			rule("output", family, "daddr", loopbackSet, "counter", "dnat", "to", guest))
	}
	return cmds
}

// masqueradeGateway returns the gateway and VM addresses of a VM CIDR (vmNetworkCIDR or
// vmIPv6NetworkCIDR; def when empty): its first and second host addresses.
func masqueradeGateway(cidr, def string) (gateway, vm net.IP, prefix int, err error) {
	if cidr == "" {
		cidr = def
	}
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("VM network CIDR %q: %w", cidr, err)
	}
	prefix, bits := n.Mask.Size()
	if prefix > bits-2 {
		return nil, nil, 0, fmt.Errorf("VM network CIDR %q is too small", cidr)
	}
	gateway, vm = nextIP(n.IP), nextIP(nextIP(n.IP))
	return gateway, vm, prefix, nil
}

func nextIP(ip net.IP) net.IP {
	out := append(net.IP(nil), ip...)
	for i := len(out) - 1; i >= 0; i-- {
		out[i]++
		if out[i] != 0 {
			break
		}
	}
	return out
}

// hostPodNetwork is the lab's host pod network: the bridge lab-pods in the lab namespace, made
// on first use, and the /24s of kernel workers attached to it. The lab namespace makes all of
// 10.244.0.0/16 local (hack/labns); an attached /24 gets a route to the bridge in table local
// too, longer, so it wins: its addresses are the pods', not the lab namespace's. The lab
// namespace routes between the /24s (forwarding on; it has no other interface).
type hostPodNetwork struct {
	mu      sync.Mutex
	up      bool
	subnets map[string]bool // "10.244.X.0/24"
	veths   map[string]bool // the pods' veths on the bridge, by name
}

// NetworkInterfaces are the interfaces of the lab's network namespace: lo, and once kernel
// workers or host pods exist, the host pod network's bridge and the veths of its pods, and
// while MetalLB runs its uplink (MetalLBUplink), each leading to a namespace the lab created.
// Nothing else may be there.
func (l *Lab) NetworkInterfaces() []string {
	out := []string{"lo"}
	p := &l.podNet
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up {
		out = append(out, hostPodBridge)
	}
	for v := range p.veths {
		out = append(out, v)
	}
	return out
}

func (p *hostPodNetwork) track(veth string, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.veths == nil {
		p.veths = map[string]bool{}
	}
	if add {
		p.veths[veth] = true
	} else {
		delete(p.veths, veth)
	}
}

// podSubnetOf returns the /24 of a kernel worker's pod IP, or why it cannot be one.
func podSubnetOf(ip net.IP) (*net.IPNet, error) {
	ip4 := ip.To4()
	if ip4 == nil || !mustParseCIDR("10.244.0.0/17").Contains(ip4) || ip4[2] == 0 {
		return nil, fmt.Errorf("kernel worker pod IP %s: must be in 10.244.1.0-10.244.127.255 (the lab's host pod IPs; 10.244.0.0/24 holds the control planes)", ip)
	}
	if ip4[3] == 0 || ip4[3] >= hostPodGatewayHost {
		return nil, fmt.Errorf("kernel worker pod IP %s: .0, .254 and .255 of a /24 are the network, the gateway and the broadcast", ip)
	}
	return &net.IPNet{IP: ip4.Mask(net.CIDRMask(24, 32)), Mask: net.CIDRMask(24, 32)}, nil
}

// podIPv6 is the IPv6 address the lab gives a pod next to its IPv4 one: fd00:10:244:X::Y for
// 10.244.X.Y (the numbers read as written).
func podIPv6(ip4 net.IP) string {
	ip4 = ip4.To4()
	return fmt.Sprintf("fd00:10:244:%d::%d", ip4[2], ip4[3])
}

func podGateways(subnet *net.IPNet) (v4, v6 string) {
	gw := append(net.IP(nil), subnet.IP.To4()...)
	gw[3] = hostPodGatewayHost
	return gw.String(), podIPv6(gw)
}

// attachPodSubnet makes the /24 of ip part of the host pod network (once), after checking
// that no userspace worker of the lab has a pod IP there: those are local addresses of the
// lab namespace, which the /24's route would take away.
func (l *Lab) attachPodSubnet(ip net.IP) (*net.IPNet, error) {
	subnet, err := podSubnetOf(ip)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	for _, w := range l.workers {
		if w.kernel == nil && subnet.Contains(net.ParseIP(w.IP)) {
			l.mu.Unlock()
			return nil, fmt.Errorf("pod IP %s: worker %s of the userspace masquerade stand-in has pod IP %s in %s: a /24 is either on the kernel datapath or not", ip, w.Machine, w.IP, subnet)
		}
	}
	l.mu.Unlock()
	p := &l.podNet
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subnets[subnet.String()] {
		return subnet, nil
	}
	if ok, why := InPrivateNetwork(); !ok {
		return nil, fmt.Errorf("refusing to build the host pod network outside the lab's namespace: %s", why)
	}
	var cmds []string
	if !p.up {
		// No duplicate address detection on the links to come (see newNetNamespace).
		if err := writeSysctls("0", "ipv6/conf/all/accept_dad", "ipv6/conf/default/accept_dad"); err != nil {
			return nil, err
		}
		cmds = append(cmds, "link add "+hostPodBridge+" type bridge", "link set "+hostPodBridge+" up")
	}
	gw, gw6 := podGateways(subnet)
	cmds = append(cmds,
		"addr add "+gw+"/24 dev "+hostPodBridge,
		"route add "+subnet.String()+" dev "+hostPodBridge+" src "+gw+" table local",
		"addr add "+gw6+"/64 dev "+hostPodBridge+" nodad")
	if err := runIP(cmds...); err != nil {
		return nil, fmt.Errorf("host pod network: %w", err)
	}
	if !p.up {
		// Route between the /24s (and nothing else exists to route to); no redirects, the
		// pods' gateways are on one bridge on purpose.
		if err := writeSysctls("1", "ipv4/ip_forward", "ipv6/conf/all/forwarding"); err != nil {
			return nil, err
		}
		if err := writeSysctls("0", "ipv4/conf/all/send_redirects", "ipv4/conf/"+hostPodBridge+"/send_redirects"); err != nil {
			return nil, err
		}
		p.up = true
	}
	if p.subnets == nil {
		p.subnets = map[string]bool{}
	}
	p.subnets[subnet.String()] = true
	return subnet, nil
}

// onKernelSubnet reports whether ip is in a /24 attached to the host pod network.
func (l *Lab) onKernelSubnet(ip string) bool {
	subnet, err := podSubnetOf(net.ParseIP(ip))
	if err != nil {
		return false
	}
	l.podNet.mu.Lock()
	defer l.podNet.mu.Unlock()
	return l.podNet.subnets[subnet.String()]
}

// runIP runs ip commands in the lab namespace itself, in one `ip -batch`.
func runIP(commands ...string) error {
	cmd := exec.Command("ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(commands, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip: %w: %s", err, out)
	}
	return nil
}

func writeSysctls(value string, keys ...string) error {
	for _, k := range keys {
		if err := os.WriteFile("/proc/sys/net/"+k, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl net/%s: %w", k, err)
		}
	}
	return nil
}

// podNamespace is a host pod's network namespace on the host pod network: eth0 with its pod
// IP (and IPv6 address, when dual-stack), default routes to the /24's gateways on lab-pods.
type podNamespace struct {
	*netNamespace
	addr, addr6 string
	hostVeth    string
	net         *hostPodNetwork
}

// newPodNamespace creates the namespace <lab>/kernel/<name>.netns for a pod with ip.
func (l *Lab) newPodNamespace(name string, ip net.IP, dualStack bool) (_ *podNamespace, err error) {
	subnet, err := l.attachPodSubnet(ip)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(l.Dir, "kernel")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ns, err := newNetNamespace(dir, name)
	if err != nil {
		return nil, err
	}
	ip4 := ip.To4()
	p := &podNamespace{netNamespace: ns, addr: ip4.String(), hostVeth: fmt.Sprintf("lp%02x%02x%02x%02x", ip4[0], ip4[1], ip4[2], ip4[3]), net: &l.podNet}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	p.net.track(p.hostVeth, true)
	if err := runIP(
		"link add "+p.hostVeth+" type veth peer name "+kubevirtPodIface+" netns "+ns.path,
		"link set "+p.hostVeth+" master "+hostPodBridge,
		"link set "+p.hostVeth+" up",
	); err != nil {
		return nil, fmt.Errorf("pod %s: %w", name, err)
	}
	gw, gw6 := podGateways(subnet)
	cmds := []string{
		"addr add " + p.addr + "/24 dev " + kubevirtPodIface,
		"link set " + kubevirtPodIface + " up",
		"route add default via " + gw,
	}
	if dualStack {
		p.addr6 = podIPv6(ip4)
		cmds = append(cmds, "addr add "+p.addr6+"/64 dev "+kubevirtPodIface+" nodad", "route add ::/0 via "+gw6)
	}
	if err := ns.ip(cmds...); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *podNamespace) close() {
	p.netNamespace.close()
	// Deleting the namespace deletes its end of the veth and with it ours; a namespace still
	// held (a socket, a process) keeps it: cut the pod off the network at once.
	_ = runIP("link del " + p.hostVeth)
	p.net.track(p.hostVeth, false)
}

// kernelVM is one worker VM on the kernel datapath: its virt-launcher pod's namespace and the
// VM's own, joined as KubeVirt joins them, and KubeVirt's NAT rules in the pod's.
type kernelVM struct {
	pod *podNamespace
	vm  *netNamespace
	// vmAddr and gateway are the VM's masquerade address and its gateway (10.0.2.2 and
	// 10.0.2.1 by default); vmAddr6 and gateway6 their IPv6 ones when dual-stack.
	vmAddr, gateway, vmAddr6, gateway6 net.IP
	// nft are the nft commands applied in the pod's namespace, in order.
	nft []nftCommand

	mu        sync.Mutex
	listeners []net.Listener
}

// kernelVMSpec is what the kernel datapath of one VM is made from: the pod IP (the host pod
// network's IPAM) and the VMI's spec (its masquerade interface and pod network).
type kernelVMSpec struct {
	name      string
	podIP     net.IP
	dualStack bool
	vmi       *kubevirtv1.VirtualMachineInstanceSpec
	// legacyMigrationPorts: the VMI's status.migrationTransport is not Unix.
	legacyMigrationPorts bool
}

// startKernelVM builds the datapath of one VM (research 1.3): the pod namespace on the host
// pod network, the bridge k6t-eth0 with the gateway address and KubeVirt's MAC, forwarding
// and route_localnet, the veth pair tap0 <-> the VM namespace's eth0 (the VM address, default
// route via the gateway), and KubeVirt's nft rules, applied as KubeVirt applies them: one
// `nft` run per command, in the pod's namespace.
func (l *Lab) startKernelVM(spec kernelVMSpec) (_ *kernelVM, err error) {
	iface, network, ok := masqueradeInterface(spec.vmi)
	if !ok {
		return nil, fmt.Errorf("VM %s: no masquerade interface on the pod network", spec.name)
	}
	k := &kernelVM{}
	var prefix, prefix6 int
	if k.gateway, k.vmAddr, prefix, err = masqueradeGateway(network.Pod.VMNetworkCIDR, kubevirtVMCIDR); err != nil {
		return nil, err
	}
	if spec.dualStack {
		if k.gateway6, k.vmAddr6, prefix6, err = masqueradeGateway(network.Pod.VMIPv6NetworkCIDR, kubevirtVMCIDR6); err != nil {
			return nil, err
		}
	}
	base := strings.ReplaceAll(spec.podIP.String(), ".", "-")
	if k.pod, err = l.newPodNamespace(base+"-pod", spec.podIP, spec.dualStack); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			k.close()
		}
	}()
	dir := filepath.Join(l.Dir, "kernel")
	if k.vm, err = newNetNamespace(dir, base+"-vm"); err != nil {
		return nil, err
	}

	podCmds := []string{
		"link add " + kubevirtBridge + " type bridge",
		"link set " + kubevirtBridge + " address " + kubevirtBridgeMAC,
		fmt.Sprintf("addr add %s/%d dev %s", k.gateway, prefix, kubevirtBridge),
	}
	if spec.dualStack {
		podCmds = append(podCmds, fmt.Sprintf("addr add %s/%d dev %s nodad", k.gateway6, prefix6, kubevirtBridge))
	}
	podCmds = append(podCmds,
		"link set "+kubevirtBridge+" up",
		"link add "+kubevirtTap+" type veth peer name eth0 netns "+k.vm.path,
		"link set "+kubevirtTap+" master "+kubevirtBridge,
		"link set "+kubevirtTap+" up",
	)
	if err := k.pod.ip(podCmds...); err != nil {
		return nil, err
	}
	sysctls := []string{"ipv4/ip_forward", "ipv4/conf/" + kubevirtBridge + "/route_localnet"}
	if spec.dualStack {
		sysctls = append(sysctls, "ipv6/conf/all/forwarding")
	}
	if err := k.pod.sysctl("1", sysctls...); err != nil {
		return nil, err
	}
	vmCmds := []string{
		fmt.Sprintf("addr add %s/%d dev eth0", k.vmAddr, prefix),
		"link set eth0 up",
		"route add default via " + k.gateway.String(),
	}
	if spec.dualStack {
		vmCmds = append(vmCmds, fmt.Sprintf("addr add %s/%d dev eth0 nodad", k.vmAddr6, prefix6), "route add ::/0 via "+k.gateway6.String())
	}
	if err := k.vm.ip(vmCmds...); err != nil {
		return nil, err
	}

	k.nft = kubevirtMasqueradeNFT("ip", kubevirtPodIface, kubevirtBridge, k.gateway, k.vmAddr, iface, spec.legacyMigrationPorts)
	if spec.dualStack {
		k.nft = append(k.nft, kubevirtMasqueradeNFT("ip6", kubevirtPodIface, kubevirtBridge, k.gateway6, k.vmAddr6, iface, spec.legacyMigrationPorts)...)
	}
	for _, c := range k.nft {
		if _, err := k.pod.run("nft", c...); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// listenInVM listens on port (TCP) on every address of the VM, as a server on the VM's host
// network does (the kubelet binds every address): in the VM's namespace that is its eth0 and
// lo, nothing of the lab's.
func (k *kernelVM) listenInVM(port int32) (net.Listener, error) {
	var l net.Listener
	err := k.vm.do(func() (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(port))))
		return err
	})
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.listeners = append(k.listeners, l)
	k.mu.Unlock()
	return l, nil
}

// close shuts the VM down: its servers, its namespace, its pod's namespace (and veths).
func (k *kernelVM) close() {
	k.mu.Lock()
	for _, l := range k.listeners {
		_ = l.Close()
	}
	k.listeners = nil
	k.mu.Unlock()
	if k.vm != nil {
		k.vm.close()
	}
	if k.pod != nil {
		k.pod.close()
	}
}

// masqueradeInterface returns the VMI's masquerade interface on its pod network, and that
// network (KubeVirt binds the first masquerade interface, netpod.go lookupMasquradeBridge).
func masqueradeInterface(spec *kubevirtv1.VirtualMachineInstanceSpec) (kubevirtv1.Interface, kubevirtv1.Network, bool) {
	for _, n := range spec.Networks {
		if n.Pod == nil {
			continue
		}
		for _, iface := range spec.Domain.Devices.Interfaces {
			if iface.Name == n.Name && iface.Masquerade != nil {
				return iface, n, true
			}
		}
	}
	return kubevirtv1.Interface{}, kubevirtv1.Network{}, false
}

// errNotKernel: the worker is played by the userspace masquerade stand-in.
var errNotKernel = errors.New("the worker is not on the kernel datapath (KubeVirtOptions.KernelDatapath, lab.OnKernelDatapath)")

// OnKernelDatapath reports whether the worker's VM and virt-launcher pod are network
// namespaces with KubeVirt's NAT (true), or the userspace masquerade stand-in plays them.
func (w *Worker) OnKernelDatapath() bool { return w.kernel != nil }

// IPv6 is the worker's pod IPv6 address on a dual-stack kernel worker, "" otherwise.
func (w *Worker) IPv6() string {
	if w.kernel == nil {
		return ""
	}
	return w.kernel.pod.addr6
}

// VMAddress6 is the VM's IPv6 masquerade address on a dual-stack kernel worker, "" otherwise.
func (w *Worker) VMAddress6() string {
	if w.kernel == nil || w.kernel.vmAddr6 == nil {
		return ""
	}
	return w.kernel.vmAddr6.String()
}

// InVM returns the command that runs name with args inside the VM (its network namespace:
// the VM's host network), e.g. a server, an agent, or `ip addr` to look at it. The caller
// runs and ends it; sockets it holds keep the VM's namespace alive after the VM shut down,
// unreachable.
func (w *Worker) InVM(ctx context.Context, name string, args ...string) (*exec.Cmd, error) {
	if w.kernel == nil {
		return nil, errNotKernel
	}
	bin, argv := w.kernel.vm.command(name, args...)
	return exec.CommandContext(ctx, bin, argv...), nil
}

// InPod returns the command that runs name with args in the worker's virt-launcher pod
// (its network namespace), e.g. `nft list ruleset`.
func (w *Worker) InPod(ctx context.Context, name string, args ...string) (*exec.Cmd, error) {
	if w.kernel == nil {
		return nil, errNotKernel
	}
	bin, argv := w.kernel.pod.command(name, args...)
	return exec.CommandContext(ctx, bin, argv...), nil
}

// DoInVM runs f on a thread inside the VM's network namespace: sockets f creates (a UDP
// server, a dialer's connection) are the VM's.
func (w *Worker) DoInVM(f func() error) error {
	if w.kernel == nil {
		return errNotKernel
	}
	return w.kernel.vm.do(f)
}

// DoInPod runs f on a thread inside the virt-launcher pod's network namespace.
func (w *Worker) DoInPod(f func() error) error {
	if w.kernel == nil {
		return errNotKernel
	}
	return w.kernel.pod.do(f)
}

// DialFromVM connects to address over network ("tcp", "udp", ...) from inside the VM, as a
// process on the VM's host network does (a kubelet probe, a hostNetwork pod).
func (w *Worker) DialFromVM(ctx context.Context, network, address string) (net.Conn, error) {
	if w.kernel == nil {
		return nil, errNotKernel
	}
	return w.kernel.vm.dialNetwork(ctx, network, address)
}

// DialFromPod connects to address over network from inside the virt-launcher pod.
func (w *Worker) DialFromPod(ctx context.Context, network, address string) (net.Conn, error) {
	if w.kernel == nil {
		return nil, errNotKernel
	}
	return w.kernel.pod.dialNetwork(ctx, network, address)
}

// NFTCommands are the nft commands the worker's virt-launcher pod ran, in order, each as the
// arguments of one `nft` run (KubeVirt's masquerade rules, kubevirtMasqueradeNFT).
func (w *Worker) NFTCommands() [][]string {
	if w.kernel == nil {
		return nil
	}
	out := make([][]string, len(w.kernel.nft))
	for i, c := range w.kernel.nft {
		out[i] = append([]string(nil), c...)
	}
	return out
}

// HostPod is a pod of the host cluster on the lab's host pod network, with no Pod object and
// nothing running: a network namespace holding the pod IP (and its IPv6 address when
// dual-stack) on eth0, to dial from or serve in, as another workload of the host cluster
// would. Close it when done (the lab does at Stop).
type HostPod struct {
	ns *podNamespace
	// IP and IPv6 are its addresses.
	IP, IPv6 string
}

// AddHostPod creates a host pod with ip (in 10.244.1.0-10.244.127.253, a /24 that holds no
// userspace worker); dualStack adds its IPv6 address (fd00:10:244:X::Y for 10.244.X.Y).
func (l *Lab) AddHostPod(ip string, dualStack bool) (*HostPod, error) {
	parsed := net.ParseIP(ip)
	if parsed == nil {
		return nil, fmt.Errorf("host pod IP %q", ip)
	}
	ns, err := l.newPodNamespace(strings.ReplaceAll(ip, ".", "-")+"-hostpod", parsed, dualStack)
	if err != nil {
		return nil, err
	}
	p := &HostPod{ns: ns, IP: ns.addr, IPv6: ns.addr6}
	l.onStop(p.Close)
	return p, nil
}

// Dial connects to address over network from the host pod.
func (p *HostPod) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	return p.ns.dialNetwork(ctx, network, address)
}

// Do runs f on a thread inside the host pod's network namespace (a listener f creates is the pod's).
func (p *HostPod) Do(f func() error) error { return p.ns.do(f) }

// Close removes the host pod from the network.
func (p *HostPod) Close() { p.ns.close() }

// DialFromGuestAPIServer connects to address (TCP) the way the guest apiserver does for
// `kubectl logs`/`exec` (a connection to the kubelet at the Node's address): from the
// hosted control plane's pod, on the host network, with its pod IP as source. In
// production a dial of 10.0.2.2 from there times out (the host network routes it somewhere
// that never answers); in the lab namespace it has no route and fails at once.
func DialFromGuestAPIServer(ctx context.Context, address string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(GuestAPIServerAddress)}}
	return d.DialContext(ctx, "tcp", address)
}

// DialKubelet connects to the kubelet of a guest Node the way the guest apiserver does for
// `kubectl logs`, `exec` and `port-forward`: from the hosted control plane's pod, to the
// Node's InternalIP (the apiserver's first preferred address type, as k0s configures it:
// --kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname) on KubeletPort.
func (l *Lab) DialKubelet(ctx context.Context, node string) (net.Conn, error) {
	ip, err := l.guestNodeInternalIP(ctx, node)
	if err != nil {
		return nil, err
	}
	return DialFromGuestAPIServer(ctx, net.JoinHostPort(ip, strconv.Itoa(KubeletPort)))
}

// DialNodeIPFromVM connects from inside w's VM to port at the InternalIP of w's guest Node:
// what the kubelet's probe of a hostNetwork pod does (such a pod's IP is the node IP), and
// what any process of the VM does that dials its own node IP.
func (l *Lab) DialNodeIPFromVM(ctx context.Context, w *Worker, port int32) (net.Conn, error) {
	ip, err := l.guestNodeInternalIP(ctx, w.Machine)
	if err != nil {
		return nil, err
	}
	return w.DialFromVM(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(int(port))))
}

func (l *Lab) guestNodeInternalIP(ctx context.Context, name string) (string, error) {
	node := &corev1.Node{}
	if err := l.Guest.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return "", err
	}
	ip := nodeInternalIP(node)
	if ip == "" {
		return "", fmt.Errorf("guest Node %s has no InternalIP", name)
	}
	return ip, nil
}
