package guestcache

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	kcfg "sigs.k8s.io/cluster-api/util/kubeconfig"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
)

// guest is one Cluster's guest: its connection while there is one, and its health probe
// state. Only the Cache's reconciler connects, probes and disconnects (never two at once for
// one Cluster); the controllers read it concurrently.
type guest struct {
	key client.ObjectKey

	mu            sync.RWMutex
	conn          *connection
	health        clustercache.HealthCheckingState
	connectFailed time.Time
}

// connection is what a guest costs while connected.
type connection struct {
	restConfig *rest.Config
	// prober sends the health probe (discovery's REST client: no codec needed for `/`).
	prober rest.Interface
	mapper *guestMapper
	// listWatchHTTP is the caches' HTTP client: the same transport (one HTTP/2 connection)
	// as the clients', with listWatchTimeout instead of Options.Timeout.
	listWatchHTTP    *http.Client
	cached, uncached client.Client
	cache            *boundedCache
	stop             context.CancelFunc
	watches          sets.Set[string]
}

// probe sends the health probe, `GET /`, to the guest apiserver, giving it timeout: at
// connect and every health probe interval after.
func (conn *connection) probe(ctx context.Context, timeout time.Duration) error {
	_, err := conn.prober.Get().AbsPath("/").Timeout(timeout).DoRaw(ctx)
	return err
}

func (g *guest) connected() bool { return g.current() != nil }

func (g *guest) current() *connection {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.conn
}

func (g *guest) state() clustercache.HealthCheckingState {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.health
}

func (g *guest) lastConnectFailure() time.Time {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.connectFailed
}

// connect builds the guest's clients and cache from its checked kubeconfig, probes the
// apiserver and waits for nothing else: no informer exists until a controller asks for one.
// It holds no lock while it dials, so that the controllers' GetClient calls never wait.
func (g *guest) connect(ctx context.Context, c *Cache) error {
	conn, err := c.newConnection(ctx, g.key)
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.health.LastProbeTime = now
	if err != nil {
		g.connectFailed = now
		g.health.ConsecutiveFailures++
		return err
	}
	g.conn = conn
	g.health = clustercache.HealthCheckingState{LastProbeTime: now, LastProbeSuccessTime: now}
	return nil
}

// probe sends `GET /` to the guest apiserver and records the answer.
func (g *guest) probe(ctx context.Context, timeout time.Duration) error {
	conn := g.current()
	if conn == nil {
		return nil
	}
	err := conn.probe(ctx, timeout)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.health.LastProbeTime = time.Now()
	if err != nil {
		g.health.ConsecutiveFailures++
		return err
	}
	g.health.ConsecutiveFailures = 0
	g.health.LastProbeSuccessTime = g.health.LastProbeTime
	return nil
}

// disconnect stops the guest's cache, and with it every informer and watch of the connection.
func (g *guest) disconnect() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn != nil {
		g.conn.stop()
		g.conn = nil
	}
}

// disconnectUnanswered drops a connection whose guest stopped answering its health probes,
// and counts that as a failed connect: the next try waits for the retry interval, whatever
// event of the Cluster comes first.
func (g *guest) disconnectUnanswered() {
	g.disconnect()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.connectFailed = time.Now()
}

// watch adds watcher to the connection's cache unless one of that name was added.
func (g *guest) watch(ctx context.Context, watcher clustercache.Watcher) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		return fmt.Errorf("%w: watch %s", clustercache.ErrClusterNotConnected, watcher.Name())
	}
	if g.conn.watches.Has(watcher.Name()) {
		return nil
	}
	// Starting a watch only starts its source: it does not block on the guest, and an error
	// starting the informer would not come back here. The count of a capped kind does, first.
	if err := g.conn.cache.admitObject(ctx, watcher.Object()); err != nil {
		return fmt.Errorf("watch %s of %T in %s: %w", watcher.Name(), watcher.Object(), g.key, err)
	}
	if err := watcher.Watch(g.conn.cache); err != nil {
		return fmt.Errorf("watch %s of %T in %s: %w", watcher.Name(), watcher.Object(), g.key, err)
	}
	g.conn.watches.Insert(watcher.Name())
	ctrl.LoggerFrom(ctx).V(4).Info("Watching the guest", "watch", watcher.Name())
	return nil
}

// newConnection connects to the guest of cluster.
func (c *Cache) newConnection(ctx context.Context, cluster client.ObjectKey) (*connection, error) {
	kubeconfig, err := kcfg.FromSecret(ctx, c.opts.SecretClient, cluster)
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig Secret: %w", err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("parsing the kubeconfig: %w", err)
	}
	if cfg.ExecProvider != nil || cfg.AuthProvider != nil {
		return nil, errors.New("the kubeconfig names an exec plugin or an auth provider, which guestnet never runs")
	}
	cfg.UserAgent, cfg.QPS, cfg.Burst, cfg.Timeout = c.opts.UserAgent, c.opts.QPS, c.opts.Burst, c.opts.Timeout
	// Uncompressed answers: a compressed watch stream holds a gzip reader (about 40 KiB)
	// for as long as it lasts, one per kind per guest. guestnet's lists of a guest are
	// bounded (guestbounds); its watch events are small.
	cfg.DisableCompression = true

	transport, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the transport: %w", err)
	}
	httpClient := &http.Client{Transport: transport, Timeout: cfg.Timeout}
	d, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	conn := &connection{
		restConfig:    cfg,
		prober:        d.RESTClient(),
		mapper:        newGuestMapper(d),
		listWatchHTTP: &http.Client{Transport: transport, Timeout: listWatchTimeout},
		watches:       sets.New[string](),
	}
	if err := conn.probe(ctx, c.healthProbe.Timeout); err != nil {
		return nil, fmt.Errorf("the guest apiserver does not answer: %w", err)
	}

	uncached, err := client.New(cfg, client.Options{Scheme: c.scheme, Mapper: conn.mapper, HTTPClient: httpClient})
	if err != nil {
		return nil, fmt.Errorf("creating the guest's client: %w", err)
	}
	// The guest's capped kinds are counted now, all at once, while up to
	// ClusterCacheConcurrency guests connect at a time: the first reconcile of each object of
	// this guest then finds the count made (guestbounds.Check keeps it) instead of making it
	// in one of its controller's few workers. Over the cap or not, the connection stands (the
	// controllers report the count); a count that failed is made by the first Check.
	conn.uncached = withTimeout{Client: uncached, timeout: cfg.Timeout}
	if err := c.opts.Bounds.Check(ctx, cluster, conn.uncached, nil); err != nil && !errors.As(err, new(*guestbounds.TooLargeError)) {
		ctrl.LoggerFrom(ctx).V(1).Info("Counting the guest's objects at connect failed; the first reconcile counts them", "error", err.Error())
	}
	listWatchConfig := rest.CopyConfig(cfg)
	listWatchConfig.Timeout = listWatchTimeout
	informers, err := ctrlcache.New(listWatchConfig, c.cacheOptions(conn))
	if err != nil {
		return nil, fmt.Errorf("creating the guest's cache: %w", err)
	}
	cache := &boundedCache{Cache: informers, scheme: c.scheme, bounds: c.opts.Bounds, cluster: cluster,
		live: conn.uncached}
	cached, err := client.New(cfg, client.Options{
		Scheme: c.scheme, Mapper: conn.mapper, HTTPClient: httpClient,
		Cache: &client.CacheOptions{Reader: cache, DisableFor: c.opts.DisableFor, Unstructured: true},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the guest's cached client: %w", err)
	}
	cacheCtx, stop := context.WithCancel(c.ctx)
	go func() { _ = cache.Start(cacheCtx) }()
	syncCtx, cancel := context.WithTimeout(ctx, initialSyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx) {
		stop()
		return nil, fmt.Errorf("the guest's cache did not start: %w", syncCtx.Err())
	}
	conn.cache, conn.stop = cache, stop
	// A read through the cache waits for its informer's first list: never longer than a
	// request may take.
	conn.cached = cachedClient{
		withTimeout: withTimeout{Client: singleObjects{Client: cached, cache: cache, objects: c.opts.SingleObjects}, timeout: cfg.Timeout},
		cache:       cache,
	}
	return conn, nil
}

// cachedClient is a guest's cached client; it says what the guest's cache holds
// (guestbounds.Cached), for clusterscope.GuestClient's count.
type cachedClient struct {
	withTimeout
	cache *boundedCache
}

func (c cachedClient) Count(gvk schema.GroupVersionKind) (int, bool) { return c.cache.Count(gvk) }

// singleObjects reads Options.SingleObjects from the guest's cache; every other read goes to
// Client (which reads their kinds live: DisableFor).
type singleObjects struct {
	client.Client
	cache   client.Reader
	objects []client.Object
}

func (c singleObjects) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	for _, single := range c.objects {
		if reflect.TypeOf(obj) == reflect.TypeOf(single) && key == client.ObjectKeyFromObject(single) {
			return c.cache.Get(ctx, key, obj, opts...)
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// withTimeout bounds each read: a cached read of a kind not cached yet starts its informer
// and waits for it, which an unreachable guest would make wait for ever.
type withTimeout struct {
	client.Client
	timeout time.Duration
}

func (c withTimeout) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c withTimeout) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return c.Client.List(ctx, list, opts...)
}
