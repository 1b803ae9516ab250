package policy

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Pools are the host's CiliumLoadBalancerIPPools. A decision reads a pool by name (poolRef,
// sharedPools) and, for a GuestIngress that lets LB-IPAM choose its IP, every pool: a reader
// that looks pools up as asked (the GuestIngress controller's, on the manager's cache) reads
// the whole host only then.
type Pools interface {
	// Get is the pool of that name, nil when there is none.
	Get(name string) *unstructured.Unstructured
	// All are every pool, in name order.
	All() []*unstructured.Unstructured
}

// PoolMap is Pools held in a map by name.
type PoolMap map[string]*unstructured.Unstructured

// Get implements Pools.
func (m PoolMap) Get(name string) *unstructured.Unstructured { return m[name] }

// All implements Pools.
func (m PoolMap) All() []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, 0, len(m))
	for _, pool := range m {
		if pool != nil {
			out = append(out, pool)
		}
	}
	slices.SortFunc(out, func(a, b *unstructured.Unstructured) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return out
}

// pools are in.Pools, none when nil.
func (in Input) pools() Pools {
	if in.Pools == nil {
		return PoolMap(nil)
	}
	return in.Pools
}
