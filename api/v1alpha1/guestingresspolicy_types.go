package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AdmittedCondition, on a GuestIngress, says whether a GuestIngressPolicy admits everything
// the GuestIngress asks for. guestnet fails closed: without it, nothing is created on the host.
const AdmittedCondition = "Admitted"

// Admitted condition reasons.
const (
	// AdmittedReason: a GuestIngressPolicy that selects the namespace admits the GuestIngress.
	AdmittedReason = "Admitted"
	// NoPolicyReason: no GuestIngressPolicy selects the GuestIngress's namespace.
	NoPolicyReason = "NoPolicy"
	// NotAllowedReason: the policies that select the namespace do not allow something the
	// GuestIngress asks for; the message names it and which policy would allow it.
	NotAllowedReason = "NotAllowed"
	// QuotaExceededReason: the namespace already has as many GuestIngresses as the policy allows.
	QuotaExceededReason = "QuotaExceeded"
)

// GuestIngressPolicySpec is what tenants of the selected namespaces may claim on the host
// network through their GuestIngresses. Everything not listed is refused.
type GuestIngressPolicySpec struct {
	// namespaceSelector selects the namespaces whose GuestIngresses this policy admits.
	// An empty selector ({}) selects every namespace.
	// +required
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// addresses are the load-balancer IP ranges (CIDRs) that spec.loadBalancer.ip and
	// spec.loadBalancer.cidrs of an admitted GuestIngress must lie in.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=49
	Addresses []string `json:"addresses,omitempty"`

	// sharedPools are the CiliumLoadBalancerIPPools, not guestnet's, that spec.loadBalancer.poolRef
	// may name.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	SharedPools []string `json:"sharedPools,omitempty"`

	// loadBalancerClasses that spec.loadBalancer.class may name.
	// +optional
	// +listType=set
	// +kubebuilder:default={"io.cilium/l2-announcer"}
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	LoadBalancerClasses []string `json:"loadBalancerClasses,omitempty"`

	// l2Announcement says which host nodes and interfaces may announce an admitted
	// GuestIngress's IP. Without it, the Cilium L2 announcer class is not admitted.
	// +optional
	L2Announcement *L2AnnouncementPolicy `json:"l2Announcement,omitempty"`

	// hostService says what a GuestIngress may pass to its host Service.
	// +optional
	HostService HostServicePolicy `json:"hostService,omitempty"`

	// maxGuestIngressesPerNamespace caps the GuestIngresses this policy admits in one
	// namespace (the oldest are admitted). Unset: no cap.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxGuestIngressesPerNamespace *int32 `json:"maxGuestIngressesPerNamespace,omitempty"`
}

// L2AnnouncementPolicy bounds the CiliumL2AnnouncementPolicy guestnet creates.
type L2AnnouncementPolicy struct {
	// interfaces are the host interface regular expressions that may announce. A GuestIngress's
	// spec.loadBalancer.l2.interfaces must each be one of them; when it names none, all of
	// these are used.
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

// HostServicePolicy says what a GuestIngress may pass to its host Service.
type HostServicePolicy struct {
	// allowedAnnotationKeys of spec.loadBalancer.annotations: exact keys, or a prefix ending
	// in "/*" (e.g. "example.com/*"). Keys of Cilium LB-IPAM, MetalLB and guestnet itself
	// are never passed.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=317
	AllowedAnnotationKeys []string `json:"allowedAnnotationKeys,omitempty"`

	// allowedLabelKeys of spec.loadBalancer.labels, written like allowedAnnotationKeys.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=317
	AllowedLabelKeys []string `json:"allowedLabelKeys,omitempty"`

	// externalTrafficPolicies that spec.loadBalancer.externalTrafficPolicy may name. Local
	// makes the host allocate a health-check nodePort on every host node.
	// +optional
	// +listType=set
	// +kubebuilder:default={"Cluster"}
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:Enum=Cluster;Local
	ExternalTrafficPolicies []corev1.ServiceExternalTrafficPolicy `json:"externalTrafficPolicies,omitempty"`
}

// GuestIngressPolicyStatus is what the policy admits now.
type GuestIngressPolicyStatus struct {
	// namespaces counts the namespaces the policy selects.
	// +optional
	Namespaces int32 `json:"namespaces"`

	// admittedGuestIngresses counts the GuestIngresses the policy admits.
	// +optional
	AdmittedGuestIngresses int32 `json:"admittedGuestIngresses"`

	// observedGeneration is the generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready (the policy is usable as written).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=guestingresspolicies,scope=Cluster,shortName=gip,categories=guestnet

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
	SchemeBuilder.Register(&GuestIngressPolicy{}, &GuestIngressPolicyList{})
}
