package lab

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// Lab address plan. Inside the lab's private network namespace (hack/labns) these ranges are
// local to lo, so the realistic addresses of a KubeVirt host work and nothing leaves the machine.
const (
	// HostAPIServerAddress is where the host kube-apiserver listens.
	HostAPIServerAddress = "10.244.0.1"
	// GuestAPIServerAddress is where the guest kube-apiserver listens: a host pod IP, since
	// the hosted control plane (k0smotron, Kamaji) runs as a pod on the host network.
	GuestAPIServerAddress = "10.244.0.2"
	// APIServerPort is the port every lab kube-apiserver serves on.
	APIServerPort = 6443
	// HostServiceCIDR is the host cluster's service CIDR; local in the lab namespace so that
	// stand-ins can bind ClusterIPs.
	HostServiceCIDR = "10.97.0.0/16"
	// HostServiceCIDR6 is the host cluster's IPv6 service CIDR: the host serves dual-stack
	// Services (a GuestIngress's host Service with ips of both families). No route in the lab
	// namespace: no stand-in serves host IPv6 ClusterIPs.
	HostServiceCIDR6 = "fd00:10:97::/112"
	// GuestServiceCIDR is the guest cluster's service CIDR. It has no route in the lab
	// namespace: the guest apiserver cannot reach guest ClusterIPs, as in production.
	GuestServiceCIDR = "10.96.0.0/16"
	// GuestServiceCIDR6 is the guest cluster's IPv6 service CIDR: the guest serves
	// dual-stack Services (Services are IPv4 single-stack unless they ask for more).
	GuestServiceCIDR6 = "fd00:10:96::/112"
	// LoadBalancerCIDR is the lab's "physical" network of load-balancer IPs: pools of the
	// tests take IPs from it, and the Cilium stand-in (StartCiliumStandIn) listens on the IPs
	// it announces. Local in the lab namespace; an IP outside it is never bound or dialed.
	LoadBalancerCIDR = "10.98.0.0/16"
	// GuestControlPlaneLoadBalancerIP is the one load-balancer IP, besides its own address, the
	// guest apiserver's serving certificate is valid for: k0smotron puts a control plane's
	// external address (its LoadBalancer Service's IP) in the SANs. A test that gives a control
	// plane's Service (kmc-<name>-lb, WithControlPlaneLoadBalancer) an IP must request this
	// one, or TLS through it fails verification. In LoadBalancerCIDR; nothing else uses it.
	GuestControlPlaneLoadBalancerIP = "10.98.240.10"
	// WorkerCIDR holds the pod IPs of worker virt-launcher pods (the VMs' real addresses).
	WorkerCIDR = "10.244.1.0/24"
)

// InPrivateNetwork reports whether this process runs in a network namespace whose only
// interface is lo, and explains why not otherwise. Once a namespace has been found private,
// it stays so for this process: the interfaces the lab adds to it later (the host pod
// network of kernel workers, kerneldatapath.go) lead only to namespaces the lab created.
func InPrivateNetwork() (bool, string) {
	self, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		return false, err.Error()
	}
	ino := self.Sys().(*syscall.Stat_t).Ino
	verified.Lock()
	defer verified.Unlock()
	if verified.netns != 0 && verified.netns == ino {
		return true, ""
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return false, err.Error()
	}
	for _, i := range ifaces {
		if i.Name != "lo" {
			return false, fmt.Sprintf("network interface %q exists: not a private lab namespace", i.Name)
		}
	}
	l, err := net.Listen("tcp", HostAPIServerAddress+":0")
	if err != nil {
		return false, fmt.Sprintf("cannot bind %s (is the lab route missing?): %v", HostAPIServerAddress, err)
	}
	_ = l.Close()
	verified.netns = ino
	return true, ""
}

// verified is the network namespace InPrivateNetwork found private (its inode), 0 before.
var verified struct {
	sync.Mutex
	netns uint64
}

// RequireLab skips the test unless it runs inside the lab's private network namespace with
// the lab assets available, and fails instead of skipping under CI, where a skip would hide
// a broken set-up. Run lab tests with `make test`.
func RequireLab(t testing.TB) {
	t.Helper()
	reason := ""
	if ok, why := InPrivateNetwork(); !ok {
		reason = "not in the lab's private network namespace (" + why + ")"
	} else if _, err := LookupAssets(); err != nil {
		reason = err.Error()
	}
	if reason == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("lab test cannot run: %s; run it with `make test`", reason)
	}
	hintOnce.Do(hintSkipped)
	t.Skipf("lab test skipped: %s; run it with `make test`", reason)
}

// LabHint is the one line a plain `go test ./...` prints about the lab tests it skipped.
const LabHint = "guestnet: lab tests skipped (they need the lab's binaries and its network namespace): " +
	"run them with `make test`, a subset with `make test TEST_PKGS=./controllers/guestingress/... TEST_ARGS='-run X'`"

var hintOnce sync.Once

// hintSkipped prints LabHint on the terminal, once per go command: `go test ./...` shows
// nothing of a package that passes but its ok line (and -v shows every skip's reason), so
// the test binary writes to the terminal itself; the first package of that go command (the
// binaries' parent process) to skip a lab test does, the others see its marker file.
func hintSkipped() {
	if testing.Verbose() {
		return
	}
	tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0)
	if err != nil {
		return // no terminal: nobody to tell
	}
	defer tty.Close()
	marker := filepath.Join(os.TempDir(), fmt.Sprintf("guestnet-lab-hint-%d", os.Getppid()))
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return // another package of this go command said it
	}
	_ = f.Close()
	fmt.Fprintln(tty, LabHint)
}
