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
)

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
