// Command manager runs the guestnet controllers: the Cluster API add-on provider that gives
// nested KubeVirt guest clusters an ingress IP on the host network (GuestIngress) and makes
// their webhooks and aggregated APIs reachable from their control plane (GuestWebhookBridge).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	logsv1 "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/flags"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestingresspolicy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestnodeidentity"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestwebhookbridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/workerports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/exp/topology"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/diagnose"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/feature"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeagent"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

var setupLog = ctrl.Log.WithName("setup")

// options are the command-line flags; the names and defaults follow the Cluster API
// providers' own managers so that operators find what they know.
type options struct {
	logs    *logsv1.LoggingConfiguration
	manager flags.ManagerOptions // --diagnostics-address, --insecure-diagnostics, --tls-*

	leaderElect                 bool
	leaderElectionLeaseDuration time.Duration
	leaderElectionRenewDeadline time.Duration
	leaderElectionRetryPeriod   time.Duration

	healthAddr string
	// profilerAddress serves net/http/pprof without authentication (CAPI's managers have
	// the same flag); off unless set. The secure diagnostics endpoint serves pprof too.
	profilerAddress string

	kubeAPIQPS   float32
	kubeAPIBurst int

	// wiring: namespace, watch filter, sync period, concurrency and guest clients.
	wiring manager.Options
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

	fs.StringVar(&o.wiring.WatchNamespace, "namespace", "",
		"Namespace to watch for guestnet and Cluster API objects. If unset, all namespaces are watched.")
	fs.StringVar(&o.wiring.WatchFilterValue, "watch-filter", "",
		fmt.Sprintf("Reconcile only objects whose label %s has this value. If unset, all objects are reconciled.", clusterv1.WatchLabel))
	fs.DurationVar(&o.wiring.SyncPeriod, "sync-period", 10*time.Minute,
		"The minimum interval at which watched objects are reconciled again (e.g. 15m).")
	fs.StringVar(&o.healthAddr, "health-addr", ":9440",
		"The address the health and readiness probes (/healthz, /readyz) bind to.")

	fs.StringVar(&o.profilerAddress, "profiler-address", "",
		"Bind address to expose the pprof profiler without authentication (e.g. localhost:6060). Off when empty.")

	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", 100,
		"Maximum queries per second from the manager to the Kubernetes API server of the host cluster.")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 200,
		"Maximum burst of queries from the manager to the Kubernetes API server of the host cluster.")

	fs.IntVar(&o.wiring.GuestIngressConcurrency, "guestingress-concurrency", 10,
		"Number of GuestIngresses to reconcile simultaneously.")
	fs.IntVar(&o.wiring.GuestWebhookBridgeConcurrency, "guestwebhookbridge-concurrency", 10,
		"Number of GuestWebhookBridges to reconcile simultaneously.")
	fs.IntVar(&o.wiring.GuestNodeIdentityConcurrency, "guestnodeidentity-concurrency", 10,
		"Number of GuestNodeIdentities to reconcile simultaneously.")
	fs.IntVar(&o.wiring.WorkerPortsConcurrency, "workerports-concurrency", 10,
		"Number of Clusters whose worker port declarations are reconciled simultaneously.")
	fs.IntVar(&o.wiring.TopologyVariablesConcurrency, "topology-variables-concurrency", 10,
		"Number of Clusters whose guestnet topology variable is reconciled simultaneously (feature gate ClusterTopologyVariables).")

	fs.StringVar(&o.wiring.NodeAgentImage, "node-agent-image", "",
		"Image of guestnet's node agent in the guest clusters (GuestNodeIdentity). If unset, the manager's own image, read from its pod (POD_NAME, POD_NAMESPACE).")
	fs.IntVar(&guestbounds.Default.MaxObjects, "guest-max-objects", guestbounds.DefaultMaxObjects,
		"The most Services, and the most of each webhook configuration kind and APIServices, guestnet caches of one guest cluster. "+
			"A guest that holds more is not cached, and its GuestIngresses and GuestWebhookBridges report ClusterAvailable=False, reason GuestTooLarge. Negative: no cap.")
	fs.DurationVar(&guestbounds.Default.RecheckEvery, "guest-recount-period", guestbounds.DefaultRecheckEvery,
		"How often guestnet counts again the objects of a guest cluster that was within --guest-max-objects, from what its cache holds (no request); a guest over it is counted live every minute.")
	fs.IntVar(&o.wiring.ClusterCacheConcurrency, "clustercache-concurrency", 100,
		"Number of guest clusters guestnet connects to and health-checks simultaneously (the names are those of CAPI's ClusterCache flags).")
	fs.Float32Var(&o.wiring.ClusterCacheClientQPS, "clustercache-client-qps", 20,
		"Maximum queries per second from guestnet's clients to each guest cluster's API server.")
	fs.IntVar(&o.wiring.ClusterCacheClientBurst, "clustercache-client-burst", 30,
		"Maximum burst of queries from guestnet's clients to each guest cluster's API server.")
}

func main() {
	// `manager diagnose ...` runs the runbook's checks against one guest cluster, prints a
	// verdict per item and exits (internal/diagnose); the manager's flags do not apply.
	if len(os.Args) > 1 && os.Args[1] == "diagnose" {
		ctrl.SetLogger(klog.Background())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := diagnose.Run(ctx, os.Args[2:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}

	// `manager node-agent ...` is guestnet's agent inside a guest VM (internal/nodeagent),
	// run by the DaemonSet a GuestNodeIdentity applies into the guest.
	if len(os.Args) > 1 && os.Args[1] == "node-agent" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := nodeagent.Command(ctx, os.Args[2:], os.Stderr)
		stop()
		os.Exit(code)
	}

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
	restConfig.UserAgent = manager.Name

	mgr, err := newManager(restConfig, opts)
	if err != nil {
		return err
	}
	if err := setupChecks(mgr); err != nil {
		return err
	}
	clusterCache, err := manager.SetupClusterCache(ctx, mgr, opts.wiring)
	if err != nil {
		return err
	}
	// Optional APIs (Cilium LB-IPAM, CAPK): a missing one disables only what needs it.
	gates, err := manager.SetupGates(mgr)
	if err != nil {
		return err
	}
	if err := setupReconcilers(ctx, mgr, clusterCache, opts.wiring, gates); err != nil {
		return err
	}
	// guestnet's gauges, computed from the manager's cache on every scrape (internal/metrics);
	// its counters register themselves.
	if err := ctrlmetrics.Registry.Register(&metrics.Collector{Reader: mgr.GetCache(), Elected: mgr.Elected()}); err != nil {
		return fmt.Errorf("registering guestnet's metrics: %w", err)
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
		Scheme:                 scheme.New(),
		LeaderElection:         opts.leaderElect,
		LeaderElectionID:       manager.Name + "-leader-election-capi",
		LeaseDuration:          &opts.leaderElectionLeaseDuration,
		RenewDeadline:          &opts.leaderElectionRenewDeadline,
		RetryPeriod:            &opts.leaderElectionRetryPeriod,
		HealthProbeBindAddress: opts.healthAddr,
		PprofBindAddress:       opts.profilerAddress,
		Metrics:                *metricsOptions,
		Cache:                  opts.wiring.CacheOptionsFor(restConfig),
		Client:                 manager.ClientOptions(),
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	return mgr, nil
}

// setupReconcilers registers the guestnet controllers on mgr, and the experimental ones whose
// feature gates are enabled.
func setupReconcilers(ctx context.Context, mgr ctrl.Manager, clusterCache clustercache.ClusterCache, o manager.Options, gates manager.Gates) error {
	// The host's own addresses, which no GuestIngress gets: one cache for both controllers.
	hostAddresses, err := hostaddrs.NewWatcher(mgr)
	if err != nil {
		return fmt.Errorf("setting up the watch of the host's own addresses: %w", err)
	}
	if err := (&guestingress.Reconciler{
		Client:           mgr.GetClient(),
		HostAddresses:    hostAddresses,
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     clusterCache,
		WatchFilterValue: o.WatchFilterValue,
		WatchNamespace:   o.WatchNamespace,
		Cilium:           gates.Cilium,
		CiliumBGP:        gates.CiliumBGP,
		MetalLB:          gates.MetalLB,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.GuestIngressConcurrency)); err != nil {
		return fmt.Errorf("setting up GuestIngress controller: %w", err)
	}
	if err := (&guestwebhookbridge.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     clusterCache,
		WatchFilterValue: o.WatchFilterValue,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.GuestWebhookBridgeConcurrency)); err != nil {
		return fmt.Errorf("setting up GuestWebhookBridge controller: %w", err)
	}
	// Without it the Nodes' addresses are still written; the agent waits (NodeAgent says why).
	agentImage, agentImageErr := manager.NodeAgentImage(ctx, mgr.GetAPIReader(), o.NodeAgentImage)
	if agentImageErr != nil {
		setupLog.Error(agentImageErr, "The node agent's image is unknown: GuestNodeIdentities will not apply the agent")
	}
	if err := (&guestnodeidentity.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     clusterCache,
		WatchFilterValue: o.WatchFilterValue,
		AgentImage:       agentImage,
		AgentImageError:  agentImageErr,
		HostAddresses:    hostAddresses,
		Cilium:           gates.Cilium,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.GuestNodeIdentityConcurrency)); err != nil {
		return fmt.Errorf("setting up GuestNodeIdentity controller: %w", err)
	}
	if err := (&workerports.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     clusterCache,
		WatchFilterValue: o.WatchFilterValue,
		CAPK:             gates.CAPK,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.WorkerPortsConcurrency)); err != nil {
		return fmt.Errorf("setting up worker ports controller: %w", err)
	}
	// A manager limited to one namespace cannot count what a cluster-scoped policy admits: it
	// leaves the policies' status to one that sees every namespace.
	if o.WatchNamespace == "" {
		if err := (&guestingresspolicy.Reconciler{
			Client:           mgr.GetClient(),
			HostAddresses:    hostAddresses,
			WatchFilterValue: o.WatchFilterValue,
			Cilium:           gates.Cilium,
		}).SetupWithManager(ctx, mgr, manager.Concurrency(1)); err != nil {
			return fmt.Errorf("setting up GuestIngressPolicy controller: %w", err)
		}
	}
	if feature.Gates.Enabled(feature.ClusterTopologyVariables) {
		if err := (&topology.Reconciler{
			Client:           mgr.GetClient(),
			WatchFilterValue: o.WatchFilterValue,
		}).SetupWithManager(ctx, mgr, manager.Concurrency(o.TopologyVariablesConcurrency)); err != nil {
			return fmt.Errorf("setting up topology variables controller: %w", err)
		}
	}
	return nil
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
