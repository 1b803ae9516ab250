package diagnose

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

const uninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"

func taint(n *corev1.Node) {
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: uninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule})
}

// nodeResults are the results of the node checks, by check and object.
func nodeResults(s *State) *Report {
	rep := &Report{Verdict: OK}
	rep.add(checkNodes(s)...)
	rep.add(checkCiliumNodes(s)...)
	return rep
}

func TestDiagnose_NodesHealthy(t *testing.T) {
	g := NewWithT(t)
	rep := nodeResults(healthy(t))
	g.Expect(rep.Results).To(HaveLen(2))
	r := find(t, rep, CheckNodeAddress, "")
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("the 2 guest Nodes have their VM's virt-launcher pod IP as InternalIP"))
	r = find(t, rep, CheckCiliumNode, "")
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("the 2 CiliumNodes name their Node's InternalIP"))
}

// 1. InternalIPs that are not the VM's pod IP, written by someone other than the kubelet.
func TestDiagnose_NodeAddress(t *testing.T) {
	a, b := machineName("a"), machineName("b")
	tests := []struct {
		name        string
		change      func(s *State)
		object      string
		detail, fix []string
	}{
		{name: "the masquerade address", object: a, change: func(s *State) {
			s.Guest.Nodes[0] = guestNode(a, "10.0.2.2", "kubevirt-cloud-controller-manager")
		}, detail: []string{
			"InternalIP 10.0.2.2 is KubeVirt's masquerade address of the VM, not its virt-launcher pod IP 10.244.1.11 (pod virt-launcher-tenant-a-md-0-a)",
			"written by kubevirt-cloud-controller-manager",
			"`kubectl logs`, `exec` and metrics-server fail (dial tcp 10.0.2.2:10250)",
		}, fix: []string{
			"kubevirt-cloud-controller-manager wrote it: fix that initializer",
			"or leave the Nodes to guestnet: create a GuestNodeIdentity for Cluster tenant-a (docs/node-identity.md)",
		}},
		{name: "a stale pod IP", object: a, change: func(s *State) {
			s.Guest.Nodes[0] = guestNode(a, "10.244.1.99", "kubevirt-cloud-controller-manager")
		}, detail: []string{"InternalIP 10.244.1.99 is not its VM's virt-launcher pod IP 10.244.1.11 (pod virt-launcher-tenant-a-md-0-a)"}},
		{name: "the same InternalIP on two Nodes", object: b, change: func(s *State) {
			s.Guest.Nodes[1] = guestNode(b, "10.244.1.11", "someone")
		}, detail: []string{"InternalIP 10.244.1.11 is not its VM's virt-launcher pod IP 10.244.1.12 (pod virt-launcher-tenant-a-md-0-b), and also the InternalIP of Node tenant-a-md-0-a"}},
		{name: "no InternalIP and no taint", object: a, change: func(s *State) {
			s.Guest.Nodes[0] = guestNode(a, "", "kubelet")
		}, detail: []string{"no InternalIP, and no uninitialized taint: nothing initialized it and the taint was removed"},
			fix: []string{"create a GuestNodeIdentity for Cluster tenant-a (docs/node-identity.md), or run KubeVirt's cloud provider"}},
		{name: "a Node of no worker VM with the masquerade address", object: "bare", change: func(s *State) {
			s.Guest.Nodes = append(s.Guest.Nodes, guestNode("bare", "10.0.2.2", "other"))
		}, detail: []string{"InternalIP 10.0.2.2 is KubeVirt's masquerade address of the VM; no running virt-launcher pod of the Cluster's workers matches it"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			s := healthy(t)
			tt.change(s)
			rep := nodeResults(s)
			r := find(t, rep, CheckNodeAddress, tt.object)
			g.Expect(r.Verdict).To(Equal(Fail), r.Line())
			g.Expect(r.Runbook).To(Equal("docs/runbook.md#node-address"))
			for _, d := range tt.detail {
				g.Expect(r.Detail).To(ContainSubstring(d))
			}
			for _, f := range tt.fix {
				g.Expect(r.Fix).To(ContainSubstring(f))
			}
			// One verdict per Node: no OK summary next to a failure, no other check of it.
			for _, res := range rep.Results {
				if res.Check != CheckCiliumNode {
					g.Expect(res.Verdict).To(Equal(Fail), res.Line())
				}
			}
		})
	}
}

func TestDiagnose_NodeAddressUnderAGuestNodeIdentity(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.NodeIdentities = []guestnetv1.GuestNodeIdentity{{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ids"}, Spec: guestnetv1.GuestNodeIdentitySpec{ClusterName: clusterName}}}
	s.Guest.Nodes[0] = guestNode(machineName("a"), "10.244.1.99", "guestnet")
	r := find(t, nodeResults(s), CheckNodeAddress, machineName("a"))
	g.Expect(r.Verdict).To(Equal(Fail), r.Line())
	g.Expect(r.Fix).To(Equal("GuestNodeIdentity ids initializes this Cluster's Nodes: its NodeAddresses condition says why this one is not (kubectl describe gni ids -n k0smotron)"))
}

func TestDiagnose_NodeMatchedByCAPKLabelOrName(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	// Without KubeVirt's annotation, CAPK's label names the machine; without providerID, the
	// Node's name is the machine's.
	delete(s.Pods[0].Annotations, "kubevirt.io/domain")
	s.Pods[0].Labels[virtlauncher.MachineNameLabel] = machineName("a")
	s.Guest.Nodes[1].Spec.ProviderID = ""
	s.Guest.Nodes[0].Status.Addresses[0].Address = "10.244.1.98"
	s.Guest.Nodes[1].Status.Addresses[0].Address = "10.244.1.97"
	s.Guest.Nodes[0].ManagedFields[0].Manager = "x"
	s.Guest.Nodes[1].ManagedFields[0].Manager = "x"
	rep := nodeResults(s)
	g.Expect(find(t, rep, CheckNodeAddress, machineName("a")).Detail).To(ContainSubstring("pod IP 10.244.1.11"))
	g.Expect(find(t, rep, CheckNodeAddress, machineName("b")).Detail).To(ContainSubstring("pod IP 10.244.1.12"))
}

func TestDiagnose_NodeAddressNotCompared(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	// A Node of no worker VM of the Cluster, and a worker in a live migration (two pods).
	s.Guest.Nodes = append(s.Guest.Nodes, guestNode("bare-metal", "192.0.2.7", "kubelet"))
	moved := workerPod("b", "10.244.1.13", true)
	moved.Name += "-2"
	s.Pods = append(s.Pods, moved)
	r := find(t, nodeResults(s), CheckNodeAddress, "")
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("1 of the 3 guest Nodes has its VM's virt-launcher pod IP as InternalIP; not compared: " +
		"bare-metal (no running virt-launcher pod of the Cluster's workers matches it), tenant-a-md-0-b (2 running virt-launcher pods: a live migration)"))
}

// 2. The taint of a kubelet in external mode that nothing initializes.
func TestDiagnose_NodeUninitialized(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Guest.Nodes[0] = guestNode(machineName("a"), "", "kubelet")
	taint(&s.Guest.Nodes[0])
	rep := nodeResults(s)
	r := find(t, rep, CheckNodeUninitialized, machineName("a"))
	g.Expect(r.Verdict).To(Equal(Fail), r.Line())
	g.Expect(r.Detail).To(Equal("tainted node.cloudprovider.kubernetes.io/uninitialized for 1h0m0s, with no InternalIP: its kubelet runs in external cloud-provider mode " +
		"and nothing initializes the Node: pods that do not tolerate the taint are not scheduled there, and `kubectl logs`/`exec` cannot reach it"))
	g.Expect(r.Fix).To(Equal("create a GuestNodeIdentity for Cluster tenant-a (docs/node-identity.md): guestnet then writes each Node's VM's virt-launcher pod IP " +
		"as its InternalIP and removes the taint; or run KubeVirt's cloud provider"))
	g.Expect(r.Runbook).To(Equal("docs/runbook.md#node-uninitialized"))
	for _, res := range rep.Results {
		if res.Check != CheckCiliumNode {
			g.Expect(res.Object).NotTo(BeEmpty(), "no OK summary next to a failure: %s", res.Line())
		}
	}

	// Just registered: an initializer may be at it.
	s.Guest.Nodes[0].CreationTimestamp = metav1.NewTime(now.Add(-20 * time.Second))
	r = find(t, nodeResults(s), CheckNodeUninitialized, machineName("a"))
	g.Expect(r.Verdict).To(Equal(Warn), r.Line())
	g.Expect(r.Fix).To(HavePrefix("run diagnose again in a minute; if it stays, create a GuestNodeIdentity"))

	// With a GuestNodeIdentity, guestnet should have initialized it.
	s.NodeIdentities = []guestnetv1.GuestNodeIdentity{{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ids"}, Spec: guestnetv1.GuestNodeIdentitySpec{ClusterName: clusterName}}}
	s.Guest.Nodes[0].CreationTimestamp = metav1.NewTime(now.Add(-time.Hour))
	r = find(t, nodeResults(s), CheckNodeUninitialized, machineName("a"))
	g.Expect(r.Fix).To(HavePrefix("GuestNodeIdentity ids initializes this Cluster's Nodes: its NodeAddresses condition says why this one is not"))
}

// 3. A kubelet that writes its own address (not in external mode).
func TestDiagnose_KubeletNotExternal(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	for i := range s.Guest.Nodes {
		s.Guest.Nodes[i].Status.Addresses[0].Address = "10.0.2.2"
	}
	s.Guest.CiliumNodes = nil
	rep := nodeResults(s)
	g.Expect(rep.Results).To(HaveLen(2))
	r := find(t, rep, CheckKubeletMode, machineName("a"))
	g.Expect(r.Verdict).To(Equal(Fail), r.Line())
	g.Expect(r.Detail).To(Equal("InternalIP 10.0.2.2 is KubeVirt's masquerade address of the VM, not its virt-launcher pod IP 10.244.1.11 (pod virt-launcher-tenant-a-md-0-a), " +
		"and also the InternalIP of Node tenant-a-md-0-b; the kubelet wrote it itself: it does not run in external cloud-provider mode, " +
		"so it rewrites its addresses every 10 s and no initializer may set them; `kubectl logs`, `exec` and metrics-server fail (dial tcp 10.0.2.2:10250)"))
	g.Expect(r.Fix).To(Equal("run the kubelets in external cloud-provider mode: add --enable-cloud-provider to the K0sWorkerConfigTemplate's spec.args " +
		"(--cloud-provider=external for other kubelets), then roll the workers (the Nodes must register again) and have them initialized: " +
		"create a GuestNodeIdentity for Cluster tenant-a (docs/node-identity.md), or run KubeVirt's cloud provider"))
	g.Expect(r.Runbook).To(Equal("docs/runbook.md#kubelet-not-external"))
	g.Expect(find(t, rep, CheckKubeletMode, machineName("b")).Verdict).To(Equal(Fail))

	// Addresses with no record of their writer are the kubelet's too.
	s.Guest.Nodes[0].ManagedFields = nil
	g.Expect(find(t, nodeResults(s), CheckKubeletMode, machineName("a")).Verdict).To(Equal(Fail))
}

func TestDiagnose_NodesUnreadable(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Guest.Nodes, s.Guest.CiliumNodes = nil, nil
	s.Guest.NodesErr = errors.New(`nodes is forbidden: User "x" cannot list resource "nodes"`)
	rep := nodeResults(s)
	g.Expect(rep.Results).To(HaveLen(1))
	r := find(t, rep, CheckNodeAddress, "")
	g.Expect(r.Verdict).To(Equal(Warn), r.Line())
	g.Expect(r.Detail).To(ContainSubstring(`the guest's Nodes cannot be read: nodes is forbidden`))

	s.Guest.NodesErr = nil
	s.Guest.NodesTruncated = true
	s.Guest.Nodes = healthy(t).Guest.Nodes
	r = find(t, nodeResults(s), CheckNodeAddress, "")
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(ContainSubstring("; the guest has more than 5000 Nodes: only the first 5000 were checked"))
}

// 4. A Cilium agent that read its node IP before the Node had the right one.
func TestDiagnose_CiliumNode(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Guest.CiliumNodes[1].InternalIPs = []string{"10.0.2.2"}
	rep := nodeResults(s)
	r := find(t, rep, CheckCiliumNode, machineName("b"))
	g.Expect(r.Verdict).To(Equal(Fail), r.Line())
	g.Expect(r.Detail).To(Equal("names InternalIP 10.0.2.2, but Node tenant-a-md-0-b's InternalIP is 10.244.1.12: its Cilium agent read the node IP " +
		"when it started, before the Node had this one, and its peers tunnel to 10.0.2.2: pod traffic from other nodes to this one is lost"))
	g.Expect(r.Fix).To(Equal("restart that node's Cilium agent (it reads its node IP only at start): " +
		"kubectl --context guest -n kube-system delete pod -l k8s-app=cilium --field-selector spec.nodeName=tenant-a-md-0-b"))
	g.Expect(r.Runbook).To(Equal("docs/runbook.md#cilium-node-ip"))
	g.Expect(rep.Results).To(HaveLen(2), "no OK summary of the CiliumNodes next to a failure")

	// No CiliumNode CRD in the guest (no Cilium): nothing to say.
	s.Guest.CiliumNodes = nil
	for _, res := range nodeResults(s).Results {
		g.Expect(res.Check).NotTo(Equal(CheckCiliumNode))
	}
	// A CiliumNode of no Node (the agent's leftover), or of a Node whose own address is wrong: not compared.
	s.Guest.CiliumNodes = []CiliumNode{{Name: "gone", InternalIPs: []string{"10.0.2.2"}}}
	r = find(t, nodeResults(s), CheckCiliumNode, "")
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("no CiliumNode of a Node with a right InternalIP (1 CiliumNodes)"))
}

func TestDiagnose_NodeChecksNeedTheGuest(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Guest.Err = errors.New("unreachable")
	for _, res := range Diagnose(s).Results {
		g.Expect(res.Check).NotTo(BeElementOf(CheckNodeAddress, CheckNodeUninitialized, CheckKubeletMode, CheckCiliumNode))
	}
}

// A worker template with its own VM network: its .2 is the masquerade address.
func TestDiagnose_NodeAddressOfACustomVMNetwork(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	networks := []any{map[string]any{"name": "default", "pod": map[string]any{"vmNetworkCIDR": "10.11.0.0/24"}}}
	g.Expect(unstructured.SetNestedSlice(s.Workers[0].Template.Object, networks,
		"spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "networks")).To(Succeed())
	s.Guest.Nodes = append(s.Guest.Nodes, guestNode("elsewhere", "10.11.0.2", "x"))
	r := find(t, nodeResults(s), CheckNodeAddress, "elsewhere")
	g.Expect(r.Verdict).To(Equal(Fail), r.Line())
	g.Expect(r.Detail).To(HavePrefix("InternalIP 10.11.0.2 is KubeVirt's masquerade address of the VM; no running virt-launcher pod"))
}

// A Node whose own address is wrong gets its Node's verdict, not a Cilium one: its agent is
// restarted once the address is right.
func TestDiagnose_CiliumNodeOfAWrongNode(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Guest.Nodes[1].Status.Addresses[0].Address = "10.0.2.2"
	rep := nodeResults(s)
	g.Expect(find(t, rep, CheckKubeletMode, machineName("b")).Verdict).To(Equal(Fail))
	r := find(t, rep, CheckCiliumNode, "")
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("1 of the 2 CiliumNodes name their Node's InternalIP; the others have no Node with a right InternalIP (see the Nodes' checks)"))
}
