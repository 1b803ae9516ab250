// Package prologue is how guestnet's reconcilers begin, so that each decides the same way
// which objects are its own, when it may act and how a finalizer is stored: the steps of CAPI's
// core controllers before reconcileNormal/reconcileDelete, in one place.
package prologue

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
)

// Object is a guestnet object that belongs to one Cluster of its namespace.
type Object interface {
	clusterscope.Object
	GetClusterName() string
}

// InWatchFilter is true when obj is this instance's to reconcile: no watch filter is set, or
// obj carries cluster.x-k8s.io/watch-filter with its value. Each reconciler checks it on the
// object it reconciles: requests also come from objects the filter does not see (host
// Services, other objects' changes, Clusters).
func InWatchFilter(obj metav1.Object, watchFilterValue string) bool {
	return watchFilterValue == "" || obj.GetLabels()[clusterv1.WatchLabel] == watchFilterValue
}

// Reader reads what a reconcile starts from.
type Reader struct {
	Client           client.Client
	WatchFilterValue string
	// OwnWrites, when set, skips reads the cache has not caught up on (see
	// status.OwnWrites) and forgets objects that are gone.
	OwnWrites *status.OwnWrites
}

// Get reads the object of req into obj and its Cluster (nil when there is none), and returns
// ctx with a logger that names the Cluster. ok is false when the reconcile has nothing to
// do: obj is gone, the cache has not seen guestnet's own last write of it (that write's
// event brings it back), or it is another instance's (watch filter).
func (r Reader) Get(ctx context.Context, req ctrl.Request, obj Object) (_ context.Context, cluster *clusterv1.Cluster, ok bool, err error) {
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			if r.OwnWrites != nil {
				r.OwnWrites.Forget(req.NamespacedName)
			}
			return ctx, nil, false, nil
		}
		return ctx, nil, false, err
	}
	if r.OwnWrites != nil && r.OwnWrites.Stale(obj) {
		return ctx, nil, false, nil
	}
	if !InWatchFilter(obj, r.WatchFilterValue) {
		return ctx, nil, false, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("Cluster", klog.KRef(obj.GetNamespace(), obj.GetClusterName())))
	cluster, err = clusterscope.GetCluster(ctx, r.Client, obj.GetNamespace(), obj.GetClusterName())
	if err != nil {
		return ctx, nil, false, err
	}
	return ctx, cluster, true, nil
}

// Paused sets obj's Paused condition from obj and its Cluster (CAPI's pause annotation and
// spec.paused) and reports whether the reconcile must stop there.
func Paused(ctx context.Context, obj clusterscope.Object, cluster *clusterv1.Cluster) bool {
	if clusterscope.SetPausedCondition(obj, cluster) {
		ctrl.LoggerFrom(ctx).V(4).Info("Reconciliation is paused")
		return true
	}
	return false
}

// StoreFinalizer adds finalizer to obj and stores it at once, before anything is created, so
// that a deletion always finds it: a merge patch against before (obj as read) with
// optimistic locking. before and obj then carry the new resourceVersion, so the deferred
// status patch goes on from there. Nothing is written when obj has the finalizer already.
func (r Reader) StoreFinalizer(ctx context.Context, before, obj client.Object, finalizer string) error {
	if controllerutil.ContainsFinalizer(obj, finalizer) {
		return nil
	}
	written := before.DeepCopyObject().(client.Object)
	controllerutil.AddFinalizer(written, finalizer)
	if err := r.Client.Patch(ctx, written, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("adding finalizer: %w", err)
	}
	if r.OwnWrites != nil {
		r.OwnWrites.Replaced(client.ObjectKeyFromObject(before), before.GetResourceVersion())
	}
	// (written has what the apiserver answered, all managed fields included, which the
	// cache drops: only the finalizers and the version are taken from it.)
	for _, o := range []client.Object{before, obj} {
		controllerutil.AddFinalizer(o, finalizer)
		o.SetResourceVersion(written.GetResourceVersion())
	}
	return nil
}
