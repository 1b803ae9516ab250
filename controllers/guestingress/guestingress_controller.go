// Package guestingress reconciles GuestIngress: it exposes the ingress controller of one guest
// cluster on a load-balancer IP of the host network. The chain it owns is the field report's
// working one: physical IP (Cilium L2 announcement) -> host LoadBalancer Service (IP from a
// CiliumLoadBalancerIPPool) -> the cluster's worker virt-launcher pods -> guest nodePorts
// declared on the VMs' masquerade interface -> guest ingress controller.
package guestingress

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/predicates"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/prologue"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
)

// controllerName names the controller, its ClusterCache source and its events.
const controllerName = "guestingress"

// Reconciler reconciles GuestIngress objects.
type Reconciler struct {
	Client client.Client

	// APIReader reads from the host apiserver directly, for the few reads the manager's
	// cache cannot answer: whether an object that guestnet would create exists and belongs to
	// someone else (the cache holds only guestnet's Services), and what is left to delete.
	// The manager's API reader when nil.
	APIReader client.Reader

	// ClusterCache gives access to the guest cluster through its <cluster>-kubeconfig Secret.
	ClusterCache clustercache.ClusterCache

	// WatchFilterValue, when set, limits the controller to objects (and Clusters) labelled
	// cluster.x-k8s.io/watch-filter=<value>.
	WatchFilterValue string

	// WatchNamespace, when set, is the one namespace the manager watches: host objects made
	// for GuestIngresses of other namespaces are another instance's, never swept here.
	WatchNamespace string

	// Cilium says whether the host serves Cilium's LB-IPAM pools and L2 policies: until it
	// does, GuestIngresses report CiliumLBIPAMNotInstalled and nothing is created for them,
	// and the pool and policy watches start once it does (internal/optional). Taken to be
	// installed when nil.
	Cilium *optional.Gate
	// CiliumBGP and MetalLB say whether the host serves the other announcers' APIs: a
	// GuestIngress whose policy chose a missing one is refused with the gate's message, and
	// their watches start once they are served. Taken to be installed when nil.
	CiliumBGP, MetalLB *optional.Gate

	// HostAddresses keeps the host's own addresses, which admission never hands out;
	// SetupWithManager makes one when nil.
	HostAddresses *hostaddrs.Watcher

	// Admit decides what a GuestIngress may claim on the host; policy.Admit when nil (tests
	// put their own decision in).
	Admit func(policy.Input) policy.Decision

	recorder   events.EventRecorder
	controller controller.Controller
	// ownWrites skips a reconcile on a cache that has not seen this controller's last write.
	ownWrites status.OwnWrites
}

// scope is what one reconcile of a GuestIngress works with.
type scope struct {
	guestIngress *guestnetv1.GuestIngress
	// before is the GuestIngress as read, the base of the deferred status patch; a write of
	// the status during the reconcile (storeGuestService) moves it on.
	before *guestnetv1.GuestIngress
	// cluster is the CAPI Cluster named by spec.clusterName; nil when it does not exist.
	cluster *clusterv1.Cluster
	// paused is true when CAPI pause applies: then only the Paused condition is written.
	paused bool
	// guestClient talks to the guest apiserver (nil while it cannot be reached); guestErr is
	// why not, for ClusterAvailable.
	guestClient client.Client
	guestErr    error

	// world, host and admissionInput are what observeHost read of the host (reconcileHeld,
	// before pause and deletion are looked at): every GuestIngress, pool and policy, and this
	// GuestIngress's decision and host objects, as they are after reconcileHeld's writes.
	// swept: reconcileHeld swept what was made for a former GuestIngress of this name, and
	// the reconcile stopped there; revoked: it took off what the policy no longer admits.
	world          *hostWorld
	host           *ingress.Observed
	admissionInput policy.Input
	swept, revoked bool

	// observed, plan and result are the three stages of reconcileNormal, set as each is
	// done; the status is derived from them (updateStatus).
	observed *ingress.Observed
	plan     *ingress.Plan
	result   *ingress.Result

	// notTriedYet: the manager has not tried to connect to the guest since it started
	// (clusterscope.NotTriedYet), and the reconcile stopped before the plan: the status stays
	// as the last reconcile that knew the guest left it.
	notTriedYet bool
	// hostDeleted: the host objects are gone (deletion); waitingForGuest: the deletion waits
	// for the guest apiserver to give the guest Service back.
	hostDeleted     bool
	waitingForGuest bool
	// err is the error reconcileNormal ended with, if any.
	err error
	// ciliumMissing says that the host serves no Cilium LB-IPAM (the gate's message): the
	// reconcile did nothing.
	ciliumMissing string
}

// SetupWithManager registers the controller. Besides GuestIngress itself it watches Clusters
// (pause, provisioning, creation and deletion change what a GuestIngress reports), the
// ClusterCache's connect/disconnect events, the host objects it creates (Service,
// EndpointSlices, pool, L2 policy), every pool (a poolRef's, an admin's that a claim overlaps),
// the other GuestIngresses whose IP claims collide or that name the same guest Service,
// GuestIngressPolicies and namespace labels
// (admission), the kubeconfig Secrets (a guest gone for good) and, through the ClusterCache,
// the guest's Services and cilium-config (see watchGuest): nothing waits for a resync.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.ClusterCache == nil {
		return errors.New("guestingress: Client and ClusterCache must not be nil")
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Admit == nil {
		r.Admit = policy.Admit
	}
	if err := addIndexes(ctx, mgr.GetFieldIndexer(), hostIndexes()); err != nil {
		return err
	}

	if r.HostAddresses == nil {
		w, err := hostaddrs.NewWatcher(mgr)
		if err != nil {
			return err
		}
		r.HostAddresses = w
	}
	predicateLog := ctrl.LoggerFrom(ctx).WithValues("controller", controllerName)
	filter := predicates.ResourceHasFilterLabel(mgr.GetScheme(), predicateLog, r.WatchFilterValue)
	clusterToGuestIngresses := clusterscope.ClusterToObjects(mgr.GetClient(),
		func() client.ObjectList { return &guestnetv1.GuestIngressList{} })
	machineDeploymentToGuestIngresses := clusterscope.MachineDeploymentToObjects(mgr.GetClient(),
		func() client.ObjectList { return &guestnetv1.GuestIngressList{} })

	c, err := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		// A resync reconciles each GuestIngress once, through For: every other watch passes
		// only what changed (clusterscope.Changed), else each resync maps every host object to its
		// GuestIngress again, and the watches that map to many (colliding claims, a policy)
		// cost the whole fleet per object (docs/performance.md).
		// Paused objects are not filtered out: their Paused condition must still be reported,
		// and what their policy no longer admits is taken off.
		For(&guestnetv1.GuestIngress{}, builder.WithPredicates(filter)).
		// A GuestIngress that leaves this instance's watch filter (its label changed or went)
		// is another instance's: what this one made for it is swept.
		Watches(&guestnetv1.GuestIngress{}, &handler.EnqueueRequestForObject{},
			builder.WithPredicates(leftWatchFilter(r.WatchFilterValue))).
		Watches(&clusterv1.Cluster{},
			handler.EnqueueRequestsFromMapFunc(clusterToGuestIngresses),
			builder.WithPredicates(clusterscope.ClusterChanged(), filter),
		).
		// A rollout of the workers changes PortsDeclared.
		Watches(&clusterv1.MachineDeployment{}, handler.EnqueueRequestsFromMapFunc(machineDeploymentToGuestIngresses),
			builder.WithPredicates(filter, clusterscope.Changed)).
		WatchesRawSource(r.ClusterCache.GetClusterSource(controllerName, clusterToGuestIngresses)).
		// The host objects: the Service (its IP arrives in its status), its EndpointSlices
		// (workers come and go), the pool (Cilium's PoolConflict) and the L2 policy (repaired
		// when changed or deleted by someone else). A poolRef pool that appears ends PoolNotFound.
		// (The pool and the L2 policy are watched once Cilium is installed: watchCilium.)
		Owns(&corev1.Service{}, builder.WithPredicates(clusterscope.Changed)).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(r.endpointSliceToGuestIngress), builder.WithPredicates(clusterscope.Changed)).
		// Whether a poolRef GuestIngress holds its IP is read from its host Service: the
		// GuestIngresses whose claims collide are decided again when it changes or goes.
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.hostServiceToCollidingGuestIngresses), builder.WithPredicates(clusterscope.Changed)).
		// A GuestIngress whose IP claim collides with another one's is decided again when
		// that one changes or goes away; a policy's per-namespace cap when one comes or goes.
		Watches(&guestnetv1.GuestIngress{}, handler.EnqueueRequestsFromMapFunc(r.collidingGuestIngresses), builder.WithPredicates(clusterscope.Changed)).
		Watches(&guestnetv1.GuestIngress{}, handler.EnqueueRequestsFromMapFunc(r.namespaceGuestIngresses),
			builder.WithPredicates(createOrDelete)).
		// One GuestIngress per guest Service: the others of the Cluster that name or hold a
		// guest Service are decided again when one takes, gives back or stops naming it.
		Watches(&guestnetv1.GuestIngress{}, handler.EnqueueRequestsFromMapFunc(r.guestServiceRivalsOf), builder.WithPredicates(clusterscope.Changed)).
		// Admission: the GuestIngressPolicies, and the labels of the namespaces they select.
		Watches(&guestnetv1.GuestIngressPolicy{}, handler.EnqueueRequestsFromMapFunc(r.allGuestIngresses), builder.WithPredicates(clusterscope.Changed)).
		// The host's own addresses: a Node that joins, an apiserver that moves, may take what a
		// GuestIngress holds (rare: every GuestIngress is decided again).
		WatchesRawSource(r.HostAddresses.Source(handler.EnqueueRequestsFromMapFunc(r.allGuestIngresses))).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.namespaceGuestIngresses),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// A deleted <cluster>-kubeconfig Secret means the guest is gone for good
		// (clusterscope.GuestGone): a deletion that waits for the guest ends.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(secretToGuestIngresses(clusterToGuestIngresses)),
			builder.WithPredicates(kubeconfigSecret)).
		WithOptions(options).
		Build(r)
	if err != nil {
		return err
	}
	r.controller = c
	r.recorder = mgr.GetEventRecorder(controllerName + "-controller")
	if err := r.Cilium.WhenInstalled(ctx, r.watchCilium(mgr, c)); err != nil {
		return err
	}
	for _, w := range []struct {
		gate *optional.Gate
		kind []*unstructured.Unstructured
	}{
		{r.CiliumBGP, []*unstructured.Unstructured{ingress.NewBGPAdvertisement()}},
		{r.MetalLB, []*unstructured.Unstructured{ingress.NewMetalLBPool(), ingress.NewMetalLBL2Advertisement(), ingress.NewMetalLBBGPAdvertisement()}},
	} {
		if err := w.gate.WhenInstalled(ctx, r.watchAnnouncer(mgr, c, w.gate, w.kind)); err != nil {
			return err
		}
	}
	return nil
}

// watchAnnouncer adds the watches of an announcer's kinds to c once its API is served (a
// deleted or changed advertisement is put back), with a reconcile of every GuestIngress when it
// came later (those refused for the missing API build their chain then).
func (r *Reconciler) watchAnnouncer(mgr ctrl.Manager, c controller.Controller, gate *optional.Gate, kinds []*unstructured.Unstructured) func(context.Context) error {
	installedLater := !gate.Installed()
	return func(ctx context.Context) error {
		if err := addIndexes(ctx, mgr.GetFieldIndexer(), announcerIndexes(kinds)); err != nil {
			return err
		}
		for _, kind := range kinds {
			if err := c.Watch(source.Kind(mgr.GetCache(), client.Object(kind), handler.EnqueueRequestsFromMapFunc(r.hostObjectToGuestIngress), clusterscope.Changed)); err != nil {
				return err
			}
		}
		if !installedLater {
			return nil
		}
		return r.reconcileEveryGuestIngress(c)
	}
}

// watchCilium adds the watches of Cilium's pools and L2 policies to c: at setup when Cilium
// is installed, else once it is, together with a reconcile of every GuestIngress (those that
// reported CiliumLBIPAMNotInstalled build their chain then).
func (r *Reconciler) watchCilium(mgr ctrl.Manager, c controller.Controller) func(context.Context) error {
	installedLater := !r.Cilium.Installed()
	return func(ctx context.Context) error {
		if err := addIndexes(ctx, mgr.GetFieldIndexer(), ciliumIndexes()); err != nil {
			return err
		}
		if err := c.Watch(source.Kind(mgr.GetCache(), client.Object(ingress.NewPool()),
			handler.EnqueueRequestsFromMapFunc(r.poolToGuestIngresses), clusterscope.Changed)); err != nil {
			return err
		}
		if err := c.Watch(source.Kind(mgr.GetCache(), client.Object(ingress.NewL2Policy()),
			handler.EnqueueRequestsFromMapFunc(r.hostObjectToGuestIngress), clusterscope.Changed)); err != nil {
			return err
		}
		if !installedLater {
			return nil
		}
		return r.reconcileEveryGuestIngress(c)
	}
}

// reconcileEveryGuestIngress makes c reconcile every GuestIngress once: an optional API that
// came after the manager started lets those that reported it missing build their chain.
func (r *Reconciler) reconcileEveryGuestIngress(c controller.Controller) error {
	return c.Watch(source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		for _, req := range r.allGuestIngresses(ctx, nil) {
			q.Add(req)
		}
		return nil
	}))
}

// Own objects: read them, write status, hold the finalizer until the host objects are gone.
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses/status,verbs=patch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses/finalizers,verbs=update
// The CAPI Cluster named by spec.clusterName: pause, provisioning state.
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// The <cluster>-kubeconfig Secret the ClusterCache connects to the guest apiserver with.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// The host LoadBalancer Service in the Cluster's namespace that selects the worker virt-launcher pods
// (server-side applied; deleted when the GuestIngress goes).
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete
// Its EndpointSlices: zero ready endpoints is the field report's "connection refused".
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=list;watch
// Cilium LB-IPAM pool (created from spec.loadBalancer, or read when poolRef names one) and L2 announcement policy.
// +kubebuilder:rbac:groups=cilium.io,resources=ciliumloadbalancerippools;ciliuml2announcementpolicies,verbs=get;list;watch;create;patch;delete
// The announcers a policy may choose besides Cilium's L2: a CiliumBGPAdvertisement per
// GuestIngress of Cilium's BGP class; a MetalLB IPAddressPool and the advertisements the
// policy names per GuestIngress of MetalLB's class (in MetalLB's namespace).
// +kubebuilder:rbac:groups=cilium.io,resources=ciliumbgpadvertisements,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=metallb.io,resources=ipaddresspools;l2advertisements;bgpadvertisements,verbs=get;list;watch;create;patch;delete
// With externalTrafficPolicy Local guestnet writes the host Service's EndpointSlices itself,
// from the worker virt-launcher pods (cached) whose guest node runs the ingress controller.
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=create;patch;delete
// PortsDeclared: the worker MachineDeployments and their templates are read (the
// workerports controller is the one that writes them).
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=kubevirtmachinetemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinedeployments,verbs=get;list;watch
// Admission (internal/policy): the GuestIngressPolicies, and the labels of the namespaces they select.
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresspolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch
// The host's own addresses (internal/hostaddrs), never a tenant's: Nodes' addresses and pod
// CIDRs, the apiserver's endpoints (EndpointSlices of default/kubernetes, read with the rule
// above), the ServiceCIDRs.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=servicecidrs,verbs=list;watch
// Events on condition changes (controller-runtime's recorder writes events.k8s.io/v1 Events).
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one GuestIngress towards its spec and reports what it found in status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	guestIngress := &guestnetv1.GuestIngress{}
	ctx, cluster, ok, err := r.reader().Get(ctx, req, guestIngress)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !ok {
		if guestIngress.UID != "" && prologue.InWatchFilter(guestIngress, r.WatchFilterValue) {
			return ctrl.Result{}, nil // the cache has not seen guestnet's last write of it: that write's event brings it back
		}
		// Gone, or another instance's now: what this instance made for it goes.
		return ctrl.Result{}, r.sweepGone(ctx, req.NamespacedName)
	}
	s := &scope{guestIngress: guestIngress, cluster: cluster}

	// What was read: the deferred patch writes what the reconcile changed since.
	before := guestIngress.DeepCopy()
	s.before = before
	defer func() {
		if err := r.patch(ctx, before, s, reterr == nil); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()

	// Before anything else: what it holds on the host stays within what its policy admits
	// now, paused or not, being deleted or not, whatever its spec and its guest.
	if err := r.reconcileHeld(ctx, s); err != nil || s.swept {
		return ctrl.Result{}, err
	}

	// Pause means "make no new changes": what reconcileHeld took off stays off.
	if s.paused = prologue.Paused(ctx, guestIngress, cluster); s.paused {
		return ctrl.Result{}, nil
	}

	if !guestIngress.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}

	if err := r.reader().StoreFinalizer(ctx, before, guestIngress, guestnetv1.GuestIngressFinalizer); err != nil {
		return ctrl.Result{}, err
	}

	return r.reconcileNormal(ctx, s)
}

// reader reads what a reconcile starts from (internal/prologue).
func (r *Reconciler) reader() prologue.Reader {
	return prologue.Reader{Client: r.Client, WatchFilterValue: r.WatchFilterValue, OwnWrites: &r.ownWrites}
}

// patch writes what the reconcile changed on the GuestIngress since before, in one status
// write (status.Patch). The status is derived first from what the reconcile observed and did:
// all of it (updateStatus) and, after a reconcile without error, status.observedGeneration is
// stamped; while paused, what reconcileHeld decided (updatePausedStatus); nothing after a
// sweep (the reconcile its deletions bring reports) or before the manager's first try to
// connect to the guest (notTriedYet). Condition changes are recorded as events
// once they are stored.
func (r *Reconciler) patch(ctx context.Context, before *guestnetv1.GuestIngress, s *scope, reconciled bool) error {
	gi := s.guestIngress
	switch {
	case s.swept, s.notTriedYet:
	case s.paused:
		updatePausedStatus(s)
	default:
		updateStatus(s)
		if reconciled {
			gi.Status.ObservedGeneration = gi.Generation
		}
	}
	written, err := status.Patch(ctx, r.Client, before, gi)
	if written {
		r.ownWrites.Replaced(client.ObjectKeyFromObject(gi), before.ResourceVersion)
	}
	if err != nil {
		return err
	}
	record.Conditions(ctx, r.recorder, gi, before.Status.Conditions)
	if written && s.observed != nil && s.plan != nil {
		// The conditions name only the tenant's own objects; what they leave out is the
		// admin's, logged with each status they were written with.
		for _, detail := range ingress.Withheld(gi, s.observed, s.plan) {
			ctrl.LoggerFrom(ctx).Info("Not in the GuestIngress's conditions (not the tenant's to read): "+detail, "reason", conditions.GetReason(gi, guestnetv1.ReadyCondition))
		}
	}
	return nil
}
