// Package guestwebhookbridge reconciles GuestWebhookBridge: it makes the guest cluster's
// APIServices and admission webhooks reachable from the guest control plane, which runs on
// the host network and cannot reach guest Service IPs. Each bridged target is dialed through
// a host ClusterIP Service that selects the cluster's worker virt-launcher pods and forwards
// to a fixed guest nodePort; the originals are restored when the bridge goes away.
package guestwebhookbridge

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/predicates"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/prologue"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
)

// controllerName names the controller, its ClusterCache source and its events.
const controllerName = "guestwebhookbridge"

// Reconciler reconciles GuestWebhookBridge objects.
type Reconciler struct {
	Client client.Client

	// APIReader reads from the host apiserver directly: a host Service of someone else's
	// where the bridge would create one (the manager's cache holds only guestnet's), and what
	// must not lag (the bridge's own records and Services when it is deleted, whether a guest
	// is gone, whether a bridge a record names exists). The manager's API reader when nil.
	APIReader client.Reader

	// ClusterCache gives access to the guest cluster through its <cluster>-kubeconfig Secret.
	ClusterCache clustercache.ClusterCache

	// WatchFilterValue, when set, limits the controller to objects (and Clusters) labelled
	// cluster.x-k8s.io/watch-filter=<value>.
	WatchFilterValue string

	// Probe checks a bridged target from the host network; bridge.Probe when nil (unit tests
	// replace it).
	Probe func(ctx context.Context, addr, serverName string, caBundle []byte, insecure bool) bridge.ProbeResult

	recorder   events.EventRecorder
	controller controller.Controller

	memoOnce sync.Once
	answers  *memo
}

// memo is what the reconciler remembers between reconciles (see memo).
func (r *Reconciler) memo() *memo {
	r.memoOnce.Do(func() { r.answers = newMemo() })
	return r.answers
}

// scope is what one reconcile of a GuestWebhookBridge works with.
type scope struct {
	bridge *guestnetv1.GuestWebhookBridge
	// cluster is the CAPI Cluster named by spec.clusterName; nil when it does not exist.
	cluster *clusterv1.Cluster
	// guestClient talks to the guest apiserver; set once ClusterAvailable is True.
	guestClient client.Client
	// observed is what the guest held when the plan was made.
	observed bridge.Observed
	// hostServices are the bridge's live host Services by name, after the host phase.
	hostServices map[string]*corev1.Service
	// keepHost (host Service names) and keepGuest ("<namespace>/<name>") are the bridge's
	// Services in use; the others are deleted at the end of the reconcile.
	keepHost, keepGuest map[string]bool
	// paused is true when CAPI pause applies: then only the Paused condition is written.
	paused bool
	// reliesOnEgress: mode Auto leaves webhooks alone because the guest apiserver reaches
	// their Services itself (konnectivity), which must be checked again soon.
	reliesOnEgress bool
	// patchHelper writes the bridge back at the end of the reconcile; original is the state
	// it compares with.
	patchHelper *patch.Helper
	original    *guestnetv1.GuestWebhookBridge
}

// recordsStored tells the deferred patch that status.records was stored as records already
// (writeHostRecords), so that it does not write them again.
func (s *scope) recordsStored(records []guestnetv1.BridgeRecord, c client.Client) error {
	s.original.Status.Records = records
	h, err := patch.NewHelper(s.original, c)
	if err != nil {
		return err
	}
	s.patchHelper = h
	return nil
}

// SetupWithManager registers the controller. Besides GuestWebhookBridge itself it watches
// Clusters (pause, provisioning, creation and deletion change what a bridge reports), their
// <cluster>-kubeconfig Secrets (a deleted one ends a deletion waiting for the guest), the
// ClusterCache's connect/disconnect events, the MachineDeployments (PortsDeclared), its host
// Services and their EndpointSlices (workers come and go), and, through the ClusterCache, the
// guest's APIServices, webhook configurations and Services (see watchGuest): a Helm revert
// is repaired at once, nothing waits for a resync.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.ClusterCache == nil {
		return errors.New("guestwebhookbridge: Client and ClusterCache must not be nil")
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if err := clusterscope.AddClusterNameIndex(ctx, mgr, &guestnetv1.GuestWebhookBridge{}); err != nil {
		return err
	}

	predicateLog := ctrl.LoggerFrom(ctx).WithValues("controller", controllerName)
	filter := predicates.ResourceHasFilterLabel(mgr.GetScheme(), predicateLog, r.WatchFilterValue)
	clusterToBridges := clusterscope.ClusterToObjects(mgr.GetClient(),
		func() client.ObjectList { return &guestnetv1.GuestWebhookBridgeList{} })
	machineDeploymentToBridges := clusterscope.MachineDeploymentToObjects(mgr.GetClient(),
		func() client.ObjectList { return &guestnetv1.GuestWebhookBridgeList{} })

	c, err := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		// A resync reconciles each bridge once, through For: the other watches pass only what
		// changed (clusterscope.Changed).
		// Paused objects are not filtered out: their Paused condition must still be reported.
		For(&guestnetv1.GuestWebhookBridge{}, builder.WithPredicates(filter)).
		Watches(&clusterv1.Cluster{},
			handler.EnqueueRequestsFromMapFunc(clusterToBridges),
			builder.WithPredicates(clusterscope.ClusterChanged(), filter),
		).
		// A rollout of the workers changes PortsDeclared.
		Watches(&clusterv1.MachineDeployment{}, handler.EnqueueRequestsFromMapFunc(machineDeploymentToBridges),
			builder.WithPredicates(filter, clusterscope.Changed)).
		WatchesRawSource(r.ClusterCache.GetClusterSource(controllerName, clusterToBridges)).
		// A deleted <cluster>-kubeconfig Secret means the guest is gone for good: a deletion
		// waiting for the guest gives up at once.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.kubeconfigSecretToBridges), builder.WithPredicates(clusterscope.Changed)).
		Owns(&corev1.Service{}, builder.WithPredicates(clusterscope.Changed)).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(r.endpointSliceToBridge), builder.WithPredicates(clusterscope.Changed)).
		WithOptions(options).
		Build(r)
	if err != nil {
		return err
	}
	r.controller = c
	r.recorder = mgr.GetEventRecorder(controllerName + "-controller")
	return nil
}

// clusterToBridges maps any event of a guest object of the Cluster key to the Cluster's bridges.
func (r *Reconciler) clusterToBridges(key client.ObjectKey) handler.MapFunc {
	return clusterscope.GuestToObjects(r.Client, key, func() client.ObjectList { return &guestnetv1.GuestWebhookBridgeList{} })
}

// guestServiceToBridges maps an event of a guest Service of the Cluster key to the Cluster's
// bridges whose plan it can change (bridge.ServiceMatters): in a guest with many Services,
// the others' changes would each replan every bridge.
func (r *Reconciler) guestServiceToBridges(key client.ObjectKey) handler.MapFunc {
	return r.guestObjectToBridges(key, func(o client.Object, gwb *guestnetv1.GuestWebhookBridge) bool {
		svc, ok := o.(*corev1.Service)
		return !ok || bridge.ServiceMatters(svc, gwb, r.memo().serviceKeysOf(gwb.UID))
	})
}

// guestTargetToBridges maps an event of a guest APIService or webhook configuration of the
// Cluster key to the Cluster's bridges whose plan it can change (bridge.TargetMatters): a
// bridge's revert is repaired without every other bridge of the guest replanning first.
func (r *Reconciler) guestTargetToBridges(key client.ObjectKey) handler.MapFunc {
	return r.guestObjectToBridges(key, bridge.TargetMatters)
}

// guestObjectToBridges maps an event of a guest object of the Cluster key to the Cluster's
// bridges for which matters says so.
func (r *Reconciler) guestObjectToBridges(key client.ObjectKey, matters func(client.Object, *guestnetv1.GuestWebhookBridge) bool) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		list := &guestnetv1.GuestWebhookBridgeList{}
		if err := clusterscope.ListOfCluster(ctx, r.Client, key, list, client.UnsafeDisableDeepCopy); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Failed to list the bridges of Cluster", "Cluster", key)
			return nil
		}
		var out []reconcile.Request
		for i := range list.Items {
			if gwb := &list.Items[i]; matters(o, gwb) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(gwb)})
			}
		}
		return out
	}
}

// kubeconfigSecretToBridges maps a <cluster>-kubeconfig Secret to the Cluster's bridges.
func (r *Reconciler) kubeconfigSecretToBridges(ctx context.Context, o client.Object) []reconcile.Request {
	cluster, ok := strings.CutSuffix(o.GetName(), "-kubeconfig")
	if !ok || o.GetLabels()[clusterv1.ClusterNameLabel] != cluster {
		return nil
	}
	return r.clusterToBridges(client.ObjectKey{Namespace: o.GetNamespace(), Name: cluster})(ctx, o)
}

// endpointSliceToBridge maps an EndpointSlice of a host Service of a bridge to the bridge.
func (r *Reconciler) endpointSliceToBridge(ctx context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[discoveryv1.LabelServiceName]
	if name == "" {
		return nil
	}
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: name}, svc); err != nil {
		return nil
	}
	ref := metav1.GetControllerOfNoCopy(svc)
	if ref == nil || ref.Kind != "GuestWebhookBridge" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: svc.Namespace, Name: ref.Name}}}
}

// Own objects: read them, write status, hold the finalizer until the originals are restored.
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestwebhookbridges,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestwebhookbridges/status,verbs=patch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestwebhookbridges/finalizers,verbs=update
// The CAPI Cluster named by spec.clusterName: pause, provisioning state.
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// The <cluster>-kubeconfig Secret the ClusterCache connects to the guest apiserver with.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// One host ClusterIP Service per bridged guest Service, selecting the worker virt-launcher pods; its DNS name is what the guest apiserver dials.
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete
// Its EndpointSlices: a bridge without ready endpoints cannot be reachable (probed again when they change).
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=list;watch
// PortsDeclared: the worker MachineDeployments and their templates are read (the
// workerports controller is the one that writes them).
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=kubevirtmachinetemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinedeployments,verbs=get;list;watch
// In the guest, guestnet acts with the identity of the <cluster>-kubeconfig Secret: it reads
// APIServices, webhook configurations, Services and konnectivity agent pods, patches the
// selected APIServices and webhook configurations (their service reference or url, and the
// record annotation), and creates its NodePort and ExternalName Services; no host RBAC is
// involved.
// Events on condition changes (controller-runtime's recorder writes events.k8s.io/v1 Events).
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one GuestWebhookBridge towards its spec and reports what it found in status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	bridge := &guestnetv1.GuestWebhookBridge{}
	reader := prologue.Reader{Client: r.Client, WatchFilterValue: r.WatchFilterValue}
	ctx, cluster, ok, err := reader.Get(ctx, req, bridge)
	if !ok || err != nil {
		return ctrl.Result{}, err
	}
	s := &scope{bridge: bridge, cluster: cluster, original: bridge.DeepCopy()}

	patchHelper, err := patch.NewHelper(bridge, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	s.patchHelper = patchHelper
	conditionsBefore := slices.Clone(bridge.Status.Conditions)
	defer func() {
		if err := r.patch(ctx, s.patchHelper, s, conditionsBefore, reterr == nil); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()

	if s.paused = prologue.Paused(ctx, bridge, cluster); s.paused {
		return ctrl.Result{}, nil
	}

	if !bridge.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}

	if !controllerutil.ContainsFinalizer(bridge, guestnetv1.GuestWebhookBridgeFinalizer) {
		if err := reader.StoreFinalizer(ctx, s.original, bridge, guestnetv1.GuestWebhookBridgeFinalizer); err != nil {
			return ctrl.Result{}, err
		}
		// The deferred patch compares with the bridge as stored now.
		if s.patchHelper, err = patch.NewHelper(s.original, r.Client); err != nil {
			return ctrl.Result{}, err
		}
	}

	return r.reconcileNormal(ctx, s)
}

// patch writes the GuestWebhookBridge back. Unless it is paused, Ready is summarised first and,
// after a reconcile without error, status.observedGeneration is stamped. Condition changes
// are recorded as events once they are stored.
func (r *Reconciler) patch(ctx context.Context, patchHelper *patch.Helper, s *scope, conditionsBefore []metav1.Condition, reconciled bool) error {
	opts := []patch.Option{patch.WithOwnedConditions{Conditions: ownedConditions}}
	if !s.paused {
		setReadyCondition(s.bridge)
		if reconciled {
			opts = append(opts, patch.WithStatusObservedGeneration{})
		}
	}
	if err := patchHelper.Patch(ctx, s.bridge, opts...); err != nil {
		return err
	}
	record.Conditions(ctx, r.recorder, s.bridge, conditionsBefore)
	return nil
}
