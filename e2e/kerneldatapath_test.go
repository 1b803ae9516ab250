package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// The kernel datapath is KubeVirt v1.9.0's masquerade binding, played by the kernel with
// KubeVirt's own nft rules (docs/lab.md, "The kernel datapath"), checked with real packets:
// a declared port reaches the VM, an undeclared one is refused by the virt-launcher pod's
// kernel (TCP RST, UDP ICMP port-unreachable; KubeVirt has no drop rule), inbound traffic
// keeps its source, the VM's outbound traffic leaves with the pod IP, over IPv4 and IPv6,
// and the pod's ruleset is exactly KubeVirt's.
func TestLab_KernelMasquerade(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)

	gc, err := l.CreateGuestCluster(ctx, uniqueName("kmasq"), "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, 10250, 30080}, UDPPorts: []int32{8473}})
	g.Expect(err).NotTo(HaveOccurred())
	start := time.Now()
	w, err := l.AddWorker(ctx, gc, "kmasq-a", "10.244.100.5", lab.DualStack())
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("dual-stack kernel worker added (namespaces, veths, %d nft runs, Pod and Node) in %s", len(w.NFTCommands()), time.Since(start).Round(time.Millisecond))
	g.Expect(w.OnKernelDatapath()).To(BeTrue())
	g.Expect(w.VMAddress).To(Equal("10.0.2.2"))
	g.Expect(w.IPv6()).To(Equal("fd00:10:244:100::5"))
	other, err := l.AddHostPod("10.244.101.9", true)
	g.Expect(err).NotTo(HaveOccurred())

	// In the VM: TCP servers on a declared and an undeclared port that answer with the
	// client's address as the VM sees it; UDP echo servers likewise.
	for _, port := range []int32{30080, 30081} {
		serveRemoteAddress(t, w, port)
	}
	for _, port := range []int{8473, 9999} {
		udpEchoInVM(t, w, port)
	}

	for _, family := range []struct{ name, pod, client, vm string }{
		{"IPv4", w.IP, other.IP, "10.0.2.2"},
		{"IPv6", w.IPv6(), other.IPv6, "fd10:0:2::2"},
	} {
		t.Run(family.name+": a declared TCP port reaches the VM", func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(remoteAddressSeenBy(ctx, dialLab, family.pod, 30080)).NotTo(BeEmpty())
		})
		t.Run(family.name+": an undeclared TCP port is refused by the pod, although the VM serves it", func(t *testing.T) {
			g := NewWithT(t)
			_, err := remoteAddressSeenBy(ctx, dialLab, family.pod, 30081)
			g.Expect(errors.Is(err, syscall.ECONNREFUSED)).To(BeTrue(), "want connection refused (RST), got %v", err)
		})
		t.Run(family.name+": a declared UDP port reaches the VM", func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(udpExchange(ctx, family.pod, 8473)).To(Equal("echo"))
		})
		t.Run(family.name+": an undeclared UDP port gets port-unreachable, although the VM serves it", func(t *testing.T) {
			g := NewWithT(t)
			_, err := udpExchange(ctx, family.pod, 9999)
			g.Expect(errors.Is(err, syscall.ECONNREFUSED)).To(BeTrue(), "want ICMP port-unreachable (ECONNREFUSED), got %v", err)
		})
		t.Run(family.name+": inbound keeps the client's address", func(t *testing.T) {
			g := NewWithT(t)
			seen, err := remoteAddressSeenBy(ctx, other.Dial, family.pod, 30080)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(seen).To(Equal(family.client))
		})
		t.Run(family.name+": the VM's outbound traffic is masqueraded to the pod IP", func(t *testing.T) {
			g := NewWithT(t)
			var ln net.Listener
			g.Expect(other.Do(func() (err error) { ln, err = net.Listen("tcp", net.JoinHostPort(family.client, "9000")); return err })).To(Succeed())
			defer ln.Close()
			accepted := make(chan string, 1)
			go func() {
				if c, err := ln.Accept(); err == nil {
					accepted <- hostOf(c.RemoteAddr())
					_ = c.Close()
				}
			}()
			c, err := w.DialFromVM(ctx, "tcp", net.JoinHostPort(family.client, "9000"))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(hostOf(c.LocalAddr())).To(Equal(family.vm), "inside, the VM is its masquerade address")
			_ = c.Close()
			g.Eventually(accepted).Should(Receive(Equal(family.pod)), "the other pod sees the VM's pod IP")
		})
	}

	t.Run("the pod's nat tables are KubeVirt v1.9.0's", func(t *testing.T) {
		g := NewWithT(t)
		for _, f := range []struct{ family, vm, gateway, loopback string }{
			{"ip", "10.0.2.2", "10.0.2.1", "127.0.0.1"},
			{"ip6", "fd10:0:2::2", "fd10:0:2::1", "::1"},
		} {
			cmd, err := w.InPod(ctx, "nft", "-j", "list", "table", f.family, "nat")
			g.Expect(err).NotTo(HaveOccurred())
			out, err := cmd.Output()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(renderNFT(t, out)).To(Equal(kubevirtNATTable(f.family, f.vm, f.gateway, f.loopback,
				[]string{"tcp 22", "tcp 10250", "tcp 30080", "udp 8473"})))
		}
	})
}

// kubevirtNATTable is the nat table KubeVirt v1.9.0 writes (docs/node-identity-research.md
// 1.2) for a VM interface declaring ports ("tcp 80"), as `nft -j list` shows it rendered by
// renderNFT: chains with their hooks and priorities, then each chain's rules in order (nft
// lists a one-element set as its element).
func kubevirtNATTable(family, vm, gateway, loopback string, ports []string) []string {
	out := []string{
		"chain prerouting: nat hook prerouting priority -100",
		"chain input: nat hook input priority 100",
		"chain output: nat hook output priority -100",
		"chain postrouting: nat hook postrouting priority 100",
		"chain KUBEVIRT_PREINBOUND",
		"chain KUBEVIRT_POSTINBOUND",
		"prerouting: iifname eth0 counter jump KUBEVIRT_PREINBOUND",
	}
	for _, p := range ports {
		proto, port, _ := strings.Cut(p, " ")
		out = append(out, fmt.Sprintf("output: %s daddr %s %s dport %s counter dnat to %s", family, loopback, proto, port, vm))
	}
	out = append(out,
		fmt.Sprintf("postrouting: %s saddr %s counter masquerade", family, vm),
		"postrouting: oifname k6t-eth0 counter jump KUBEVIRT_POSTINBOUND")
	for _, p := range ports {
		proto, port, _ := strings.Cut(p, " ")
		out = append(out, fmt.Sprintf("KUBEVIRT_PREINBOUND: %s dport %s counter dnat to %s", proto, port, vm))
	}
	for _, p := range ports {
		proto, port, _ := strings.Cut(p, " ")
		out = append(out, fmt.Sprintf("KUBEVIRT_POSTINBOUND: %s dport %s %s saddr %s counter snat to %s", proto, port, family, loopback, gateway))
	}
	return out
}

// renderNFT renders `nft -j list table` output as kubevirtNATTable writes it: chains, then
// rules (nft lists them chain by chain, in the order the chains were made), counters'
// values left out.
func renderNFT(t *testing.T, out []byte) []string {
	t.Helper()
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("nft -j: %v: %s", err, out)
	}
	var chains, rules []string
	for _, item := range doc.Nftables {
		if raw, ok := item["chain"]; ok {
			var c struct {
				Name, Type, Hook string
				Prio             *int
			}
			_ = json.Unmarshal(raw, &c)
			line := "chain " + c.Name
			if c.Hook != "" {
				line += fmt.Sprintf(": %s hook %s priority %d", c.Type, c.Hook, *c.Prio)
			}
			chains = append(chains, line)
		}
		if raw, ok := item["rule"]; ok {
			var r struct {
				Chain string
				Expr  []map[string]any
			}
			_ = json.Unmarshal(raw, &r)
			var words []string
			for _, e := range r.Expr {
				words = append(words, renderNFTExpr(e))
			}
			rules = append(rules, r.Chain+": "+strings.Join(words, " "))
		}
	}
	return append(chains, rules...)
}

func renderNFTExpr(e map[string]any) string {
	for kind, v := range e {
		m, _ := v.(map[string]any)
		switch kind {
		case "match":
			return renderNFTValue(m["left"]) + " " + renderNFTValue(m["right"])
		case "counter", "masquerade", "return":
			return kind
		case "jump":
			return "jump " + fmt.Sprint(m["target"])
		case "dnat", "snat":
			return kind + " to " + fmt.Sprint(m["addr"])
		}
		return fmt.Sprintf("%s %v", kind, v)
	}
	return ""
}

func renderNFTValue(v any) string {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Sprint(v)
	}
	if meta, ok := m["meta"].(map[string]any); ok {
		return fmt.Sprint(meta["key"])
	}
	if p, ok := m["payload"].(map[string]any); ok {
		return fmt.Sprintf("%v %v", p["protocol"], p["field"])
	}
	if set, ok := m["set"].([]any); ok {
		var elems []string
		for _, e := range set {
			elems = append(elems, fmt.Sprint(e))
		}
		return "{ " + strings.Join(elems, ", ") + " }"
	}
	return fmt.Sprint(v)
}

// dialLab dials from the lab namespace, i.e. from the host network.
func dialLab(ctx context.Context, network, address string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, network, address)
}

type dialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// serveRemoteAddress serves, in the worker's VM on port, the client's address as the VM
// sees it, one line per connection.
func serveRemoteAddress(t *testing.T, w *lab.Worker, port int32) {
	t.Helper()
	ln, err := w.ServeInVM(port)
	if err != nil {
		t.Fatalf("serving in VM %s: %v", w.Machine, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, hostOf(c.RemoteAddr())+"\n")
			_ = c.Close()
		}
	}()
}

// remoteAddressSeenBy connects with dial to a serveRemoteAddress server and returns what it saw.
func remoteAddressSeenBy(ctx context.Context, dial dialFunc, host string, port int32) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", net.JoinHostPort(host, fmt.Sprint(port)))
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// udpEchoInVM answers each datagram to port in the worker's VM with "echo".
func udpEchoInVM(t *testing.T, w *lab.Worker, port int) {
	t.Helper()
	var pc net.PacketConn
	if err := w.DoInVM(func() (err error) { pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", port)); return err }); err != nil {
		t.Fatalf("UDP server in VM %s: %v", w.Machine, err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte("echo"), from)
		}
	}()
}

// udpExchange sends a datagram from the lab namespace to host:port on a connected socket and
// returns the answer; an ICMP port-unreachable shows as ECONNREFUSED.
func udpExchange(ctx context.Context, host string, port int) (string, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "udp", net.JoinHostPort(host, fmt.Sprint(port)))
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

func hostOf(a net.Addr) string {
	h, _, _ := net.SplitHostPort(a.String())
	return h
}

// The field report's node-identity failures, reproduced with real packets on the kernel
// datapath (docs/node-identity-research.md 4.2): the guest apiserver cannot reach a kubelet
// whose Node says 10.0.2.2 (kubectl logs, exec), while the pod IP works; a hostNetwork probe
// from inside the VM at its node IP (the pod IP) is refused by the virt-launcher pod, and no
// process of the VM can even bind the node IP.
func TestLab_KernelDatapathNodeIdentityFailures(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)

	gc, err := l.CreateGuestCluster(ctx, uniqueName("knode"), "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, 10250, 30080}})
	g.Expect(err).NotTo(HaveOccurred())
	w, err := l.AddWorker(ctx, gc, uniqueName("knode"), "10.244.102.3", lab.OnKernelDatapath())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.ServeKubeletStandIn(lab.KubeletUsage{CPUCores: 0.1, MemoryBytes: 1 << 30})).To(Succeed())
	g.Expect(w.ServeMachineName(30080)).To(Succeed()) // a hostNetwork server (node-exporter, say)

	// The Node as the node-identity fix leaves it: InternalIP = the pod IP. The guest
	// apiserver reaches the kubelet.
	c, err := l.DialKubelet(ctx, w.Machine)
	g.Expect(err).NotTo(HaveOccurred())
	_ = c.Close()

	// As a kubelet without --node-ip registers itself behind masquerade: 10.0.2.2.
	setNodeInternalIP(t, l, w.Machine, lab.VMAddressMasquerade)
	_, err = l.DialKubelet(ctx, w.Machine)
	g.Expect(err).To(HaveOccurred(), "the guest apiserver cannot reach a kubelet at 10.0.2.2 (in production: a timeout)")
	t.Logf("kubectl logs-style dial of %s:10250: %v", lab.VMAddressMasquerade, err)

	// A probe from inside the VM at the node IP (= pod IP), at a declared port the VM serves:
	// the virt-launcher pod owns that address and refuses; at 10.0.2.2 it works.
	setNodeInternalIP(t, l, w.Machine, w.IP)
	_, err = l.DialNodeIPFromVM(ctx, w, 30080)
	g.Expect(errors.Is(err, syscall.ECONNREFUSED)).To(BeTrue(), "a probe at the node IP from inside the VM is refused, got %v", err)
	c, err = w.DialFromVM(ctx, "tcp", net.JoinHostPort(w.VMAddress, "30080"))
	g.Expect(err).NotTo(HaveOccurred(), "the server runs")
	_ = c.Close()
	g.Expect(lab.Get(ctx, w.IP, 30080)).To(Equal(w.Machine), "and answers from outside at the pod IP")
	err = w.DoInVM(func() error {
		ln, err := net.Listen("tcp", net.JoinHostPort(w.IP, "0"))
		if err == nil {
			_ = ln.Close()
		}
		return err
	})
	g.Expect(errors.Is(err, syscall.EADDRNOTAVAIL)).To(BeTrue(), "the node IP is no address of the VM: nothing there can bind it, got %v", err)
}

// The guest tunnel stand-in (the kernel's VXLAN on the guest's tunnel-port) crosses nodes
// exactly when the real kernel lets it: with the Nodes' InternalIPs = the pod IPs and the
// tunnel port declared on the VMs' interface; not with the InternalIPs the kubelets register
// behind masquerade (10.0.2.2), and not with the tunnel port undeclared (the virt-launcher
// pod answers the tunnel with port-unreachable, which VXLAN ignores: it looks silent).
func TestLab_GuestTunnelNeedsNodeIPsAndTheTunnelPort(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	guest := l.Guest.Client

	// The field report's Cilium: VXLAN on 8473.
	ciliumConfig := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "cilium-config"},
		Data: map[string]string{"tunnel-protocol": "vxlan", "tunnel-port": "8473"}}
	g.Expect(guest.Create(ctx, ciliumConfig)).To(Succeed())
	t.Cleanup(func() { deleteGuestObjects(t, l, ciliumConfig) })

	ns := uniqueName("tunnel")
	declared, err := l.CreateGuestCluster(ctx, ns, "declared", lab.WorkerTemplateOptions{Ports: []int32{22, 10250}, UDPPorts: []int32{8473}})
	g.Expect(err).NotTo(HaveOccurred())
	a, err := l.AddWorker(ctx, declared, ns+"-a", "10.244.103.1", lab.OnKernelDatapath())
	g.Expect(err).NotTo(HaveOccurred())
	b, err := l.AddWorker(ctx, declared, ns+"-b", "10.244.103.2", lab.OnKernelDatapath())
	g.Expect(err).NotTo(HaveOccurred())
	tunnel, err := l.StartGuestTunnel(ctx, a, b)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tunnel.Port).To(Equal(8473))

	reachable := func(from, to *lab.Worker) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return tunnel.Reachable(ctx, from, to)
	}
	// InternalIPs = pod IPs, port declared: cross-node traffic works, both ways.
	g.Expect(reachable(a, b)).To(Succeed())
	g.Expect(reachable(b, a)).To(Succeed())

	// The kubelets' own InternalIP behind masquerade: every tunnel endpoint is 10.0.2.2.
	setNodeInternalIP(t, l, a.Machine, lab.VMAddressMasquerade)
	setNodeInternalIP(t, l, b.Machine, lab.VMAddressMasquerade)
	g.Expect(tunnel.Sync(ctx)).To(Succeed())
	err = reachable(a, b)
	g.Expect(err).To(HaveOccurred(), "with InternalIP 10.0.2.2 the tunnel goes nowhere")
	t.Logf("overlay with InternalIPs 10.0.2.2: %v", err)

	// Back to the pod IPs: it works again (the failure was the addresses).
	setNodeInternalIP(t, l, a.Machine, a.IP)
	setNodeInternalIP(t, l, b.Machine, b.IP)
	g.Expect(tunnel.Sync(ctx)).To(Succeed())
	g.Expect(reachable(a, b)).To(Succeed())

	// The same with the tunnel port undeclared on the VMs' interface.
	undeclared, err := l.CreateGuestCluster(ctx, ns, "undeclared", lab.WorkerTemplateOptions{Ports: []int32{22, 10250}})
	g.Expect(err).NotTo(HaveOccurred())
	c, err := l.AddWorker(ctx, undeclared, ns+"-c", "10.244.104.1", lab.OnKernelDatapath())
	g.Expect(err).NotTo(HaveOccurred())
	d, err := l.AddWorker(ctx, undeclared, ns+"-d", "10.244.104.2", lab.OnKernelDatapath())
	g.Expect(err).NotTo(HaveOccurred())
	tunnel2, err := l.StartGuestTunnel(ctx, c, d)
	g.Expect(err).NotTo(HaveOccurred())
	ctx5, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = tunnel2.Reachable(ctx5, c, d)
	g.Expect(err).To(HaveOccurred(), "an undeclared tunnel port: nothing crosses")
	t.Logf("overlay with 8473/UDP undeclared: %v", err)
}

// setNodeInternalIP sets the guest Node's InternalIP, as a kubelet (or a cloud-node
// controller) writes it.
func setNodeInternalIP(t *testing.T, l *lab.Lab, name, ip string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := l.Guest.Client.Get(context.Background(), client.ObjectKey{Name: name}, node); err != nil {
			return err
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
		return l.Guest.Client.Status().Update(context.Background(), node)
	})
	if err != nil {
		t.Fatalf("setting the InternalIP of guest Node %s: %v", name, err)
	}
}

// The KubeVirt stand-in on the kernel datapath: a VM gets a kernel worker whose pod IP is its
// virt-launcher Pod's status.podIP and its VMI's interface address, with KubeVirt's rules for
// the VMI's ports; when the Pod goes the VM restarts with a new pod (a new IP; the old one
// answers nothing any more); when the VM goes everything goes.
func TestLab_KubeVirtStandInOnTheKernelDatapath(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	host := l.Host.Client
	ns := uniqueName("kvkernel")
	g.Expect(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	kv, err := l.StartKubeVirtStandIn(ctx, ns, lab.KubeVirtOptions{
		WorkerSubnet: "10.244.105.0/24", KernelDatapath: true,
		OnBoot: func(_ context.Context, w *lab.Worker) error { return w.ServeMachineName(30080) },
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kv.Stop)

	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm-0"},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
					Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
					Ports: []kubevirtv1.Port{{Port: 30080}},
				}}}},
				Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
			}},
		},
	}
	g.Expect(host.Create(ctx, vm)).To(Succeed())

	// running returns the VM's pod IP once its Pod, VMI and kernel worker agree on it.
	running := func(g Gomega) *lab.Worker {
		pods := &corev1.PodList{}
		g.Expect(host.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher"})).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(1))
		pod := pods.Items[0]
		g.Expect(pod.DeletionTimestamp).To(BeNil())
		g.Expect(pod.Annotations).To(HaveKeyWithValue(kubevirtv1.MigrationTransportUnixAnnotation, "true"))
		vmi := &kubevirtv1.VirtualMachineInstance{}
		g.Expect(host.Get(ctx, client.ObjectKeyFromObject(vm), vmi)).To(Succeed())
		g.Expect(vmi.Status.Phase).To(Equal(kubevirtv1.Running))
		g.Expect(vmi.Status.MigrationTransport).To(Equal(kubevirtv1.MigrationTransportUnix))
		g.Expect(vmi.Status.Interfaces).To(HaveLen(1))
		g.Expect(vmi.Status.Interfaces[0].IP).To(Equal(pod.Status.PodIP))
		g.Expect(kv.Workers()).To(HaveLen(1))
		w := kv.Workers()[0]
		g.Expect(w.Pod).To(Equal(pod.Name))
		g.Expect(w.IP).To(Equal(pod.Status.PodIP))
		g.Expect(w.OnKernelDatapath()).To(BeTrue())
		g.Expect(lab.Get(ctx, w.IP, 30080)).To(Equal("vm-0"))
		return w
	}
	var first *lab.Worker
	g.Eventually(func(g Gomega) { first = running(g) }).WithTimeout(time.Minute).Should(Succeed())
	g.Expect(first.IP).To(Equal("10.244.105.1"))
	g.Expect(strings.Join(first.NFTCommands()[10], " ")).To(Equal("add rule ip nat KUBEVIRT_PREINBOUND tcp dport { 30080 } counter dnat to 10.0.2.2"))

	// The virt-launcher Pod goes: the VM comes back in a new pod with the next IP.
	g.Expect(host.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: first.Pod}})).To(Succeed())
	var second *lab.Worker
	g.Eventually(func(g Gomega) {
		second = running(g)
		g.Expect(second.IP).NotTo(Equal(first.IP))
	}).WithTimeout(time.Minute).Should(Succeed())
	g.Expect(second.IP).To(Equal("10.244.105.2"))
	_, err = lab.Get(ctx, first.IP, 30080)
	g.Expect(err).To(HaveOccurred(), "the old pod IP is gone with its pod")

	// The VM goes: its VMI, its pod and its datapath go.
	g.Expect(host.Delete(ctx, vm)).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := host.Get(ctx, client.ObjectKeyFromObject(vm), &kubevirtv1.VirtualMachine{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
		pods := &corev1.PodList{}
		g.Expect(host.List(ctx, pods, client.InNamespace(ns))).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty())
		g.Expect(kv.Workers()).To(BeEmpty())
	}).WithTimeout(time.Minute).Should(Succeed())
	_, err = lab.Get(ctx, second.IP, 30080)
	g.Expect(err).To(HaveOccurred(), "a deleted VM answers nothing")
	_, err = os.Stat(l.Dir + "/kernel/10-244-105-2-vm.netns")
	g.Expect(os.IsNotExist(err)).To(BeTrue(), "its network namespace is released: %v", err)
}
