package guestwebhookbridge

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
)

// memo keeps, between reconciles, the answers of what guestnet cannot watch: TLS probes of
// bridged targets, the guest's konnectivity agents (uncached Pods) and its cilium-config
// (uncached ConfigMap). An answer is reused while its inputs are unchanged and it is younger
// than recheckAfter, so a bridge that nothing changes reads and probes nothing, and, with
// stable messages, writes nothing. It lives in memory: a restarted manager asks once again.
type memo struct {
	mu     sync.Mutex
	now    func() time.Time
	probes map[types.UID]map[string]probeAnswer
	reads  map[string]readAnswer
}

type probeAnswer struct {
	inputs string
	result bridge.ProbeResult
	at     time.Time
}

type readAnswer struct {
	value any
	at    time.Time
}

func newMemo() *memo {
	return &memo{now: time.Now, probes: map[types.UID]map[string]probeAnswer{}, reads: map[string]readAnswer{}}
}

// probe returns the answer for the target key of bridge uid when one is known for these
// inputs and still fresh.
func (m *memo) probe(uid types.UID, key, inputs string) (bridge.ProbeResult, time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.probes[uid][key]
	if !ok || a.inputs != inputs || m.now().Sub(a.at) >= recheckAfter {
		return bridge.ProbeResult{}, time.Time{}, false
	}
	return a.result, a.at, true
}

func (m *memo) storeProbe(uid types.UID, key, inputs string, r bridge.ProbeResult) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.probes[uid] == nil {
		m.probes[uid] = map[string]probeAnswer{}
	}
	m.probes[uid][key] = probeAnswer{inputs: inputs, result: r, at: m.now()}
}

// keepProbes forgets the answers of bridge uid for targets keep lacks.
func (m *memo) keepProbes(uid types.UID, keep map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key := range m.probes[uid] {
		if !keep[key] {
			delete(m.probes[uid], key)
		}
	}
}

// forget drops everything known about bridge uid (it is gone).
func (m *memo) forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.probes, uid)
}

// read returns the memoized answer of read for key, calling it when there is none younger
// than recheckAfter. Errors are not kept.
func (m *memo) read(key string, read func() (any, error)) (any, error) {
	m.mu.Lock()
	a, ok := m.reads[key]
	m.mu.Unlock()
	if ok && m.now().Sub(a.at) < recheckAfter {
		return a.value, nil
	}
	v, err := read()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.reads[key] = readAnswer{value: v, at: m.now()}
	m.mu.Unlock()
	return v, nil
}

// ciliumConfigReader serves the guest's kube-system/cilium-config from the memo, and every
// other read from the guest client: PortsDeclared needs it on every reconcile, the guest does
// not let guestnet watch it (ConfigMaps are not cached), and it changes rarely.
type ciliumConfigReader struct {
	client.Reader
	memo    *memo
	cluster string
}

func (c ciliumConfigReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || key != (client.ObjectKey{Namespace: "kube-system", Name: "cilium-config"}) {
		return c.Reader.Get(ctx, key, obj, opts...)
	}
	type answer struct {
		cm  *corev1.ConfigMap
		err error
	}
	v, err := c.memo.read("cilium-config/"+c.cluster, func() (any, error) {
		got := &corev1.ConfigMap{}
		err := c.Reader.Get(ctx, key, got, opts...)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		return answer{cm: got, err: err}, nil // NotFound is an answer too
	})
	if err != nil {
		return err
	}
	a := v.(answer)
	if a.err != nil {
		return a.err
	}
	a.cm.DeepCopyInto(cm)
	return nil
}
