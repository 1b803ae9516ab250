package lab

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// masqueradeNAT stands in, in userspace, for the NAT that KubeVirt's masquerade binding puts
// in a worker's virt-launcher pod: it listens on the pod IP and forwards to the VM, but only
// the ports the VM's template declares on the masquerade interface (every port the VM serves
// when the template has no ports list). An undeclared port finds nothing listening, so the
// client is refused at once, as KubeVirt v1.9.0 refuses it: its rules have no drop rule, and
// what they do not DNAT reaches the pod's own kernel, which answers RST (ICMP port-unreachable
// for UDP) (pkg/network/setup/netpod/masquerade/masquerade.go, setupNATByFamily). TCP only:
// the lab's guest workloads are TCP. Workers on the kernel datapath (kerneldatapath.go) run
// KubeVirt's own rules instead; docs/lab.md says which tests use which.
type masqueradeNAT struct {
	podIP, vmAddress string
	forwardAll       bool

	mu        sync.Mutex
	listeners map[int32]net.Listener
	wg        sync.WaitGroup
}

func newMasqueradeNAT(podIP, vmAddress string, declared []int32, forwardAll bool) (*masqueradeNAT, error) {
	n := &masqueradeNAT{podIP: podIP, vmAddress: vmAddress, forwardAll: forwardAll, listeners: map[int32]net.Listener{}}
	for _, p := range declared {
		if err := n.forward(p); err != nil {
			n.stop()
			return nil, err
		}
	}
	return n, nil
}

// forward starts forwarding podIP:port to vmAddress:port (once per port).
func (n *masqueradeNAT) forward(port int32) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.listeners[port]; ok {
		return nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(n.podIP, strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("masquerade stand-in for %s: %w", n.podIP, err)
	}
	n.listeners[port] = l
	n.wg.Go(func() { serveForwardWith(l, dialTCP(net.JoinHostPort(n.vmAddress, strconv.Itoa(int(port))))) })
	return nil
}

func (n *masqueradeNAT) stop() {
	n.mu.Lock()
	for _, l := range n.listeners {
		_ = l.Close()
	}
	n.mu.Unlock()
	n.wg.Wait()
}

// vmAddress is where the lab runs what runs inside a worker VM. In KubeVirt every VM sees
// itself as 10.0.2.2 behind its own NAT; the lab's workers share one network namespace, so
// each VM gets its own stand-in address instead: the pod IP with 128 added to the third
// octet (10.244.1.11 -> 10.244.129.11). Nothing but the worker's NAT stand-in dials it.
func vmAddress(podIP string) (string, error) {
	ip := net.ParseIP(podIP).To4()
	if ip == nil || !mustParseCIDR("10.244.0.0/16").Contains(ip) || ip[2] >= 128 {
		return "", errors.New("worker IPs must be in 10.244.0.0/17 (the lab's host pod IPs)")
	}
	vm := append(net.IP(nil), ip...)
	vm[2] += 128
	return vm.String(), nil
}

func mustParseCIDR(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}
