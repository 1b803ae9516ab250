package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GuestNodeIdentityFinalizer lets guestnet take its agent out of the guest (after it removed
// what it put in every VM's kernel) before a GuestNodeIdentity goes away.
const GuestNodeIdentityFinalizer = "guestnet.addons.cluster.x-k8s.io/guestnodeidentity"

// GuestNodeIdentity condition types (see also the shared ones in common_types.go).
const (
	// NodeAddressesCondition says whether every guest Node's InternalIPs are its VM's
	// virt-launcher pod IPs (docs/node-identity.md).
	NodeAddressesCondition = "NodeAddresses"

	// NodeAgentCondition says whether guestnet's agent runs, ready, on every guest Node: the
	// node IP is a local address of each VM and KubeVirt's masquerade address is translated
	// to it and back.
	NodeAgentCondition = "NodeAgent"

	// ControlPlaneAddressCondition says whether the control plane's host Service has the
	// address of spec.controlPlane, admitted by a GuestIngressPolicy and announced the way a
	// GuestIngress's is. Absent when spec.controlPlane is not set.
	ControlPlaneAddressCondition = "ControlPlaneAddress"
)

// GuestNodeIdentity condition reasons.
const (
	// NodeAddressesSetReason: every guest Node's InternalIPs are its VM's pod IPs.
	NodeAddressesSetReason = "NodeAddressesSet"
	// NoNodesReason: the guest has no Node yet.
	NoNodesReason = "NoNodes"
	// KubeletNotExternalReason: a Node's kubelet set its own addresses (it does not run in
	// external cloud-provider mode), so guestnet may not write them: the kubelet would revert
	// them within seconds. The message names the Nodes and the kubelet argument to add.
	KubeletNotExternalReason = "KubeletNotExternal"
	// WorkerPodNotFoundReason: no running virt-launcher pod of this Cluster's workers matches
	// a Node (by its providerID or name); the Node keeps what it has.
	WorkerPodNotFoundReason = "WorkerPodNotFound"
	// InitializedElsewhereReason: another manager (KubeVirt's cloud provider, say) wrote the
	// addresses of some Nodes; guestnet leaves them alone. Informational: Ready is not held.
	InitializedElsewhereReason = "InitializedElsewhere"
	// NodeAddressesExternalReason: spec.nodeAddresses is External: guestnet writes no Node.
	NodeAddressesExternalReason = "NodeAddressesExternal"

	// NodeAgentReadyReason: the agent runs the applied template, ready, on every Node.
	NodeAgentReadyReason = "NodeAgentReady"
	// NodeAgentRollingOutReason: the agent's DaemonSet is not rolled out yet; the message
	// gives its counts.
	NodeAgentRollingOutReason = "NodeAgentRollingOut"
	// NodeAgentImageUnknownReason: the manager does not know the agent's image (its own): it
	// was started without --node-agent-image outside a pod; the message says what to set.
	NodeAgentImageUnknownReason = "NodeAgentImageUnknown"
	// NodeAgentRemovingReason: the object is being deleted; the agents take off what they put
	// in the kernels before guestnet deletes them.
	NodeAgentRemovingReason = "NodeAgentRemoving"

	// ControlPlaneAddressReadyReason: the control plane's Service has the admitted address and
	// the Cluster's control plane endpoint is that address.
	ControlPlaneAddressReadyReason = "ControlPlaneAddressReady"
	// ControlPlaneServiceNotFoundReason: the control plane's host Service does not exist (yet):
	// the control plane provider creates it when its Service type is LoadBalancer.
	ControlPlaneServiceNotFoundReason = "ControlPlaneServiceNotFound"
	// ControlPlaneServiceNotLoadBalancerReason: the control plane's host Service is not of type
	// LoadBalancer, or its loadBalancerClass is one Cilium does not serve.
	ControlPlaneServiceNotLoadBalancerReason = "ControlPlaneServiceNotLoadBalancer"
	// ControlPlaneEndpointElsewhereReason: the Service has the address but the Cluster's
	// spec.controlPlaneEndpoint, which Cluster API sets once, names another host.
	ControlPlaneEndpointElsewhereReason = "ControlPlaneEndpointElsewhere"
	// IPPendingReason, PoolConflictReason, HostObjectConflictReason (GuestIngress's) and the
	// Admitted reasons of common_types.go are used as well.
)

// NodeAddressesMode says who writes the guest Nodes' addresses.
// +kubebuilder:validation:Enum=Managed;External
type NodeAddressesMode string

const (
	// NodeAddressesManaged means guestnet is the cloud-node controller of the Cluster's Nodes: it
	// writes each Node's addresses from its VM's virt-launcher pod and removes the
	// node.cloudprovider.kubernetes.io/uninitialized taint.
	NodeAddressesManaged NodeAddressesMode = "Managed"
	// NodeAddressesExternal means another cloud-node controller (KubeVirt's cloud provider) does;
	// guestnet runs only its agent in the VMs.
	NodeAddressesExternal NodeAddressesMode = "External"
)

// GuestNodeIdentitySpec opts a Cluster in to node identity.
type GuestNodeIdentitySpec struct {
	// clusterName is the name of the CAPI Cluster in this namespace whose workers this is for.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="clusterName must be the name of a Cluster in this namespace: lower-case letters, digits, '-' and '.', e.g. tenant-a (no namespace/ prefix)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterName is immutable"
	ClusterName string `json:"clusterName"`

	// nodeAddresses says who writes the guest Nodes' addresses: Managed (guestnet, the
	// default) or External (another cloud-node controller, e.g. KubeVirt's cloud provider).
	// +optional
	// +kubebuilder:default=Managed
	NodeAddresses NodeAddressesMode `json:"nodeAddresses,omitempty"`

	// controlPlane gives the control plane's host LoadBalancer Service an address that works
	// from inside the VMs and from outside, admitted by a GuestIngressPolicy and announced as
	// a GuestIngress's is. The control plane provider makes it the Cluster's endpoint (the
	// workers' join address); it must be set when the Cluster is created, because Cluster API
	// sets the endpoint once.
	// +optional
	ControlPlane *ControlPlaneAddressSpec `json:"controlPlane,omitempty"`
}

// ControlPlaneAddressSpec is the load-balancer address of a hosted control plane. guestnet
// creates a CiliumLoadBalancerIPPool holding only ip and selecting only the Service, an L2
// announcement policy for it, and requests ip on the Service (lbipam.cilium.io/ips, with its
// own field manager); it changes nothing else of the Service, which the control plane
// provider owns.
type ControlPlaneAddressSpec struct {
	// serviceName is the control plane's host Service in this namespace. Defaults to
	// k0smotron's kmc-<control plane name>-lb for a Cluster whose controlPlaneRef is a
	// K0smotronControlPlane (whose spec.service.type must be LoadBalancer).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="serviceName must be a Service name: lower-case letters, digits and '-', starting with a letter"
	ServiceName string `json:"serviceName,omitempty"`

	// ip is the control plane's address, e.g. 10.2.6.221.
	// +required
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="ip must be an IPv4 or IPv6 address, e.g. 10.2.6.221"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="controlPlane.ip is immutable: the Cluster's endpoint, its certificates and every kubeconfig carry it"
	IP string `json:"ip"`

	// l2 says which host nodes and interfaces announce the address, within what the
	// admitting GuestIngressPolicy allows.
	// +optional
	L2 *L2AnnouncementSpec `json:"l2,omitempty"`
}

// GuestNodeIdentityStatus is what guestnet observed and did.
type GuestNodeIdentityStatus struct {
	// nodes counts the guest Nodes of the Cluster's KubeVirt workers (those with a worker
	// virt-launcher pod, waiting for guestnet, or whose addresses guestnet wrote).
	// +optional
	Nodes int32 `json:"nodes"`

	// nodesWithPodIP counts the guest Nodes whose InternalIPs are their VM's pod IPs.
	// +optional
	NodesWithPodIP int32 `json:"nodesWithPodIP"`

	// agentsReady counts the agent pods that run the applied template and are ready.
	// +optional
	AgentsReady int32 `json:"agentsReady"`

	// controlPlaneAddress is the address the control plane's Service got (spec.controlPlane).
	// +optional
	ControlPlaneAddress string `json:"controlPlaneAddress,omitempty"`

	// observedGeneration is the generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready, Paused, ClusterAvailable, NodeAddresses, NodeAgent and, with
	// spec.controlPlane, ControlPlaneAddress.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=guestnodeidentities,scope=Namespaced,shortName=gni,categories=cluster-api;guestnet
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".spec.clusterName",description="CAPI Cluster"
// +kubebuilder:printcolumn:name="Nodes",type="integer",JSONPath=".status.nodes",description="Guest Nodes"
// +kubebuilder:printcolumn:name="Pod IP",type="integer",JSONPath=".status.nodesWithPodIP",description="Nodes whose InternalIPs are their pod IPs"
// +kubebuilder:printcolumn:name="Agents",type="integer",JSONPath=".status.agentsReady",description="Agents ready"
// +kubebuilder:printcolumn:name="Control plane",type="string",JSONPath=".status.controlPlaneAddress",description="The control plane's load-balancer address",priority=1
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// GuestNodeIdentity makes a Cluster's KubeVirt workers real nodes behind masquerade: each
// guest Node's InternalIP is its VM's virt-launcher pod IP, and inside each VM that address
// is a local one, KubeVirt's masquerade address translated to it and back
// (docs/node-identity.md). One per Cluster; deleting it is the opt-out.
type GuestNodeIdentity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the Cluster.
	// +required
	Spec GuestNodeIdentitySpec `json:"spec"`

	// status reports the Nodes and the agent.
	// +optional
	Status GuestNodeIdentityStatus `json:"status,omitempty"`
}

// GetClusterName returns the name of the Cluster the GuestNodeIdentity belongs to.
func (g *GuestNodeIdentity) GetClusterName() string { return g.Spec.ClusterName }

// GetConditions returns the conditions (CAPI util/conditions Getter).
func (g *GuestNodeIdentity) GetConditions() []metav1.Condition { return g.Status.Conditions }

// SetConditions sets the conditions (CAPI util/conditions Setter).
func (g *GuestNodeIdentity) SetConditions(c []metav1.Condition) { g.Status.Conditions = c }

// +kubebuilder:object:root=true

// GuestNodeIdentityList is a list of GuestNodeIdentity.
type GuestNodeIdentityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuestNodeIdentity `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &GuestNodeIdentity{}, &GuestNodeIdentityList{})
}
