// Package guestingress reconciles GuestIngress: it exposes the ingress controller of one guest
// cluster on a load-balancer IP of the host network. The chain it owns is the field report's
// working one: physical IP (Cilium L2 announcement) -> host LoadBalancer Service (IP from a
// CiliumLoadBalancerIPPool) -> the cluster's worker virt-launcher pods -> guest nodePorts
// declared on the VMs' masquerade interface -> guest ingress controller.
package guestingress

import (
	"context"
	"errors"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/predicates"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
)

// controllerName names the controller, its ClusterCache source and its events.
const controllerName = "guestingress"

// Reconciler reconciles GuestIngress objects.
type Reconciler struct {
	Client client.Client

	// ClusterCache gives access to the guest cluster through its <cluster>-kubeconfig Secret.
	ClusterCache clustercache.ClusterCache

	// WatchFilterValue, when set, limits the controller to objects (and Clusters) labelled
	// cluster.x-k8s.io/watch-filter=<value>.
	WatchFilterValue string

	recorder events.EventRecorder
}

// scope is what one reconcile of a GuestIngress works with.
type scope struct {
	guestIngress *guestnetv1.GuestIngress
	// cluster is the CAPI Cluster named by spec.clusterName; nil when it does not exist.
	cluster *clusterv1.Cluster
	// guestClient talks to the guest apiserver; set once ClusterAvailable is True.
	guestClient client.Client
	// paused is true when CAPI pause applies: then only the Paused condition is written.
	paused bool
}

// SetupWithManager registers the controller. Besides GuestIngress itself it watches Clusters
// (pause, provisioning, creation and deletion change what a GuestIngress reports) and the
// ClusterCache's connect/disconnect events, so that nothing waits for a resync.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.ClusterCache == nil {
		return errors.New("guestingress: Client and ClusterCache must not be nil")
	}
	if err := clusterscope.AddClusterNameIndex(ctx, mgr, &guestnetv1.GuestIngress{}); err != nil {
		return err
	}

	predicateLog := ctrl.LoggerFrom(ctx).WithValues("controller", controllerName)
	clusterToGuestIngresses := clusterscope.ClusterToObjects(mgr.GetClient(),
		func() client.ObjectList { return &guestnetv1.GuestIngressList{} })
	machineDeploymentToGuestIngresses := clusterscope.MachineDeploymentToObjects(mgr.GetClient(),
		func() client.ObjectList { return &guestnetv1.GuestIngressList{} })

	err := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		// Paused objects are not filtered out: their Paused condition must still be reported.
		For(&guestnetv1.GuestIngress{}).
		Watches(&clusterv1.Cluster{},
			handler.EnqueueRequestsFromMapFunc(clusterToGuestIngresses),
			builder.WithPredicates(clusterscope.ClusterChanged()),
		).
		// A rollout of the workers changes PortsDeclared.
		Watches(&clusterv1.MachineDeployment{}, handler.EnqueueRequestsFromMapFunc(machineDeploymentToGuestIngresses)).
		WatchesRawSource(r.ClusterCache.GetClusterSource(controllerName, clusterToGuestIngresses)).
		WithEventFilter(predicates.ResourceHasFilterLabel(mgr.GetScheme(), predicateLog, r.WatchFilterValue)).
		WithOptions(options).
		Complete(r)
	if err != nil {
		return err
	}
	r.recorder = mgr.GetEventRecorder(controllerName + "-controller")
	return nil
}

// Own objects: read them, write status, hold the finalizer until the host objects are gone.
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses/finalizers,verbs=update
// The CAPI Cluster named by spec.clusterName: pause, provisioning state.
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// The <cluster>-kubeconfig Secret the ClusterCache connects to the guest apiserver with.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// The host LoadBalancer Service in the Cluster's namespace that selects the worker virt-launcher pods.
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// Its EndpointSlices: zero ready endpoints is the field report's "connection refused".
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// Cilium LB-IPAM pool (created from spec.loadBalancer, or read when poolRef names one) and L2 announcement policy.
// +kubebuilder:rbac:groups=cilium.io,resources=ciliumloadbalancerippools;ciliuml2announcementpolicies,verbs=get;list;watch;create;update;patch;delete
// PortsDeclared: the worker MachineDeployments and their templates are read (the
// workerports controller is the one that writes them).
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=kubevirtmachinetemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinedeployments,verbs=get;list;watch
// Events on condition changes (controller-runtime's recorder writes events.k8s.io/v1 Events).
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one GuestIngress towards its spec and reports what it found in status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	guestIngress := &guestnetv1.GuestIngress{}
	if err := r.Client.Get(ctx, req.NamespacedName, guestIngress); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}

	log := ctrl.LoggerFrom(ctx).WithValues("Cluster", klog.KRef(guestIngress.Namespace, guestIngress.Spec.ClusterName))
	ctx = ctrl.LoggerInto(ctx, log)

	cluster, err := clusterscope.GetCluster(ctx, r.Client, guestIngress.Namespace, guestIngress.Spec.ClusterName)
	if err != nil {
		return ctrl.Result{}, err
	}
	s := &scope{guestIngress: guestIngress, cluster: cluster}

	patchHelper, err := patch.NewHelper(guestIngress, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	conditionsBefore := slices.Clone(guestIngress.Status.Conditions)
	defer func() {
		if err := r.patch(ctx, patchHelper, s, conditionsBefore, reterr == nil); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()

	if s.paused = clusterscope.SetPausedCondition(guestIngress, cluster); s.paused {
		log.V(4).Info("Reconciliation is paused")
		return ctrl.Result{}, nil
	}

	if !guestIngress.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}

	// Store the finalizer before anything is created, so a deletion always finds it. The
	// deferred patch writes it; its update event brings the object straight back.
	if controllerutil.AddFinalizer(guestIngress, guestnetv1.GuestIngressFinalizer) {
		return ctrl.Result{}, nil
	}

	return r.reconcileNormal(ctx, s)
}

// patch writes the GuestIngress back. Unless it is paused, Ready is summarised first and,
// after a reconcile without error, status.observedGeneration is stamped. Condition changes
// are recorded as events once they are stored.
func (r *Reconciler) patch(ctx context.Context, patchHelper *patch.Helper, s *scope, conditionsBefore []metav1.Condition, reconciled bool) error {
	opts := []patch.Option{patch.WithOwnedConditions{Conditions: ownedConditions}}
	if !s.paused {
		setReadyCondition(s.guestIngress)
		if reconciled {
			opts = append(opts, patch.WithStatusObservedGeneration{})
		}
	}
	if err := patchHelper.Patch(ctx, s.guestIngress, opts...); err != nil {
		return err
	}
	clusterscope.RecordConditionChanges(r.recorder, s.guestIngress, conditionsBefore)
	return nil
}
