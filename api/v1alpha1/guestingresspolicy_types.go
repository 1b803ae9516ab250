package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AdmittedCondition says, on a GuestIngress, whether a GuestIngressPolicy admits everything
// the GuestIngress asks for. guestnet fails closed: without it, nothing is created on the host.
const AdmittedCondition = "Admitted"

// Admitted condition reasons.
const (
	// AdmittedReason: a GuestIngressPolicy that selects the namespace admits the GuestIngress.
	AdmittedReason = "Admitted"
	// NoPolicyReason: no GuestIngressPolicy selects the GuestIngress's namespace.
	NoPolicyReason = "NoPolicy"
	// NotAllowedReason: the policies that select the namespace do not allow something the
	// GuestIngress asks for; the message names it (and whether a policy of other namespaces,
	// unnamed, would allow it).
	NotAllowedReason = "NotAllowed"
	// QuotaExceededReason: the namespace already has as many GuestIngresses as the policy allows.
	QuotaExceededReason = "QuotaExceeded"
	// HostAddressReason: a policy admits what the GuestIngress asks for, but it is, or
	// contains, an address the host cluster uses for itself (its apiserver, a Node, its pod or
	// Service network, a range an admin reserved), which guestnet never hands to a tenant; the
	// message says which kind of host address.
	HostAddressReason = "HostAddress"
)

// Ready condition reasons of a GuestIngressPolicy (besides ReadyReason): the policy cannot
// be used as written. A GuestIngress that needs the broken part is not admitted.
const (
	// SharedPoolNotFoundReason: a pool of spec.sharedPools does not exist.
	SharedPoolNotFoundReason = "SharedPoolNotFound"
	// SharedPoolUnsafeReason: a pool of spec.sharedPools does not select Services by
	// namespace (io.kubernetes.service.namespace): a tenant could match its serviceSelector
	// with labels it sets, so guestnet does not use it.
	SharedPoolUnsafeReason = "SharedPoolUnsafe"
	// InvalidSelectorReason: spec.namespaceSelector or spec.l2Announcement.nodeSelector is
	// not a valid label selector; the policy admits nothing.
	InvalidSelectorReason = "InvalidSelector"
	// InvalidInterfaceReason: an entry of spec.l2Announcement.interfaces is not a regular
	// expression Cilium can use.
	InvalidInterfaceReason = "InvalidInterface"
)

// HostAddressesOutsideCondition says, on a GuestIngressPolicy, whether the host cluster's own
// addresses all lie outside what the policy admits. When False, the policy admits host
// addresses that guestnet will never hand out; the message names them (the admin's to read).
const HostAddressesOutsideCondition = "HostAddressesOutside"

// HostAddressesOutside condition reasons.
const (
	// HostAddressesOutsideReason: no address the host uses lies in spec.addresses or in the
	// blocks of spec.sharedPools.
	HostAddressesOutsideReason = "HostAddressesOutside"
	// CoversHostAddressesReason: spec.addresses or a shared pool contains addresses the host
	// uses; GuestIngresses asking for them are refused (HostAddress).
	CoversHostAddressesReason = "CoversHostAddresses"
)

// Keys that never reach a host Service from spec.loadBalancer.annotations or .labels, whatever
// a policy allows (the API server rejects policies that list them, and guestnet's builders
// drop them): guestnet's own marks, Cilium LB-IPAM's and MetalLB's IP requests and sharing
// keys, the key that hides a Service from kube-proxy and Cilium, and Cilium's pseudo-labels.
var (
	// ForbiddenHostServiceKeys are exact keys.
	ForbiddenHostServiceKeys = []string{
		"app.kubernetes.io/managed-by",
		"cluster.x-k8s.io/cluster-name",
		"service.kubernetes.io/service-proxy-name",
	}
	// ForbiddenHostServiceKeyPrefixes are prefixes: every key that starts with one.
	ForbiddenHostServiceKeyPrefixes = []string{
		"guestnet.addons.cluster.x-k8s.io/",
		"lbipam.cilium.io/",
		"io.cilium/lb-ipam-",
		"metallb.io/",
		"metallb.universe.tf/",
		"io.kubernetes.service.",
	}
)

// GuestIngressPolicySpec is what tenants of the selected namespaces may claim on the host
// network through their GuestIngresses. Everything not listed is refused.
type GuestIngressPolicySpec struct {
	// namespaceSelector selects the namespaces whose GuestIngresses this policy admits.
	// An empty selector ({}) selects every namespace; a namespace is selected by name with
	// the kubernetes.io/metadata.name label the API server puts on every namespace.
	// +required
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// addresses are the load-balancer IP ranges (CIDRs, network address first, e.g.
	// 10.2.6.0/24) that spec.loadBalancer.ip and every spec.loadBalancer.cidrs entry of an
	// admitted GuestIngress must lie in. The pools guestnet creates contain only these.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="each address range must be a CIDR such as 10.2.6.0/24"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self).prefixLength() > 0",message="an address range of prefix length 0 admits every address, the host's own included: list the ranges tenants may announce"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="write an address range with its network address, e.g. 10.2.6.0/24 rather than 10.2.6.5/24"
	Addresses []string `json:"addresses,omitempty"`

	// reservedAddresses are ranges (CIDRs, network address first; a /32 or /128 for one
	// address) that no GuestIngress gets, whatever any policy admits: addresses of the host
	// that guestnet cannot learn from the API (a control-plane VIP behind a DNS name, routers,
	// gateways, storage). A range listed in any policy is reserved for every GuestIngress,
	// beside what guestnet learns itself (docs/security.md#the-hosts-own-addresses).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="each reserved range must be a CIDR such as 10.2.6.1/32"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="write a reserved range with its network address, e.g. 10.2.6.0/24 rather than 10.2.6.5/24"
	ReservedAddresses []string `json:"reservedAddresses,omitempty"`

	// sharedPools are the CiliumLoadBalancerIPPools, not guestnet's, that
	// spec.loadBalancer.poolRef may name. Each must select Services by namespace
	// (io.kubernetes.service.namespace), never only by labels a tenant could set; a
	// spec.loadBalancer.ip with poolRef must lie in the pool's blocks.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	SharedPools []string `json:"sharedPools,omitempty"`

	// loadBalancerClasses that spec.loadBalancer.class may name.
	// +optional
	// +listType=set
	// +kubebuilder:default={"io.cilium/l2-announcer"}
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	LoadBalancerClasses []string `json:"loadBalancerClasses,omitempty"`

	// l2Announcement says which host nodes and interfaces may announce an admitted
	// GuestIngress's IP. Without it, the Cilium L2 announcer class is not admitted.
	// +optional
	L2Announcement *L2AnnouncementPolicy `json:"l2Announcement,omitempty"`

	// bgpAdvertisement says how an admitted GuestIngress of Cilium's BGP class
	// (io.cilium/bgp-control-plane) is announced: guestnet creates one
	// CiliumBGPAdvertisement per GuestIngress, selecting only its host Service, labelled so
	// that the platform's CiliumBGPPeerConfigs pick it up. Peering stays the platform's.
	// Without it, that class is not admitted.
	// +optional
	BGPAdvertisement *BGPAdvertisementPolicy `json:"bgpAdvertisement,omitempty"`

	// metalLB says how an admitted GuestIngress of MetalLB's class is given its IP and
	// announced: guestnet creates a MetalLB IPAddressPool whose serviceAllocation admits only
	// its host Service, and the advertisements named here for that pool alone. Without it,
	// MetalLB's class is not admitted.
	// +optional
	MetalLB *MetalLBPolicy `json:"metalLB,omitempty"`

	// hostService says what a GuestIngress may pass to its host Service.
	// +optional
	// +kubebuilder:default={}
	HostService HostServicePolicy `json:"hostService,omitempty"`

	// maxGuestIngressesPerNamespace caps the GuestIngresses this policy admits in one
	// namespace: the oldest are admitted, the others get QuotaExceeded. Unset: no cap.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxGuestIngressesPerNamespace *int32 `json:"maxGuestIngressesPerNamespace,omitempty"`
}

// L2AnnouncementPolicy bounds the CiliumL2AnnouncementPolicy guestnet creates.
type L2AnnouncementPolicy struct {
	// interfaces are the host interface regular expressions that may announce, e.g. ^eth0$.
	// A GuestIngress's spec.loadBalancer.l2.interfaces must each be one of them, written
	// the same; when it names none, all of these are used.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Interfaces []string `json:"interfaces"`

	// nodeSelector selects the host nodes that may announce; it is always combined (AND)
	// with the GuestIngress's own spec.loadBalancer.l2.nodeSelector. {} selects every node.
	// +required
	NodeSelector metav1.LabelSelector `json:"nodeSelector"`
}

// BGPAdvertisementPolicy bounds the CiliumBGPAdvertisements guestnet creates.
type BGPAdvertisementPolicy struct {
	// advertisementLabels are put on every CiliumBGPAdvertisement guestnet creates under
	// this policy: the labels the platform's CiliumBGPPeerConfig families[].advertisements
	// selector matches, e.g. {bgp.example.com/advertise: tenants}.
	// +required
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=8
	AdvertisementLabels map[string]string `json:"advertisementLabels"`

	// allowedAdvertisementLabels are the extra labels, each "key=value", a GuestIngress may
	// add (spec.loadBalancer.bgp.advertisementLabels) to choose among the platform's peer
	// groups. None by default.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:Pattern=`^[^=]+=[^=]*$`
	AllowedAdvertisementLabels []string `json:"allowedAdvertisementLabels,omitempty"`

	// communities a GuestIngress may attach to its route (spec.loadBalancer.bgp.communities).
	// None by default. A community is allowed when its value is listed here in any form.
	// +optional
	Communities *BGPCommunities `json:"communities,omitempty"`
}

// MetalLBPolicy says how guestnet uses MetalLB for the GuestIngresses a policy admits.
type MetalLBPolicy struct {
	// loadBalancerClass is the class MetalLB's controller serves (its --lb-class flag): a
	// GuestIngress whose spec.loadBalancer.class is this one is given its IP and announced by
	// MetalLB. It must also be in spec.loadBalancerClasses.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	LoadBalancerClass string `json:"loadBalancerClass"`

	// namespace MetalLB runs in, where guestnet creates the IPAddressPools and advertisements.
	// +optional
	// +kubebuilder:default=metallb-system
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// l2Advertisement, when set, makes guestnet create an L2Advertisement for each pool,
	// announcing it with ARP/NDP from these interfaces and nodes. MetalLB's L2 mode announces
	// from a node with a ready local endpoint when externalTrafficPolicy is Local.
	// +optional
	L2Advertisement *MetalLBL2Advertisement `json:"l2Advertisement,omitempty"`

	// bgpAdvertisement, when set, makes guestnet create a BGPAdvertisement for each pool,
	// announcing it as a /32 (/128) to these peers.
	// +optional
	BGPAdvertisement *MetalLBBGPAdvertisement `json:"bgpAdvertisement,omitempty"`
}

// MetalLBL2Advertisement bounds the L2Advertisements guestnet creates.
type MetalLBL2Advertisement struct {
	// interfaces MetalLB announces from (exact names); empty means every interface.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=15
	Interfaces []string `json:"interfaces,omitempty"`

	// nodeSelectors select the nodes that may announce (any of them); empty means every node.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	NodeSelectors []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
}

// MetalLBBGPAdvertisement bounds the BGPAdvertisements guestnet creates.
type MetalLBBGPAdvertisement struct {
	// peers are the names of the platform's BGPPeers to announce to; empty means every peer.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Peers []string `json:"peers,omitempty"`

	// nodeSelectors select the nodes that may announce (any of them); empty means every node.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	NodeSelectors []metav1.LabelSelector `json:"nodeSelectors,omitempty"`

	// communities a GuestIngress may attach to its route. None by default.
	// +optional
	Communities *BGPCommunities `json:"communities,omitempty"`
}

// HostServicePolicy says what a GuestIngress may pass to its host Service.
type HostServicePolicy struct {
	// allowedAnnotationKeys of spec.loadBalancer.annotations: exact keys, or a prefix ending
	// in "/*" (e.g. "example.com/*"). None by default. The keys of guestnet itself, Cilium
	// LB-IPAM, MetalLB, service.kubernetes.io/service-proxy-name and io.kubernetes.service.*
	// are never passed, and the API server rejects entries that would allow them.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^(([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?|[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[*])$')",message="each entry must be a key such as example.com/team, or a prefix such as example.com/*"
	// +kubebuilder:validation:items:XValidation:rule="self.endsWith('/*') ? !(['guestnet.addons.cluster.x-k8s.io/', 'lbipam.cilium.io/', 'io.cilium/lb-ipam-', 'metallb.io/', 'metallb.universe.tf/', 'io.kubernetes.service.'].exists(d, d.startsWith(self.substring(0, size(self) - 1)) || self.substring(0, size(self) - 1).startsWith(d)) || ['app.kubernetes.io/managed-by', 'cluster.x-k8s.io/cluster-name', 'service.kubernetes.io/service-proxy-name'].exists(k, k.startsWith(self.substring(0, size(self) - 1)))) : !(['guestnet.addons.cluster.x-k8s.io/', 'lbipam.cilium.io/', 'io.cilium/lb-ipam-', 'metallb.io/', 'metallb.universe.tf/', 'io.kubernetes.service.'].exists(d, self.startsWith(d)) || self in ['app.kubernetes.io/managed-by', 'cluster.x-k8s.io/cluster-name', 'service.kubernetes.io/service-proxy-name'])",message="no policy can allow this key: guestnet never passes its own keys (guestnet.addons.cluster.x-k8s.io/*, app.kubernetes.io/managed-by, cluster.x-k8s.io/cluster-name), Cilium LB-IPAM's (lbipam.cilium.io/*, io.cilium/lb-ipam-*), MetalLB's (metallb.io/*, metallb.universe.tf/*), service.kubernetes.io/service-proxy-name or io.kubernetes.service.* to a host Service"
	AllowedAnnotationKeys []string `json:"allowedAnnotationKeys,omitempty"`

	// allowedLabelKeys of spec.loadBalancer.labels, written like allowedAnnotationKeys.
	// Labels take part in pool selection: allow none that a pool's serviceSelector uses.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^(([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?|[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[*])$')",message="each entry must be a key such as example.com/team, or a prefix such as example.com/*"
	// +kubebuilder:validation:items:XValidation:rule="self.endsWith('/*') ? !(['guestnet.addons.cluster.x-k8s.io/', 'lbipam.cilium.io/', 'io.cilium/lb-ipam-', 'metallb.io/', 'metallb.universe.tf/', 'io.kubernetes.service.'].exists(d, d.startsWith(self.substring(0, size(self) - 1)) || self.substring(0, size(self) - 1).startsWith(d)) || ['app.kubernetes.io/managed-by', 'cluster.x-k8s.io/cluster-name', 'service.kubernetes.io/service-proxy-name'].exists(k, k.startsWith(self.substring(0, size(self) - 1)))) : !(['guestnet.addons.cluster.x-k8s.io/', 'lbipam.cilium.io/', 'io.cilium/lb-ipam-', 'metallb.io/', 'metallb.universe.tf/', 'io.kubernetes.service.'].exists(d, self.startsWith(d)) || self in ['app.kubernetes.io/managed-by', 'cluster.x-k8s.io/cluster-name', 'service.kubernetes.io/service-proxy-name'])",message="no policy can allow this key: guestnet never passes its own keys (guestnet.addons.cluster.x-k8s.io/*, app.kubernetes.io/managed-by, cluster.x-k8s.io/cluster-name), Cilium LB-IPAM's (lbipam.cilium.io/*, io.cilium/lb-ipam-*), MetalLB's (metallb.io/*, metallb.universe.tf/*), service.kubernetes.io/service-proxy-name or io.kubernetes.service.* to a host Service"
	AllowedLabelKeys []string `json:"allowedLabelKeys,omitempty"`

	// externalTrafficPolicies that spec.loadBalancer.externalTrafficPolicy may name. Local
	// makes the host allocate a health-check nodePort, open on every host node; host
	// Services never get other nodePorts (allocateLoadBalancerNodePorts: false).
	// +optional
	// +listType=set
	// +kubebuilder:default={"Cluster"}
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:Enum=Cluster;Local
	ExternalTrafficPolicies []corev1.ServiceExternalTrafficPolicy `json:"externalTrafficPolicies,omitempty"`
}

// GuestIngressPolicyStatus is what the policy admits now.
type GuestIngressPolicyStatus struct {
	// selector is spec.namespaceSelector in kubectl's selector syntax ("<all>" for {}).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Selector string `json:"selector,omitempty"`

	// namespaces counts the namespaces the policy selects.
	// +optional
	Namespaces int32 `json:"namespaces"`

	// admittedGuestIngresses counts the GuestIngresses the policy admits.
	// +optional
	AdmittedGuestIngresses int32 `json:"admittedGuestIngresses"`

	// guestIngresses are the GuestIngresses the policy admits, by namespace and name, with
	// what each claims (the first 32).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	GuestIngresses []AdmittedGuestIngress `json:"guestIngresses,omitempty"`

	// observedGeneration is the generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready (the policy is usable as written) and HostAddressesOutside (the
	// host's own addresses lie outside what it admits).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AdmittedGuestIngress is one GuestIngress a policy admits.
type AdmittedGuestIngress struct {
	// namespace of the GuestIngress.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// name of the GuestIngress.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// claim is what it claims, e.g. "10.2.6.220", "10.2.6.216/29" or "pool shared".
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Claim string `json:"claim,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=guestingresspolicies,scope=Cluster,shortName=gip,categories=guestnet
// +kubebuilder:printcolumn:name="Selector",type="string",JSONPath=".status.selector",description="Namespaces the policy selects"
// +kubebuilder:printcolumn:name="Namespaces",type="integer",JSONPath=".status.namespaces",description="Namespaces selected"
// +kubebuilder:printcolumn:name="Addresses",type="string",JSONPath=".spec.addresses",description="Load-balancer IP ranges admitted"
// +kubebuilder:printcolumn:name="Classes",type="string",JSONPath=".spec.loadBalancerClasses",description="loadBalancerClasses admitted"
// +kubebuilder:printcolumn:name="Admitted",type="integer",JSONPath=".status.admittedGuestIngresses",description="GuestIngresses admitted"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// GuestIngressPolicy is owned by the host cluster's admin: it says what the GuestIngresses
// of a set of namespaces may claim on the host network (IP ranges, classes, announcing nodes
// and interfaces, host Service metadata, shared pools, how many). A GuestIngress that no
// policy admits gets nothing on the host.
type GuestIngressPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what the policy admits.
	// +required
	Spec GuestIngressPolicySpec `json:"spec"`

	// status is what the policy admits now.
	// +optional
	Status GuestIngressPolicyStatus `json:"status,omitempty"`
}

// GetConditions returns the conditions (CAPI util/conditions Getter).
func (p *GuestIngressPolicy) GetConditions() []metav1.Condition { return p.Status.Conditions }

// SetConditions sets the conditions (CAPI util/conditions Setter).
func (p *GuestIngressPolicy) SetConditions(c []metav1.Condition) { p.Status.Conditions = c }

// +kubebuilder:object:root=true

// GuestIngressPolicyList is a list of GuestIngressPolicy.
type GuestIngressPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuestIngressPolicy `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &GuestIngressPolicy{}, &GuestIngressPolicyList{})
}
