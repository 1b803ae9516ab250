// Package guestcache is guestnet's access to the guest apiserver of each Cluster: a cached
// client, a live client and the watches guestnet's controllers add, per guest; a health probe
// that drops a connection which stopped answering and connects anew; and the events that
// bring a controller's objects back when their guest connects or goes away. It implements
// Cluster API's clustercache.ClusterCache interface, with the same behaviour for guestnet's
// controllers (connect once the Cluster's infrastructure is provisioned, retry a failed
// connect after an interval, probe `/` every 10 s, drop after 5 failures or at once on
// Unauthorized, watches that live as long as the connection), at a fraction of its memory
// per guest: no discovery when connecting (guestMapper), one HTTP/2 connection per guest
// where CAPI's opens two, no compressed watch streams, and one listener per informer however
// many controllers watch its kind (sharedInformer). Each guest's cache starts the first
// informer of a kind guestbounds caps only after a live count of it, and says what its
// informers hold, so that a connected guest is recounted without a request; it caches single
// objects of otherwise uncached kinds (cilium-config) by a watch of that one object.
// docs/decisions/0013-guest-connections.md says why guestnet does not use CAPI's, and
// 0014-steady-state-reads.md why the counts and cilium-config come from the cache.
package guestcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/predicates"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
)

// Options configure the guest connections.
type Options struct {
	// SecretClient reads the <cluster>-kubeconfig Secrets (kubeconfig.SecretReader: only
	// what guestnet checked).
	SecretClient client.Reader
	// WatchFilterValue limits the Clusters connected to to those with this watch filter label.
	WatchFilterValue string
	// Transform is applied to every object a guest's cache stores.
	Transform toolscache.TransformFunc
	// DisableFor are the kinds the cached client reads live, never cached.
	DisableFor []client.Object
	// SingleObjects are objects, of kinds in DisableFor, that the cached client reads from a
	// cache of that one object (a watch field-selected on its name, in its namespace),
	// at most one per kind; every other object of their kinds is read live.
	SingleObjects []client.Object
	// Bounds caps what a guest's cache holds of the kinds it counts: the first informer of
	// such a kind starts after a live count of it, and the cached client counts what its
	// informers hold (guestbounds.Cached). None when nil.
	Bounds *guestbounds.Bounds
	// UserAgent, QPS and Burst of each guest's clients (QPS 20 and Burst 30 when 0).
	UserAgent string
	QPS       float32
	Burst     int
	// Timeout of each request but the caches' lists and watches (10 s when 0).
	Timeout time.Duration
}

// Defaults of what CAPI's ClusterCache fixes too (sigs.k8s.io/cluster-api v1.14.2,
// controllers/clustercache: buildClusterAccessorConfig).
const (
	defaultConnectRetryInterval = 30 * time.Second
	healthProbeInterval         = 10 * time.Second
	healthProbeTimeout          = 5 * time.Second
	healthProbeFailureThreshold = 5
	initialSyncTimeout          = 5 * time.Minute
	// listWatchTimeout bounds a cache's list without cutting its watches short: client-go
	// ends a watch after 5 to 10 minutes (reflector's minWatchTimeout).
	listWatchTimeout = 11 * time.Minute
	// requeueAfterError is when a Cluster that could not be read is tried again.
	requeueAfterError = 10 * time.Second
)

// healthProbeConfig is how a connected guest is probed: every Interval, each probe given
// Timeout, the connection dropped after FailureThreshold failures in a row. Production uses
// defaultHealthProbe, CAPI's values; the package's tests shorten them.
type healthProbeConfig struct {
	Interval         time.Duration
	Timeout          time.Duration
	FailureThreshold int
}

var defaultHealthProbe = healthProbeConfig{
	Interval:         healthProbeInterval,
	Timeout:          healthProbeTimeout,
	FailureThreshold: healthProbeFailureThreshold,
}

// Cache holds the connection to the guest apiserver of each provisioned Cluster.
type Cache struct {
	clusters client.Reader
	scheme   *runtime.Scheme
	opts     Options

	// ctx is the lifetime of every guest's cache (Shutdown ends it).
	ctx    context.Context
	cancel context.CancelFunc

	healthProbe healthProbeConfig

	mu            sync.Mutex
	guests        map[client.ObjectKey]*guest
	retryInterval time.Duration

	sourcesMu sync.Mutex
	sources   []chan event.GenericEvent
}

var _ clustercache.ClusterCache = &Cache{}

// SetupWithManager creates the Cache and the controller that connects to the guest of each
// Cluster, probes it and disconnects when the Cluster goes.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts Options, controllerOpts controller.Options) (*Cache, error) {
	if opts.SecretClient == nil || opts.UserAgent == "" {
		return nil, errors.New("guestcache: SecretClient and UserAgent must be set")
	}
	c := newCache(mgr.GetClient(), mgr.GetScheme(), opts)
	err := ctrl.NewControllerManagedBy(mgr).
		Named("guestcache").
		For(&clusterv1.Cluster{}).
		WithOptions(controllerOpts).
		WithEventFilter(predicates.ResourceHasFilterLabel(mgr.GetScheme(), ctrl.LoggerFrom(ctx), opts.WatchFilterValue)).
		Complete(c)
	if err != nil {
		c.Shutdown()
		return nil, fmt.Errorf("setting up the guest connections' controller: %w", err)
	}
	return c, nil
}

// newCache returns a Cache that reads the Clusters from clusters, with the defaults of opts
// filled in, that no controller reconciles yet.
func newCache(clusters client.Reader, scheme *runtime.Scheme, opts Options) *Cache {
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.QPS == 0 {
		opts.QPS = 20
	}
	if opts.Burst == 0 {
		opts.Burst = 30
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Cache{
		clusters: clusters, scheme: scheme, opts: opts,
		ctx: ctx, cancel: cancel,
		healthProbe: defaultHealthProbe,
		guests:      map[client.ObjectKey]*guest{}, retryInterval: defaultConnectRetryInterval,
	}
}

// Reconcile connects to the Cluster's guest once its infrastructure is provisioned (not
// sooner than the retry interval after a failed try, or after a disconnect for unanswered
// probes), probes a connected guest every
// health probe interval, drops its connection after the failure threshold of failed probes
// in a row or one Unauthorized answer (a rotated kubeconfig: it connects again at once),
// and drops it when the Cluster is gone. Each connect and disconnect is an event for every
// controller's GetClusterSource.
func (c *Cache) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	cluster := &clusterv1.Cluster{}
	if err := c.clusters.Get(ctx, req.NamespacedName, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			c.forget(ctx, req.NamespacedName)
			return reconcile.Result{}, nil
		}
		log.Error(err, "Reading the Cluster")
		return reconcile.Result{RequeueAfter: requeueAfterError}, nil
	}
	g := c.guestFor(req.NamespacedName)
	if !clusterscope.IsProvisioned(cluster) {
		return reconcile.Result{}, nil // the Cluster's update brings it back
	}

	now := time.Now()
	if !g.connected() {
		if wait := g.lastConnectFailure().Add(c.connectRetryInterval()).Sub(now); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		if err := g.connect(ctx, c); err != nil {
			log.Error(err, "Connect failed")
			if g.state().ConsecutiveFailures == 1 {
				c.send(ctx, cluster) // the objects that waited for the first try (Tried) report it
			}
			return reconcile.Result{RequeueAfter: c.connectRetryInterval()}, nil
		}
		log.Info("Connected")
		c.send(ctx, cluster)
		return reconcile.Result{RequeueAfter: c.healthProbe.Interval}, nil
	}

	if wait := g.state().LastProbeTime.Add(c.healthProbe.Interval).Sub(now); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	switch err := g.probe(ctx, c.healthProbe.Timeout); {
	case err == nil:
		return reconcile.Result{RequeueAfter: c.healthProbe.Interval}, nil
	case apierrors.IsUnauthorized(err):
		log.Info("Disconnected: the guest apiserver no longer accepts the credentials", "error", err.Error())
		g.disconnect()
		c.send(ctx, cluster)
		return reconcile.Result{RequeueAfter: time.Millisecond}, nil
	case g.state().ConsecutiveFailures >= c.healthProbe.FailureThreshold:
		log.Info("Disconnected: the guest apiserver did not answer the health probe", "failures", c.healthProbe.FailureThreshold, "error", err.Error())
		g.disconnectUnanswered()
		c.send(ctx, cluster)
		return reconcile.Result{RequeueAfter: c.connectRetryInterval()}, nil
	default:
		return reconcile.Result{RequeueAfter: c.healthProbe.Interval}, nil
	}
}

// forget disconnects from a Cluster that is gone and tells the controllers.
func (c *Cache) forget(ctx context.Context, key client.ObjectKey) {
	c.mu.Lock()
	g := c.guests[key]
	delete(c.guests, key)
	c.mu.Unlock()
	if g != nil && g.connected() {
		g.disconnect()
		ctrl.LoggerFrom(ctx).Info("Disconnected: the Cluster is gone")
		gone := &clusterv1.Cluster{}
		gone.Namespace, gone.Name = key.Namespace, key.Name
		c.send(ctx, gone)
	}
}

func (c *Cache) guestFor(key client.ObjectKey) *guest {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.guests[key]
	if g == nil {
		g = &guest{key: key}
		c.guests[key] = g
	}
	return g
}

func (c *Cache) guest(key client.ObjectKey) *guest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.guests[key]
}

func (c *Cache) connectRetryInterval() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.retryInterval
}

// SetConnectionCreationRetryInterval changes the 30 s wait before a failed connect is tried
// again (the lab's controller tests shorten it).
func (c *Cache) SetConnectionCreationRetryInterval(interval time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retryInterval = interval
}

// Shutdown stops every guest's cache (tests).
func (c *Cache) Shutdown() { c.cancel() }

// connection returns the guest's connection, or ErrClusterNotConnected saying what for.
func (c *Cache) connection(cluster client.ObjectKey, what string) (*connection, error) {
	if g := c.guest(cluster); g != nil {
		if conn := g.current(); conn != nil {
			return conn, nil
		}
	}
	return nil, fmt.Errorf("%w: %s of %s", clustercache.ErrClusterNotConnected, what, cluster)
}

// GetClient returns the guest's client whose reads come from its cache.
func (c *Cache) GetClient(_ context.Context, cluster client.ObjectKey) (client.Client, error) {
	conn, err := c.connection(cluster, "client")
	if err != nil {
		return nil, err
	}
	return conn.cached, nil
}

// GetReader returns the guest's cached client as a reader.
func (c *Cache) GetReader(ctx context.Context, cluster client.ObjectKey) (client.Reader, error) {
	return c.GetClient(ctx, cluster)
}

// GetUncachedClient returns the guest's client that reads from its apiserver.
func (c *Cache) GetUncachedClient(_ context.Context, cluster client.ObjectKey) (client.Client, error) {
	conn, err := c.connection(cluster, "uncached client")
	if err != nil {
		return nil, err
	}
	return conn.uncached, nil
}

// GetRESTConfig returns a copy of the REST config the guest's clients use.
func (c *Cache) GetRESTConfig(_ context.Context, cluster client.ObjectKey) (*rest.Config, error) {
	conn, err := c.connection(cluster, "REST config")
	if err != nil {
		return nil, err
	}
	return rest.CopyConfig(conn.restConfig), nil
}

// Watch adds watcher to the guest's cache once per connection (by its name); a new
// connection starts without any, and the controllers add theirs again on its connect event.
func (c *Cache) Watch(ctx context.Context, cluster client.ObjectKey, watcher clustercache.Watcher) error {
	if watcher.Name() == "" {
		return errors.New("guestcache: a watch needs a name")
	}
	g := c.guest(cluster)
	if g == nil {
		return fmt.Errorf("%w: watch %s", clustercache.ErrClusterNotConnected, watcher.Name())
	}
	return g.watch(ctx, watcher)
}

// Tried reports whether the cache has tried to connect to the guest of cluster since it
// started, with or without success. Before its first try "not connected" says nothing about
// the guest (clusterscope.NotTriedYet): a manager that has just started has not tried yet.
func (c *Cache) Tried(_ context.Context, cluster client.ObjectKey) bool {
	g := c.guest(cluster)
	return g != nil && !g.state().LastProbeTime.IsZero()
}

// GetHealthCheckingState returns the guest's health probe state.
func (c *Cache) GetHealthCheckingState(_ context.Context, cluster client.ObjectKey) clustercache.HealthCheckingState {
	if g := c.guest(cluster); g != nil {
		return g.state()
	}
	return clustercache.HealthCheckingState{}
}

// GetClusterSource returns a source of the Clusters whose guest connected or disconnected,
// mapped to requests by mapFunc. CAPI's WatchForProbeFailure option is not supported: no
// guestnet controller needs an event for a probe that fails without a disconnect.
func (c *Cache) GetClusterSource(_ string, mapFunc func(ctx context.Context, cluster client.Object) []ctrl.Request, opts ...clustercache.GetClusterSourceOption) source.Source {
	if len(opts) > 0 {
		panic("guestcache: GetClusterSource takes no options")
	}
	ch := make(chan event.GenericEvent)
	c.sourcesMu.Lock()
	c.sources = append(c.sources, ch)
	c.sourcesMu.Unlock()
	return source.Channel(ch, handler.EnqueueRequestsFromMapFunc(mapFunc))
}

// send tells every source that cluster's guest connected or disconnected. It gives up when
// ctx (the Reconcile's) is done: a stopping manager no longer reads its sources, and waits
// for this worker.
func (c *Cache) send(ctx context.Context, cluster *clusterv1.Cluster) {
	c.sourcesMu.Lock()
	defer c.sourcesMu.Unlock()
	for _, ch := range c.sources {
		select {
		case ch <- event.GenericEvent{Object: cluster}:
		case <-ctx.Done():
			return
		case <-c.ctx.Done():
			return
		}
	}
}

// cacheOptions are the options of conn's cache: what every guest's cache stores, through
// conn's mapper and transport.
func (c *Cache) cacheOptions(conn *connection) ctrlcache.Options {
	var byObject map[client.Object]ctrlcache.ByObject
	for _, obj := range c.opts.SingleObjects {
		if byObject == nil {
			byObject = map[client.Object]ctrlcache.ByObject{}
		}
		name := fields.OneTermEqualSelector("metadata.name", obj.GetName())
		byObject[obj] = ctrlcache.ByObject{
			Namespaces: map[string]ctrlcache.Config{obj.GetNamespace(): {FieldSelector: name}},
			Field:      name,
		}
	}
	return ctrlcache.Options{
		HTTPClient:       conn.listWatchHTTP,
		Scheme:           c.scheme,
		Mapper:           conn.mapper,
		DefaultTransform: c.opts.Transform,
		ByObject:         byObject,
	}
}
