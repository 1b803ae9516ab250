package guestwebhookbridge

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
)

// memo keeps, between reconciles, the answers of what guestnet cannot watch: TLS probes of
// bridged targets and the guest's konnectivity agents (uncached Pods). An answer is reused while its inputs are unchanged and it is younger
// than recheckAfter, so a bridge that nothing changes reads and probes nothing, and, with
// stable messages, writes nothing. It lives in memory: a restarted manager asks once again.
type memo struct {
	mu     sync.Mutex
	now    func() time.Time
	probes map[types.UID]map[string]probeAnswer
	reads  map[string]readAnswer
	// serviceKeys are the guest Services each bridge's last plan looked up
	// (bridge.Plan.GuestServiceKeys), for the guest Service events (bridge.ServiceMatters).
	serviceKeys map[types.UID]sets.Set[string]
}

type probeAnswer struct {
	inputs string
	result bridge.ProbeResult
	at     time.Time
	// unanswered counts the probes in a row, for these inputs, that no server answered.
	unanswered int
}

// firstRetryAfter is how long a probe that no server answered (refused, timed out) is kept
// before it is asked again; each further one for the same inputs doubles it, up to
// recheckAfter. That failure often fixes itself without a change guestnet sees (a datapath
// that programs the host Service after its endpoints are ready, a server still starting). A
// server's answer, verified or not (an expired certificate), is kept recheckAfter.
const firstRetryAfter = 5 * time.Second

// keptFor is how long the answer is reused.
func (a probeAnswer) keptFor() time.Duration {
	if a.result.Answered {
		return recheckAfter
	}
	return min(recheckAfter, firstRetryAfter<<min(a.unanswered-1, 10))
}

type readAnswer struct {
	value any
	at    time.Time
}

func newMemo() *memo {
	return &memo{now: time.Now, probes: map[types.UID]map[string]probeAnswer{}, reads: map[string]readAnswer{},
		serviceKeys: map[types.UID]sets.Set[string]{}}
}

// probe returns the answer for the target key of bridge uid when one is known for these
// inputs and still fresh, and how long it stays so.
func (m *memo) probe(uid types.UID, key, inputs string) (bridge.ProbeResult, time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.probes[uid][key]
	if !ok || a.inputs != inputs {
		return bridge.ProbeResult{}, 0, false
	}
	left := a.keptFor() - m.now().Sub(a.at)
	if left <= 0 {
		return bridge.ProbeResult{}, 0, false
	}
	return a.result, left, true
}

// storeProbe keeps r as the answer for these inputs, and returns the answer kept and how
// long it is kept.
func (m *memo) storeProbe(uid types.UID, key, inputs string, r bridge.ProbeResult) (bridge.ProbeResult, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.probes[uid] == nil {
		m.probes[uid] = map[string]probeAnswer{}
	}
	a := probeAnswer{inputs: inputs, result: r, at: m.now()}
	if !r.Answered {
		a.unanswered = 1
		if prev, ok := m.probes[uid][key]; ok && prev.inputs == inputs && !prev.result.Answered {
			a.unanswered = prev.unanswered + 1
			// Still no answer: keep the first failure's words. Refused, reset and timed out
			// alternate while a server is down; each would be a status write saying the same.
			a.result.Detail = prev.result.Detail
		}
	}
	m.probes[uid][key] = a
	return a.result, a.keptFor()
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
	delete(m.serviceKeys, uid)
}

// setServiceKeys keeps the guest Services the last plan of bridge uid looked up; nil (no
// plan) makes every guest Service event matter to it.
func (m *memo) setServiceKeys(uid types.UID, keys sets.Set[string]) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if keys == nil {
		delete(m.serviceKeys, uid)
		return
	}
	m.serviceKeys[uid] = keys
}

// serviceKeysOf returns what setServiceKeys kept for bridge uid (nil: none). A kept set is
// replaced, never changed: the caller reads it without the lock.
func (m *memo) serviceKeysOf(uid types.UID) sets.Set[string] {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.serviceKeys[uid]
}

// readFor returns the memoized answer of read for key, calling it when there is none younger
// than ttl. Errors are not kept.
func (m *memo) readFor(key string, ttl time.Duration, read func() (any, error)) (any, error) {
	m.mu.Lock()
	a, ok := m.reads[key]
	m.mu.Unlock()
	if ok && m.now().Sub(a.at) < ttl {
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
