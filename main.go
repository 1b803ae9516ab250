// Command manager runs the guestnet controllers: the Cluster API add-on provider that gives
// nested KubeVirt guest clusters an ingress IP on the host network (GuestIngress) and makes
// their webhooks and aggregated APIs reachable from their control plane (GuestWebhookBridge).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	logsv1 "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/flags"
	"sigs.k8s.io/cluster-api/util/secret"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestwebhookbridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/feature"
)

// managerName is the user agent of every client and the prefix of the leader election lease.
const managerName = "guestnet-manager"

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(clusterv1.AddToScheme(scheme))
	utilruntime.Must(guestnetv1.AddToScheme(scheme))
}

// options are the command-line flags; the names and defaults follow the Cluster API
// providers' own managers so that operators find what they know.
type options struct {
	logs    *logsv1.LoggingConfiguration
	manager flags.ManagerOptions // --diagnostics-address, --insecure-diagnostics, --tls-*

	leaderElect                 bool
	leaderElectionLeaseDuration time.Duration
	leaderElectionRenewDeadline time.Duration
	leaderElectionRetryPeriod   time.Duration

	watchNamespace   string
	watchFilterValue string
	syncPeriod       time.Duration
	healthAddr       string

	kubeAPIQPS   float32
	kubeAPIBurst int

	guestIngressConcurrency       int
	guestWebhookBridgeConcurrency int

	clusterCacheConcurrency int
	clusterCacheClientQPS   float32
	clusterCacheClientBurst int
}

// addFlags registers every flag of the manager on fs.
func addFlags(fs *pflag.FlagSet, o *options) {
	o.logs = logs.NewOptions()
	logsv1.AddFlags(o.logs, fs)
	flags.AddManagerOptions(fs, &o.manager)
	feature.MutableGates.AddFlag(fs)

	fs.BoolVar(&o.leaderElect, "leader-elect", false,
		"Enable leader election, so that only one replica of the manager is active at a time.")
	fs.DurationVar(&o.leaderElectionLeaseDuration, "leader-elect-lease-duration", 15*time.Second,
		"How long non-leader candidates wait before they force-acquire leadership.")
	fs.DurationVar(&o.leaderElectionRenewDeadline, "leader-elect-renew-deadline", 10*time.Second,
		"How long the leader retries refreshing leadership before giving it up.")
	fs.DurationVar(&o.leaderElectionRetryPeriod, "leader-elect-retry-period", 2*time.Second,
		"How long the leader election clients wait between tries.")

	fs.StringVar(&o.watchNamespace, "namespace", "",
		"Namespace to watch for guestnet and Cluster API objects. If unset, all namespaces are watched.")
	fs.StringVar(&o.watchFilterValue, "watch-filter", "",
		fmt.Sprintf("Reconcile only objects whose label %s has this value. If unset, all objects are reconciled.", clusterv1.WatchLabel))
	fs.DurationVar(&o.syncPeriod, "sync-period", 10*time.Minute,
		"The minimum interval at which watched objects are reconciled again (e.g. 15m).")
	fs.StringVar(&o.healthAddr, "health-addr", ":9440",
		"The address the health and readiness probes (/healthz, /readyz) bind to.")

	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", 100,
		"Maximum queries per second from the manager to the Kubernetes API server of the host cluster.")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 200,
		"Maximum burst of queries from the manager to the Kubernetes API server of the host cluster.")

	fs.IntVar(&o.guestIngressConcurrency, "guestingress-concurrency", 10,
		"Number of GuestIngresses to reconcile simultaneously.")
	fs.IntVar(&o.guestWebhookBridgeConcurrency, "guestwebhookbridge-concurrency", 10,
		"Number of GuestWebhookBridges to reconcile simultaneously.")

	fs.IntVar(&o.clusterCacheConcurrency, "clustercache-concurrency", 100,
		"Number of clusters the ClusterCache connects to and health-checks simultaneously.")
	fs.Float32Var(&o.clusterCacheClientQPS, "clustercache-client-qps", 20,
		"Maximum queries per second from the ClusterCache clients to each guest cluster's API server.")
	fs.IntVar(&o.clusterCacheClientBurst, "clustercache-client-burst", 30,
		"Maximum burst of queries from the ClusterCache clients to each guest cluster's API server.")
}

func main() {
	opts := &options{}
	addFlags(pflag.CommandLine, opts)
	pflag.CommandLine.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	pflag.CommandLine.AddGoFlagSet(flag.CommandLine)
	pflag.Parse()

	if err := logsv1.ValidateAndApply(opts.logs, nil); err != nil {
		fmt.Fprintf(os.Stderr, "invalid logging flags: %v\n", err)
		os.Exit(1)
	}
	ctrl.SetLogger(klog.Background())
	pflag.CommandLine.VisitAll(func(f *pflag.Flag) {
		setupLog.V(1).Info("Flag", "name", f.Name, "value", f.Value.String())
	})

	if err := run(ctrl.SetupSignalHandler(), opts); err != nil {
		setupLog.Error(err, "Manager failed")
		os.Exit(1)
	}
}

// run builds the manager, registers everything on it and runs it until ctx is done.
func run(ctx context.Context, opts *options) error {
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	restConfig.QPS = opts.kubeAPIQPS
	restConfig.Burst = opts.kubeAPIBurst
	restConfig.UserAgent = managerName

	mgr, err := newManager(restConfig, opts)
	if err != nil {
		return err
	}
	if err := setupChecks(mgr); err != nil {
		return err
	}
	clusterCache, err := setupClusterCache(ctx, mgr, opts)
	if err != nil {
		return err
	}
	if err := setupReconcilers(ctx, mgr, clusterCache, opts); err != nil {
		return err
	}

	setupLog.Info("Starting manager")
	return mgr.Start(ctx)
}

// newManager creates the controller-runtime manager: scheme, cache, leader election,
// metrics (diagnostics) and probe endpoints.
func newManager(restConfig *rest.Config, opts *options) (ctrl.Manager, error) {
	_, metricsOptions, err := flags.GetManagerOptions(opts.manager)
	if err != nil {
		return nil, fmt.Errorf("invalid diagnostics or TLS flags: %w", err)
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 scheme,
		LeaderElection:         opts.leaderElect,
		LeaderElectionID:       managerName + "-leader-election-capi",
		LeaseDuration:          &opts.leaderElectionLeaseDuration,
		RenewDeadline:          &opts.leaderElectionRenewDeadline,
		RetryPeriod:            &opts.leaderElectionRetryPeriod,
		HealthProbeBindAddress: opts.healthAddr,
		Metrics:                *metricsOptions,
		Cache:                  cacheOptions(opts),
		Client: client.Options{
			Cache: &client.CacheOptions{
				// Reads of Secrets and ConfigMaps go to the API server: caching every one of
				// them in the host cluster would cost memory, and OOMKills leave no logs.
				DisableFor: []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}},
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	return mgr, nil
}

// cacheOptions restricts what the manager caches: one namespace when --namespace is set,
// no managed fields, and only the Secrets that belong to a Cluster (label
// cluster.x-k8s.io/cluster-name, as CAPI's own manager does) with their data dropped unless
// they are the <cluster>-kubeconfig Secrets the ClusterCache needs.
func cacheOptions(opts *options) ctrlcache.Options {
	var namespaces map[string]ctrlcache.Config
	if opts.watchNamespace != "" {
		namespaces = map[string]ctrlcache.Config{opts.watchNamespace: {}}
	}

	clusterSecrets, err := labels.NewRequirement(clusterv1.ClusterNameLabel, selection.Exists, nil)
	utilruntime.Must(err)

	return ctrlcache.Options{
		DefaultNamespaces: namespaces,
		SyncPeriod:        &opts.syncPeriod,
		DefaultTransform:  ctrlcache.TransformStripManagedFields(),
		ByObject: map[client.Object]ctrlcache.ByObject{
			&corev1.Secret{}: {
				Label:     labels.NewSelector().Add(*clusterSecrets),
				Transform: keepOnlyKubeconfigData,
			},
		},
	}
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

// setupChecks registers the liveness and readiness probes served on --health-addr.
func setupChecks(mgr ctrl.Manager) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}
	return nil
}

// setupClusterCache sets up CAPI's ClusterCache: one client and cache per guest cluster,
// built from the <cluster>-kubeconfig Secret and health-checked.
func setupClusterCache(ctx context.Context, mgr ctrl.Manager, opts *options) (clustercache.ClusterCache, error) {
	clusterCache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		// The manager's cache holds only the Cluster Secrets (see cacheOptions).
		SecretClient:     mgr.GetCache(),
		WatchFilterValue: opts.watchFilterValue,
		Cache: clustercache.CacheOptions{
			DefaultTransform: ctrlcache.TransformStripManagedFields(),
		},
		Client: clustercache.ClientOptions{
			QPS:       opts.clusterCacheClientQPS,
			Burst:     opts.clusterCacheClientBurst,
			UserAgent: managerName,
			Cache: clustercache.ClientCacheOptions{
				// Never cache all Secrets and ConfigMaps of a guest cluster.
				DisableFor: []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}},
			},
		},
	}, concurrency(opts.clusterCacheConcurrency))
	if err != nil {
		return nil, fmt.Errorf("setting up ClusterCache: %w", err)
	}
	return clusterCache, nil
}

// setupReconcilers registers the guestnet controllers.
func setupReconcilers(ctx context.Context, mgr ctrl.Manager, clusterCache clustercache.ClusterCache, opts *options) error {
	if err := (&guestingress.Reconciler{
		Client:           mgr.GetClient(),
		ClusterCache:     clusterCache,
		WatchFilterValue: opts.watchFilterValue,
	}).SetupWithManager(ctx, mgr, concurrency(opts.guestIngressConcurrency)); err != nil {
		return fmt.Errorf("setting up GuestIngress controller: %w", err)
	}
	if err := (&guestwebhookbridge.Reconciler{
		Client:           mgr.GetClient(),
		ClusterCache:     clusterCache,
		WatchFilterValue: opts.watchFilterValue,
	}).SetupWithManager(ctx, mgr, concurrency(opts.guestWebhookBridgeConcurrency)); err != nil {
		return fmt.Errorf("setting up GuestWebhookBridge controller: %w", err)
	}
	return nil
}

func concurrency(n int) controller.Options {
	return controller.Options{MaxConcurrentReconciles: n}
}
