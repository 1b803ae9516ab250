package lab

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

// The nft commands are KubeVirt v1.9.0's, as docs/node-identity-research.md 1.2 lists them
// from pkg/network/setup/netpod/masquerade/masquerade.go (setupNATByFamily), written out
// here by hand: the generator must say exactly this, in this order.
func TestKubeVirtMasqueradeNFT(t *testing.T) {
	head := func(f, vm string) []string {
		return []string{
			"add table " + f + " nat",
			"add chain " + f + " nat prerouting { type nat hook prerouting priority -100; }",
			"add chain " + f + " nat input { type nat hook input priority 100; }",
			"add chain " + f + " nat output { type nat hook output priority -100; }",
			"add chain " + f + " nat postrouting { type nat hook postrouting priority 100; }",
			"add chain " + f + " nat KUBEVIRT_PREINBOUND",
			"add chain " + f + " nat KUBEVIRT_POSTINBOUND",
			"add rule " + f + " nat postrouting " + f + " saddr " + vm + " counter masquerade",
			"add rule " + f + " nat prerouting iifname eth0 counter jump KUBEVIRT_PREINBOUND",
			"add rule " + f + " nat postrouting oifname k6t-eth0 counter jump KUBEVIRT_POSTINBOUND",
		}
	}
	ports := kubevirtv1.Interface{Name: "default", Ports: []kubevirtv1.Port{{Port: 80}, {Port: 8473, Protocol: "UDP"}, {Name: "kubelet", Port: 10250, Protocol: "TCP"}}}
	for _, tc := range []struct {
		name       string
		family     string
		gateway    string
		vm         string
		iface      kubevirtv1.Interface
		legacyMigr bool
		want       []string
	}{{
		name: "ports list", family: "ip", gateway: "10.0.2.1", vm: "10.0.2.2", iface: ports,
		want: append(head("ip", "10.0.2.2"),
			"add rule ip nat KUBEVIRT_PREINBOUND tcp dport { 80 } counter dnat to 10.0.2.2",
			"add rule ip nat KUBEVIRT_POSTINBOUND tcp dport 80 ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
			"add rule ip nat output ip daddr { 127.0.0.1 } tcp dport 80 counter dnat to 10.0.2.2",
			"add rule ip nat KUBEVIRT_PREINBOUND udp dport { 8473 } counter dnat to 10.0.2.2",
			"add rule ip nat KUBEVIRT_POSTINBOUND udp dport 8473 ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
			"add rule ip nat output ip daddr { 127.0.0.1 } udp dport 8473 counter dnat to 10.0.2.2",
			"add rule ip nat KUBEVIRT_PREINBOUND tcp dport { 10250 } counter dnat to 10.0.2.2",
			"add rule ip nat KUBEVIRT_POSTINBOUND tcp dport 10250 ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
			"add rule ip nat output ip daddr { 127.0.0.1 } tcp dport 10250 counter dnat to 10.0.2.2",
		),
	}, {
		name: "no ports list, IPv6", family: "ip6", gateway: "fd10:0:2::1", vm: "fd10:0:2::2", iface: kubevirtv1.Interface{Name: "default"},
		want: append(head("ip6", "fd10:0:2::2"),
			"add rule ip6 nat KUBEVIRT_PREINBOUND counter dnat to fd10:0:2::2",
			"add rule ip6 nat KUBEVIRT_POSTINBOUND ip6 saddr { ::1 } counter snat to fd10:0:2::1",
			"add rule ip6 nat output ip6 daddr { ::1 } counter dnat to fd10:0:2::2",
		),
	}, {
		name: "portRanges without the feature gate forward every port", family: "ip", gateway: "10.0.2.1", vm: "10.0.2.2",
		iface: kubevirtv1.Interface{Name: "default", PortRanges: []kubevirtv1.PortRange{{Start: 30000, End: 30100, Protocol: "TCP"}}},
		want: append(head("ip", "10.0.2.2"),
			"add rule ip nat KUBEVIRT_PREINBOUND counter dnat to 10.0.2.2",
			"add rule ip nat KUBEVIRT_POSTINBOUND ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
			"add rule ip nat output ip daddr { 127.0.0.1 } counter dnat to 10.0.2.2",
		),
	}, {
		name: "legacy migration transport", family: "ip", gateway: "10.0.2.1", vm: "10.0.2.2", legacyMigr: true,
		iface: kubevirtv1.Interface{Name: "default", Ports: []kubevirtv1.Port{{Port: 22}}},
		want: append(head("ip", "10.0.2.2"),
			"add rule ip nat output tcp dport { 49152, 49153 } ip saddr 127.0.0.1 counter return",
			"add rule ip nat KUBEVIRT_POSTINBOUND tcp dport { 49152, 49153 } ip saddr 127.0.0.1 counter return",
			"add rule ip nat KUBEVIRT_PREINBOUND tcp dport { 22 } counter dnat to 10.0.2.2",
			"add rule ip nat KUBEVIRT_POSTINBOUND tcp dport 22 ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
			"add rule ip nat output ip daddr { 127.0.0.1 } tcp dport 22 counter dnat to 10.0.2.2",
		),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range kubevirtMasqueradeNFT(tc.family, "eth0", "k6t-eth0", net.ParseIP(tc.gateway), net.ParseIP(tc.vm), tc.iface, tc.legacyMigr) {
				got = append(got, strings.Join(c, " "))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("nft commands:\n%s\nwant (KubeVirt v1.9.0):\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestMasqueradeGateway(t *testing.T) {
	for _, tc := range []struct{ cidr, gateway, vm string }{
		{"", "10.0.2.1", "10.0.2.2"},
		{"10.11.12.0/28", "10.11.12.1", "10.11.12.2"},
	} {
		gw, vm, _, err := masqueradeGateway(tc.cidr, kubevirtVMCIDR)
		if err != nil || gw.String() != tc.gateway || vm.String() != tc.vm {
			t.Errorf("masqueradeGateway(%q) = %v, %v, %v; want %s, %s", tc.cidr, gw, vm, err, tc.gateway, tc.vm)
		}
	}
	if _, _, _, err := masqueradeGateway("10.0.2.0/31", kubevirtVMCIDR); err == nil {
		t.Error("a /31 has no room for a gateway and a VM")
	}
}

// The layout of one kernel VM (research 1.3), read back from the kernel, and nothing left of
// it once it is closed. Needs a private network namespace (hack/labns), no control plane.
func TestKernelVMLayout(t *testing.T) {
	if ok, why := InPrivateNetwork(); !ok {
		if os.Getenv("CI") != "" {
			t.Fatalf("needs the lab's network namespace: %s", why)
		}
		t.Skipf("needs the lab's network namespace (hack/labns): %s", why)
	}
	l := &Lab{Dir: t.TempDir()}
	spec := &kubevirtv1.VirtualMachineInstanceSpec{
		Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
			Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
			Ports: []kubevirtv1.Port{{Port: 10250}},
		}}}},
		Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
	}
	k, err := l.startKernelVM(kernelVMSpec{name: "layout", podIP: net.ParseIP("10.244.119.7"), dualStack: true, vmi: spec})
	if err != nil {
		t.Fatal(err)
	}
	read := func(ns *netNamespace, args ...string) string {
		out, err := ns.run(args[0], args[1:]...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	sysctl := func(ns *netNamespace, key string) string {
		var v []byte
		if err := ns.do(func() (err error) { v, err = os.ReadFile("/proc/sys/net/" + key); return err }); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(v))
	}
	for _, want := range []struct {
		ns       *netNamespace
		args     []string
		contains string
	}{
		{k.pod.netNamespace, []string{"ip", "-o", "addr", "show", "dev", "eth0"}, "inet 10.244.119.7/24"},
		{k.pod.netNamespace, []string{"ip", "-o", "addr", "show", "dev", "eth0"}, "inet6 fd00:10:244:119::7/64"},
		{k.pod.netNamespace, []string{"ip", "route", "show", "default"}, "default via 10.244.119.254 dev eth0"},
		{k.pod.netNamespace, []string{"ip", "-o", "addr", "show", "dev", "k6t-eth0"}, "inet 10.0.2.1/24"},
		{k.pod.netNamespace, []string{"ip", "-o", "addr", "show", "dev", "k6t-eth0"}, "inet6 fd10:0:2::1/120"},
		{k.pod.netNamespace, []string{"ip", "link", "show", "dev", "k6t-eth0"}, "link/ether 02:00:00:00:00:00"},
		{k.pod.netNamespace, []string{"ip", "link", "show", "dev", "tap0"}, "master k6t-eth0"},
		{k.vm, []string{"ip", "-o", "addr", "show", "dev", "eth0"}, "inet 10.0.2.2/24"},
		{k.vm, []string{"ip", "-o", "addr", "show", "dev", "eth0"}, "inet6 fd10:0:2::2/120"},
		{k.vm, []string{"ip", "route", "show", "default"}, "default via 10.0.2.1 dev eth0"},
		{k.vm, []string{"ip", "-6", "route", "show", "default"}, "default via fd10:0:2::1 dev eth0"},
	} {
		if got := read(want.ns, want.args...); !strings.Contains(got, want.contains) {
			t.Errorf("%s: %s: got\n%s\nwant %q", want.ns.name, strings.Join(want.args, " "), got, want.contains)
		}
	}
	for key, want := range map[string]string{
		"ipv4/ip_forward": "1", "ipv4/conf/k6t-eth0/route_localnet": "1", "ipv6/conf/all/forwarding": "1",
	} {
		if got := sysctl(k.pod.netNamespace, key); got != want {
			t.Errorf("pod sysctl %s = %s, want %s", key, got, want)
		}
	}
	if out, err := exec0("ip", "route", "show", "table", "local", "10.244.119.0/24"); err != nil || !strings.Contains(out, "dev "+hostPodBridge) {
		t.Errorf("the lab namespace routes the pods' /24 to %s in table local: %q, %v", hostPodBridge, out, err)
	}
	if ok, why := InPrivateNetwork(); !ok {
		t.Errorf("the lab namespace is still private with the host pod network in it: %s", why)
	}

	hostVeth := k.pod.hostVeth
	k.close()
	if out, err := exec0("ip", "link", "show", "dev", hostVeth); err == nil {
		t.Errorf("the pod's veth outlived it: %s", out)
	}
	if _, err := os.Stat(k.vm.path); !os.IsNotExist(err) {
		t.Errorf("the VM's namespace file outlived it: %v", err)
	}
}

func exec0(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}
