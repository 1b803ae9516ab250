package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeagent"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
)

// nodeIdentityTimeout bounds each wait of the node-identity tests: guestnet reacts to watch
// events (guest Nodes, host pods), the stand-in's kubelets to a 0.5 s loop.
const nodeIdentityTimeout = 30 * time.Second

// nodeIdentityEnv is a guest cluster whose workers are VMs of the KubeVirt stand-in on the
// kernel datapath, their kubelets in the mode the test names, guestnet's manager binary with
// its generated RBAC, and the node agents' stand-in.
type nodeIdentityEnv struct {
	l      *lab.Lab
	ctx    context.Context
	ns     string
	gc     *lab.GuestCluster
	kv     *lab.KubeVirt
	agents *lab.NodeAgents
	// vms are the VMs createVM made: their guest Nodes go when the test ends (the lab's
	// guest is every test's).
	vms []string
}

func newNodeIdentityEnv(t *testing.T, subnet string, kubelet lab.KubeletMode) *nodeIdentityEnv {
	t.Helper()
	return newNodeIdentityEnvIn(t, startLab(t), uniqueName("nodeid"), subnet, kubelet)
}

// newNodeIdentityEnvIn is newNodeIdentityEnv in namespace ns, the guest Cluster created with opts.
func newNodeIdentityEnvIn(t *testing.T, l *lab.Lab, ns, subnet string, kubelet lab.KubeletMode, opts ...lab.GuestClusterOption) *nodeIdentityEnv {
	t.Helper()
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	e := &nodeIdentityEnv{l: l, ctx: ctx, ns: ns}
	var err error
	e.gc, err = l.CreateGuestCluster(ctx, e.ns, "guest", lab.WorkerTemplateOptions{Ports: []int32{10250, 30080}, UDPPorts: []int32{8473}}, opts...)
	g.Expect(err).NotTo(HaveOccurred())
	e.kv, err = l.StartKubeVirtStandIn(ctx, e.ns, lab.KubeVirtOptions{
		WorkerSubnet: subnet, KernelDatapath: true, GuestKubelet: kubelet,
		OnBoot: func(_ context.Context, w *lab.Worker) error {
			if err := w.ServeKubeletStandIn(lab.KubeletUsage{CPUCores: 0.1, MemoryBytes: 1 << 30}); err != nil {
				return err
			}
			return w.ServeMachineName(30080) // a hostNetwork server (node-exporter, say)
		},
	})
	g.Expect(err).NotTo(HaveOccurred())
	// Registered before kv.Stop, so it runs after it: no kubelet registers the Nodes again.
	t.Cleanup(func() {
		for _, name := range e.vms {
			_ = l.Guest.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		}
	})
	t.Cleanup(e.kv.Stop)
	e.agents = l.StartNodeAgents(ctx, e.kv)
	t.Cleanup(e.agents.Stop)
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: e.ns})
	return e
}

// createVM creates a worker VM as CAPK does for KubevirtMachine name of the guest Cluster:
// its VMI template labelled for the Cluster, the namespace and the machine, the masquerade
// interface declaring the template's ports.
func (e *nodeIdentityEnv) createVM(t *testing.T, name string) {
	t.Helper()
	NewWithT(t).Expect(lab.CreateWorkerVM(e.ctx, e.l.Host.Client, e.ns, e.gc.Name, name, []int32{10250, 30080, 30081}, []int32{8473})).To(Succeed())
	e.vms = append(e.vms, name)
}

// worker waits for VM name's worker and its guest Node.
func (e *nodeIdentityEnv) worker(t *testing.T, name string) *lab.Worker {
	t.Helper()
	var w *lab.Worker
	NewWithT(t).Eventually(func(g Gomega) {
		w = nil
		for _, x := range e.kv.Workers() {
			if x.Machine == name {
				w = x
			}
		}
		g.Expect(w).NotTo(BeNil())
		g.Expect(e.l.Guest.Client.Get(e.ctx, client.ObjectKey{Name: name}, &corev1.Node{})).To(Succeed())
	}).WithTimeout(nodeIdentityTimeout).Should(Succeed())
	return w
}

func (e *nodeIdentityEnv) node(g Gomega, name string) *corev1.Node {
	node := &corev1.Node{}
	g.Expect(e.l.Guest.Client.Get(e.ctx, client.ObjectKey{Name: name}, node)).To(Succeed())
	return node
}

func (e *nodeIdentityEnv) createIdentity(t *testing.T) *guestnetv1.GuestNodeIdentity {
	t.Helper()
	gni := &guestnetv1.GuestNodeIdentity{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "guest"},
		Spec:       guestnetv1.GuestNodeIdentitySpec{ClusterName: e.gc.Name},
	}
	NewWithT(t).Expect(e.l.Host.Client.Create(e.ctx, gni)).To(Succeed())
	return gni
}

func (e *nodeIdentityEnv) condition(g Gomega, gni *guestnetv1.GuestNodeIdentity, t string) *metav1.Condition {
	got := &guestnetv1.GuestNodeIdentity{}
	g.Expect(e.l.Host.Client.Get(e.ctx, client.ObjectKeyFromObject(gni), got)).To(Succeed())
	c := conditions.Get(got, t)
	g.Expect(c).NotTo(BeNil(), "condition %s of %v", t, got.Status.Conditions)
	return c
}

// expectNodeIdentity checks, with real packets, each property of issue 19 that makes a VM a
// node: the guest apiserver reaches the kubelet at the Node's InternalIP; from inside the VM
// its node IP answers (a hostNetwork probe) and can be bound; what the pod's NAT delivers to
// 10.0.2.2 reaches a socket bound to the node IP.
func expectNodeIdentity(g Gomega, e *nodeIdentityEnv, w *lab.Worker) {
	node := e.node(g, w.Machine)
	g.Expect(nodeidentity.InternalIPs(node)).To(Equal([]string{w.IP}), "InternalIP of %s", w.Machine)
	g.Expect(nodeidentity.HasUninitializedTaint(node)).To(BeFalse())
	c, err := e.l.DialKubelet(e.ctx, w.Machine)
	g.Expect(err).NotTo(HaveOccurred(), "kubectl logs/exec: the guest apiserver dials the kubelet at the InternalIP")
	_ = c.Close()
	c, err = e.l.DialNodeIPFromVM(e.ctx, w, 30080)
	g.Expect(err).NotTo(HaveOccurred(), "a hostNetwork probe at the node IP from inside the VM")
	_ = c.Close()
	var bound net.Listener
	g.Expect(w.DoInVM(func() (err error) {
		bound, err = net.Listen("tcp", net.JoinHostPort(w.IP, "10250"))
		if err != nil && errors.Is(err, syscall.EADDRINUSE) {
			return nil // the kubelet stand-in holds the wildcard: the address is local
		}
		return err
	})).To(Succeed(), "the node IP is an address of the VM")
	if bound != nil {
		_ = bound.Close()
	}
}

// Issue 19, properties 1 and 2, on the kernel datapath: kubelets in external cloud-provider
// mode register Nodes with no InternalIP and the uninitialized taint; nothing works (the
// control). A GuestNodeIdentity makes each Node's InternalIP its VM's pod IP and the agent
// makes that address the VM's own: kubectl logs, hostNetwork probes and the guest tunnel
// across nodes work. A VM recreated with a new pod IP gets it on its Node; an agent
// restart keeps the kernel as it is; deleting the GuestNodeIdentity takes the agents and
// what they put in the kernels out.
func TestNodeIdentity_PodIPIsTheNodesIdentityInsideAndOutsideTheVM(t *testing.T) {
	g := NewWithT(t)
	e := newNodeIdentityEnv(t, "10.244.106.0/24", lab.KubeletExternal)
	ciliumConfig := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "cilium-config"},
		Data: map[string]string{"tunnel-protocol": "vxlan", "tunnel-port": "8473"}}
	g.Expect(client.IgnoreAlreadyExists(e.l.Guest.Client.Create(e.ctx, ciliumConfig))).To(Succeed())
	t.Cleanup(func() { deleteGuestObjects(t, e.l, ciliumConfig) })

	e.createVM(t, e.ns+"-a")
	e.createVM(t, e.ns+"-b")
	a, b := e.worker(t, e.ns+"-a"), e.worker(t, e.ns+"-b")

	// The control: nothing initializes the Nodes.
	for _, w := range []*lab.Worker{a, b} {
		node := e.node(g, w.Machine)
		g.Expect(nodeidentity.InternalIPs(node)).To(BeEmpty(), "an external-mode kubelet registers no InternalIP")
		g.Expect(nodeidentity.HasUninitializedTaint(node)).To(BeTrue())
		_, err := e.l.DialKubelet(e.ctx, w.Machine)
		g.Expect(err).To(HaveOccurred(), "kubectl logs without an InternalIP")
	}
	_, err := a.DialFromVM(e.ctx, "tcp", net.JoinHostPort(a.IP, "30080"))
	g.Expect(errors.Is(err, syscall.ECONNREFUSED)).To(BeTrue(), "a probe at the pod IP from inside the VM is refused by the virt-launcher pod, got %v", err)

	// The guest's Cilium agents started before the Nodes had their pod IPs, as they do (they
	// tolerate the taint): a's CiliumNode names the VM's own address, b's (started later) the
	// pod IP. guestnet restarts a's agent only.
	removeCRD, err := e.l.InstallGuestCiliumNodeCRD()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(removeCRD)
	agents := map[string]*corev1.Pod{}
	for _, w := range []struct {
		w  *lab.Worker
		ip string
	}{{a, lab.VMAddressMasquerade}, {b, b.IP}} {
		cn := &unstructured.Unstructured{}
		cn.SetGroupVersionKind(lab.CiliumNodeGVK)
		cn.SetName(w.w.Machine)
		g.Expect(unstructured.SetNestedSlice(cn.Object, []any{map[string]any{"type": "InternalIP", "ip": w.ip}}, "spec", "addresses")).To(Succeed())
		g.Expect(e.l.Guest.Client.Create(e.ctx, cn)).To(Succeed())
		t.Cleanup(func() { _ = e.l.Guest.Client.Delete(context.Background(), cn) })
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", GenerateName: "cilium-", Labels: map[string]string{"k8s-app": "cilium"}},
			Spec:       corev1.PodSpec{NodeName: w.w.Machine, Containers: []corev1.Container{{Name: "cilium-agent", Image: "quay.io/cilium/cilium:v1.20.2"}}},
		}
		g.Expect(e.l.Guest.Client.Create(e.ctx, pod)).To(Succeed())
		t.Cleanup(func() { _ = e.l.Guest.Client.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
		agents[w.w.Machine] = pod
	}

	gni := e.createIdentity(t)
	t.Cleanup(func() {
		if t.Failed() {
			dumpKernels(t, a, b)
		}
	})
	start := time.Now()
	for _, w := range []*lab.Worker{a, b} {
		g.Eventually(func(g Gomega) { expectNodeIdentity(g, e, w) }).WithTimeout(nodeIdentityTimeout).Should(Succeed())
	}
	t.Logf("both Nodes initialized and their VMs' kernels set within %s", time.Since(start).Round(10*time.Millisecond))
	g.Eventually(func(g Gomega) {
		c := e.condition(g, gni, guestnetv1.ReadyCondition)
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "Ready: %s %s", c.Reason, c.Message)
	}).WithTimeout(nodeIdentityTimeout).Should(Succeed())

	// The agent's metrics, where a guest Prometheus (or a sidecar) reads them in the VM.
	g.Eventually(func(g Gomega) {
		metrics := agentMetrics(e.ctx, g, a)
		g.Expect(metrics).To(ContainSubstring("guestnet_node_agent_ready 1"))
		g.Expect(metrics).To(MatchRegexp(`guestnet_node_agent_syncs_total\{result="changed"\} [1-9]`), "the agent wrote the kernel")
		g.Expect(metrics).To(MatchRegexp(`guestnet_node_agent_last_change_timestamp_seconds [1-9]`))
	}).WithTimeout(nodeIdentityTimeout).Should(Succeed())

	// a's Cilium agent is restarted (deleted: its DaemonSet would start a new one), b's is not.
	agentGoing := func(name string) bool {
		p := &corev1.Pod{}
		err := e.l.Guest.Client.Get(e.ctx, client.ObjectKeyFromObject(agents[name]), p)
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
	}
	g.Eventually(func() bool { return agentGoing(a.Machine) }).WithTimeout(nodeIdentityTimeout).Should(BeTrue(),
		"the Cilium agent whose CiliumNode names 10.0.2.2 is restarted")
	g.Expect(agentGoing(b.Machine)).To(BeFalse(), "the one whose CiliumNode names its pod IP is left alone")

	// The guest tunnel between the Nodes' InternalIPs, on the declared tunnel port.
	tunnel, err := e.l.StartGuestTunnel(e.ctx, a, b)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() error {
		ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
		defer cancel()
		return errors.Join(tunnel.Reachable(ctx, a, b), tunnel.Reachable(ctx, b, a))
	}).WithTimeout(nodeIdentityTimeout).Should(Succeed(), "cross-node traffic through the guest tunnel")

	// What the masquerade delivers to 10.0.2.2 reaches a socket bound to the node IP (a
	// tunnel or server that binds its node IP, as Flannel and Calico do).
	var ln net.Listener
	g.Expect(a.DoInVM(func() (err error) { ln, err = net.Listen("tcp", net.JoinHostPort(a.IP, "30081")); return err })).To(Succeed())
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(c.LocalAddr().String() + "\n"))
			_ = c.Close()
		}
	}()
	local, err := remoteAddressSeenBy(e.ctx, dialLab, a.IP, 30081)
	g.Expect(err).NotTo(HaveOccurred(), "a client outside reaches a server bound to the node IP (the pod's NAT sends it to 10.0.2.2)")
	g.Expect(local).To(Equal(net.JoinHostPort(a.IP, "30081")))

	t.Run("agent-restart-keeps-the-kernel", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(e.agents.Kill(a.Machine)).To(Succeed())
		expectNodeIdentity(g, e, a) // at once: nothing was cleaned up on the way out
		g.Eventually(func() bool { return e.agents.Ready(a.Machine) }).WithTimeout(nodeIdentityTimeout).Should(BeTrue())
	})

	t.Run("vm-recreated-with-a-new-pod-ip", func(t *testing.T) {
		g := NewWithT(t)
		old := b.IP
		g.Expect(e.l.Host.Client.Delete(e.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: b.Pod}})).To(Succeed())
		var nb *lab.Worker
		g.Eventually(func(g Gomega) {
			nb = e.worker(t, b.Machine)
			g.Expect(nb.IP).NotTo(Equal(old))
			expectNodeIdentity(g, e, nb)
		}).WithTimeout(nodeIdentityTimeout).Should(Succeed())
		t.Logf("Node %s: InternalIP %s -> %s", b.Machine, old, nb.IP)
		b = nb
	})

	t.Run("opt-out-removes-everything", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(e.l.Host.Client.Delete(e.ctx, gni)).To(Succeed())
		g.Eventually(func() bool {
			return apierrors.IsNotFound(e.l.Host.Client.Get(e.ctx, client.ObjectKeyFromObject(gni), &guestnetv1.GuestNodeIdentity{}))
		}).WithTimeout(nodeIdentityTimeout).Should(BeTrue(), "the finalizer goes once the agents removed their state")
		g.Expect(apierrors.IsNotFound(e.l.Guest.Client.Get(e.ctx,
			client.ObjectKey{Namespace: nodeagent.Namespace, Name: nodeagent.Name}, &appsv1.DaemonSet{}))).To(BeTrue())
		g.Eventually(func() bool {
			return apierrors.IsNotFound(e.l.Guest.Client.Get(e.ctx, client.ObjectKey{Name: nodeagent.Namespace}, &corev1.Namespace{}))
		}).WithTimeout(nodeIdentityTimeout).Should(BeTrue(), "the agent's namespace goes too")
		for _, w := range []*lab.Worker{a, b} {
			err := w.DoInVM(func() error {
				l, err := net.Listen("tcp", net.JoinHostPort(w.IP, "0"))
				if err == nil {
					_ = l.Close()
				}
				return err
			})
			g.Expect(errors.Is(err, syscall.EADDRNOTAVAIL)).To(BeTrue(), "the node IP is off lo in %s, got %v", w.Machine, err)
			out, err := w.InVM(e.ctx, "nft", "list", "tables")
			g.Expect(err).NotTo(HaveOccurred())
			tables, err := out.CombinedOutput()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(string(tables)).NotTo(ContainSubstring(nodeagent.TableName))
		}
	})
}

// A kubelet that is not in external cloud-provider mode writes its own InternalIP (10.0.2.2
// behind masquerade) on every status update: guestnet does not fight it, and says which
// kubelet argument to add.
func TestNodeIdentity_KubeletNotExternalIsReportedNotFought(t *testing.T) {
	g := NewWithT(t)
	e := newNodeIdentityEnv(t, "10.244.107.0/24", lab.KubeletMasquerade)
	e.createVM(t, e.ns+"-a")
	a := e.worker(t, e.ns+"-a")
	gni := e.createIdentity(t)
	g.Eventually(func(g Gomega) {
		c := e.condition(g, gni, guestnetv1.NodeAddressesCondition)
		g.Expect(c.Reason).To(Equal(guestnetv1.KubeletNotExternalReason))
		g.Expect(c.Message).To(ContainSubstring("--enable-cloud-provider"))
		g.Expect(c.Message).To(ContainSubstring(a.Machine))
	}).WithTimeout(nodeIdentityTimeout).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(nodeidentity.InternalIPs(e.node(g, a.Machine))).To(Equal([]string{lab.VMAddressMasquerade}))
	}).WithTimeout(5*time.Second).Should(Succeed(), "guestnet leaves the kubelet's address alone")
	_, err := e.l.DialKubelet(e.ctx, a.Machine)
	g.Expect(err).To(HaveOccurred(), "and kubectl logs still fails, which the condition explains")
	c := e.condition(g, gni, guestnetv1.ReadyCondition)
	g.Expect(c.Status).To(Equal(metav1.ConditionFalse))

	// The opt-out works all the same (the agents, not ready here, remove nothing and say so).
	g.Expect(e.l.Host.Client.Delete(e.ctx, gni)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(e.l.Host.Client.Get(e.ctx, client.ObjectKeyFromObject(gni), &guestnetv1.GuestNodeIdentity{}))
	}).WithTimeout(nodeIdentityTimeout).Should(BeTrue())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(e.l.Guest.Client.Get(e.ctx, client.ObjectKey{Name: nodeagent.Namespace}, &corev1.Namespace{}))
	}).WithTimeout(nodeIdentityTimeout).Should(BeTrue(), "nothing of the agent is left in the guest")
}

// dumpKernels logs what the VMs' and pods' kernels hold, for a failed test.
func dumpKernels(t *testing.T, workers ...*lab.Worker) {
	for _, w := range workers {
		for _, in := range []func(context.Context, string, ...string) (*exec.Cmd, error){w.InVM, w.InPod} {
			for _, args := range [][]string{{"ip", "addr"}, {"ip", "route"}, {"nft", "list", "ruleset"}} {
				cmd, err := in(context.Background(), args[0], args[1:]...)
				if err != nil {
					continue
				}
				out, _ := cmd.CombinedOutput()
				t.Logf("%s: %v:\n%s", w.Machine, args, out)
			}
		}
	}
}

// agentMetrics reads the node agent's /metrics from inside w's VM (127.0.0.1:HealthPort).
func agentMetrics(ctx context.Context, g Gomega, w *lab.Worker) string {
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: w.DialFromVM, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", nodeagent.HealthPort), http.NoBody)
	g.Expect(err).NotTo(HaveOccurred())
	resp, err := hc.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	return string(body)
}
