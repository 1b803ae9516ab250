// Package nodeidentity decides, for each guest Node of a Cluster that opted in to node
// identity (GuestNodeIdentity), what its addresses must be and whether guestnet may write
// them (docs/decisions/0011-node-identity.md). Pure functions: the controller
// (controllers/guestnodeidentity) reads and writes, this package decides.
//
// Facts it rests on (docs/node-identity-research.md): a kubelet in external cloud-provider
// mode (k0s: --enable-cloud-provider) registers its Node with the taint
// node.cloudprovider.kubernetes.io/uninitialized and a Hostname address only, and never
// touches the addresses once another writer set them; any other kubelet rewrites them on
// every status update (k8s.io/kubernetes v1.37.2 pkg/kubelet/nodestatus/setters.go
// NodeAddress). The VM behind KubeVirt's masquerade binding is reachable only at its
// virt-launcher pod's IPs, which the host kubelet writes in the pod's status.podIPs.
package nodeidentity

import (
	"bytes"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// UninitializedTaint is the taint a kubelet in external cloud-provider mode registers its
// Node with, until a cloud-node controller initializes it (k8s.io/cloud-provider api
// TaintExternalCloudProvider).
const UninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"

// KubeletFieldManager is the field manager of the kubelet's writes of a Node's status.
const KubeletFieldManager = "kubelet"

// ProviderIDPrefix is the prefix of the providerID CAPK gives a KubevirtMachine and CAPI
// copies to the Node: kubevirt://<KubevirtMachine name>.
const ProviderIDPrefix = "kubevirt://"

// MachineName is the KubevirtMachine (VM, VMI) a guest Node runs on: its providerID's name
// when CAPK set one, else its own name (CAPK's VM host name is the KubevirtMachine's name,
// which the kubelet registers as the Node's name).
func MachineName(node *corev1.Node) string {
	if name, ok := strings.CutPrefix(node.Spec.ProviderID, ProviderIDPrefix); ok && name != "" {
		return name
	}
	return node.Name
}

// WorkerPodSelector selects the virt-launcher pod of node's VM among the Cluster
// namespace/cluster's workers.
func WorkerPodSelector(namespace, cluster string, node *corev1.Node) map[string]string {
	return virtlauncher.MachineSelector(namespace, cluster, MachineName(node))
}

// Verdict is what guestnet does with one Node.
type Verdict string

const (
	// InSync means the Node's InternalIPs are its pod IPs already.
	InSync Verdict = "InSync"
	// Write means guestnet writes the addresses (the Node waits for initialization, or guestnet
	// wrote them before and the pod IPs changed), then removes the taint.
	Write Verdict = "Write"
	// KubeletOwned means the kubelet wrote other addresses itself: it does not run in external
	// cloud-provider mode, and would revert any other writer.
	KubeletOwned Verdict = "KubeletOwned"
	// OtherInitializer means another manager (KubeVirt's cloud provider) wrote the addresses.
	OtherInitializer Verdict = "OtherInitializer"
	// NoWorkerPod means no running virt-launcher pod of the Cluster's workers matches a Node
	// that waits for guestnet (the taint) or whose addresses guestnet wrote (its VM is down).
	NoWorkerPod Verdict = "NoWorkerPod"
	// NotAWorker means no virt-launcher pod of the Cluster's workers matches a Node that
	// does not wait for guestnet and whose addresses guestnet never wrote: a Node of other
	// infrastructure (another MachineDeployment's provider, a control-plane Node), left alone.
	NotAWorker Verdict = "NotAWorker"
	// Migrating means several running pods match (a live migration): the Node keeps what it has
	// until one is left.
	Migrating Verdict = "Migrating"
)

// Decision is the verdict on one Node and what it is made of.
type Decision struct {
	Verdict Verdict
	// PodIPs are the VM's virt-launcher pod IPs (the Node's InternalIPs to be).
	PodIPs []string
	// InternalIPs are the Node's InternalIPs now.
	InternalIPs []string
	// Writers are the managers other than the kubelet and guestnet that wrote the addresses.
	Writers []string
	// Tainted: the Node still carries UninitializedTaint.
	Tainted bool
}

// Decide decides what guestnet does with node, given the running virt-launcher pods that
// WorkerPodSelector selects and guestnet's field manager.
func Decide(node *corev1.Node, pods []corev1.Pod, fieldManager string) Decision {
	d := Decision{InternalIPs: InternalIPs(node), Tainted: HasUninitializedTaint(node)}
	var running []corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && len(p.Status.PodIPs) > 0 {
			running = append(running, p)
		}
	}
	guestnetWrote := false
	for _, w := range AddressWriters(node) {
		switch w {
		case fieldManager:
			guestnetWrote = true
		case KubeletFieldManager:
		default:
			d.Writers = append(d.Writers, w)
		}
	}
	switch len(running) {
	case 0:
		d.Verdict = NoWorkerPod
		if !d.Tainted && !guestnetWrote {
			d.Verdict = NotAWorker
		}
		return d
	case 1:
	default:
		d.Verdict = Migrating
		return d
	}
	for _, ip := range running[0].Status.PodIPs {
		d.PodIPs = append(d.PodIPs, ip.IP)
	}
	switch {
	case slices.Equal(d.InternalIPs, d.PodIPs) && !d.Tainted:
		d.Verdict = InSync
	case len(d.Writers) > 0 && !guestnetWrote:
		d.Verdict = OtherInitializer
	case d.Tainted || guestnetWrote:
		d.Verdict = Write
	default:
		d.Verdict = KubeletOwned
	}
	return d
}

// InternalIPs are node's InternalIP addresses, in order.
func InternalIPs(node *corev1.Node) []string {
	var out []string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			out = append(out, a.Address)
		}
	}
	return out
}

// HasUninitializedTaint reports whether node waits for a cloud-node controller.
func HasUninitializedTaint(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == UninitializedTaint })
}

// WithoutUninitializedTaint returns node's taints without UninitializedTaint.
func WithoutUninitializedTaint(node *corev1.Node) []corev1.Taint {
	return slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == UninitializedTaint })
}

// Addresses are the addresses guestnet writes, whole, as k8s.io/cloud-provider's cloud-node
// controller does: one InternalIP per pod IP, then the Node's host names as they are (the
// kubelet's Hostname address; the Node's name when it has none).
func Addresses(node *corev1.Node, podIPs []string) []corev1.NodeAddress {
	out := make([]corev1.NodeAddress, 0, len(podIPs)+1)
	for _, ip := range podIPs {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	hostnames := 0
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeHostName {
			out = append(out, a)
			hostnames++
		}
	}
	if hostnames == 0 {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeHostName, Address: node.Name})
	}
	return out
}

// AddressWriters are the field managers that wrote node's status.addresses, in the order of
// its managedFields.
func AddressWriters(node *corev1.Node) []string {
	var out []string
	for _, e := range node.ManagedFields {
		if writesAddresses(e) && !slices.Contains(out, e.Manager) {
			out = append(out, e.Manager)
		}
	}
	return out
}

// addressesMark stands in, in a trimmed Node's managedFields, for the fields of an entry that
// wrote status.addresses.
const addressesMark = `{"f:status":{"f:addresses":{}}}`

func writesAddresses(e metav1.ManagedFieldsEntry) bool {
	return e.FieldsV1 != nil && bytes.Contains(e.FieldsV1.GetRawBytes(), []byte(`"f:addresses"`))
}

// TrimNode keeps of a guest Node what Decide and the controller read: name, resourceVersion,
// UID, providerID, taints, addresses and, of its managedFields, who wrote the addresses. A
// Node's images, conditions and labels can be tens of kilobytes; guestnet caches Nodes of
// every guest that opted in.
func TrimNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Generation: n.Generation,
			CreationTimestamp: n.CreationTimestamp, DeletionTimestamp: n.DeletionTimestamp,
		},
		Spec:   corev1.NodeSpec{ProviderID: n.Spec.ProviderID, Taints: n.Spec.Taints},
		Status: corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
	for _, e := range n.ManagedFields {
		if writesAddresses(e) {
			out.ManagedFields = append(out.ManagedFields, metav1.ManagedFieldsEntry{
				Manager: e.Manager, Operation: e.Operation, Subresource: e.Subresource,
				FieldsType: e.FieldsType, FieldsV1: metav1.NewFieldsV1(addressesMark),
			})
		}
	}
	return out
}
