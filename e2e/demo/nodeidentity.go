package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// Two more guest clusters, whose VMs run on the lab's kernel datapath (KubeVirt's own nftables
// rules, the guest tunnel as a kernel VXLAN): "plain", whose kubelets register behind
// masquerade as real ones do (InternalIP 10.0.2.2), and "managed", whose kubelets run in
// external cloud-provider mode and which has a GuestNodeIdentity. The guest apiserver reaches a
// kubelet (what `kubectl logs` needs) and the tunnel crosses nodes on "managed" only.
const (
	nodeIDPlainNamespace   = "k0smotron-plain"
	nodeIDManagedNamespace = "k0smotron-managed"
	// The guest tunnel's port (the field report's Cilium: VXLAN on 8473).
	demoTunnelPort = 8473
)

func nodeIdentityTour(ctx context.Context, l *lab.Lab, host, guest kubectlFunc) error {
	section("Node identity: two more clusters on the kernel datapath. \"plain\": kubelets as they register behind masquerade (10.0.2.2); \"managed\": kubelets in external cloud-provider mode (k0s --enable-cloud-provider)")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "cilium-config"},
		Data: map[string]string{"tunnel-protocol": "vxlan", "tunnel-port": fmt.Sprint(demoTunnelPort)}}
	if err := client.IgnoreAlreadyExists(l.Guest.Client.Create(ctx, cm)); err != nil {
		return err
	}
	plain, err := nodeIDCluster(ctx, l, nodeIDPlainNamespace, "10.244.120.0/24", lab.KubeletMasquerade)
	if err != nil {
		return err
	}
	managed, err := nodeIDCluster(ctx, l, nodeIDManagedNamespace, "10.244.121.0/24", lab.KubeletExternal)
	if err != nil {
		return err
	}
	l.StartNodeAgents(ctx, managed)
	guest("get", "nodes", "-o", "wide", "-l", "guestnet-demo")
	fmt.Println("(plain's Nodes say 10.0.2.2, the address every VM has; managed's have no InternalIP and the taint node.cloudprovider.kubernetes.io/uninitialized)")

	section("Without guestnet: the guest apiserver dials a kubelet (the path of `kubectl logs`/`exec`) at the Node's InternalIP")
	dialKubelet(ctx, l, plain.Workers()[0].Machine)
	reachable(ctx, l, plain)

	section("guestnet: a GuestNodeIdentity for \"managed\"")
	gni := &guestnetv1.GuestNodeIdentity{ObjectMeta: metav1.ObjectMeta{Namespace: nodeIDManagedNamespace, Name: "guest"},
		Spec: guestnetv1.GuestNodeIdentitySpec{ClusterName: "guest"}}
	if err := l.Host.Client.Create(ctx, gni); err != nil {
		return err
	}
	if err := waitFor(ctx, func() bool {
		got := &guestnetv1.GuestNodeIdentity{}
		return l.Host.Client.Get(ctx, client.ObjectKeyFromObject(gni), got) == nil && conditions.IsTrue(got, guestnetv1.ReadyCondition)
	}); err != nil {
		return err
	}
	host("get", "gni", "-n", nodeIDManagedNamespace)
	guest("get", "nodes", "-o", "wide", "-l", "guestnet-demo")
	guest("get", "daemonset", "-n", "guestnet-system")
	w := managed.Workers()[0]
	if cmd, err := w.InVM(ctx, "nft", "list", "table", "ip", "guestnet"); err == nil {
		out, _ := cmd.CombinedOutput()
		fmt.Printf("\n$ nft list table ip guestnet   # inside VM %s\n%s", w.Machine, out)
	}
	section("With guestnet: the guest apiserver reaches the kubelet at the pod IP, and the tunnel crosses nodes")
	dialKubelet(ctx, l, w.Machine)
	reachable(ctx, l, managed)
	return nil
}

// nodeIDCluster creates a guest cluster with two worker VMs of the KubeVirt stand-in on the
// kernel datapath, their kubelets in mode, each serving the kubelet stand-in.
func nodeIDCluster(ctx context.Context, l *lab.Lab, ns, subnet string, mode lab.KubeletMode) (*lab.KubeVirt, error) {
	gc, err := l.CreateGuestCluster(ctx, ns, "guest", lab.WorkerTemplateOptions{Ports: []int32{10250}, UDPPorts: []int32{demoTunnelPort}})
	if err != nil {
		return nil, err
	}
	kv, err := l.StartKubeVirtStandIn(ctx, ns, lab.KubeVirtOptions{WorkerSubnet: subnet, KernelDatapath: true, GuestKubelet: mode,
		OnBoot: func(_ context.Context, w *lab.Worker) error {
			return w.ServeKubeletStandIn(lab.KubeletUsage{CPUCores: 0.1, MemoryBytes: 1 << 30})
		}})
	if err != nil {
		return nil, err
	}
	for _, name := range []string{ns + "-a", ns + "-b"} {
		if err := lab.CreateWorkerVM(ctx, l.Host.Client, ns, gc.Name, name, []int32{10250}, []int32{demoTunnelPort}); err != nil {
			return nil, err
		}
	}
	err = waitFor(ctx, func() bool {
		if len(kv.Workers()) != 2 {
			return false
		}
		for _, w := range kv.Workers() {
			node := &corev1.Node{}
			if l.Guest.Client.Get(ctx, client.ObjectKey{Name: w.Machine}, node) != nil {
				return false
			}
			if node.Labels["guestnet-demo"] == "" {
				node.Labels["guestnet-demo"] = ns
				if l.Guest.Client.Update(ctx, node) != nil {
					return false
				}
			}
		}
		return true
	})
	return kv, err
}

// reachable prints whether the guest tunnel stand-in between kv's two VMs carries traffic.
func reachable(ctx context.Context, l *lab.Lab, kv *lab.KubeVirt) {
	ws := kv.Workers()
	t, err := l.StartGuestTunnel(ctx, ws[0], ws[1])
	if err != nil {
		fmt.Printf("guest tunnel: %v\n", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := t.Reachable(ctx, ws[0], ws[1]); err != nil {
		fmt.Printf("guest tunnel %s -> %s (VXLAN on %d between the Nodes' InternalIPs): FAILS: %v\n", ws[0].Machine, ws[1].Machine, t.Port, err)
		return
	}
	fmt.Printf("guest tunnel %s -> %s (VXLAN on %d between the Nodes' InternalIPs): works\n", ws[0].Machine, ws[1].Machine, t.Port)
}

// dialKubelet prints whether the guest apiserver's address reaches node's kubelet at its
// InternalIP, as the apiserver does for `kubectl logs`, `exec` and `port-forward`.
func dialKubelet(ctx context.Context, l *lab.Lab, node string) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := l.DialKubelet(ctx, node)
	if err != nil {
		fmt.Printf("guest apiserver -> kubelet of %s (its InternalIP, port 10250): FAILS: %v\n", node, err)
		return
	}
	_ = c.Close()
	fmt.Printf("guest apiserver -> kubelet of %s (its InternalIP, port 10250): connected\n", node)
}
