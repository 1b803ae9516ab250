package ssa

import (
	"crypto/sha256"
	"encoding/json"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// verdicts remembers ServiceUpToDate's answers. A Service's content is fixed by its UID and
// resourceVersion, so the answer for the same desired configuration cannot change until the
// Service does; and computing it (extracting guestnet's fields, a walk of the whole object
// with its schema) was 11% of the manager's CPU at N=1,000 (docs/performance.md), asked again
// for every Service on every resync.
//
// Answers are kept two generations of verdictsGeneration: one asked for within a generation
// is kept for the next, so the Services a resync looks at stay, and a deleted Service's go.
type verdicts struct {
	mu                sync.Mutex
	current, previous map[verdictKey]bool
	started           time.Time
	now               func() time.Time
}

// verdictsGeneration is at least the default sync period (10 minutes), so that a Service
// looked at once per resync keeps its answer.
const verdictsGeneration = 15 * time.Minute

type verdictKey struct {
	uid             types.UID
	resourceVersion string
	desired         [sha256.Size]byte
}

var serviceVerdicts = newVerdicts(time.Now)

func newVerdicts(now func() time.Time) *verdicts {
	return &verdicts{current: map[verdictKey]bool{}, previous: map[verdictKey]bool{}, started: now(), now: now}
}

// key is the key of desired against the live object of uid at resourceVersion; false when
// the live object has no identity (built in memory, never read from an apiserver) or
// desired does not encode.
func (v *verdicts) key(uid types.UID, resourceVersion string, desired any) (verdictKey, bool) {
	if uid == "" || resourceVersion == "" {
		return verdictKey{}, false
	}
	b, err := json.Marshal(desired)
	if err != nil {
		return verdictKey{}, false
	}
	return verdictKey{uid: uid, resourceVersion: resourceVersion, desired: sha256.Sum256(b)}, true
}

func (v *verdicts) get(k verdictKey) (upToDate, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.rotate()
	if upToDate, ok = v.current[k]; ok {
		return upToDate, true
	}
	if upToDate, ok = v.previous[k]; ok {
		v.current[k] = upToDate
	}
	return upToDate, ok
}

func (v *verdicts) put(k verdictKey, upToDate bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.rotate()
	v.current[k] = upToDate
}

// rotate starts a new generation when the current one is over (v.mu held).
func (v *verdicts) rotate() {
	if now := v.now(); now.Sub(v.started) >= verdictsGeneration {
		v.previous, v.current, v.started = v.current, map[verdictKey]bool{}, now
	}
}

// len is the number of answers kept.
func (v *verdicts) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.current) + len(v.previous)
}
