package v1alpha1

// Condition types shared by GuestIngress and GuestWebhookBridge. Each condition is a
// metav1.Condition (CAPI v1beta2 style); its reason is one of the constants below and its
// message says what to do when the condition is not what it should be.
const (
	// ReadyCondition summarises every other condition of the object: True only when the
	// object does everything it was asked to.
	ReadyCondition = "Ready"

	// PausedCondition is True while CAPI pause (the cluster.x-k8s.io/paused annotation on the
	// object or on its Cluster, or Cluster.spec.paused) stops guestnet from changing anything.
	PausedCondition = "Paused"

	// ClusterAvailableCondition says whether the referenced CAPI Cluster exists, is provisioned
	// and its guest apiserver can be reached through the <cluster>-kubeconfig Secret.
	ClusterAvailableCondition = "ClusterAvailable"

	// PortsDeclaredCondition says whether the ports this object needs are declared on the
	// masquerade interface of every worker VM template of the cluster.
	PortsDeclaredCondition = "PortsDeclared"
)

// Reasons shared by the conditions above.
const (
	// ReadyReason: the condition holds.
	ReadyReason = "Ready"
	// NotReadyReason: at least one condition that Ready summarises does not hold.
	NotReadyReason = "NotReady"

	// PausedReason: CAPI pause is in effect; nothing is changed until it is lifted.
	PausedReason = "Paused"
	// NotPausedReason: changes are reconciled.
	NotPausedReason = "NotPaused"

	// ClusterNotFoundReason: no Cluster of that name exists in the object's namespace.
	ClusterNotFoundReason = "ClusterNotFound"
	// ClusterNotProvisionedReason: the Cluster exists but its infrastructure or control
	// plane is not provisioned yet, so there is no guest apiserver to talk to.
	ClusterNotProvisionedReason = "ClusterNotProvisioned"
	// GuestUnreachableReason: the guest apiserver could not be reached; host objects are
	// left as they are and the request is retried with backoff.
	GuestUnreachableReason = "GuestUnreachable"
	// ClusterAvailableReason: the Cluster is provisioned and its guest apiserver answers.
	ClusterAvailableReason = "ClusterAvailable"

	// DeletingReason: the object is being deleted and guestnet is undoing what it did.
	DeletingReason = "Deleting"
	// InternalErrorReason: an unexpected error; the message carries it.
	InternalErrorReason = "InternalError"
	// InvalidSpecReason: the spec passed admission but a value the CRD could not check is not
	// usable (a GuestIngress label value, l2 interface regular expression or node selector; a
	// bridge label selector written before the CRD validated it); guestnet changes nothing
	// until it is corrected, and the message says what to change.
	InvalidSpecReason = "InvalidSpec"

	// GuestGoneReason: the Cluster, or its <cluster>-kubeconfig Secret, is gone for good:
	// nothing in the guest can be restored any more, so guestnet cleans the host side and
	// releases its finalizer (an event says what was left in the guest).
	GuestGoneReason = "GuestGone"
)

// SkipGuestCleanupAnnotation lets an admin give up on an unreachable guest: with it set to "true" on
// a GuestIngress or GuestWebhookBridge that is being deleted, guestnet stops waiting to
// restore what it changed in the guest, cleans the host side, releases its finalizer and
// records in an event what it left in the guest.
const SkipGuestCleanupAnnotation = "guestnet.addons.cluster.x-k8s.io/skip-guest-cleanup"

// ObjectReference names a namespaced object in the guest cluster.
type ObjectReference struct {
	// namespace of the object in the guest cluster.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`

	// name of the object in the guest cluster.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
}

// Knobs of the masquerade port declarations, set as annotations on the CAPI Cluster (values
// in Git, reconciled by guestnet).
const (
	// ExtraWorkerPortsAnnotation lists more ports every worker VM must accept, beyond those
	// guestnet derives itself: comma-separated port[/protocol], e.g. "9100,4240/TCP,51871/UDP".
	ExtraWorkerPortsAnnotation = "guestnet.addons.cluster.x-k8s.io/extra-worker-ports"

	// TemplateRevisionAnnotation forces new worker templates (and so a rollout of the workers)
	// for changes that no declared port captures: guestnet puts its value in the content hash
	// of the templates it generates. Change it to any new value to roll the workers.
	// guestnet also writes it on the templates it generates and on the MachineDeployments it
	// repoints: there it records the revision that was rolled out, so each MachineDeployment
	// is rolled once per revision (a repoint by someone else does not undo that).
	TemplateRevisionAnnotation = "guestnet.addons.cluster.x-k8s.io/template-revision"
)

// Marks guestnet writes on the MachineDeployments it repoints, in the same patch as the repoint.
const (
	// RepointedFromAnnotation names the user's KubevirtMachineTemplate that guestnet last
	// replaced on the MachineDeployment with a copy (directly, or through an earlier copy of
	// it). guestnet never points a MachineDeployment back at a template it replaced: when the
	// MachineDeployment names that template again and it still lacks required ports, someone
	// else set it back (a GitOps tool re-applying its source), and guestnet stops repointing
	// instead of fighting (reason RepointReverted). Remove the annotation to let guestnet
	// repoint once more.
	RepointedFromAnnotation = "guestnet.addons.cluster.x-k8s.io/repointed-from"
)

// Marks on the KubevirtMachineTemplates guestnet generates.
const (
	// GeneratedTemplateLabel marks a worker template generated by guestnet; its value is the
	// name of the Cluster it belongs to. Generated templates no MachineDeployment or
	// MachineSet references any more are deleted.
	GeneratedTemplateLabel = "guestnet.addons.cluster.x-k8s.io/generated-for"

	// BaseTemplateAnnotation names the user's template a generated one derives from, so that
	// the next generation is named <base>-<hash> again (never <base>-<hash>-<hash>).
	BaseTemplateAnnotation = "guestnet.addons.cluster.x-k8s.io/base-template"
)

// PortsDeclared condition reasons.
const (
	// PortsDeclaredReason: every worker template declares the object's ports, and every worker runs it.
	PortsDeclaredReason = "PortsDeclared"
	// AllPortsForwardedReason: the workers' masquerade interface has no ports list, so every
	// port reaches the VMs and nothing needs declaring.
	AllPortsForwardedReason = "AllPortsForwarded"
	// NotMasqueradeReason: the workers' pod network is not bound with masquerade; there is no
	// ports list to keep.
	NotMasqueradeReason = "NotMasquerade"
	// PortsNotRequestedReason: spec.declarePorts is false; the user declares the ports.
	PortsNotRequestedReason = "PortsNotRequested"
	// PortsMissingReason: a worker template lacks ports; guestnet is declaring them (a new
	// template and a rollout of the workers follow).
	PortsMissingReason = "PortsMissing"
	// RollingOutReason: the ports are declared on a new worker template and CAPI is rolling
	// the workers to it; old workers still drop the new ports.
	RollingOutReason = "RollingOut"
	// TopologyVariableRequiredReason: the workers belong to a ClusterClass topology, which
	// guestnet never edits; the message gives the topology variable value to set.
	TopologyVariableRequiredReason = "TopologyVariableRequired"
	// NoWorkersReason: the Cluster has no MachineDeployment with a KubevirtMachineTemplate.
	NoWorkersReason = "NoWorkers"
	// WorkerTemplateErrorReason: a worker template is missing or cannot be read.
	WorkerTemplateErrorReason = "WorkerTemplateError"
	// RepointRevertedReason: after guestnet repointed a MachineDeployment at a copy that
	// declares the ports, another field manager (named in the message) set it back to the
	// template that lacks them. guestnet stops repointing it; the message gives the ports list
	// to declare in the template's source.
	RepointRevertedReason = "RepointReverted"
	// WorkersElsewhereReason: CAPK creates the VMs of a worker MachineDeployment outside the
	// Cluster's namespace (virtualMachineTemplate.metadata.namespace of its template, or
	// another cluster: infraClusterSecretRef), where guestnet's host Services, which select
	// the virt-launcher pods in the Cluster's namespace, cannot reach them.
	WorkersElsewhereReason = "WorkersElsewhere"
	// TemplateNameTakenReason: an object guestnet did not write (other content, or not
	// labelled for this Cluster) holds the name of the copy guestnet would create; guestnet
	// does not adopt it and does not repoint.
	TemplateNameTakenReason = "TemplateNameTaken"
)
