// Package manager holds the options of guestnet's controller-runtime manager and what it
// caches: the cache and client options and the guest connections (internal/guestcache: one
// client and cache per guest cluster, built from the <cluster>-kubeconfig Secret). It registers no controller: main.go
// does. The manager binary and the controller packages' lab tests (e2e/lab.StartManager)
// share it, so those tests cache what the binary caches.
package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestcache"
	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/kubeconfig"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// Name is the user agent of every client and the prefix of the leader election lease.
const Name = "guestnet-manager"

// Options are the settings of the manager (main.go sets them from its flags). Zero values are
// usable: every concurrency then is 1, the guest clients use CAPI's default QPS and
// burst, and nothing is resynced periodically.
type Options struct {
	// WatchNamespace limits the manager to one namespace; all namespaces when empty.
	WatchNamespace string
	// InEveryNamespace are kinds cached in every namespace even when WatchNamespace is set:
	// MetalLB's pools and advertisements, which live in MetalLB's namespace (a
	// GuestIngress's, and the platform's that admission checks against). Only kinds the host
	// serves: the cache asks the apiserver about each when it starts (AnnouncerKindsServed).
	InEveryNamespace []client.Object
	// WatchFilterValue limits the controllers to objects (and Clusters) labelled
	// cluster.x-k8s.io/watch-filter=<value>; all objects when empty.
	WatchFilterValue string
	// SyncPeriod is the minimum interval at which watched objects are reconciled again;
	// zero disables the periodic resync.
	SyncPeriod time.Duration

	GuestIngressConcurrency       int
	GuestWebhookBridgeConcurrency int
	GuestNodeIdentityConcurrency  int
	WorkerPortsConcurrency        int
	// NodeAgentImage is the image of guestnet's node agent in the guests; the manager's own
	// when empty (NodeAgentImage).
	NodeAgentImage string
	// TopologyVariablesConcurrency is the concurrency of the experimental topology
	// controller (exp/topology), registered only with the ClusterTopologyVariables gate.
	TopologyVariablesConcurrency int

	// ClusterCacheConcurrency is the number of guest clusters connected to and
	// health-checked simultaneously (internal/guestcache).
	ClusterCacheConcurrency int
	// ClusterCacheClientQPS and ClusterCacheClientBurst limit each guest apiserver's client.
	ClusterCacheClientQPS   float32
	ClusterCacheClientBurst int
}

// CacheOptions restricts what the manager caches: one namespace when WatchNamespace is set,
// no managed fields but guestnet's own (see KeepOwnManagedFields; on MachineDeployments also
// who owns the infrastructureRef, ports.KeepInfrastructureRefOwners), only the Secrets that
// belong to a Cluster (label cluster.x-k8s.io/cluster-name, as CAPI's own manager does) with
// their data dropped unless they are the <cluster>-kubeconfig Secrets the guest connections need,
// and only the Services and EndpointSlices guestnet created (label
// app.kubernetes.io/managed-by=guestnet, which the EndpointSlice controller copies from a
// Service to its slices): a host cluster has many of both, and OOMKills leave no logs. Of
// the Pods it caches only the worker virt-launcher pods (their pod IPs are the guest Nodes'
// InternalIPs, controllers/guestnodeidentity), and of those only what guestnet reads.
func (o Options) CacheOptions() ctrlcache.Options {
	var namespaces map[string]ctrlcache.Config
	if o.WatchNamespace != "" {
		namespaces = map[string]ctrlcache.Config{o.WatchNamespace: {}}
	}

	clusterSecrets, err := labels.NewRequirement(clusterv1.ClusterNameLabel, selection.Exists, nil)
	utilruntime.Must(err)
	ours := labels.SelectorFromSet(labels.Set{ownership.ManagedByLabel: ownership.ManagedByValue})

	opts := ctrlcache.Options{
		DefaultNamespaces: namespaces,
		SyncPeriod:        ptr.To(o.SyncPeriod),
		DefaultTransform:  KeepOwnManagedFields,
		ByObject: map[client.Object]ctrlcache.ByObject{
			&corev1.Secret{}: {
				Label:     labels.NewSelector().Add(*clusterSecrets),
				Transform: keepOnlyKubeconfigData,
			},
			&corev1.Service{}:            {Label: ours},
			&discoveryv1.EndpointSlice{}: {Label: ours},
			&corev1.Pod{}: {
				Label:     labels.SelectorFromSet(labels.Set{virtlauncher.KubeVirtLabel: virtlauncher.LauncherValue, virtlauncher.RoleLabel: virtlauncher.WorkerRole}),
				Transform: keepWorkerPodIdentity,
			},
			// Who set a MachineDeployment's template, to name a GitOps tool that reverts it.
			&clusterv1.MachineDeployment{}: {Transform: ports.KeepInfrastructureRefOwners},
		},
	}
	if o.WatchNamespace != "" {
		for _, obj := range o.InEveryNamespace {
			opts.ByObject[obj] = ctrlcache.ByObject{Namespaces: map[string]ctrlcache.Config{ctrlcache.AllNamespaces: {}}}
		}
	}
	return opts
}

// CacheOptionsFor is CacheOptions for the host restConfig talks to: a namespace-scoped
// manager also caches MetalLB's kinds in every namespace when the host serves them (they live
// in MetalLB's namespace). main and the lab's in-process managers both build their cache here.
func (o Options) CacheOptionsFor(restConfig *rest.Config) ctrlcache.Options {
	if o.WatchNamespace != "" {
		if httpClient, err := rest.HTTPClientFor(restConfig); err == nil {
			if mapper, err := apiutil.NewDynamicRESTMapper(restConfig, httpClient); err == nil {
				o.InEveryNamespace = AnnouncerKindsServed(mapper)
			}
		}
	}
	return o.CacheOptions()
}

// AnnouncerKindsServed are MetalLB's kinds guestnet caches (ingress.MetalLB*GVK) when the
// host apiserver serves them all, none otherwise: for Options.InEveryNamespace, looked up
// once at start (a namespace-scoped manager started before MetalLB was installed caches
// MetalLB's objects of its own namespace only: restart it).
func AnnouncerKindsServed(mapper meta.RESTMapper) []client.Object {
	var out []client.Object
	for _, gvk := range []schema.GroupVersionKind{ingress.MetalLBPoolGVK, ingress.MetalLBL2AdvertisementGVK, ingress.MetalLBBGPAdvertisementGVK} {
		if _, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return nil
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		out = append(out, u)
	}
	return out
}

// ClientOptions are the options of the manager's client.
func ClientOptions() client.Options {
	return client.Options{
		Cache: &client.CacheOptions{
			// Reads of Secrets and ConfigMaps go to the API server: caching every one of
			// them in the host cluster would cost memory, and OOMKills leave no logs.
			DisableFor: []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}},
			// The kinds guestnet has no Go types for (Cilium's pools and L2 policies,
			// KubevirtMachineTemplates) are read from the cache too: controller-runtime
			// reads unstructured objects live unless told, and every reconcile reads them.
			Unstructured: true,
		},
	}
}

// KeepOwnManagedFields is a cache transform that drops every managedFields entry but
// guestnet's own server-side apply entries (field manager ownership.FieldManager). Those are
// small, exist only on the objects guestnet applies, and tell guestnet what it owns, so it can
// skip an apply that would change nothing (internal/ssa.ServiceUpToDate).
func KeepOwnManagedFields(in any) (any, error) {
	obj, err := meta.Accessor(in)
	if err != nil {
		return in, nil //nolint:nilerr // not an object (e.g. a tombstone): nothing to strip
	}
	var keep []metav1.ManagedFieldsEntry
	for _, e := range obj.GetManagedFields() {
		if e.Manager == ownership.FieldManager {
			keep = append(keep, e)
		}
	}
	obj.SetManagedFields(keep)
	return in, nil
}

// keepWorkerPodIdentity is the cache transform of worker virt-launcher pods: their name,
// labels, phase and pod IPs, which node identity reads, and their node and readiness, which
// a Local GuestIngress's endpoints need; not the rest of their spec (containers, volumes:
// kilobytes per VM).
func keepWorkerPodIdentity(in any) (any, error) {
	p, ok := in.(*corev1.Pod)
	if !ok {
		return in, nil
	}
	return &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp, CreationTimestamp: p.CreationTimestamp,
		},
		// The host node and readiness: a host Service of externalTrafficPolicy Local gets its
		// endpoints from guestnet (ingress.LocalEndpoints), each on its pod's node.
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs, Conditions: readyCondition(p)},
	}, nil
}

// readyCondition is the pod's Ready condition alone (none when it has none).
func readyCondition(p *corev1.Pod) []corev1.PodCondition {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return nil
}

// NodeAgentImage is the image of guestnet's node agent: image when set, else the manager's
// own, read from its pod (environment POD_NAME and POD_NAMESPACE, which the release's
// Deployment sets from the downward API; the container named manager).
func NodeAgentImage(ctx context.Context, reader client.Reader, image string) (string, error) {
	if image != "" {
		return image, nil
	}
	name, namespace := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if name == "" || namespace == "" {
		return "", errors.New("--node-agent-image is not set and the manager does not know its own pod (POD_NAME, POD_NAMESPACE): set --node-agent-image to the manager's image")
	}
	pod := &corev1.Pod{}
	if err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pod); err != nil {
		return "", fmt.Errorf("reading the manager's own pod %s/%s for the node agent's image (or set --node-agent-image): %w", namespace, name, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "manager" {
			return c.Image, nil
		}
	}
	return "", fmt.Errorf("the manager's pod %s/%s has no container named manager: set --node-agent-image", namespace, name)
}

// keepOnlyKubeconfigData is a cache transform that drops the data of every cached Secret but
// the <cluster>-kubeconfig ones.
func keepOnlyKubeconfigData(in any) (any, error) {
	if s, ok := in.(*corev1.Secret); ok {
		s.SetManagedFields(nil)
		if !strings.HasSuffix(s.Name, "-"+string(secret.Kubeconfig)) {
			s.Data = nil
		}
	}
	return in, nil
}

// SetupClusterCache sets up guestnet's guest connections (internal/guestcache, which
// implements CAPI's ClusterCache interface) on mgr, whose options must come from
// CacheOptions and ClientOptions: they read the kubeconfig Secrets from the manager's cache,
// through guestnet's check (kubeconfig.SecretReader: a tenant can write them), and their
// "not connected" says why when the check refused the Secret (kubeconfig.ClusterCache).
func SetupClusterCache(ctx context.Context, mgr ctrl.Manager, o Options) (clustercache.ClusterCache, error) {
	// The manager's cache holds only the Cluster Secrets (see CacheOptions), and the Clusters.
	secrets := kubeconfig.SecretReader{Reader: mgr.GetCache()}
	guests, err := guestcache.SetupWithManager(ctx, mgr, guestcache.Options{
		SecretClient:     secrets,
		WatchFilterValue: o.WatchFilterValue,
		// Only what guestnet reads of each guest object (managedFields: it server-side
		// applies the guest ingress controller's Service). clusterscope.GuestClient caps how
		// many objects of a guest are cached at all (internal/guestbounds).
		Transform: KeepWhatGuestnetReads,
		// Never cache all Secrets and ConfigMaps of a guest cluster: only kube-system/cilium-config,
		// which guestnet reads on every reconcile (docs/decisions/0014-steady-state-reads.md).
		DisableFor:    []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}},
		SingleObjects: []client.Object{ports.CiliumConfig()},
		Bounds:        guestbounds.Default,
		UserAgent:     Name,
		QPS:           o.ClusterCacheClientQPS,
		Burst:         o.ClusterCacheClientBurst,
	}, Concurrency(o.ClusterCacheConcurrency))
	if err != nil {
		return nil, fmt.Errorf("setting up the guest connections: %w", err)
	}
	return kubeconfig.ClusterCache(guests, secrets), nil
}

// Concurrency returns the options of a controller that reconciles n objects at once.
func Concurrency(n int) controller.Options {
	return controller.Options{MaxConcurrentReconciles: n}
}
