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
// controller is concerned: the specs (without clusterName) of the cluster's GuestIngress and
// GuestWebhookBridge, nil when the value has no such field (or it is null).
type Variable struct {
	Ingress       map[string]any
	WebhookBridge map[string]any
}

// VariableOf reads the guestnet variable from the Cluster's spec.topology.variables (the
// cluster-level value; per-MachineDeployment overrides only change that MachineDeployment's
// worker template, through the ClusterClass patch). found is false when the Cluster has no
// topology or no such variable. A value that is not an object, or whose ingress or
// webhookBridge is not an object, is an error: the caller changes nothing.
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
		if v.Ingress, err = objectField(value, IngressField); err != nil {
			return v, true, err
		}
		if v.WebhookBridge, err = objectField(value, WebhookBridgeField); err != nil {
			return v, true, err
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
)

// ObjectName is the name of the GuestIngress and of the GuestWebhookBridge made from a
// Cluster's variable: the Cluster's name, in the Cluster's namespace.
func ObjectName(cluster *clusterv1.Cluster) string { return cluster.Name }

// Desired is the object of kind (GuestIngress or GuestWebhookBridge) as this controller
// server-side applies it for cluster: spec is the variable's part for it, completed with
// clusterName; labels ManagedLabel, CAPI's cluster-name label and, when the manager runs with
// a watch filter, the filter label (so that guestnet's other controllers see the object);
// the Cluster as controller owner (the garbage collector deletes the object with it). The
// spec is passed on as it is: the CRD validates it, and its defaults apply.
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

// specOf returns the part of v for kind.
func specOf(v Variable, kind string) map[string]any {
	switch kind {
	case GuestIngressKind:
		return v.Ingress
	case GuestWebhookBridgeKind:
		return v.WebhookBridge
	}
	return nil
}

// fieldOf names the variable field that holds kind's spec.
func fieldOf(kind string) string {
	if kind == GuestIngressKind {
		return IngressField
	}
	return WebhookBridgeField
}
