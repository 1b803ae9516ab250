package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// podNetns stands in for the network namespace of a guest pod on a worker VM, for servers
// that cannot be told which address to bind: cert-manager's webhook (1.11) listens on
// ":<secure-port>" and ":<healthz-port>", every address of its pod. In the lab's own network
// namespace that would be every lab address, so such a server runs in a network namespace of
// its own (a child of the lab's, with nothing but lo), where the wildcard is harmless, as in
// its pod:
//   - egress: the guest apiserver's address is local in the pod namespace, and a forwarder
//     carries each connection to the real guest apiserver (as the VM's NAT carries a pod's
//     traffic to the host network in production), TLS untouched;
//   - ingress: publish(port) listens on the worker's VM address (Worker.ServeInVM, so the
//     masquerade stand-in forwards the port from the worker's pod IP when it is declared) and
//     forwards to the port inside the pod namespace, as a hostPort would.
//
// The forwarders create their sockets inside the pod namespace from a thread that enters it
// for that one call (setns), so the test process itself stays in the lab namespace.
type podNetns struct {
	*netNamespace

	mu        sync.Mutex
	listeners []net.Listener
	wg        sync.WaitGroup
}

// newPodNetns creates the namespace <dir>/<name>.netns with lo up and the guest apiserver's
// address local, and starts the egress forwarder to the guest apiserver.
func newPodNetns(dir, name string) (*podNetns, error) {
	return newPodNetnsTo(dir, name, GuestAPIServerAddress)
}

// newPodNetnsTo creates the namespace <dir>/<name>.netns with lo up and each apiserver
// address local, and starts an egress forwarder to each (port 6443).
func newPodNetnsTo(dir, name string, apiservers ...string) (_ *podNetns, err error) {
	ns, err := newNetNamespace(dir, name)
	if err != nil {
		return nil, err
	}
	n := &podNetns{netNamespace: ns}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	var setup []string
	for _, a := range apiservers {
		setup = append(setup, "addr add "+a+"/32 dev lo")
	}
	if err := n.ip(setup...); err != nil {
		return nil, fmt.Errorf("pod network namespace %s: %w", name, err)
	}
	for _, a := range apiservers {
		apiserver := hostPort(a, 6443)
		var egress net.Listener
		if err := n.do(func() (err error) { egress, err = net.Listen("tcp", apiserver); return err }); err != nil {
			return nil, fmt.Errorf("pod network namespace %s: egress forwarder: %w", name, err)
		}
		n.track(egress)
		n.wg.Go(func() {
			serveForwardWith(egress, func(ctx context.Context) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", apiserver)
			})
		})
	}
	return n, nil
}

// publish makes port of the pod namespace reachable at the worker's VM address.
func (n *podNetns) publish(w *Worker, port int32) error {
	l, err := w.ServeInVM(port)
	if err != nil {
		return fmt.Errorf("publishing %s port %d on %s: %w", n.name, port, w.VMAddress, err)
	}
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	n.wg.Go(func() {
		serveForwardWith(l, func(ctx context.Context) (net.Conn, error) { return n.dial(ctx, target) })
	})
	return nil
}

// publishAt makes port of the pod namespace reachable at addr (host:port, port 0 for a free
// one) in the lab namespace, as a Service of a host pod would; it returns the address.
func (n *podNetns) publishAt(addr string, port int) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("publishing %s port %d on %s: %w", n.name, port, addr, err)
	}
	n.track(l)
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	n.wg.Go(func() {
		serveForwardWith(l, func(ctx context.Context) (net.Conn, error) { return n.dial(ctx, target) })
	})
	return l.Addr().String(), nil
}

func (n *podNetns) track(l net.Listener) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.listeners = append(n.listeners, l)
}

// close stops the forwarders (published ports close with their worker, or here) and
// releases the namespace.
func (n *podNetns) close() {
	n.mu.Lock()
	for _, l := range n.listeners {
		_ = l.Close()
	}
	n.listeners = nil
	n.mu.Unlock()
	n.netNamespace.close()
}

// netNamespace is a network namespace of the lab's own making, a child of the lab's: kept
// alive by an nsfs bind mount on a file of the lab directory (so `ip link ... netns <file>`
// and `nsenter --net=<file>` name it, and nothing is written to /run/netns), with lo up and
// nothing else until its user adds it. The test process never moves into it: do runs a
// function on a thread that enters it for that one call.
type netNamespace struct {
	name string
	path string // nsfs bind mount that keeps the namespace alive
	ns   *os.File
}

// newNetNamespace creates the namespace <dir>/<name>.netns with lo up.
func newNetNamespace(dir, name string) (_ *netNamespace, err error) {
	n := &netNamespace{name: name, path: filepath.Join(dir, name+".netns")}
	if err := os.WriteFile(n.path, nil, 0o600); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	if out, err := exec.Command("unshare", "--net="+n.path, "true").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("network namespace %s: unshare: %w: %s", name, err, out)
	}
	if n.ns, err = os.Open(n.path); err != nil {
		return nil, err
	}
	if err := n.ip("link set lo up"); err != nil {
		return nil, err
	}
	// No duplicate address detection for the links the lab adds: their link-local
	// addresses would stay tentative for a second, and IPv6 neighbour discovery across the
	// lab's bridges with them (the first packets of a connection are lost meanwhile).
	if err := n.sysctl("0", "ipv6/conf/all/accept_dad", "ipv6/conf/default/accept_dad"); err != nil {
		return nil, err
	}
	return n, nil
}

// command returns the command line that runs bin with args inside the namespace (nsenter
// execs in place: the process keeps its pid and parent-death signal).
func (n *netNamespace) command(bin string, args ...string) (string, []string) {
	return "nsenter", append([]string{"--net=" + n.path, "--", bin}, args...)
}

// run runs bin with args inside the namespace and returns its output.
func (n *netNamespace) run(bin string, args ...string) ([]byte, error) {
	name, argv := n.command(bin, args...)
	out, err := exec.Command(name, argv...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("in network namespace %s: %s %s: %w: %s", n.name, bin, strings.Join(args, " "), err, out)
	}
	return out, nil
}

// ip runs the ip commands (each an `ip` command line without "ip") inside the namespace,
// in one `ip -batch`, stopping at the first that fails.
func (n *netNamespace) ip(commands ...string) error {
	if len(commands) == 0 {
		return nil
	}
	name, argv := n.command("ip", "-batch", "-")
	cmd := exec.Command(name, argv...)
	cmd.Stdin = strings.NewReader(strings.Join(commands, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("in network namespace %s: ip: %w: %s", n.name, err, out)
	}
	return nil
}

// sysctl sets each /proc/sys/net key (e.g. "ipv4/ip_forward") of the namespace to value:
// /proc/sys/net shows the network namespace of the thread that opens it.
func (n *netNamespace) sysctl(value string, keys ...string) error {
	return n.do(func() error {
		for _, k := range keys {
			if err := os.WriteFile("/proc/sys/net/"+k, []byte(value), 0o644); err != nil {
				return fmt.Errorf("network namespace %s: sysctl net/%s: %w", n.name, k, err)
			}
		}
		return nil
	})
}

// dial connects to addr from inside the namespace.
func (n *netNamespace) dial(ctx context.Context, addr string) (net.Conn, error) {
	return n.dialNetwork(ctx, "tcp", addr)
}

// dialNetwork connects to addr over network from inside the namespace.
func (n *netNamespace) dialNetwork(ctx context.Context, network, addr string) (c net.Conn, err error) {
	err = n.do(func() error {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// do runs f on a thread that is inside the namespace for the duration of f; sockets f
// creates belong to the namespace for good.
func (n *netNamespace) do(f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	if err := unix.Setns(int(n.ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering network namespace %s: %w", n.name, err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, so the runtime ends it with this goroutine instead of
		// reusing it in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("leaving network namespace %s: %w", n.name, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// close releases the namespace: it goes once no process and no socket holds it.
func (n *netNamespace) close() {
	if n.ns != nil {
		_ = n.ns.Close()
	}
	_ = unix.Unmount(n.path, unix.MNT_DETACH)
	_ = os.Remove(n.path)
}
