package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The guest tunnel stand-in plays the guest CNI's overlay between worker VMs of the kernel
// datapath with the kernel's own VXLAN device, so that cross-node pod traffic works exactly
// when the real kernel lets it (docs/node-identity-research.md 4.2, 8.3 step 3):
//
//   - per node, in its VM's namespace, a VXLAN device on the guest's tunnel port (the
//     `tunnel-port` of the guest's kube-system/cilium-config, else Cilium's VXLAN default
//     8472; read as Cilium reads it, not through guestnet's code), with no local address
//     (its socket is the wildcard, as Cilium's flow-based device: a packet the masquerade
//     DNATed to 10.0.2.2 is accepted), noudpcsum (Cilium sends no outer UDP checksum,
//     BPF_F_ZERO_CSUM_TX; with checksums no inner packet survives the lab's veths and two
//     NATs, research appendix B) and no learning;
//   - an overlay address per node, 10.245.<i>.1/16 in the guest pod CIDR, the i-th node of
//     the tunnel;
//   - forwarding entries towards each other node's tunnel endpoint: its guest Node's
//     InternalIP, read from the guest's Node objects by Sync, as Cilium's agents read their
//     peers' node IPs (from CiliumNodes, which the agents fill from the Nodes).
//
// What it leaves out, for the node-identity work (research 8.3 step 3): Cilium's agent per
// node that reads its node IP once at start and publishes it in a CiliumNode, and peers
// following CiliumNodes; here Sync re-reads every Node when the test says so. Geneve is not
// played. Each node also answers on its overlay address, port OverlayProbePort, with its
// name: Reachable dials it from another node over the overlay.

// GuestTunnel is a running guest tunnel stand-in between kernel workers (StartGuestTunnel).
type GuestTunnel struct {
	l *Lab
	// Port is the tunnel's UDP port (the guest's tunnel-port).
	Port int

	mu    sync.Mutex
	nodes []*tunnelNode
}

type tunnelNode struct {
	w       *Worker
	overlay net.IP
	peers   []string // the tunnel endpoints of its forwarding entries
}

const (
	// tunnelDevice is the VXLAN device in each VM (Cilium's is cilium_vxlan).
	tunnelDevice = "vxlan-guest"
	// tunnelVNI is the stand-in's VXLAN network identifier (Cilium's VNI carries the source
	// identity; one is enough here).
	tunnelVNI = 2
	// ciliumVXLANPort is Cilium's default VXLAN port (cilium-config tunnel-port unset).
	ciliumVXLANPort = 8472
	// OverlayProbePort is where each node of the tunnel answers on its overlay address with
	// its name (cilium-health's port).
	OverlayProbePort = 4240
)

// StartGuestTunnel builds the tunnel between the workers, which must be on the kernel
// datapath and have guest Nodes named after their machines, then syncs its forwarding
// entries with the Nodes' InternalIPs (Sync).
func (l *Lab) StartGuestTunnel(ctx context.Context, workers ...*Worker) (*GuestTunnel, error) {
	port, err := guestTunnelPort(ctx, l.Guest.Client)
	if err != nil {
		return nil, err
	}
	t, err := l.newGuestTunnel(port, workers...)
	if err != nil {
		return nil, err
	}
	return t, t.Sync(ctx)
}

// newGuestTunnel makes the VXLAN devices and overlay addresses, with no forwarding entry.
func (l *Lab) newGuestTunnel(port int, workers ...*Worker) (*GuestTunnel, error) {
	t := &GuestTunnel{l: l, Port: port}
	for i, w := range workers {
		if !w.OnKernelDatapath() {
			return nil, fmt.Errorf("guest tunnel: worker %s: %w", w.Machine, errNotKernel)
		}
		n := &tunnelNode{w: w, overlay: net.IPv4(10, 245, byte(i+1), 1).To4()}
		if err := w.kernel.vm.ip(
			fmt.Sprintf("link add %s type vxlan id %d dstport %d noudpcsum nolearning", tunnelDevice, tunnelVNI, port),
			fmt.Sprintf("addr add %s/16 dev %s", n.overlay, tunnelDevice),
			"link set "+tunnelDevice+" up",
		); err != nil {
			return nil, fmt.Errorf("guest tunnel on %s: %w", w.Machine, err)
		}
		if err := n.serveName(); err != nil {
			return nil, err
		}
		t.nodes = append(t.nodes, n)
	}
	return t, nil
}

// guestTunnelPort is the guest Cilium's tunnel port: kube-system/cilium-config's
// tunnel-port, else 8472 (VXLAN, Cilium's default protocol).
func guestTunnelPort(ctx context.Context, guest client.Client) (int, error) {
	cm := &corev1.ConfigMap{}
	switch err := guest.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "cilium-config"}, cm); {
	case apierrors.IsNotFound(err):
		return ciliumVXLANPort, nil
	case err != nil:
		return 0, err
	}
	if p := cm.Data["tunnel-protocol"]; p != "" && p != "vxlan" {
		return 0, fmt.Errorf("guest tunnel: cilium-config tunnel-protocol %q: the lab plays VXLAN only", p)
	}
	v := cm.Data["tunnel-port"]
	if v == "" || v == "0" {
		return ciliumVXLANPort, nil
	}
	port, err := strconv.Atoi(v)
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("guest tunnel: cilium-config tunnel-port %q", v)
	}
	return port, nil
}

// serveName answers each connection on the node's overlay address with the node's name.
func (n *tunnelNode) serveName() error {
	var l net.Listener
	if err := n.w.kernel.vm.do(func() (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort(n.overlay.String(), strconv.Itoa(OverlayProbePort)))
		return err
	}); err != nil {
		return fmt.Errorf("guest tunnel on %s: %w", n.w.Machine, err)
	}
	n.w.kernel.mu.Lock()
	n.w.kernel.listeners = append(n.w.kernel.listeners, l)
	n.w.kernel.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, n.w.Machine+"\n")
			_ = c.Close()
		}
	}()
	return nil
}

// Sync points each node's forwarding entries at every other node's InternalIP, read now
// from the guest Nodes (all-zero MAC entries: broadcast and unknown unicast, ARP included, go
// to each of them), and forgets the neighbours learnt before. A node without a guest Node
// or without an InternalIP gets no entry.
func (t *GuestTunnel) Sync(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	endpoints := map[string]string{}
	for _, n := range t.nodes {
		node := &corev1.Node{}
		switch err := t.l.Guest.Client.Get(ctx, client.ObjectKey{Name: n.w.Machine}, node); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return err
		}
		if ip := nodeInternalIP(node); ip != "" {
			endpoints[n.w.Machine] = ip
		}
	}
	return t.pointAt(endpoints)
}

// pointAt makes each node's forwarding entries the tunnel endpoints of the other nodes
// (by machine name).
func (t *GuestTunnel) pointAt(endpoints map[string]string) error {
	for _, n := range t.nodes {
		var fdb, peers []string
		for _, ip := range n.peers {
			fdb = append(fdb, "fdb del 00:00:00:00:00:00 dev "+tunnelDevice+" dst "+ip)
		}
		for _, peer := range t.nodes {
			if ip, ok := endpoints[peer.w.Machine]; ok && peer != n && !slices.Contains(peers, ip) {
				peers = append(peers, ip)
				fdb = append(fdb, "fdb append 00:00:00:00:00:00 dev "+tunnelDevice+" dst "+ip)
			}
		}
		if err := runBatch(n.w.kernel.vm, "bridge", fdb...); err != nil {
			return fmt.Errorf("guest tunnel on %s: %w", n.w.Machine, err)
		}
		n.peers = peers
		if err := n.w.kernel.vm.ip("neigh flush dev " + tunnelDevice); err != nil {
			return err
		}
	}
	return nil
}

// runBatch runs the command lines with `bin -batch -` inside the namespace.
func runBatch(ns *netNamespace, bin string, commands ...string) error {
	if len(commands) == 0 {
		return nil
	}
	name, argv := ns.command(bin, "-batch", "-")
	cmd := exec.Command(name, argv...)
	cmd.Stdin = strings.NewReader(strings.Join(commands, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", bin, err, out)
	}
	return nil
}

// OverlayAddress is the node's address on the overlay ("" when it is not on the tunnel).
func (t *GuestTunnel) OverlayAddress(w *Worker) string {
	if n := t.node(w); n != nil {
		return n.overlay.String()
	}
	return ""
}

func (t *GuestTunnel) node(w *Worker) *tunnelNode {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.nodes {
		if n.w == w {
			return n
		}
	}
	return nil
}

// Reachable reports whether pod traffic crosses the overlay from node from to node to: a
// TCP connection from inside from's VM to to's overlay address (OverlayProbePort), answered
// with to's name. It returns the error otherwise: the tunnel is silent, so a failure shows as
// the overlay's ARP getting no answer ("no route to host" after the kernel's three probes,
// about 3 s) or as ctx's deadline.
func (t *GuestTunnel) Reachable(ctx context.Context, from, to *Worker) error {
	dst := t.node(to)
	if dst == nil || t.node(from) == nil {
		return errors.New("guest tunnel: both workers must be on the tunnel")
	}
	c, err := from.DialFromVM(ctx, "tcp", net.JoinHostPort(dst.overlay.String(), strconv.Itoa(OverlayProbePort)))
	if err != nil {
		return fmt.Errorf("overlay %s -> %s: %w", from.Machine, to.Machine, err)
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	name, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("overlay %s -> %s: %w", from.Machine, to.Machine, err)
	}
	if got := strings.TrimSpace(name); got != to.Machine {
		return fmt.Errorf("overlay %s -> %s: answered by %s", from.Machine, to.Machine, got)
	}
	return nil
}
