// Package guestnodeidentity reconciles GuestNodeIdentity: it makes a Cluster's KubeVirt
// workers real nodes behind masquerade, with no SSH (docs/decisions/0011-node-identity.md).
// On the host side it is the cloud-node controller of the Cluster's guest Nodes: each Node's
// InternalIPs become its VM's virt-launcher pod IPs (read from the host pod, which only the
// host kubelet writes), then the node.cloudprovider.kubernetes.io/uninitialized taint goes;
// it follows the pod when the VM restarts with a new IP. In the guest it applies guestnet's
// agent (internal/nodeagent), which makes the node IP an address of every VM.
package guestnodeidentity

import (
	"context"
	"errors"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/predicates"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/prologue"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// controllerName names the controller, its ClusterCache source and its events.
const controllerName = "guestnodeidentity"

// Reconciler reconciles GuestNodeIdentity objects.
type Reconciler struct {
	Client client.Client

	// APIReader reads from the host apiserver directly (whether a guest is gone).
	APIReader client.Reader

	// ClusterCache gives access to the guest cluster through its <cluster>-kubeconfig Secret.
	ClusterCache clustercache.ClusterCache

	// WatchFilterValue, when set, limits the controller to objects (and Clusters) labelled
	// cluster.x-k8s.io/watch-filter=<value>.
	WatchFilterValue string

	// AgentImage is the image of guestnet's agent in the guest: the manager's own.
	// AgentImageError says why it is not known (then no agent is applied).
	AgentImage      string
	AgentImageError error

	// HostAddresses keeps the host's own addresses, which a control plane address never is
	// (shared with the GuestIngress controller; made here when nil).
	HostAddresses *hostaddrs.Watcher

	// Cilium says whether the host serves Cilium's pools and L2 policies: their watches
	// start once it does.
	Cilium *optional.Gate

	recorder   events.EventRecorder
	controller controller.Controller
	// written: when guestnet wrote which Node's addresses (the Cilium follow-up).
	written writtenNodes
}

// scope is what one reconcile of a GuestNodeIdentity works with.
type scope struct {
	gni *guestnetv1.GuestNodeIdentity
	// cluster is the CAPI Cluster named by spec.clusterName; nil when it does not exist.
	cluster *clusterv1.Cluster
	// guestClient talks to the guest apiserver (cached: Nodes, DaemonSets).
	guestClient client.Client
	// paused is true when CAPI pause applies: then only the Paused condition is written.
	paused bool
}

// SetupWithManager registers the controller. Besides GuestNodeIdentity it watches Clusters
// (pause, provisioning), the ClusterCache's connect events, the worker virt-launcher pods of
// the host (a VM restarted with a new pod IP) and, through the ClusterCache, the guest's
// Nodes and DaemonSets (see watchGuest).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.ClusterCache == nil {
		return errors.New("guestnodeidentity: Client and ClusterCache must not be nil")
	}
	if r.AgentImage == "" && r.AgentImageError == nil {
		r.AgentImageError = errors.New("the manager was started without --node-agent-image")
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if err := clusterscope.AddClusterNameIndex(ctx, mgr, &guestnetv1.GuestNodeIdentity{}); err != nil {
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
	clusterToObjects := clusterscope.ClusterToObjects(mgr.GetClient(),
		func() client.ObjectList { return &guestnetv1.GuestNodeIdentityList{} })

	c, err := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		// A resync reconciles each GuestNodeIdentity once, through For: the other watches
		// pass only what changed (clusterscope.Changed).
		For(&guestnetv1.GuestNodeIdentity{}, builder.WithPredicates(filter)).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(clusterToObjects),
			builder.WithPredicates(clusterscope.ClusterChanged(), filter)).
		WatchesRawSource(r.ClusterCache.GetClusterSource(controllerName, clusterToObjects)).
		// The manager's cache holds only worker virt-launcher pods (internal/manager).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.workerPodToObjects), builder.WithPredicates(clusterscope.Changed)).
		// Admission of the control plane addresses: the policies, the namespaces' labels and
		// the host's own addresses.
		Watches(&guestnetv1.GuestIngressPolicy{}, handler.EnqueueRequestsFromMapFunc(r.withControlPlane), builder.WithPredicates(clusterscope.Changed)).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.withControlPlane),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WatchesRawSource(r.HostAddresses.Source(handler.EnqueueRequestsFromMapFunc(r.withControlPlane))).
		WithOptions(options).
		Build(r)
	if err != nil {
		return err
	}
	r.controller = c
	r.recorder = mgr.GetEventRecorder(controllerName + "-controller")
	if r.Cilium == nil {
		return nil
	}
	// The control plane's pool (Cilium's PoolConflict) and L2 policy (repaired when changed
	// or deleted by someone else), once Cilium is installed.
	return r.Cilium.WhenInstalled(ctx, func(context.Context) error {
		for _, obj := range []client.Object{ingress.NewPool(), ingress.NewL2Policy()} {
			if err := c.Watch(source.Kind(mgr.GetCache(), obj, handler.EnqueueRequestsFromMapFunc(controlPlaneObjectToObject), clusterscope.Changed)); err != nil {
				return err
			}
		}
		return nil
	})
}

// withControlPlane maps any event to every GuestNodeIdentity with spec.controlPlane (few: one
// per Cluster that asks for a control plane address).
func (r *Reconciler) withControlPlane(ctx context.Context, o client.Object) []reconcile.Request {
	var opts []client.ListOption
	if ns, ok := o.(*corev1.Namespace); ok {
		opts = append(opts, client.InNamespace(ns.Name)) // a namespace's labels concern its own
	}
	list := &guestnetv1.GuestNodeIdentityList{}
	if err := r.Client.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list GuestNodeIdentities")
		return nil
	}
	var requests []reconcile.Request
	for i := range list.Items {
		gni := &list.Items[i]
		if gni.Spec.ControlPlane == nil {
			continue
		}
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(gni)})
	}
	return requests
}

// controlPlaneObjectToObject maps a pool or L2 policy guestnet made for a control plane
// address to its GuestNodeIdentity.
func controlPlaneObjectToObject(_ context.Context, o client.Object) []reconcile.Request {
	ns, name, ok := strings.Cut(o.GetAnnotations()[ownership.NodeIdentityAnnotation], "/")
	if !ok || o.GetLabels()[ownership.ManagedByLabel] != ownership.ManagedByValue {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}}
}

// clusterToObjects maps any event of a guest object of the Cluster key to its
// GuestNodeIdentities.
func (r *Reconciler) clusterToObjects(key client.ObjectKey) handler.MapFunc {
	toObjects := clusterscope.ClusterToObjects(r.Client, func() client.ObjectList { return &guestnetv1.GuestNodeIdentityList{} })
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	return func(ctx context.Context, _ client.Object) []reconcile.Request { return toObjects(ctx, cluster) }
}

// workerPodToObjects maps a worker virt-launcher pod to its Cluster's GuestNodeIdentities:
// the pod's namespace must be the one CAPK's label names (decision 0010).
func (r *Reconciler) workerPodToObjects(ctx context.Context, o client.Object) []reconcile.Request {
	labels := o.GetLabels()
	cluster := labels[virtlauncher.ClusterNameLabel]
	if cluster == "" || labels[virtlauncher.MachineNamespaceLabel] != o.GetNamespace() {
		return nil
	}
	return r.clusterToObjects(client.ObjectKey{Namespace: o.GetNamespace(), Name: cluster})(ctx, o)
}

// Own objects: read them, write status, hold the finalizer until the agent is out of the guest.
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestnodeidentities,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestnodeidentities/status,verbs=patch
// The CAPI Cluster named by spec.clusterName: pause, provisioning state, control plane endpoint.
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// The worker virt-launcher pods: their status.podIPs are the Nodes' InternalIPs.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// The control plane address (spec.controlPlane): admission reads the policies, the
// namespaces and the host's addresses (internal/hostaddrs); guestnet applies a pool and an L2
// policy, and its lbipam.cilium.io/ips annotation on the control plane's Service (read live).
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresspolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;patch
// +kubebuilder:rbac:groups=cilium.io,resources=ciliumloadbalancerippools;ciliuml2announcementpolicies,verbs=get;list;watch;create;patch;delete
// In the guest, guestnet acts with the identity of the <cluster>-kubeconfig Secret: it reads
// Nodes and patches their status.addresses and taints, and applies its agent (a namespace, a
// ServiceAccount, a ClusterRole and its binding, a DaemonSet); no host RBAC is involved.
// Events on condition changes and writes.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one GuestNodeIdentity towards its spec and reports what it found in status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	gni := &guestnetv1.GuestNodeIdentity{}
	reader := prologue.Reader{Client: r.Client, WatchFilterValue: r.WatchFilterValue}
	ctx, cluster, ok, err := reader.Get(ctx, req, gni)
	if !ok || err != nil {
		return ctrl.Result{}, err
	}
	s := &scope{gni: gni, cluster: cluster}
	original := gni.DeepCopy()
	patchHelper, err := patch.NewHelper(gni, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	conditionsBefore := slices.Clone(gni.Status.Conditions)
	defer func() {
		if err := r.patch(ctx, patchHelper, s, conditionsBefore, reterr == nil); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()

	if s.paused = prologue.Paused(ctx, gni, cluster); s.paused {
		// Paused: no new change, but a control plane address no policy admits any more is
		// still taken off (held within admitted, as for a GuestIngress).
		_, err := r.reconcileControlPlane(ctx, s)
		return ctrl.Result{}, err
	}
	if !gni.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}
	if !controllerutil.ContainsFinalizer(gni, guestnetv1.GuestNodeIdentityFinalizer) {
		if err := reader.StoreFinalizer(ctx, original, gni, guestnetv1.GuestNodeIdentityFinalizer); err != nil {
			return ctrl.Result{}, err
		}
		if patchHelper, err = patch.NewHelper(original, r.Client); err != nil {
			return ctrl.Result{}, err
		}
	}
	return r.reconcileNormal(ctx, s)
}

// patch writes the GuestNodeIdentity back: Ready summarised first unless paused, and
// status.observedGeneration after a reconcile without error; condition changes become events.
func (r *Reconciler) patch(ctx context.Context, patchHelper *patch.Helper, s *scope, conditionsBefore []metav1.Condition, reconciled bool) error {
	opts := []patch.Option{patch.WithOwnedConditions{Conditions: ownedConditions}}
	if !s.paused {
		setReadyCondition(s.gni)
		if reconciled {
			opts = append(opts, patch.WithStatusObservedGeneration{})
		}
	}
	if err := patchHelper.Patch(ctx, s.gni, opts...); err != nil {
		return err
	}
	record.Conditions(ctx, r.recorder, s.gni, conditionsBefore)
	return nil
}

// guestAgentDaemonSet is the key of the agent's DaemonSet in the guest.
var guestAgentDaemonSet = client.ObjectKey{Namespace: agentNamespace, Name: agentName}

// isAgentDaemonSet keeps the guest DaemonSet watch to the agent's own.
func isAgentDaemonSet(o client.Object) bool {
	_, ok := o.(*appsv1.DaemonSet)
	return ok && client.ObjectKeyFromObject(o) == guestAgentDaemonSet
}

// nodeChanged keeps the guest Node watch to what the decisions read (the kubelet's status
// updates change conditions every few minutes; nothing guestnet reads).
func nodeChanged(oldObj, newObj client.Object) bool {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return o.Spec.ProviderID != n.Spec.ProviderID || !slices.Equal(o.Status.Addresses, n.Status.Addresses) ||
		!slices.EqualFunc(o.Spec.Taints, n.Spec.Taints, func(a, b corev1.Taint) bool { return a.Key == b.Key && a.Effect == b.Effect }) ||
		strings.Join(managers(o), ",") != strings.Join(managers(n), ",")
}

func managers(n *corev1.Node) []string {
	out := make([]string, 0, len(n.ManagedFields))
	for _, e := range n.ManagedFields {
		out = append(out, e.Manager)
	}
	return out
}
