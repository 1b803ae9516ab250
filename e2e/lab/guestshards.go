package lab

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
)

// Guest shards are more guest clusters for fleets (fleet.go): each is a real kube-apiserver
// with the guest's flags (aggregation layer, service CIDRs, the host DNS, the audit log when
// the lab has one) that keeps its own cluster state in the guest's etcd under a key prefix
// of its own, on an address of its own. A hosting provider's fleet has one apiserver per
// guest cluster; the lab cannot run a thousand, but a fleet spread over shards gives each
// member's guest connection only its shard's objects to cache, as in production, instead of
// every member's (which would make the manager's memory grow with N², measuring the lab).

// MaxGuestShards is how many guest shards a lab can run (their address plan).
const MaxGuestShards = 100

// guestShardAddress is where guest shard i's apiserver listens: a host pod IP next to the
// guest's (GuestAPIServerAddress), as a hosted control plane's.
func guestShardAddress(i int) string { return fmt.Sprintf("10.244.0.%d", 10+i) }

// GuestShardEtcdPrefix is the etcd key prefix of guest shard i's cluster state (the guest's
// own is Kubernetes' default, /registry).
func GuestShardEtcdPrefix(i int) string { return fmt.Sprintf("/guest-shard-%02d", i) }

// guestShardStarts bounds how many shard apiservers start at once: a start is mostly CPU
// (its caches, post-start hooks), and too many at once on a small machine miss the
// readiness timeout.
const guestShardStarts = 4

// StartGuestShards starts n more guest shards (see above) next to the lab's guest, a few at
// a time, and returns them in order; they stop with the lab. Their Clusters are like l.Guest:
// admin Config, Client and Kubeconfig, their own CA, and AuditLog when the lab has Audit.
// Not with Options.Konnectivity: the shards' apiservers dial directly.
func (l *Lab) StartGuestShards(ctx context.Context, n int) ([]*Cluster, error) {
	if l.Guest == nil {
		return nil, errors.New("guest shards need the lab's guest (its etcd): not with SkipGuest")
	}
	if l.Guest.Options.EgressSelectorConfig != "" {
		return nil, errors.New("guest shards run without konnectivity: not with Options.Konnectivity")
	}
	l.mu.Lock()
	first := l.guestShards
	if first+n > MaxGuestShards {
		l.mu.Unlock()
		return nil, fmt.Errorf("%d guest shards exceed the address plan (%d)", first+n, MaxGuestShards)
	}
	l.guestShards += n
	l.mu.Unlock()

	shards := make([]*Cluster, n)
	errs := make([]error, n)
	slots := make(chan struct{}, guestShardStarts)
	var wg sync.WaitGroup
	for k := range n {
		i := first + k
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			opts := l.Guest.Options
			opts.Name = fmt.Sprintf("guest-shard-%02d", i)
			opts.Address = guestShardAddress(i)
			opts.Dir = filepath.Join(l.Dir, opts.Name)
			opts.ExternalIPs = nil
			opts.ExternalEtcd, opts.EtcdPrefix = l.Guest.EtcdURL(), GuestShardEtcdPrefix(i)
			shards[k], errs[k] = startCluster(ctx, l.Assets, opts)
			if errs[k] != nil {
				errs[k] = fmt.Errorf("starting %s: %w", opts.Name, errs[k])
			}
		})
	}
	wg.Wait()
	for _, s := range shards {
		if s != nil {
			l.onStop(s.Stop)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return shards, nil
}
