package guestingress

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// Map functions that turn events of other objects into requests for the GuestIngresses they
// concern.

// guestServiceToGuestIngresses maps a Service of the guest cluster (key names the Cluster)
// to the GuestIngresses of that Cluster that expose it, and to those whose fixed nodePorts
// it holds (their NodePortConflict ends when it lets go).
func (r *Reconciler) guestServiceToGuestIngresses(cluster client.ObjectKey) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		svc, ok := o.(*corev1.Service)
		if !ok {
			return nil
		}
		list := &guestnetv1.GuestIngressList{}
		if err := r.Client.List(ctx, list, client.InNamespace(cluster.Namespace),
			client.MatchingFields{clusterscope.ClusterNameField: cluster.Name}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngresses of Cluster", "Cluster", cluster)
			return nil
		}
		var requests []reconcile.Request
		for i := range list.Items {
			gi := &list.Items[i]
			exposes := gi.Spec.GuestService.Namespace == svc.Namespace && gi.Spec.GuestService.Name == svc.Name
			holds := slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
				return p.NodePort != 0 && slices.Contains(ingress.FixedNodePorts(gi), p.NodePort)
			})
			if exposes || holds {
				requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(gi)})
			}
		}
		return requests
	}
}

// endpointSliceToGuestIngress maps an EndpointSlice of a host Service guestnet created to
// the Service's GuestIngress.
func (r *Reconciler) endpointSliceToGuestIngress(ctx context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[discoveryv1.LabelServiceName]
	if name == "" {
		return nil
	}
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: name}, svc); err != nil {
		return nil
	}
	return r.hostObjectToGuestIngress(ctx, svc)
}

// hostObjectToGuestIngress maps a host object guestnet created to its GuestIngress, if this
// manager serves it (pools and policies are cluster-scoped: they name GuestIngresses of
// every namespace, and a manager may watch one only).
func (r *Reconciler) hostObjectToGuestIngress(ctx context.Context, o client.Object) []reconcile.Request {
	key, ok := hostnames.GuestIngressOf(o)
	if !ok || r.Client.Get(ctx, key, &guestnetv1.GuestIngress{}) != nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// poolToGuestIngresses maps a CiliumLoadBalancerIPPool to the GuestIngress it was created for,
// and to the GuestIngresses whose poolRef names it.
func (r *Reconciler) poolToGuestIngresses(ctx context.Context, o client.Object) []reconcile.Request {
	requests := r.hostObjectToGuestIngress(ctx, o)
	list := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngresses")
		return requests
	}
	for i := range list.Items {
		if ref := list.Items[i].Spec.LoadBalancer.PoolRef; ref != nil && ref.Name == o.GetName() {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return requests
}

// collidingGuestIngresses maps a GuestIngress to the other GuestIngresses whose IP claims
// collide with its own: when it changes or goes away, which of them keeps the address is
// decided again. Both the old and the new version of an update are mapped.
func (r *Reconciler) collidingGuestIngresses(ctx context.Context, o client.Object) []reconcile.Request {
	gi, ok := o.(*guestnetv1.GuestIngress)
	if !ok || ingress.ClaimOf(gi).Empty() {
		return nil
	}
	list := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngresses")
		return nil
	}
	var requests []reconcile.Request
	for i := range list.Items {
		other := &list.Items[i]
		if (other.Namespace != gi.Namespace || other.Name != gi.Name) && ingress.Overlap(gi, other) {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(other)})
		}
	}
	return requests
}
