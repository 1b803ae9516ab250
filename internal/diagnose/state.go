package diagnose

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// State is everything the checks look at, read once (Gather). The checks are pure functions
// of it.
type State struct {
	// Namespace and ClusterName name the CAPI Cluster.
	Namespace   string
	ClusterName string
	Cluster     *clusterv1.Cluster

	// Workers are the cluster's worker MachineDeployments that use KubevirtMachineTemplates,
	// each with its template analysed against what it must declare: Required, and 22/TCP
	// where CAPK SSHes into its VMs (ports.ListWorkers, Workers.Required).
	Workers []ports.Workers
	// Required is every port every worker must accept (ports.ForCluster); RequiredErr says
	// why it could not be computed (then Workers are analysed against nothing).
	Required    ports.Set
	RequiredErr error
	// Managed: guestnet manages the cluster's worker ports (a GuestIngress or
	// GuestWebhookBridge names the cluster, or the Cluster has the extra-worker-ports
	// annotation).
	Managed bool

	// Pods, Services and EndpointSlices of the Cluster's namespace. PodsErr is set when the
	// pods cannot be listed (the identity may not: guestnet's manager never reads pods); the
	// checks then rely on the EndpointSlices alone.
	Pods           []corev1.Pod
	PodsErr        error
	Services       []corev1.Service
	EndpointSlices []discoveryv1.EndpointSlice

	// Ingresses and Bridges are the GuestIngresses and GuestWebhookBridges of the cluster.
	Ingresses []guestnetv1.GuestIngress
	// Admission is what the GuestIngressPolicies decide for each GuestIngress, by name
	// (policy.Admit over what was read, as guestnet's controller decides); AdmissionErr says
	// why the policies or pools could not be read.
	Admission    map[string]policy.Decision
	AdmissionErr error
	Bridges      []guestnetv1.GuestWebhookBridge
	// NodeIdentities are the cluster's GuestNodeIdentities: with one, guestnet initializes
	// the guest Nodes (docs/node-identity.md); nil when there is none or the host does not
	// serve the kind.
	NodeIdentities []guestnetv1.GuestNodeIdentity

	// Now is when the State was read: a Node tainted uninitialized for less than
	// uninitializedGrace is still being initialized.
	Now time.Time

	// Guest is what was read from the guest; nil when the Cluster is not provisioned (no
	// guest apiserver to ask).
	Guest *Guest

	// Probed is true when --probe ran: Probes holds, by target key (bridge.Target.Key), the
	// probe of every target that goes through a host Service or a url.
	Probed bool
	Probes map[string]ProbeOutcome
}

// Guest is what was read from the guest cluster.
type Guest struct {
	// Source names where the guest's kubeconfig came from ("Secret <ns>/<cluster>-kubeconfig").
	Source string
	// Err is set when the guest could not be read; nothing else is then.
	Err error
	// Version is the guest apiserver's version.
	Version string
	// CiliumConfig is the data of kube-system/cilium-config; nil when there is none.
	CiliumConfig map[string]string
	// Observed holds every APIService and webhook configuration.
	Observed bridge.Observed
	// Services are every Service of the guest (the targets' and the bridges' own).
	Services []corev1.Service
	// Agents are the konnectivity agent pods (kube-system, k8s-app=konnectivity-agent).
	Agents []corev1.Pod
	// Egress is the guest apiserver's reach of the webhooks' Services through its `cluster`
	// egress (service proxy GETs), read only when there are agents.
	Egress []bridge.EgressCheck
	// Nodes are the guest's Nodes, trimmed to what the node checks read
	// (nodeidentity.TrimNode), at most maxGuestNodes of them (NodesTruncated: there are
	// more). NodesErr says why they could not be read; the rest of the guest is read anyway.
	Nodes          []corev1.Node
	NodesTruncated bool
	NodesErr       error
	// CiliumNodes are the guest Cilium's CiliumNodes (cilium.io/v2), reduced to their
	// InternalIPs; nil when the guest does not serve the kind (no Cilium). CiliumNodesErr says
	// why they could not be read.
	CiliumNodes    []CiliumNode
	CiliumNodesErr error
}

// CiliumNodeGVK is the guest Cilium's CiliumNode: one per Node, named after it, cluster-scoped.
var CiliumNodeGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumNode"}

// CiliumNode is what the checks read of a guest CiliumNode: its name (its Node's) and the
// addresses of type InternalIP of its spec.addresses, those the agent read at its start and
// its peers tunnel to.
type CiliumNode struct {
	Name        string
	InternalIPs []string
}

// ProbeOutcome is one probe of a target, from where diagnose runs.
type ProbeOutcome struct {
	// Addr is what was dialed, ServerName the name the certificate was checked for.
	Addr       string
	ServerName string
	Result     bridge.ProbeResult
}
