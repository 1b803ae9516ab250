package ports

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CiliumConfigTTL is how long CiliumConfigMemo serves a guest's cilium-config without reading
// it again (as long as the bridge's memo, docs/guestwebhookbridge.md).
const CiliumConfigTTL = 5 * time.Minute

// ciliumConfigKey is the guest ConfigMap ForCluster reads the tunnel port from.
var ciliumConfigKey = client.ObjectKey{Namespace: "kube-system", Name: "cilium-config"}

// CiliumConfigMemo remembers each guest cluster's kube-system/cilium-config for TTL. Every
// reconcile of a GuestIngress or Cluster needs it (the tunnel port the workers must accept),
// but guestnet may only get it in the guest (docs/rbac.md), not watch it, so no cache
// answers it; without the memo, every reconcile of every object was a live GET in its guest,
// resyncs included. A change is noticed within TTL. The zero value serves nothing from
// memory (TTL 0); a nil memo neither.
type CiliumConfigMemo struct {
	TTL time.Duration

	mu      sync.Mutex
	entries map[client.ObjectKey]ciliumConfigEntry
}

type ciliumConfigEntry struct {
	cm *corev1.ConfigMap // nil: the guest has none
	at time.Time
}

// Reader is guest, with cluster's cilium-config served from the memo.
func (m *CiliumConfigMemo) Reader(cluster client.ObjectKey, guest client.Reader) client.Reader {
	if m == nil || m.TTL <= 0 {
		return guest
	}
	return memoReader{Reader: guest, memo: m, cluster: cluster}
}

type memoReader struct {
	client.Reader
	memo    *CiliumConfigMemo
	cluster client.ObjectKey
}

func (r memoReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || key != ciliumConfigKey {
		return r.Reader.Get(ctx, key, obj, opts...)
	}
	m := r.memo
	m.mu.Lock()
	e, hit := m.entries[r.cluster]
	m.mu.Unlock()
	if !hit || time.Since(e.at) > m.TTL {
		got := &corev1.ConfigMap{}
		err := r.Reader.Get(ctx, key, got, opts...)
		switch {
		case apierrors.IsNotFound(err):
			got = nil // an answer too
		case err != nil:
			return err
		}
		e = ciliumConfigEntry{cm: got, at: time.Now()}
		m.mu.Lock()
		if m.entries == nil {
			m.entries = map[client.ObjectKey]ciliumConfigEntry{}
		}
		m.entries[r.cluster] = e
		m.mu.Unlock()
	}
	if e.cm == nil {
		return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
	}
	e.cm.DeepCopyInto(cm)
	return nil
}
