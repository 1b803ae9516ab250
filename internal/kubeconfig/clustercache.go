package kubeconfig

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
)

// ClusterCache wraps the guest connections (a clustercache.ClusterCache: internal/guestcache), whose SecretClient is secrets, so that its
// clustercache.ErrClusterNotConnected says why when the reason is a refused kubeconfig: the
// ClusterCache only logs why a connection failed, and its reconciler may not even have tried
// yet when a guestnet controller asks. The error then wraps both ErrClusterNotConnected (so
// every caller still treats the guest as "not connected yet") and the *RefusedError
// (AsRefused), which ClusterAvailable reports. A connected guest is never checked again
// here: the ClusterCache keeps a connection until it fails, and checks the Secret (through
// secrets) whenever it connects anew.
func ClusterCache(cc clustercache.ClusterCache, secrets SecretReader) clustercache.ClusterCache {
	return &explainingClusterCache{ClusterCache: cc, secrets: secrets}
}

type explainingClusterCache struct {
	clustercache.ClusterCache
	secrets SecretReader
}

// explain adds to err, when it is ErrClusterNotConnected, why the Secret of cluster is
// refused, if it is.
func (c *explainingClusterCache) explain(ctx context.Context, cluster client.ObjectKey, err error) error {
	if !errors.Is(err, clustercache.ErrClusterNotConnected) {
		return err
	}
	if refused := c.secrets.Refusal(ctx, cluster); refused != nil {
		return fmt.Errorf("%w: %w", err, refused)
	}
	return err
}

func (c *explainingClusterCache) GetClient(ctx context.Context, cluster client.ObjectKey) (client.Client, error) {
	cl, err := c.ClusterCache.GetClient(ctx, cluster)
	return cl, c.explain(ctx, cluster, err)
}

func (c *explainingClusterCache) GetReader(ctx context.Context, cluster client.ObjectKey) (client.Reader, error) {
	r, err := c.ClusterCache.GetReader(ctx, cluster)
	return r, c.explain(ctx, cluster, err)
}

func (c *explainingClusterCache) GetUncachedClient(ctx context.Context, cluster client.ObjectKey) (client.Client, error) {
	cl, err := c.ClusterCache.GetUncachedClient(ctx, cluster)
	return cl, c.explain(ctx, cluster, err)
}

func (c *explainingClusterCache) GetRESTConfig(ctx context.Context, cluster client.ObjectKey) (*rest.Config, error) {
	cfg, err := c.ClusterCache.GetRESTConfig(ctx, cluster)
	return cfg, c.explain(ctx, cluster, err)
}

func (c *explainingClusterCache) Watch(ctx context.Context, cluster client.ObjectKey, watcher clustercache.Watcher) error {
	return c.explain(ctx, cluster, c.ClusterCache.Watch(ctx, cluster, watcher))
}

// SetConnectionCreationRetryInterval passes on to the guest connections (the lab shortens the
// 30 s retry of the controller packages' tests with it).
func (c *explainingClusterCache) SetConnectionCreationRetryInterval(interval time.Duration) {
	if s, ok := c.ClusterCache.(interface{ SetConnectionCreationRetryInterval(time.Duration) }); ok {
		s.SetConnectionCreationRetryInterval(interval)
	}
}

// Shutdown passes on to the guest connections (tests stop the per-cluster caches with it).
func (c *explainingClusterCache) Shutdown() {
	if s, ok := c.ClusterCache.(interface{ Shutdown() }); ok {
		s.Shutdown()
	}
}

// Tried is the wrapped ClusterCache's answer (clusterscope.NotTriedYet): whether it has tried
// to connect to the guest of cluster since it started. One that does not say has tried. (The
// interface is clusterscope.ConnectTracker, which this package cannot import.)
func (c *explainingClusterCache) Tried(ctx context.Context, cluster client.ObjectKey) bool {
	if t, ok := c.ClusterCache.(interface {
		Tried(context.Context, client.ObjectKey) bool
	}); ok {
		return t.Tried(ctx, cluster)
	}
	return true
}
