// Package topology is guestnet's experimental ClusterClass topology controller (feature gate
// ClusterTopologyVariables, alpha, off by default; internal/manager registers it only when
// the gate is on).
//
// A ClusterClass that publishes the `guestnet` variable (templates/clusterclass-kubevirt-guestnet.yaml)
// lets a Cluster carry, in spec.topology.variables, the specs of its GuestIngress
// (guestnet.ingress), GuestWebhookBridge (guestnet.webhookBridge) and GuestNodeIdentity
// (guestnet.nodeIdentity). This controller creates, updates and deletes those objects, all
// named after the Cluster in its namespace, from that one value; the ClusterClass's own
// patches declare the ports they need on the workers and turn on the kubelets' external
// cloud-provider mode for node identity, from the same value. CAPI's topology controller and guestnet therefore read one source and
// never write each other's objects: the MachineDeployments and worker templates stay CAPI's,
// the guestnet objects are this controller's (server-side apply, field manager
// guestnet-topology, the Cluster as controller owner, label
// guestnet.addons.cluster.x-k8s.io/topology-managed=true).
//
// Only the cluster-level value is read: per-MachineDeployment overrides of the variable change
// that MachineDeployment's worker template through the ClusterClass patch, not the guestnet
// objects. An object of the same name that this controller did not create is never touched:
// the conflict is reported as an event on the Cluster (a CAPI Cluster cannot take guestnet's
// conditions). A value the CRD refuses is reported the same way, with the apiserver's
// message, and changes nothing.
package topology

import (
	"context"
	"errors"
	"maps"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/predicates"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/prologue"
)

// controllerName names the controller and its events.
const controllerName = "topologyvariables"

// Reconciler manages the GuestIngress, GuestWebhookBridge and GuestNodeIdentity of each
// ClusterClass-based Cluster from its guestnet topology variable.
type Reconciler struct {
	Client client.Client

	// WatchFilterValue, when set, limits the controller to Clusters labelled
	// cluster.x-k8s.io/watch-filter=<value>; the objects it creates carry the label too, so
	// that the controllers of their kinds in the same instance see them.
	WatchFilterValue string

	recorder events.EventRecorder
}

// scope is what one reconcile of a Cluster works with.
type scope struct {
	cluster *clusterv1.Cluster
	// variable is the cluster-level value of the guestnet variable; its zero value (no
	// part at all) when the Cluster has none.
	variable Variable
}

// SetupWithManager registers the controller: it reconciles Clusters whose spec, labels or
// annotations (pause) change, and is woken by every object of the kinds it manages named
// like a Cluster whose spec, labels, owners or deletion change (its own objects changed or
// deleted by someone else, and objects of other owners that block or unblock a name).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil {
		return errors.New("topology: Client must not be nil")
	}
	log := ctrl.LoggerFrom(ctx).WithValues("controller", controllerName)
	b := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		For(&clusterv1.Cluster{}, builder.WithPredicates(
			predicates.ResourceHasFilterLabel(mgr.GetScheme(), log, r.WatchFilterValue),
			predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{}),
		))
	for _, k := range managedKinds {
		b = b.Watches(k.newObject(), handler.EnqueueRequestsFromMapFunc(clusterOfTheSameName), builder.WithPredicates(objectChanged()))
	}
	if err := b.WithOptions(options).Complete(r); err != nil {
		return err
	}
	r.recorder = mgr.GetEventRecorder(controllerName + "-controller")
	return nil
}

// The Clusters whose topology variable is read.
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// The GuestIngress, GuestWebhookBridge and GuestNodeIdentity made from it: server-side
// applied (create, patch; never updated), deleted when the variable drops them.
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses;guestwebhookbridges;guestnodeidentities,verbs=get;list;watch;create;patch;delete
// Events on the Cluster: objects created, updated, deleted, conflicts and refused values.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile makes the Cluster's GuestIngress, GuestWebhookBridge and GuestNodeIdentity match
// its guestnet topology variable.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cluster, err := clusterscope.GetCluster(ctx, r.Client, req.Namespace, req.Name)
	if err != nil || cluster == nil {
		// No Cluster: the garbage collector deletes what this controller made for it.
		return ctrl.Result{}, err
	}
	if !prologue.InWatchFilter(cluster, r.WatchFilterValue) {
		// Another instance's Cluster (requests also come from guestnet objects).
		return ctrl.Result{}, nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("Cluster", klog.KObj(cluster))
	ctx = ctrl.LoggerInto(ctx, log)

	if !cluster.DeletionTimestamp.IsZero() {
		// The objects go with the Cluster (owner reference); their own finalizers undo
		// what they did.
		return ctrl.Result{}, nil
	}
	if clusterscope.IsPaused(cluster, cluster) {
		log.V(4).Info("Reconciliation is paused")
		return ctrl.Result{}, nil
	}

	variable, _, err := VariableOf(cluster)
	if err != nil {
		// Nothing is applied nor deleted from a value that cannot be read.
		r.recorder.Eventf(cluster, nil, corev1.EventTypeWarning, ReasonVariableInvalid, eventAction,
			"%v: guestnet changes nothing until it is fixed", err)
		return ctrl.Result{}, nil
	}
	s := &scope{cluster: cluster, variable: variable}

	var errs []error
	for _, k := range managedKinds {
		errs = append(errs, r.reconcileObject(ctx, s, k))
	}
	return ctrl.Result{}, kerrors.NewAggregate(errs)
}

// clusterOfTheSameName maps an object of a managed kind to the Cluster whose variable would
// make an object of its name.
func clusterOfTheSameName(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
}

// objectChanged passes the guestnet object events that can change what this controller does:
// creation, deletion, and updates of the spec (generation), labels, owner references or
// deletion timestamp. Status updates, the bulk of them, are dropped.
func objectChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetGeneration() != n.GetGeneration() ||
				!maps.Equal(o.GetLabels(), n.GetLabels()) ||
				!equalOwners(o, n) ||
				o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero()
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func equalOwners(a, b client.Object) bool {
	ra, rb := a.GetOwnerReferences(), b.GetOwnerReferences()
	if len(ra) != len(rb) {
		return false
	}
	for i := range ra {
		if ra[i].UID != rb[i].UID || (ra[i].Controller == nil) != (rb[i].Controller == nil) ||
			(ra[i].Controller != nil && *ra[i].Controller != *rb[i].Controller) {
			return false
		}
	}
	return true
}
