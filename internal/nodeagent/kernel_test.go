package nodeagent

import (
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	. "github.com/onsi/gomega"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The agent's kernel state, checked with the kernel: a "VM" network namespace whose eth0 is
// 10.0.2.2/24, its peer 10.0.2.1 in the test's own namespace (hack/labns: private, only lo,
// so no packet leaves the machine). After Apply, a connection the peer makes to 10.0.2.2
// arrives at a socket as addressed to the node IP, and the node IP can be bound; Apply is
// idempotent, follows a new node IP, and RemoveFromKernel takes everything off.
func TestKernelApplyAndRemove(t *testing.T) {
	if os.Getenv("GUESTNET_LABNS") != "1" {
		t.Skip("needs the lab's private network namespace (go test -exec hack/labns)")
	}
	g := NewWithT(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	outside, err := netns.Get()
	g.Expect(err).NotTo(HaveOccurred())
	defer outside.Close()
	vm, err := netns.New() // the thread is in it from here
	g.Expect(err).NotTo(HaveOccurred())
	defer vm.Close()
	defer func() { _ = netns.Set(outside) }()

	in := func(ns netns.NsHandle, f func()) {
		g.Expect(netns.Set(ns)).To(Succeed())
		f()
	}
	in(vm, func() {
		lo, err := netlink.LinkByName("lo")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(netlink.LinkSetUp(lo)).To(Succeed())
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "vmpeer0", PeerNamespace: netlink.NsFd(int(outside))}
		g.Expect(netlink.LinkAdd(veth)).To(Succeed())
		eth0, err := netlink.LinkByName("eth0")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(netlink.AddrAdd(eth0, mustAddr("10.0.2.2/24"))).To(Succeed())
		g.Expect(netlink.LinkSetUp(eth0)).To(Succeed())
		g.Expect(netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP("10.0.2.1"), LinkIndex: eth0.Attrs().Index})).To(Succeed())
	})
	in(outside, func() {
		peer, err := netlink.LinkByName("vmpeer0")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(netlink.AddrAdd(peer, mustAddr("10.0.2.1/24"))).To(Succeed())
		g.Expect(netlink.LinkSetUp(peer)).To(Succeed())
	})
	defer in(outside, func() {
		if peer, err := netlink.LinkByName("vmpeer0"); err == nil {
			_ = netlink.LinkDel(peer)
		}
	})

	var ln net.Listener
	in(vm, func() {
		uplink, vmAddress, err := Uplink()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(uplink).To(Equal("eth0"))
		g.Expect(vmAddress.String()).To(Equal("10.0.2.2"))

		k := Kernel{NodeIP: net.ParseIP("10.244.250.1"), Uplink: uplink, VMAddress: vmAddress}
		changed, err := k.Apply()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changed).To(BeTrue())
		changed, err = k.Apply()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changed).To(BeFalse(), "nothing to change the second time")

		ln, err = net.Listen("tcp4", "10.244.250.1:40000")
		g.Expect(err).NotTo(HaveOccurred())
		bound, err := net.Listen("tcp4", "10.244.250.1:0")
		g.Expect(err).NotTo(HaveOccurred(), "the node IP is an address of the VM")
		_ = bound.Close()
	})
	defer ln.Close()
	accepted := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err.Error()
			return
		}
		accepted <- c.LocalAddr().String()
		_ = c.Close()
	}()
	in(outside, func() {
		c, err := net.DialTimeout("tcp4", "10.0.2.2:40000", 3*time.Second)
		g.Expect(err).NotTo(HaveOccurred(), "what arrives for the VM address")
		_ = c.Close()
	})
	g.Eventually(accepted).Should(Receive(Equal("10.244.250.1:40000")), "reaches the socket bound to the node IP")

	in(vm, func() {
		k := Kernel{NodeIP: net.ParseIP("10.244.250.2"), Uplink: "eth0", VMAddress: net.ParseIP("10.0.2.2")}
		changed, err := k.Apply()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changed).To(BeTrue())
		_, err = net.Listen("tcp4", "10.244.250.1:0")
		g.Expect(err).To(HaveOccurred(), "the old node IP is off lo")
		have, err := currentRulesOf()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(have).To(Equal(ruleTexts(tableRules(k))))

		changed, err = RemoveFromKernel()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changed).To(BeTrue())
		have, err = currentRulesOf()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(have).To(BeEmpty())
		_, err = net.Listen("tcp4", "10.244.250.2:0")
		g.Expect(err).To(HaveOccurred(), "the node IP is off lo")
		changed, err = RemoveFromKernel()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changed).To(BeFalse())
	})
}

func mustAddr(s string) *netlink.Addr {
	a, err := netlink.ParseAddr(s)
	if err != nil {
		panic(err)
	}
	return a
}

// currentRulesOf reads the texts of the agent's table in the current network namespace.
func currentRulesOf() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	return currentRules(c)
}
