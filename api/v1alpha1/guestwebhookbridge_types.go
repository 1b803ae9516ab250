package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GuestWebhookBridgeFinalizer lets guestnet restore the original APIServices and webhook
// configurations and remove its Services before a GuestWebhookBridge goes away.
const GuestWebhookBridgeFinalizer = "guestnet.addons.cluster.x-k8s.io/guestwebhookbridge"

// GuestWebhookBridge condition types (see also the shared ones in common_types.go).
const (
	// TargetsBridgedCondition says whether every selected target is repointed at an endpoint
	// the guest control plane can reach (or left alone because it can already reach it).
	TargetsBridgedCondition = "TargetsBridged"

	// TargetsReachableCondition says whether every bridged target answers from the host
	// network and its certificate verifies for the name the guest apiserver dials.
	TargetsReachableCondition = "TargetsReachable"
)

// GuestWebhookBridge condition reasons (GuestServiceNotFound, NodePortConflict and
// HostObjectConflict are shared with GuestIngress).
const (
	// TargetsBridgedReason: every selected target is bridged, or left alone for a reason
	// its status entry gives.
	TargetsBridgedReason = "TargetsBridged"
	// TargetsReachableReason: every bridged target answers from the host network with a
	// certificate that verifies for the name the guest apiserver dials.
	TargetsReachableReason = "TargetsReachable"
	// NoTargetsReason: the selection matches no guest object yet.
	NoTargetsReason = "NoTargets"
	// TargetNotFoundReason: a target named in the spec does not exist (yet); guestnet waits.
	TargetNotFoundReason = "TargetNotFound"
	// TargetClaimedReason: another GuestWebhookBridge already bridges the target.
	TargetClaimedReason = "TargetClaimed"
	// TargetNotBridgeableReason: the target's Service cannot be bridged as it is (no
	// selector, no such port); the message says why.
	TargetNotBridgeableReason = "TargetNotBridgeable"
	// NodePortRangeExhaustedReason: the range has fewer free nodePorts than target Service ports.
	NodePortRangeExhaustedReason = "NodePortRangeExhausted"
	// TLSNameMismatchReason: the target's certificate lacks the name the guest apiserver dials.
	TLSNameMismatchReason = "TLSNameMismatch"
	// TLSUnverifiedReason: the target's certificate does not verify against its caBundle.
	TLSUnverifiedReason = "TLSUnverified"
	// EndpointUnreachableReason: the bridged endpoint does not answer from the host network.
	EndpointUnreachableReason = "EndpointUnreachable"
	// WaitingForAvailabilityReason: mode Auto waits for the aggregator's first verdict on an
	// APIService before deciding whether it needs the bridge.
	WaitingForAvailabilityReason = "WaitingForAvailability"
	// APIServiceViaKonnectivityReason: mode Auto does not bridge an APIService the
	// aggregator cannot reach in a guest that runs konnectivity agents: the aggregator dials
	// every APIService through the `cluster` egress, i.e. through the agents, whatever
	// Service it names, so the bridge cannot help (and, once the agents work again, a bridged
	// APIService would stay broken: the agents cannot reach host Services).
	APIServiceViaKonnectivityReason = "APIServiceViaKonnectivity"
	// TooManyTargetsReason: the selection matches more than MaxTargets targets; the message
	// names what was left out. guestnet bridges the first MaxTargets (those it already
	// rewrote first) and touches none of the others.
	TooManyTargetsReason = "TooManyTargets"
	// RecordUnreadableReason: a target points at this bridge, but neither copy of its record
	// (the guest annotation, the bridge's status.records) can be read, so guestnet does not
	// know what to restore: it leaves the target and every Service of the bridge as they
	// are. Only that target is affected.
	RecordUnreadableReason = "RecordUnreadable"
)

// Bounds of a bridge, so that its status patch is never rejected.
const (
	// MaxTargets is the most targets one bridge handles (status.targets holds one entry each).
	MaxTargets = 256
	// MaxRecords bounds status.records: the records of the targets bridged now and of those
	// being restored.
	MaxRecords = 2 * MaxTargets
	// MaxRecordOriginal and MaxRecordWritten bound one record; a target whose record would
	// be longer (a webhook path of hundreds of characters) is not bridged.
	MaxRecordOriginal = 1024
	MaxRecordWritten  = 2048
	// MaxTargetMessage bounds status.targets[].message.
	MaxTargetMessage = 1024
)

// Marks guestnet puts on the guest objects it changes.
const (
	// BridgeOriginalAnnotation, on a guest APIService or webhook configuration, holds what a
	// GuestWebhookBridge replaced there: which bridge (<namespace>/<name> in the host) and the
	// original service reference of each target, written in the same update as the rewrite.
	// Deleting the bridge, or dropping the target from it, puts the originals back from it.
	BridgeOriginalAnnotation = "guestnet.addons.cluster.x-k8s.io/bridge-original"

	// RecheckAnnotation, on a GuestWebhookBridge: changing its value (any value) makes
	// guestnet probe every bridged target again at once. Probes otherwise run again only when
	// what they depend on changes (the host Service's endpoints, the caBundle, the name) or
	// every 5 minutes; set it after fixing a certificate, e.g.
	// kubectl annotate gwb webhooks guestnet.addons.cluster.x-k8s.io/recheck="$(date +%s)" --overwrite
	RecheckAnnotation = "guestnet.addons.cluster.x-k8s.io/recheck"
)

// BridgeMode says when a target is rewritten.
// +kubebuilder:validation:Enum=Auto;Always
type BridgeMode string

const (
	// BridgeModeAuto leaves alone a target the guest apiserver can already reach (for example
	// through konnectivity) and bridges the others.
	BridgeModeAuto BridgeMode = "Auto"
	// BridgeModeAlways bridges every selected target.
	BridgeModeAlways BridgeMode = "Always"
)

// TargetKind is the kind of a bridged guest object.
// +kubebuilder:validation:Enum=APIService;ValidatingWebhookConfiguration;MutatingWebhookConfiguration
type TargetKind string

const (
	// APIServiceTarget is an apiregistration.k8s.io/v1 APIService.
	APIServiceTarget TargetKind = "APIService"
	// ValidatingWebhookTarget is an admissionregistration.k8s.io/v1 ValidatingWebhookConfiguration.
	ValidatingWebhookTarget TargetKind = "ValidatingWebhookConfiguration"
	// MutatingWebhookTarget is an admissionregistration.k8s.io/v1 MutatingWebhookConfiguration.
	MutatingWebhookTarget TargetKind = "MutatingWebhookConfiguration"
)

// GuestWebhookBridgeSpec selects the guest APIServices and webhook configurations to bridge.
// +kubebuilder:validation:XValidation:rule="has(self.apiServices) || has(self.validatingWebhooks) || has(self.mutatingWebhooks)",message="select at least one of apiServices, validatingWebhooks, mutatingWebhooks"
type GuestWebhookBridgeSpec struct {
	// clusterName is the name of the CAPI Cluster, in the bridge's namespace, whose guest
	// APIServices and webhooks are bridged. It cannot be changed: create another bridge.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="clusterName must be the name of a Cluster in this namespace: lower-case letters, digits, '-' and '.', e.g. tenant-a (no namespace/ prefix)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterName is immutable"
	ClusterName string `json:"clusterName"`

	// apiServices selects guest APIServices, e.g. v1beta1.metrics.k8s.io.
	// +optional
	APIServices *TargetSelector `json:"apiServices,omitempty"`

	// validatingWebhooks selects guest ValidatingWebhookConfigurations, e.g. cert-manager-webhook.
	// +optional
	ValidatingWebhooks *TargetSelector `json:"validatingWebhooks,omitempty"`

	// mutatingWebhooks selects guest MutatingWebhookConfigurations.
	// +optional
	MutatingWebhooks *TargetSelector `json:"mutatingWebhooks,omitempty"`

	// nodePortRange is the small fixed range of guest nodePorts the bridge uses, declared once
	// on the worker VMs so bridging one more target does not roll the workers. The default,
	// 30064-30079, lies in the lower band of the default nodePort range (30000-30085), which
	// the apiserver keeps for fixed nodePorts and assigns automatic ones from last.
	// +optional
	// +kubebuilder:default={start: 30064, size: 16}
	NodePortRange NodePortRange `json:"nodePortRange,omitzero"` // omitzero: omitempty never omits a struct, so Go clients sent {start: 0, size: 0} and were rejected instead of defaulted

	// mode: Auto leaves alone targets the guest apiserver already reaches; Always bridges all.
	// +optional
	// +kubebuilder:default=Auto
	Mode BridgeMode `json:"mode,omitempty"`
}

// TargetSelector selects guest objects of one kind by name, by label, or all that reference
// a Service. The selections add up.
// +kubebuilder:validation:XValidation:rule="(has(self.names) && size(self.names) > 0) || has(self.selector) || (has(self.all) && self.all)",message="give names, a selector, or all: true"
type TargetSelector struct {
	// names of the objects.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="each name must be the name of a guest object, e.g. v1beta1.metrics.k8s.io or cert-manager-webhook (an APIService is named <version>.<group>, not <group>/<version>)"
	Names []string `json:"names,omitempty"`

	// selector selects the objects by label.
	// +optional
	Selector *TargetLabelSelector `json:"selector,omitempty"`

	// all selects every object of the kind that references a Service.
	// +optional
	All bool `json:"all,omitempty"`
}

// TargetLabelSelector is a label selector (the fields of metav1.LabelSelector), bounded and
// validated when it is written: a key must be a qualified name, a value a label value.
type TargetLabelSelector struct {
	// matchLabels: every key must have this value.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))",message="each matchLabels key must be a label key: an optional DNS prefix and '/', then up to 63 letters, digits, '-', '_' or '.', e.g. app.kubernetes.io/name"
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`

	// matchExpressions: every requirement must hold.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	MatchExpressions []TargetLabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelValue is the value of a label in a TargetLabelSelector.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')",message="each matchLabels value must be a label value: up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
type LabelValue string

// TargetLabelSelectorRequirement is one requirement of a TargetLabelSelector.
// +kubebuilder:validation:XValidation:rule="self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",message="operators In and NotIn need values; Exists and DoesNotExist take none"
type TargetLabelSelectorRequirement struct {
	// key is the label key.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')",message="key must be a label key: an optional DNS prefix and '/', then up to 63 letters, digits, '-', '_' or '.', e.g. app.kubernetes.io/name"
	Key string `json:"key"`

	// operator is In, NotIn, Exists or DoesNotExist.
	// +required
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`

	// values for In and NotIn.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')",message="each value must be a label value: up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	Values []string `json:"values,omitempty"`
}

// NodePortRange is a contiguous range of guest nodePorts.
// +kubebuilder:validation:XValidation:rule="self.start + self.size - 1 <= 32767",message="nodePortRange must end at or below 32767"
type NodePortRange struct {
	// start is the first nodePort of the range.
	// +required
	// +kubebuilder:validation:Minimum=30000
	// +kubebuilder:validation:Maximum=32767
	Start int32 `json:"start"`

	// size is the number of nodePorts in the range.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	Size int32 `json:"size"`
}

// GuestWebhookBridgeStatus is what guestnet observed and did, target by target.
type GuestWebhookBridgeStatus struct {
	// targets has one entry per selected guest object (per webhook for webhook configurations),
	// for the first 256 targets (condition TargetsBridged names what was left out).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	Targets []TargetStatus `json:"targets,omitempty"`

	// records is guestnet's host copy of what it replaced in the guest: one entry per target
	// it rewrote, written before the guest object and kept until the original is back. The
	// guest object carries the same record in its bridge-original annotation; guestnet
	// re-derives either copy from the other, so a removed or damaged annotation loses nothing.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=512
	Records []BridgeRecord `json:"records,omitempty"`

	// bridgedTargets counts the targets that reach their endpoint through the bridge or
	// were left alone because they already reach it.
	// +optional
	BridgedTargets int32 `json:"bridgedTargets"`

	// totalTargets counts the selected targets.
	// +optional
	TotalTargets int32 `json:"totalTargets"`

	// observedGeneration is the generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready, Paused, ClusterAvailable, TargetsBridged, TargetsReachable, PortsDeclared.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TargetStatus answers the runbook's questions for one target.
type TargetStatus struct {
	// kind of the guest object.
	// +required
	Kind TargetKind `json:"kind"`
	// name of the guest object.
	// +required
	Name string `json:"name"`
	// webhook is the name of the webhook inside a webhook configuration.
	// +optional
	Webhook string `json:"webhook,omitempty"`
	// guestService is the Service (namespace/name) the target originally referenced.
	// +optional
	GuestService string `json:"guestService,omitempty"`
	// nodePort is the guest nodePort of the bridge's NodePort Service for this target.
	// +optional
	NodePort int32 `json:"nodePort,omitempty"`
	// hostService is the name of the host ClusterIP Service the guest apiserver dials.
	// +optional
	HostService string `json:"hostService,omitempty"`
	// url is the webhook URL written into the guest configuration.
	// +optional
	URL string `json:"url,omitempty"`
	// tlsServerName is the name the target's serving certificate must carry.
	// +optional
	TLSServerName string `json:"tlsServerName,omitempty"`
	// bridged is true when the target is repointed (or left alone because it is reachable).
	// +optional
	Bridged bool `json:"bridged"`
	// reachable is true when the endpoint answered from the host network.
	// +optional
	Reachable *bool `json:"reachable,omitempty"`
	// message says what is wrong and what to do about it.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// BridgeRecord is what a GuestWebhookBridge replaced in one guest target.
type BridgeRecord struct {
	// kind of the guest object.
	// +required
	Kind TargetKind `json:"kind"`
	// name of the guest object.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// webhook is the name of the webhook inside a webhook configuration.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Webhook string `json:"webhook,omitempty"`
	// original is the target's service reference before guestnet rewrote it, as JSON:
	// clientConfig.service of a webhook, spec.service of an APIService.
	// +required
	// +kubebuilder:validation:MaxLength=1024
	Original string `json:"original"`
	// written is what guestnet wrote in its place: the url of a webhook, the
	// <namespace>/<name>:<port> service of an APIService.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	Written string `json:"written"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=guestwebhookbridges,scope=Namespaced,shortName=gwb,categories=cluster-api;guestnet
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".spec.clusterName",description="CAPI Cluster"
// +kubebuilder:printcolumn:name="Bridged",type="integer",JSONPath=".status.bridgedTargets",description="Targets bridged"
// +kubebuilder:printcolumn:name="Total",type="integer",JSONPath=".status.totalTargets",description="Targets selected"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// GuestWebhookBridge repoints guest APIServices and webhook configurations at endpoints the
// guest control plane (on the host network) can reach, keeps them repaired, and restores
// the originals when removed.
type GuestWebhookBridge struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec selects the targets.
	// +required
	Spec GuestWebhookBridgeSpec `json:"spec"`

	// status reports each target.
	// +optional
	Status GuestWebhookBridgeStatus `json:"status,omitempty"`
}

// GetClusterName returns the name of the Cluster the GuestWebhookBridge belongs to.
func (g *GuestWebhookBridge) GetClusterName() string { return g.Spec.ClusterName }

// GetConditions returns the conditions (CAPI util/conditions Getter).
func (g *GuestWebhookBridge) GetConditions() []metav1.Condition { return g.Status.Conditions }

// SetConditions sets the conditions (CAPI util/conditions Setter).
func (g *GuestWebhookBridge) SetConditions(c []metav1.Condition) { g.Status.Conditions = c }

// +kubebuilder:object:root=true

// GuestWebhookBridgeList is a list of GuestWebhookBridge.
type GuestWebhookBridgeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuestWebhookBridge `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &GuestWebhookBridge{}, &GuestWebhookBridgeList{})
}
