package guestingress

import (
	"context"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
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
		if err := clusterscope.ListOfCluster(ctx, r.Client, cluster, list); err != nil {
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
// instance made it (its mark, ownership.MadeByInstance: pools and policies are cluster-scoped
// and name GuestIngresses of every namespace, and a manager may serve some of them only), or,
// for an object made before guestnet marked them, if the GuestIngress exists. The
// GuestIngress need not exist: its reconcile sweeps what was made for it. With the initial
// list of the watches, every host object this instance made is looked at once at start.
func (r *Reconciler) hostObjectToGuestIngress(ctx context.Context, o client.Object) []reconcile.Request {
	key, ok := ownership.GuestIngressOf(o)
	if !ok || (r.WatchNamespace != "" && key.Namespace != r.WatchNamespace) {
		return nil
	}
	if _, marked := o.GetAnnotations()[ownership.WatchFilterAnnotation]; !ownership.MadeByInstance(o, r.WatchFilterValue) &&
		(marked || r.Client.Get(ctx, key, &guestnetv1.GuestIngress{}) != nil) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// poolToGuestIngresses maps a CiliumLoadBalancerIPPool to the GuestIngress it was created for,
// to the GuestIngresses whose poolRef names it, and to those that ask for address space in it
// (a pool that holds addresses, an admin's pool they were refused for).
func (r *Reconciler) poolToGuestIngresses(ctx context.Context, o client.Object) []reconcile.Request {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	requests := r.hostObjectToGuestIngress(ctx, o)
	list := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, list, readOnly, client.MatchingFields{poolRefField: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngresses")
		return requests
	}
	for i := range list.Items {
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return append(requests, r.guestIngressesColliding(ctx, client.ObjectKey{}, ingress.Claim{Prefixes: ingress.PoolBlocks(u)})...)
}

// collidingGuestIngresses maps a GuestIngress to the other GuestIngresses whose IP claims
// collide with its own: when it changes or goes away, which of them keeps the address is
// decided again. Both the old and the new version of an update are mapped.
func (r *Reconciler) collidingGuestIngresses(ctx context.Context, o client.Object) []reconcile.Request {
	gi, ok := o.(*guestnetv1.GuestIngress)
	if !ok {
		return nil
	}
	return r.guestIngressesColliding(ctx, client.ObjectKeyFromObject(gi), ingress.ClaimOf(gi))
}

// hostServiceToCollidingGuestIngresses maps a host Service guestnet created to the
// GuestIngresses whose claims collide with its GuestIngress's, or with the IPs it requests:
// with poolRef, the Service is what holds the IP.
func (r *Reconciler) hostServiceToCollidingGuestIngresses(ctx context.Context, o client.Object) []reconcile.Request {
	svc, ok := o.(*corev1.Service)
	key, owned := ownership.GuestIngressOf(o)
	if !ok || !owned {
		return nil
	}
	claims := []ingress.Claim{}
	for _, ip := range ingress.ServiceIPs(svc) {
		claims = append(claims, ingress.Claim{IP: ip})
	}
	gi := &guestnetv1.GuestIngress{}
	if err := r.Client.Get(ctx, key, gi); err == nil {
		claims = append(claims, ingress.ClaimOf(gi))
	}
	return r.guestIngressesColliding(ctx, key, claims...)
}

// guestIngressesColliding lists the GuestIngresses but except whose claims collide with any of
// claims, through the address index (addressField).
func (r *Reconciler) guestIngressesColliding(ctx context.Context, except client.ObjectKey, claims ...ingress.Claim) []reconcile.Request {
	var addresses []netip.Prefix
	for _, c := range claims {
		addresses = append(addresses, c.Addresses()...)
	}
	var requests []reconcile.Request
	for _, key := range addressKeysToAsk(addresses) {
		list := &guestnetv1.GuestIngressList{}
		if err := r.Client.List(ctx, list, readOnly, atAddress(key)); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngresses")
			return nil
		}
		for i := range list.Items {
			other := &list.Items[i]
			req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(other)}
			if req.NamespacedName == except || slices.Contains(requests, req) {
				continue
			}
			if slices.ContainsFunc(claims, ingress.ClaimOf(other).Collides) {
				requests = append(requests, req)
			}
		}
	}
	return requests
}

// guestServiceRivalsOf maps a GuestIngress to the other GuestIngresses of its Cluster that name
// or hold (status.guestService) a guest Service it names or holds: which of them may write to
// it is decided again (ingress.GuestServiceRivalsOf). Both the old and the new version of an
// update are mapped, so a GuestIngress that stops naming or holding a Service brings the
// others back.
func (r *Reconciler) guestServiceRivalsOf(ctx context.Context, o client.Object) []reconcile.Request {
	gi, ok := o.(*guestnetv1.GuestIngress)
	if !ok {
		return nil
	}
	refs := []guestnetv1.ObjectReference{gi.Spec.GuestService}
	if gi.Status.GuestService != nil {
		refs = append(refs, *gi.Status.GuestService)
	}
	list := &guestnetv1.GuestIngressList{}
	if err := clusterscope.ListOfCluster(ctx, r.Client, client.ObjectKey{Namespace: gi.Namespace, Name: gi.Spec.ClusterName}, list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngresses of Cluster", "Cluster", klog.KRef(gi.Namespace, gi.Spec.ClusterName))
		return nil
	}
	var requests []reconcile.Request
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name == gi.Name {
			continue
		}
		if slices.Contains(refs, other.Spec.GuestService) || (other.Status.GuestService != nil && slices.Contains(refs, *other.Status.GuestService)) {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(other)})
		}
	}
	return requests
}

// namespaceGuestIngresses maps a Namespace (its labels decide which policies select it) or a
// GuestIngress that comes or goes (a policy may cap how many a namespace has) to the
// GuestIngresses of that namespace.
func (r *Reconciler) namespaceGuestIngresses(ctx context.Context, o client.Object) []reconcile.Request {
	namespace := o.GetNamespace()
	if _, ok := o.(*corev1.Namespace); ok {
		namespace = o.GetName()
	}
	list := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, list, client.InNamespace(namespace)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngresses", "namespace", namespace)
		return nil
	}
	return requestsFor(list.Items, client.ObjectKeyFromObject(o))
}

// allGuestIngresses maps a GuestIngressPolicy to every GuestIngress: which namespaces it
// selects, and what it admits there, may have changed.
func (r *Reconciler) allGuestIngresses(ctx context.Context, _ client.Object) []reconcile.Request {
	list, err := r.listGuestIngresses(ctx)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngresses")
		return nil
	}
	return requestsFor(list, client.ObjectKey{})
}

func requestsFor(list []guestnetv1.GuestIngress, except client.ObjectKey) []reconcile.Request {
	var requests []reconcile.Request
	for i := range list {
		if key := client.ObjectKeyFromObject(&list[i]); key != except {
			requests = append(requests, reconcile.Request{NamespacedName: key})
		}
	}
	return requests
}

// secretToGuestIngresses maps a <cluster>-kubeconfig Secret to the GuestIngresses of its
// Cluster (clusterToGuestIngresses).
func secretToGuestIngresses(clusterToGuestIngresses handler.MapFunc) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: o.GetNamespace(), Name: o.GetLabels()[clusterv1.ClusterNameLabel]}}
		return clusterToGuestIngresses(ctx, cluster)
	}
}

// kubeconfigSecret passes the creation and deletion of a Cluster's <cluster>-kubeconfig Secret.
var kubeconfigSecret = predicate.Funcs{
	CreateFunc:  func(e event.CreateEvent) bool { return isKubeconfigSecret(e.Object) },
	DeleteFunc:  func(e event.DeleteEvent) bool { return isKubeconfigSecret(e.Object) },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

func isKubeconfigSecret(o client.Object) bool {
	cluster := o.GetLabels()[clusterv1.ClusterNameLabel]
	return cluster != "" && o.GetName() == cluster+"-kubeconfig"
}

// createOrDelete passes creations and deletions only.
var createOrDelete = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return true },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// leftWatchFilter passes the updates of a GuestIngress that carried this instance's
// watch-filter label and no longer does (none when the instance has no watch filter: every
// GuestIngress is its own).
func leftWatchFilter(watchFilterValue string) predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		DeleteFunc: func(event.DeleteEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return watchFilterValue != "" && ownership.InstanceMark(e.ObjectOld) == watchFilterValue &&
				ownership.InstanceMark(e.ObjectNew) != watchFilterValue
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
