package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GuestIngressFinalizer lets guestnet remove the host objects it created (Service, pool,
// L2 policy) and release the ports it declared before a GuestIngress goes away.
const GuestIngressFinalizer = "guestnet.addons.cluster.x-k8s.io/guestingress"

// GuestIngress condition types (see also the shared ones in common_types.go).
const (
	// GuestServiceReadyCondition says whether the guest ingress controller's Service exists
	// and exposes the requested ports as NodePorts.
	GuestServiceReadyCondition = "GuestServiceReady"

	// LoadBalancerReadyCondition says whether the host LoadBalancer Service got its IP
	// (Cilium's cilium.io/IPAMRequestSatisfied) and its pool has no conflict
	// (cilium.io/PoolConflict).
	LoadBalancerReadyCondition = "LoadBalancerReady"

	// EndpointsReadyCondition says whether the host Service selects at least one ready
	// worker virt-launcher pod. Zero endpoints is the field report's "curl: connection refused".
	EndpointsReadyCondition = "EndpointsReady"
)

// GuestIngress condition reasons.
const (
	// GuestServiceNotFoundReason: the guest Service does not exist (yet); guestnet waits for it.
	GuestServiceNotFoundReason = "GuestServiceNotFound"
	// GuestServicePortNotFoundReason: the guest Service has no port matching spec.ports[].port.
	GuestServicePortNotFoundReason = "GuestServicePortNotFound"
	// NodePortConflictReason: a requested fixed nodePort is used by another guest Service.
	NodePortConflictReason = "NodePortConflict"
	// IPConflictReason: the requested IP is already claimed by another GuestIngress.
	IPConflictReason = "IPConflict"
	// PoolConflictReason: Cilium reports the pool overlaps another pool (cilium.io/PoolConflict).
	PoolConflictReason = "PoolConflict"
	// PoolNotFoundReason: spec.loadBalancer.poolRef names a pool that does not exist.
	PoolNotFoundReason = "PoolNotFound"
	// IPPendingReason: the host Service has no load-balancer IP yet.
	IPPendingReason = "IPPending"
	// NoEndpointsReason: the host Service's selector matches no ready virt-launcher pod.
	NoEndpointsReason = "NoEndpoints"
	// HostObjectConflictReason: a host object guestnet would create (Service, pool, L2
	// policy) exists and belongs to someone else; guestnet leaves it alone.
	HostObjectConflictReason = "HostObjectConflict"
	// NoNodePortsReason: the guest Service cannot carry nodePorts without guestnet changing
	// something of the user's (a LoadBalancer Service with allocateLoadBalancerNodePorts:
	// false, a headless or an ExternalName Service); guestnet changes nothing and the message
	// says what to change.
	NoNodePortsReason = "NoNodePorts"
	// HostObjectRejectedReason: the host apiserver refused a host object guestnet built from
	// the spec; the message quotes it.
	HostObjectRejectedReason = "HostObjectRejected"
	// GuestServiceTrafficPolicyReason: spec.loadBalancer.externalTrafficPolicy is Local (client
	// source IPs) but the guest Service is not, so the guest's kube-proxy replaces the client's
	// address; the message says what to set in the guest.
	GuestServiceTrafficPolicyReason = "GuestServiceTrafficPolicy"
	// GuestServiceFamiliesReason: the host Service serves an IP family (IPv6) that the guest
	// Service does not, so its nodePorts do not answer that family in the VMs.
	GuestServiceFamiliesReason = "GuestServiceFamilies"
	// GuestServiceClaimedReason: another GuestIngress of the same Cluster exposes the guest
	// Service of spec.guestService (one GuestIngress per guest Service: the oldest), or has
	// not given it back yet; guestnet changes nothing for this one, in the guest or on the
	// host, and the message names the other GuestIngress (always one of this namespace).
	GuestServiceClaimedReason = "GuestServiceClaimed"
)

// OriginalGuestServiceAnnotation records, on the guest Service, what the Service had in each
// field guestnet took over (type, nodePorts) before guestnet changed it, so that deleting the
// GuestIngress hands the Service back exactly. guestnet writes it in the same apply as the
// fields and removes it when it gives them back.
const OriginalGuestServiceAnnotation = "guestnet.addons.cluster.x-k8s.io/original"

// Defaults and names used on the host LoadBalancer Service.
const (
	// DefaultLoadBalancerClass makes Cilium's L2 announcer (and LB-IPAM) own the Service.
	DefaultLoadBalancerClass = "io.cilium/l2-announcer"
)

// GuestIngressSpec is the desired exposure of one guest cluster's ingress controller on a
// load-balancer IP of the host network.
// +kubebuilder:validation:XValidation:rule="!has(self.ports) || self.ports.all(p, !has(p.nodePort) || self.ports.exists_one(q, has(q.nodePort) && q.nodePort == p.nodePort && q.protocol == p.protocol))",message="spec.ports: each nodePort may be used by one port per protocol only (TCP and UDP may share one)"
// +kubebuilder:validation:XValidation:rule="!has(self.ports) || self.ports.all(p, self.ports.exists_one(q, q.port == p.port && q.protocol == p.protocol))",message="spec.ports: each port/protocol pair may be listed once only"
type GuestIngressSpec struct {
	// clusterName is the name of the CAPI Cluster, in the GuestIngress's namespace, whose
	// ingress controller is exposed. It cannot be changed: create another GuestIngress.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="clusterName must be the name of a Cluster in this namespace: lower-case letters, digits, '-' and '.', e.g. tenant-a (no namespace/ prefix)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterName is immutable"
	ClusterName string `json:"clusterName"`

	// guestService is the Service of the ingress controller inside the guest cluster, for
	// example projectcontour/envoy. guestnet makes it a NodePort Service (server-side apply
	// with its own field manager; no other field is touched) and forwards to its nodePorts.
	// +required
	GuestService ObjectReference `json:"guestService"`

	// ports to expose on the load-balancer IP. Each one names a port of the guest Service by
	// number. Defaults to http/80 and https/443.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:default={{name: "http", port: 80, protocol: "TCP"}, {name: "https", port: 443, protocol: "TCP"}}
	Ports []IngressPort `json:"ports,omitempty"`

	// loadBalancer says how the host LoadBalancer Service gets its IP and how the IP is
	// announced on the physical network.
	// +required
	LoadBalancer LoadBalancerSpec `json:"loadBalancer"`

	// declarePorts makes guestnet declare the nodePorts on the masquerade interface of every
	// worker VM, rolling the workers when the declaration changes. Set it to false only when
	// the worker templates have no ports list (every port is forwarded) or are managed by hand.
	// +optional
	// +kubebuilder:default=true
	DeclarePorts *bool `json:"declarePorts,omitempty"`
}

// IngressPort is one port of the guest ingress controller exposed on the load-balancer IP.
type IngressPort struct {
	// name of the port on the host Service (an IANA service name: lower case, at most 15
	// characters).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self.matches('[a-z]') && !self.contains('--')",message="port name must be an IANA service name: at least one letter and no '--', e.g. http"
	Name string `json:"name"`

	// port is both the port served on the load-balancer IP and the port of the guest Service
	// whose nodePort the traffic is forwarded to.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`

	// nodePort, when set, is enforced on the guest Service so the VM's declared ports stay
	// fixed. When unset, guestnet follows whatever nodePort the guest allocated (and the
	// workers roll when it changes, if the worker templates declare ports).
	// +optional
	// +kubebuilder:validation:Minimum=30000
	// +kubebuilder:validation:Maximum=32767
	NodePort *int32 `json:"nodePort,omitempty"`

	// protocol of the port.
	// +optional
	// +kubebuilder:default=TCP
	// +kubebuilder:validation:Enum=TCP;UDP
	Protocol corev1.Protocol `json:"protocol,omitempty"`
}

// LoadBalancerSpec says where the load-balancer IP comes from and how it is announced.
// Give a fixed ip, or cidrs for a pool that guestnet creates (optionally with an ip inside
// them), or poolRef to take the IP from an existing shared pool.
// +kubebuilder:validation:XValidation:rule="has(self.ip) || has(self.ips) || has(self.cidrs) || has(self.poolRef)",message="loadBalancer needs ip, ips, cidrs or poolRef"
// +kubebuilder:validation:XValidation:rule="!(has(self.cidrs) && has(self.poolRef))",message="loadBalancer.cidrs and loadBalancer.poolRef are mutually exclusive: guestnet either creates a pool from cidrs or uses the referenced one"
// The containment rule only runs on a well-formed ip and cidrs (the field rules report the
// malformed ones): cidr()/containsIP() fail with a CEL runtime error ("no such overload") on
// strings that do not parse.
// +kubebuilder:validation:XValidation:rule="!has(self.ip) || !has(self.cidrs) || !isIP(self.ip) || !self.cidrs.all(c, isCIDR(c)) || self.cidrs.exists(c, cidr(c).containsIP(self.ip))",message="loadBalancer.ip must be inside one of loadBalancer.cidrs"
// +kubebuilder:validation:XValidation:rule="!has(self.ips) || !has(self.cidrs) || !self.ips.all(i, isIP(i)) || !self.cidrs.all(c, isCIDR(c)) || self.ips.all(i, self.cidrs.exists(c, cidr(c).containsIP(i)))",message="each of loadBalancer.ips must be inside one of loadBalancer.cidrs"
// +kubebuilder:validation:XValidation:rule="!(has(self.ip) && has(self.ips))",message="loadBalancer.ip and loadBalancer.ips are mutually exclusive: list both addresses of a dual-stack Service in ips"
// +kubebuilder:validation:XValidation:rule="!(has(self.externalTrafficPolicy) && self.externalTrafficPolicy == 'Local' && (!has(self.class) || self.class == 'io.cilium/l2-announcer'))",message="externalTrafficPolicy Local does not work with Cilium's L2 announcer (io.cilium/l2-announcer): Cilium documents L2 announcements as incompatible with it, because the announcing node may have no local endpoint and drops the traffic. Use Cluster, or a class announced with BGP or MetalLB, which announce from nodes with local endpoints only"
type LoadBalancerSpec struct {
	// ip is the fixed load-balancer IP, requested from Cilium LB-IPAM with the
	// lbipam.cilium.io/ips annotation. Alone, guestnet creates a pool holding just this IP.
	// +optional
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="ip must be an IPv4 or IPv6 address, e.g. 10.2.6.220"
	IP string `json:"ip,omitempty"`

	// cidrs of a CiliumLoadBalancerIPPool that guestnet creates for this GuestIngress alone
	// (its serviceSelector matches only the host Service), e.g. 10.2.6.220/29.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="each cidr must be a CIDR such as 10.2.6.220/29"
	CIDRs []string `json:"cidrs,omitempty"`

	// ips are fixed load-balancer IPs, at most one per IP family, for a dual-stack host
	// Service (e.g. 10.2.6.220 and 2001:db8:6::220); the first is the primary family. Use ip
	// for one address.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=45
	// +kubebuilder:validation:items:XValidation:rule="isIP(self)",message="each of ips must be an IPv4 or IPv6 address, e.g. 2001:db8:6::220"
	// +kubebuilder:validation:XValidation:rule="size(self) < 2 || !self.all(i, isIP(i)) || ip(self[0]).family() != ip(self[1]).family()",message="loadBalancer.ips holds at most one address per IP family"
	IPs []string `json:"ips,omitempty"`

	// ipFamilies of the host Service, primary first; with two the Service is dual-stack
	// (ipFamilyPolicy RequireDualStack), with one single-stack. guestnet always sets both
	// fields on the host Service. Unset: the families of ip or ips, else of cidrs (in their
	// order), else IPv4.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:Enum=IPv4;IPv6
	// +kubebuilder:validation:XValidation:rule="size(self) < 2 || self[0] != self[1]",message="loadBalancer.ipFamilies lists each family once"
	IPFamilies []corev1.IPFamily `json:"ipFamilies,omitempty"`

	// poolRef names an existing CiliumLoadBalancerIPPool that guestnet does not own. Its
	// serviceSelector must match the host Service (guestnet labels it with the cluster name).
	// +optional
	PoolRef *PoolReference `json:"poolRef,omitempty"`

	// l2 configures the CiliumL2AnnouncementPolicy that answers ARP/NDP for the IP.
	// +optional
	L2 *L2AnnouncementSpec `json:"l2,omitempty"`

	// class is the loadBalancerClass of the host Service: a qualified name such as
	// io.cilium/l2-announcer.
	// +optional
	// +kubebuilder:default="io.cilium/l2-announcer"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?([.][a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && (!self.contains('/') || self.indexOf('/') <= 253)",message="class must be a qualified name (a loadBalancerClass): an optional DNS subdomain prefix and '/', then a name of at most 63 characters, e.g. io.cilium/l2-announcer"
	Class string `json:"class,omitempty"`

	// externalTrafficPolicy of the host Service. Cluster (the default) combines well with L2
	// announcements. Local keeps the client's source IP all the way to the guest's ingress
	// controller: guestnet then forwards only to the workers that run a ready endpoint of the
	// guest Service, and the guest Service must be Local too (docs/client-source-ip.md). Not
	// with Cilium's L2 announcer.
	// +optional
	// +kubebuilder:default=Cluster
	// +kubebuilder:validation:Enum=Cluster;Local
	ExternalTrafficPolicy corev1.ServiceExternalTrafficPolicy `json:"externalTrafficPolicy,omitempty"`

	// annotations copied to the host Service and kept in sync: at most 32, keys qualified
	// names, values at most 4096 characters.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?([.][a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && (!k.contains('/') || k.indexOf('/') <= 253))",message="each key of loadBalancer.annotations must be a qualified name: an optional DNS subdomain prefix (at most 253 characters) and '/', then a name of at most 63 characters (letters, digits, '-', '_', '.'), e.g. example.com/team"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 4096)",message="each value of loadBalancer.annotations may be at most 4096 characters long"
	Annotations map[string]string `json:"annotations,omitempty"`

	// bgp is what the BGP route of the IP carries when the admitting policy announces it
	// with BGP (Cilium's BGP control plane, or MetalLB in BGP mode): each community must be
	// one the policy allows.
	// +optional
	BGP *BGPAnnouncementSpec `json:"bgp,omitempty"`

	// labels copied to the host Service and kept in sync: at most 32, keys qualified
	// names, values label values (their characters are checked when the host Service is
	// built: the apiserver cannot afford a pattern on every map value at admission).
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?([.][a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && (!k.contains('/') || k.indexOf('/') <= 253))",message="each key of loadBalancer.labels must be a qualified name: an optional DNS subdomain prefix (at most 253 characters) and '/', then a name of at most 63 characters (letters, digits, '-', '_', '.'), e.g. example.com/tier"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 63)",message="each value of loadBalancer.labels must be a label value: at most 63 characters"
	Labels map[string]string `json:"labels,omitempty"`
}

// BGPAnnouncementSpec is what a GuestIngress asks to be attached to the BGP route of its IP.
type BGPAnnouncementSpec struct {
	// communities attached to the route; each must be allowed by the admitting policy
	// (compared by value: 65535:65281, 4294967041 and no-export are one community).
	// +optional
	Communities *BGPCommunities `json:"communities,omitempty"`

	// advertisementLabels are added to the CiliumBGPAdvertisement guestnet creates: the
	// labels by which the platform's CiliumBGPPeerConfigs choose advertisements, so the
	// tenant picks among the peer groups the policy offers (allowedAdvertisementLabels).
	// +optional
	// +kubebuilder:validation:MaxProperties=8
	AdvertisementLabels map[string]string `json:"advertisementLabels,omitempty"`
}

// BGPCommunities are BGP community values, written as Cilium's CiliumBGPAdvertisement
// writes them.
type BGPCommunities struct {
	// standard communities (RFC 1997): a 32-bit decimal number, or two 16-bit decimal
	// numbers separated by a colon, e.g. 65000:100.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=11
	// +kubebuilder:validation:items:Pattern=`^([0-9]{1,10}|[0-9]{1,5}:[0-9]{1,5})$`
	Standard []string `json:"standard,omitempty"`

	// wellKnown communities by name (RFC 1997 and IANA's registry), e.g. no-export.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Enum=internet;planned-shut;accept-own;route-filter-translated-v4;route-filter-v4;route-filter-translated-v6;route-filter-v6;llgr-stale;no-llgr;blackhole;no-export;no-advertise;no-export-subconfed;no-peer
	WellKnown []string `json:"wellKnown,omitempty"`

	// large communities (RFC 8092): three 32-bit decimal numbers separated by colons, e.g.
	// 64512:1:100.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=32
	// +kubebuilder:validation:items:Pattern=`^[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10}$`
	Large []string `json:"large,omitempty"`
}

// PoolReference names a cluster-scoped CiliumLoadBalancerIPPool.
type PoolReference struct {
	// name of the CiliumLoadBalancerIPPool.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// L2AnnouncementSpec selects which host nodes and interfaces announce the IP.
type L2AnnouncementSpec struct {
	// interfaces are regular expressions of the host interfaces to announce on, e.g. ^eth0$.
	// Empty means every interface.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Interfaces []string `json:"interfaces,omitempty"`

	// nodeSelector selects the host nodes that may announce. Empty means every node. At most
	// 16 matchLabels, 16 matchExpressions and 16 values per expression; the syntax of its keys
	// and values is checked when the L2 announcement policy is built (InvalidSpec).
	// +optional
	// +kubebuilder:validation:XValidation:rule="(!has(self.matchLabels) || size(self.matchLabels) <= 16) && (!has(self.matchExpressions) || size(self.matchExpressions) <= 16)",message="l2.nodeSelector may have at most 16 matchLabels, 16 matchExpressions and 16 values per expression"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 16 || self.matchExpressions.all(e, !has(e.values) || size(e.values) <= 16)",message="l2.nodeSelector may have at most 16 matchLabels, 16 matchExpressions and 16 values per expression"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 16 || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="each operator of l2.nodeSelector.matchExpressions must be In, NotIn, Exists or DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 16 || self.matchExpressions.all(e, (e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))",message="in l2.nodeSelector.matchExpressions, In and NotIn need values, Exists and DoesNotExist take none"
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
}

// GuestIngressStatus is what guestnet observed and did.
type GuestIngressStatus struct {
	// loadBalancerIP is the IP the host Service got (from its status.loadBalancer).
	// +optional
	LoadBalancerIP string `json:"loadBalancerIP,omitempty"`

	// readyEndpoints counts the ready worker endpoints behind the host Service.
	// +optional
	ReadyEndpoints int32 `json:"readyEndpoints"`

	// hostService is the name of the host LoadBalancer Service in this namespace.
	// +optional
	HostService string `json:"hostService,omitempty"`

	// ports are the guest nodePorts the host Service forwards to.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Ports []IngressPortStatus `json:"ports,omitempty"`

	// guestService is the guest Service guestnet may have changed for this GuestIngress and
	// has not given back yet: stored before guestnet first writes to it, removed once it gave
	// the Service back (spec.guestService changed, another GuestIngress owns it, or the
	// GuestIngress is deleted). It is what a change of spec.guestService gives back.
	// +optional
	GuestService *ObjectReference `json:"guestService,omitempty"`

	// observedGeneration is the generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready, Paused, ClusterAvailable, GuestServiceReady, LoadBalancerReady,
	// EndpointsReady, PortsDeclared.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// IngressPortStatus is the guest nodePort behind one exposed port.
type IngressPortStatus struct {
	// name of the port (spec.ports[].name).
	// +required
	Name string `json:"name"`
	// port served on the load-balancer IP.
	// +required
	Port int32 `json:"port"`
	// nodePort of the guest Service the traffic is forwarded to.
	// +optional
	NodePort int32 `json:"nodePort,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=guestingresses,scope=Namespaced,shortName=gi,categories=cluster-api;guestnet
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".spec.clusterName",description="CAPI Cluster"
// +kubebuilder:printcolumn:name="IP",type="string",JSONPath=".status.loadBalancerIP",description="Load-balancer IP"
// +kubebuilder:printcolumn:name="Endpoints",type="integer",JSONPath=".status.readyEndpoints",description="Ready worker endpoints"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// GuestIngress exposes the ingress controller of one guest cluster on a load-balancer IP
// of the host network: host LoadBalancer Service, Cilium LB-IPAM pool, L2 announcement
// policy, and the masquerade port declarations on the worker VMs.
type GuestIngress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired exposure.
	// +required
	Spec GuestIngressSpec `json:"spec"`

	// status is what guestnet observed.
	// +optional
	Status GuestIngressStatus `json:"status,omitempty"`
}

// GetClusterName returns the name of the Cluster the GuestIngress belongs to.
func (g *GuestIngress) GetClusterName() string { return g.Spec.ClusterName }

// GetConditions returns the conditions (CAPI util/conditions Getter).
func (g *GuestIngress) GetConditions() []metav1.Condition { return g.Status.Conditions }

// SetConditions sets the conditions (CAPI util/conditions Setter).
func (g *GuestIngress) SetConditions(c []metav1.Condition) { g.Status.Conditions = c }

// +kubebuilder:object:root=true

// GuestIngressList is a list of GuestIngress.
type GuestIngressList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuestIngress `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &GuestIngress{}, &GuestIngressList{})
}
