// Package guestingresspolicy reports, in the status of each GuestIngressPolicy, what it admits:
// how many namespaces it selects, which GuestIngresses it admits (decided by internal/policy,
// exactly as the GuestIngress controller decides), and whether it can be used as written
// (Ready). It writes nothing but that status: admission itself happens in the GuestIngress
// controller, which reads the policies directly.
package guestingresspolicy

import (
	"context"
	"errors"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/predicates"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/prologue"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
)

// controllerName names the controller and its events.
const controllerName = "guestingresspolicy"

// Reconciler reconciles the status of GuestIngressPolicies.
type Reconciler struct {
	Client client.Client

	// WatchFilterValue, when set, limits the controller to policies (and counts only
	// GuestIngresses) labelled cluster.x-k8s.io/watch-filter=<value>.
	WatchFilterValue string

	// Cilium says whether the host serves Cilium's pools; they are watched once it does
	// (internal/optional). Taken to be installed when nil.
	Cilium *optional.Gate

	// HostAddresses keeps the host's own addresses (a policy's status says which of them it
	// would admit); SetupWithManager makes one when nil.
	HostAddresses *hostaddrs.Watcher

	recorder events.EventRecorder
}

// scope is what one reconcile of a policy works with.
type scope struct {
	policy *guestnetv1.GuestIngressPolicy
}

// SetupWithManager registers the controller. A policy's status changes with the policy, with
// namespaces (labels), with GuestIngresses (created, changed, deleted), with pools (a
// shared pool appears or changes its selector) and with the host's own addresses, so each of
// those enqueues every policy:
// there are few policies, and each reconcile reads only the cache.
//
// Register it only in a manager that sees every namespace: a manager limited to one
// namespace would count that namespace only and fight the others over the status.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil {
		return errors.New("guestingresspolicy: Client must not be nil")
	}
	if r.HostAddresses == nil {
		var err error
		if r.HostAddresses, err = hostaddrs.NewWatcher(mgr); err != nil {
			return err
		}
	}
	predicateLog := ctrl.LoggerFrom(ctx).WithValues("controller", controllerName)
	filter := predicates.ResourceHasFilterLabel(mgr.GetScheme(), predicateLog, r.WatchFilterValue)
	allPolicies := handler.EnqueueRequestsFromMapFunc(r.allPolicies)
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		For(&guestnetv1.GuestIngressPolicy{}, builder.WithPredicates(filter)).
		Watches(&corev1.Namespace{}, allPolicies, builder.WithPredicates(labelsChanged())).
		// A resync of the GuestIngresses would ask for every policy once per GuestIngress, and
		// so would every status write of one (admission never reads a GuestIngress's status).
		Watches(&guestnetv1.GuestIngress{}, allPolicies, builder.WithPredicates(filter, clusterscope.Changed, notStatusOnly())).
		WatchesRawSource(r.HostAddresses.Source(allPolicies)).
		WithOptions(options).
		Build(r)
	if err != nil {
		return err
	}
	r.recorder = mgr.GetEventRecorder(controllerName + "-controller")
	// Pools: once Cilium is installed (its pool watch lists them all then, which enqueues
	// every policy when there is any pool).
	return r.Cilium.WhenInstalled(ctx, func(context.Context) error {
		return c.Watch(source.Kind(mgr.GetCache(), client.Object(ingress.NewPool()), allPolicies))
	})
}

// labelsChanged passes creations, deletions and label changes (what namespace selectors see).
func labelsChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
		},
	}
}

// notStatusOnly passes creations, deletions and updates of anything but the status: the
// spec and deletion (they change metadata.generation), labels and annotations.
func notStatusOnly() predicate.Predicate {
	return predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{})
}

// allPolicies enqueues every policy this manager serves.
func (r *Reconciler) allPolicies(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &guestnetv1.GuestIngressPolicyList{}
	if err := r.Client.List(ctx, list, r.filterOptions()...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestIngressPolicies")
		return nil
	}
	requests := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		requests[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
	}
	return requests
}

func (r *Reconciler) filterOptions() []client.ListOption {
	if r.WatchFilterValue == "" {
		return nil
	}
	return []client.ListOption{client.MatchingLabels{clusterv1.WatchLabel: r.WatchFilterValue}}
}

// Own objects: read them and write their status (with a patch; the object is read through
// the main resource).
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresspolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresspolicies/status,verbs=patch
// Namespaces: their labels are what namespaceSelectors match (the GuestIngress controller
// reads them too, to admit a GuestIngress).
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch
// GuestIngresses (counted and listed) and pools (shared pools, and pools that would hand
// out an IP) are read with the rules of the GuestIngress controller.
// Events on condition changes.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile computes the status of one policy from what the cache holds.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	p := &guestnetv1.GuestIngressPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !prologue.InWatchFilter(p, r.WatchFilterValue) {
		return ctrl.Result{}, nil
	}
	if !p.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // nothing to undo: the policy owns nothing
	}
	s := &scope{policy: p}

	patchHelper, err := patch.NewHelper(p, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	conditionsBefore := slices.Clone(p.Status.Conditions)
	defer func() {
		if err := r.patch(ctx, patchHelper, s, conditionsBefore, reterr == nil); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()
	return ctrl.Result{}, r.reconcileStatus(ctx, s)
}

// patch writes the status back (only what changed) and records condition changes as events.
func (r *Reconciler) patch(ctx context.Context, patchHelper *patch.Helper, s *scope, conditionsBefore []metav1.Condition, reconciled bool) error {
	opts := []patch.Option{patch.WithOwnedConditions{Conditions: []string{guestnetv1.ReadyCondition, guestnetv1.HostAddressesOutsideCondition}}}
	if reconciled {
		opts = append(opts, patch.WithStatusObservedGeneration{})
	}
	if err := patchHelper.Patch(ctx, s.policy, opts...); err != nil {
		return err
	}
	record.Conditions(ctx, r.recorder, s.policy, conditionsBefore)
	return nil
}
