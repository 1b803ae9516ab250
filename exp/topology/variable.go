package topology

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// VariableName is the ClusterClass variable this controller reads
// (templates/clusterclass-kubevirt-guestnet.yaml).
const VariableName = "guestnet"

// Fields of the variable's value that this controller reads. workerPorts is read by the
// ClusterClass patch alone.
const (
	IngressField       = "ingress"
	WebhookBridgeField = "webhookBridge"
	NodeIdentityField  = "nodeIdentity"
)

// FieldManager is the server-side apply field manager of the objects this controller writes.
// It differs from guestnet's own ("guestnet"): the variable is the only source of the specs.
const FieldManager = "guestnet-topology"

// ManagedLabel (value "true") marks the GuestIngress and GuestWebhookBridge this controller
// created from a Cluster's topology variable. With a controller owner reference to that
// Cluster it is what makes an object the controller's own: any other object is never touched.
// Remove it (or the owner reference) to take an object over from the variable.
const (
	ManagedLabel = "guestnet.addons.cluster.x-k8s.io/topology-managed"
	ManagedValue = "true"
)

// Variable is the cluster-level value of the guestnet topology variable, as far as this
// controller is concerned: the specs (without clusterName) of the cluster's GuestIngress,
// GuestWebhookBridge and GuestNodeIdentity, nil when the value has no such field (or it is
// null). An empty object is a part all the same: for nodeIdentity, the opt-in alone.
type Variable struct {
	Ingress       map[string]any
	WebhookBridge map[string]any
	NodeIdentity  map[string]any
}

// VariableOf reads the guestnet variable from the Cluster's spec.topology.variables (the
// cluster-level value; per-MachineDeployment overrides only change that MachineDeployment's
// worker template, through the ClusterClass patch). found is false when the Cluster has no
// topology or no such variable. A value that is not an object, or whose ingress,
// webhookBridge or nodeIdentity is not an object, is an error: the caller changes nothing.
func VariableOf(cluster *clusterv1.Cluster) (v Variable, found bool, err error) {
	if !cluster.Spec.Topology.IsDefined() {
		return v, false, nil
	}
	for _, cv := range cluster.Spec.Topology.Variables {
		if cv.Name != VariableName {
			continue
		}
		if len(cv.Value.Raw) == 0 || string(cv.Value.Raw) == "null" {
			return v, false, nil
		}
		var value map[string]any
		if err := utiljson.Unmarshal(cv.Value.Raw, &value); err != nil {
			return v, true, fmt.Errorf("the value of topology variable %s is not an object: %w", VariableName, err)
		}
		for _, k := range managedKinds {
			if *k.part(&v), err = objectField(value, k.field); err != nil {
				return v, true, err
			}
		}
		return v, true, nil
	}
	return v, false, nil
}

func objectField(value map[string]any, field string) (map[string]any, error) {
	f, ok := value[field]
	if !ok || f == nil {
		return nil, nil
	}
	m, ok := f.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s.%s in the Cluster's topology variables must be an object, not %T", VariableName, field, f)
	}
	return m, nil
}

// Kinds this controller manages.
const (
	GuestIngressKind       = "GuestIngress"
	GuestWebhookBridgeKind = "GuestWebhookBridge"
	GuestNodeIdentityKind  = "GuestNodeIdentity"
)

// managedKind is one kind this controller makes from the variable: the field of the value
// that holds its spec, where a Variable keeps it, and an empty object of the kind.
type managedKind struct {
	kind      string
	field     string
	part      func(*Variable) *map[string]any
	newObject func() client.Object
}

// spec returns the part of v for the kind.
func (k managedKind) spec(v Variable) map[string]any { return *k.part(&v) }

// managedKinds lists every kind this controller manages, in the order a reconcile handles
// them; everything kind-specific is here.
var managedKinds = []managedKind{
	{kind: GuestIngressKind, field: IngressField,
		part:      func(v *Variable) *map[string]any { return &v.Ingress },
		newObject: func() client.Object { return &guestnetv1.GuestIngress{} }},
	{kind: GuestWebhookBridgeKind, field: WebhookBridgeField,
		part:      func(v *Variable) *map[string]any { return &v.WebhookBridge },
		newObject: func() client.Object { return &guestnetv1.GuestWebhookBridge{} }},
	{kind: GuestNodeIdentityKind, field: NodeIdentityField,
		part:      func(v *Variable) *map[string]any { return &v.NodeIdentity },
		newObject: func() client.Object { return &guestnetv1.GuestNodeIdentity{} }},
}

// ObjectName is the name of each object made from a Cluster's variable (its GuestIngress,
// GuestWebhookBridge and GuestNodeIdentity): the Cluster's name, in the Cluster's namespace.
func ObjectName(cluster *clusterv1.Cluster) string { return cluster.Name }

// Desired is the object of kind (GuestIngress, GuestWebhookBridge or GuestNodeIdentity) as
// this controller server-side applies it for cluster: spec is the variable's part for it,
// completed with clusterName; labels ManagedLabel, CAPI's cluster-name label and, when the
// manager runs with a watch filter, the filter label (so that guestnet's other controllers
// see the object); the Cluster as controller owner (the garbage collector deletes the object
// with it). The spec is passed on as it is: the CRD validates it, and its defaults apply.
func Desired(kind string, cluster *clusterv1.Cluster, spec map[string]any, watchFilterValue string) *unstructured.Unstructured {
	s := runtime.DeepCopyJSON(spec)
	s["clusterName"] = cluster.Name

	labels := map[string]string{
		ManagedLabel:               ManagedValue,
		clusterv1.ClusterNameLabel: cluster.Name,
	}
	if watchFilterValue != "" {
		labels[clusterv1.WatchLabel] = watchFilterValue
	}

	u := &unstructured.Unstructured{Object: map[string]any{"spec": s}}
	u.SetAPIVersion(guestnetv1.GroupVersion.String())
	u.SetKind(kind)
	u.SetNamespace(cluster.Namespace)
	u.SetName(ObjectName(cluster))
	u.SetLabels(labels)
	u.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(),
		Kind:       "Cluster",
		Name:       cluster.Name,
		UID:        cluster.UID,
		Controller: ptr.To(true),
	}})
	return u
}

// Owns reports whether obj is cluster's, made from its topology variable: it carries
// ManagedLabel and its controller owner reference is this Cluster (same UID: an object left
// from a deleted Cluster of the same name is not).
func Owns(cluster *clusterv1.Cluster, obj metav1.Object) bool {
	if obj.GetLabels()[ManagedLabel] != ManagedValue {
		return false
	}
	ref := metav1.GetControllerOfNoCopy(obj)
	if ref == nil || ref.Kind != "Cluster" || ref.UID != cluster.UID {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == clusterv1.GroupVersion.Group
}
