// Package workerports keeps the ports every worker VM of a guest cluster must accept
// declared on the VMs' KubeVirt masquerade interface.
//
// With masquerade networking a VM whose interface lists ports receives only those ports;
// everything else stays in the virt-launcher pod, which refuses it (docs/runbook.md, "a port the VMs do not declare"). Ports are fixed when a
// VM is created, CAPK rejects in-place template edits, and CAPI rolls workers only when a
// MachineDeployment points at a template with a new name. So, per Cluster, this controller
// computes the required port set (internal/ports.ForCluster, plus 22/TCP for the templates
// whose VMs CAPK will SSH into: ports.ForWorkers) and, for every worker MachineDeployment
// whose template's ports list lacks some of it, creates a copy of its own
// for the Cluster, named after the content hash, that declares them and repoints the
// MachineDeployment: CAPI then rolls the workers with its own rollout strategy. What to do
// about each MachineDeployment is planned in internal/ports (ports.Plan), which the
// PortsDeclared conditions and diagnose report from: this controller only applies the plan.
// It does not fight other writers: a repoint someone else reverted is left as it is, and an
// object it did not write is never adopted (docs/worker-ports.md, Invariants).
//
// It is the only writer of worker templates and MachineDeployments in guestnet: GuestIngress
// and GuestWebhookBridge only read the result (their PortsDeclared condition), so they never
// race each other over a MachineDeployment. MachineDeployments that belong to a ClusterClass
// topology are never edited; the objects' PortsDeclared condition gives the topology variable
// value to set instead.
package workerports

import (
	"context"
	"errors"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/predicates"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/prologue"
)

const controllerName = "workerports"

// Reconciler declares the required worker ports of each Cluster that guestnet serves.
type Reconciler struct {
	Client client.Client

	// APIReader reads from the API server, not the cache: what decides a deletion must not
	// be stale.
	APIReader client.Reader

	// ClusterCache gives access to the guest cluster, where kube-system/cilium-config says
	// which tunnel port the guest's Cilium uses.
	ClusterCache clustercache.ClusterCache

	// WatchFilterValue, when set, limits the controller to Clusters labelled
	// cluster.x-k8s.io/watch-filter=<value>.
	WatchFilterValue string

	// CAPK says whether the host serves KubevirtMachineTemplates; they are watched once it
	// does (internal/optional). Taken to be installed when nil.
	CAPK *optional.Gate

	recorder   events.EventRecorder
	controller controller.Controller
}

// SetupWithManager registers the controller: it reconciles Clusters, and is woken by the
// guestnet objects that add requirements, by the cluster's MachineDeployments (a repoint by
// someone else is followed at once; a rollout finishing lets the next declaration through),
// by the KubevirtMachineTemplates they reference (a MachineDeployment pointed at a template
// created after it), by deleted MachineSets (the template of an old one can go) and by the
// guest's cilium-config.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.APIReader == nil || r.ClusterCache == nil {
		return errors.New("workerports: Client, APIReader and ClusterCache must not be nil")
	}
	log := ctrl.LoggerFrom(ctx).WithValues("controller", controllerName)
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		For(&clusterv1.Cluster{}, builder.WithPredicates(predicates.ResourceHasFilterLabel(mgr.GetScheme(), log, r.WatchFilterValue))).
		// A resync reconciles each Cluster once, through For: the other watches pass only
		// what changed (clusterscope.Changed).
		Watches(&guestnetv1.GuestIngress{}, handler.EnqueueRequestsFromMapFunc(objectToCluster), builder.WithPredicates(clusterscope.Changed)).
		Watches(&guestnetv1.GuestWebhookBridge{}, handler.EnqueueRequestsFromMapFunc(objectToCluster), builder.WithPredicates(clusterscope.Changed)).
		Watches(&guestnetv1.GuestNodeIdentity{}, handler.EnqueueRequestsFromMapFunc(objectToCluster), builder.WithPredicates(clusterscope.Changed)).
		Watches(&clusterv1.MachineDeployment{}, handler.EnqueueRequestsFromMapFunc(machineDeploymentToCluster), builder.WithPredicates(clusterscope.Changed)).
		// A deleted MachineSet may free the template it referenced. CAPI deletes the old one
		// after the rollout, often when the MachineDeployment no longer changes.
		Watches(machineSetMetadata(), handler.EnqueueRequestsFromMapFunc(machineSetToCluster),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})).
		WatchesRawSource(r.ClusterCache.GetClusterSource(controllerName, func(_ context.Context, o client.Object) []ctrl.Request {
			return []ctrl.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
		})).
		WithOptions(options).
		Build(r)
	if err != nil {
		return err
	}
	r.recorder = mgr.GetEventRecorder(controllerName + "-controller")
	r.controller = c
	// The templates, once CAPK is installed (metadata only: the templates themselves are read
	// when a Cluster is reconciled). Without CAPK no MachineDeployment can use one. And the
	// KubevirtClusters: whether CAPK SSHes into the VMs (22/TCP) is their managed-by
	// annotation, which may come after the Cluster's first reconcile.
	return r.CAPK.WhenInstalled(ctx, func(context.Context) error {
		if err := c.Watch(source.Kind(mgr.GetCache(), client.Object(templateMetadata()), handler.EnqueueRequestsFromMapFunc(r.templateToClusters), clusterscope.Changed)); err != nil {
			return err
		}
		return c.Watch(source.Kind(mgr.GetCache(), client.Object(kubevirtClusterMetadata()), handler.EnqueueRequestsFromMapFunc(r.infraClusterToClusters),
			predicate.Or[client.Object](predicate.AnnotationChangedPredicate{}, predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }})))
	})
}

func kubevirtClusterMetadata() *metav1.PartialObjectMetadata {
	kc := &metav1.PartialObjectMetadata{}
	kc.SetGroupVersionKind(ports.KubevirtClusterGVK)
	return kc
}

// infraClusterToClusters maps a KubevirtCluster to the Clusters of its namespace whose
// infrastructureRef names it.
func (r *Reconciler) infraClusterToClusters(ctx context.Context, o client.Object) []reconcile.Request {
	clusters := &clusterv1.ClusterList{}
	if err := r.Client.List(ctx, clusters, client.InNamespace(o.GetNamespace())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing the Clusters that may reference a KubevirtCluster", "KubevirtCluster", klog.KObj(o))
		return nil
	}
	var out []reconcile.Request
	for i := range clusters.Items {
		ref := clusters.Items[i].Spec.InfrastructureRef
		if ref.Kind == ports.KubevirtClusterGVK.Kind && ref.APIGroup == ports.KubevirtClusterGVK.Group && ref.Name == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&clusters.Items[i])})
		}
	}
	return out
}

// Worker templates are read, and copies that declare the ports are created; generated
// copies no MachineDeployment or MachineSet uses any more are deleted.
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=kubevirtmachinetemplates,verbs=get;list;watch;create;delete
// MachineDeployments are repointed at the new template, which makes CAPI roll the workers;
// MachineSets are read so a template an old MachineSet still uses is kept.
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinedeployments,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinesets,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=guestnet.addons.cluster.x-k8s.io,resources=guestingresses;guestwebhookbridges;guestnodeidentities,verbs=get;list;watch
// Whether CAPK SSHes into the VMs (then 22 is required): the KubevirtCluster's managed-by annotation
// (with each worker template's checkStrategy: ports.CAPKWillSSH).
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=kubevirtclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile declares the ports the workers of one Cluster need.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cluster, err := clusterscope.GetCluster(ctx, r.Client, req.Namespace, req.Name)
	if err != nil || cluster == nil {
		return ctrl.Result{}, err
	}
	if !prologue.InWatchFilter(cluster, r.WatchFilterValue) {
		// Another instance's Cluster (requests also come from MachineDeployments, templates
		// and guestnet objects).
		return ctrl.Result{}, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("Cluster", klog.KObj(cluster)))
	if clusterscope.IsPaused(cluster, cluster) || !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	s, err := r.newScope(ctx, cluster)
	if err != nil || s == nil {
		return ctrl.Result{}, err
	}
	if err := r.declarePorts(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.deleteUnusedTemplates(ctx, s)
}

// scope is what one reconcile of a Cluster works with.
type scope struct {
	cluster  *clusterv1.Cluster
	required ports.Set
	workers  []ports.Workers
}

// newScope computes the Cluster's required ports and reads its workers. It returns nil when
// there is nothing to do: no guestnet object and no extra-ports annotation (guestnet manages
// only the workers of clusters it serves), or no connection to the guest yet (the
// ClusterCache's connect event brings the Cluster back).
func (r *Reconciler) newScope(ctx context.Context, cluster *clusterv1.Cluster) (*scope, error) {
	consumers, err := ports.ListConsumers(ctx, r.Client, cluster)
	if err != nil {
		return nil, err
	}
	if _, annotated := cluster.Annotations[guestnetv1.ExtraWorkerPortsAnnotation]; consumers.Empty() && !annotated {
		return nil, nil
	}
	if !clusterscope.IsProvisioned(cluster) {
		return nil, nil
	}
	guest, err := r.ClusterCache.GetClient(ctx, client.ObjectKeyFromObject(cluster))
	if err != nil {
		if errors.Is(err, clustercache.ErrClusterNotConnected) {
			return nil, nil
		}
		return nil, err
	}
	// cilium-config comes from the guest's cache; a change of it brings the Cluster back.
	if key := client.ObjectKeyFromObject(cluster); r.controller != nil { // unit tests run without a controller
		toCluster := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []ctrl.Request {
			return []ctrl.Request{{NamespacedName: key}}
		})
		if err := ports.WatchCiliumConfig(ctx, r.ClusterCache, key, controllerName+"-cilium-config", r.controller, toCluster); err != nil {
			return nil, err
		}
	}
	required, _, err := ports.ForCluster(ctx, guest, cluster, consumers)
	if err != nil {
		r.recorder.Eventf(cluster, nil, corev1.EventTypeWarning, "WorkerPortsUnknown", "DeclarePorts", "Cannot compute the worker ports: %v", err)
		return nil, err
	}
	workers, err := ports.ListWorkers(ctx, r.Client, cluster, required)
	if err != nil {
		return nil, err
	}
	return &scope{cluster: cluster, required: required, workers: workers}, nil
}

func objectToCluster(_ context.Context, o client.Object) []reconcile.Request {
	if name := clusterscope.ClusterNameOf(o); name != "" {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
	}
	return nil
}

func templateMetadata() *metav1.PartialObjectMetadata {
	tmpl := &metav1.PartialObjectMetadata{}
	tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	return tmpl
}

// templateToClusters maps a KubevirtMachineTemplate to the Clusters whose MachineDeployments
// reference it.
func (r *Reconciler) templateToClusters(ctx context.Context, o client.Object) []reconcile.Request {
	mds := &clusterv1.MachineDeploymentList{}
	if err := r.Client.List(ctx, mds, client.InNamespace(o.GetNamespace())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing the MachineDeployments that may reference a KubevirtMachineTemplate", "KubevirtMachineTemplate", klog.KObj(o))
		return nil
	}
	var out []reconcile.Request
	for _, md := range mds.Items {
		ref := md.Spec.Template.Spec.InfrastructureRef
		if ref.Name != o.GetName() || ref.Kind != ports.KubevirtMachineTemplateGVK.Kind || md.Spec.ClusterName == "" {
			continue
		}
		req := reconcile.Request{NamespacedName: client.ObjectKey{Namespace: md.Namespace, Name: md.Spec.ClusterName}}
		if !slices.Contains(out, req) {
			out = append(out, req)
		}
	}
	return out
}

func machineSetMetadata() *metav1.PartialObjectMetadata {
	ms := &metav1.PartialObjectMetadata{}
	ms.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("MachineSet"))
	return ms
}

// machineSetToCluster maps a MachineSet to its Cluster (CAPI labels it with the name).
func machineSetToCluster(_ context.Context, o client.Object) []reconcile.Request {
	if name := o.GetLabels()[clusterv1.ClusterNameLabel]; name != "" {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
	}
	return nil
}

func machineDeploymentToCluster(_ context.Context, o client.Object) []reconcile.Request {
	if md, ok := o.(*clusterv1.MachineDeployment); ok && md.Spec.ClusterName != "" {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: md.Namespace, Name: md.Spec.ClusterName}}}
	}
	return nil
}
