package ports

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
)

// CiliumConfigKey is the guest ConfigMap ForCluster reads the tunnel port from.
var CiliumConfigKey = client.ObjectKey{Namespace: "kube-system", Name: "cilium-config"}

// CiliumConfig is the guest's kube-system/cilium-config, named, for a cache of it alone: the
// guest connections keep a watch of that one ConfigMap (internal/manager.SetupClusterCache),
// so that ForCluster, which reads it on every reconcile, reads it from memory and a change is
// seen at once (docs/decisions/0014-steady-state-reads.md).
func CiliumConfig() *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: CiliumConfigKey.Namespace, Name: CiliumConfigKey.Name}}
}

// ciliumTunnelKeys are the keys of cilium-config CiliumTunnel reads.
var ciliumTunnelKeys = []string{"routing-mode", "tunnel", "tunnel-protocol", "tunnel-port"}

// KeepTunnelKeys returns the entries of cilium-config data that CiliumTunnel reads: what the
// guest caches keep of it (the rest is Cilium's, a hundred entries guestnet never reads). An
// empty map stays an empty map (a cilium-config without data is not a missing one).
func KeepTunnelKeys(data map[string]string) map[string]string {
	if data == nil {
		return nil
	}
	kept := map[string]string{}
	for _, k := range ciliumTunnelKeys {
		if v, ok := data[k]; ok {
			kept[k] = v
		}
	}
	return kept
}

// WatchCiliumConfig makes a change of the guest's cilium-config, in the guest of cluster,
// reach h of controller, through the watch of that one ConfigMap the guest's cache keeps (name
// is the watch's, once per connection). A guest that is not connected is not an error: its
// connect event brings the caller back.
func WatchCiliumConfig(ctx context.Context, cc clustercache.ClusterCache, cluster client.ObjectKey, name string,
	controller clustercache.SourceWatcher[ctrl.Request], h handler.EventHandler) error {
	err := cc.Watch(ctx, cluster, clustercache.NewWatcher(clustercache.WatcherOptions{
		Name:         name,
		Watcher:      controller,
		Kind:         CiliumConfig(),
		EventHandler: h,
		Predicates:   []predicate.Predicate{isCiliumConfig},
	}))
	if errors.Is(err, clustercache.ErrClusterNotConnected) {
		return nil
	}
	return err
}

// isCiliumConfig passes the events of cilium-config alone (the guest's cache holds no other
// ConfigMap; this keeps a watch without that cache from waking anyone).
var isCiliumConfig = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return client.ObjectKeyFromObject(o) == CiliumConfigKey
})
