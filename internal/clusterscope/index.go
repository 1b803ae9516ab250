package clusterscope

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// ClusterNameField indexes guestnet objects by spec.clusterName, so that a Cluster event
// finds the objects that name the Cluster without listing the whole namespace.
const ClusterNameField = "spec.clusterName"

// ClusterNameOf returns spec.clusterName of a guestnet object (every kind that belongs to a
// Cluster has GetClusterName), "" for any other object.
func ClusterNameOf(obj client.Object) string {
	if o, ok := obj.(interface{ GetClusterName() string }); ok {
		return o.GetClusterName()
	}
	return ""
}

// IndexByClusterName is the client.IndexerFunc of ClusterNameField.
func IndexByClusterName(obj client.Object) []string {
	if name := ClusterNameOf(obj); name != "" {
		return []string{name}
	}
	return nil
}

// AddClusterNameIndex registers ClusterNameField for obj's kind with the manager's cache.
func AddClusterNameIndex(ctx context.Context, mgr ctrl.Manager, obj client.Object) error {
	return mgr.GetFieldIndexer().IndexField(ctx, obj, ClusterNameField, IndexByClusterName)
}

// ListOfCluster lists the objects (of the kind list holds) that name the Cluster key in
// spec.clusterName, through ClusterNameField, in its namespace only.
func ListOfCluster(ctx context.Context, c client.Reader, key client.ObjectKey, list client.ObjectList, opts ...client.ListOption) error {
	return c.List(ctx, list, append([]client.ListOption{
		client.InNamespace(key.Namespace), client.MatchingFields{ClusterNameField: key.Name}}, opts...)...)
}

// ClusterToObjects returns a map function that turns a Cluster into requests for the objects
// (of the kind newList lists) that name it in spec.clusterName, in the Cluster's namespace
// only: a cluster name is unique per namespace, not across namespaces.
func ClusterToObjects(c client.Reader, newList func() client.ObjectList) handler.MapFunc {
	return func(ctx context.Context, cluster client.Object) []reconcile.Request {
		list := newList()
		if err := ListOfCluster(ctx, c, client.ObjectKeyFromObject(cluster), list); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Failed to list objects of Cluster", "Cluster", client.ObjectKeyFromObject(cluster))
			return nil
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Failed to read list of objects of Cluster", "Cluster", client.ObjectKeyFromObject(cluster))
			return nil
		}
		requests := make([]reconcile.Request, 0, len(items))
		for _, item := range items {
			if obj, ok := item.(client.Object); ok {
				requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(obj)})
			}
		}
		return requests
	}
}

// GuestToObjects returns a map function that turns any event of the guest of cluster into
// requests for the objects that name that Cluster (as ClusterToObjects): for a watch in the
// guest whose objects say nothing of the host.
func GuestToObjects(c client.Reader, cluster client.ObjectKey, newList func() client.ObjectList) handler.MapFunc {
	toObjects := ClusterToObjects(c, newList)
	obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: cluster.Name}}
	return func(ctx context.Context, _ client.Object) []reconcile.Request { return toObjects(ctx, obj) }
}

// MachineDeploymentToObjects returns a map function that turns a MachineDeployment into
// requests for the guestnet objects (of the kind newList lists) of its Cluster: a rollout
// changes what their PortsDeclared condition says.
func MachineDeploymentToObjects(c client.Reader, newList func() client.ObjectList) handler.MapFunc {
	clusterToObjects := ClusterToObjects(c, newList)
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		md, ok := o.(*clusterv1.MachineDeployment)
		if !ok || md.Spec.ClusterName == "" {
			return nil
		}
		return clusterToObjects(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: md.Namespace, Name: md.Spec.ClusterName}})
	}
}
