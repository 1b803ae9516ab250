package guestingress

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// A reconcile reads the claims near its GuestIngress's, never every GuestIngress, pool and
// Service of the host: the manager's cache indexes them by address (ingress.AddressKeys) and
// by the GuestIngress they were made for. A fleet of N then costs each reconcile what its
// neighbours cost, not O(N) (docs/performance.md).

// Field indexes of the manager's cache.
const (
	// addressField files GuestIngresses by the address space they ask for, pools by their
	// blocks and guestnet's host Services by their IPs (ingress.AddressKeys).
	addressField = "guestnet.address"
	// madeForField files pools, L2 policies, announcers and host Services by the GuestIngress
	// ("<namespace>/<name>") they were made for (ownership.GuestIngressOf).
	madeForField = "guestnet.madeFor"
	// poolRefField files GuestIngresses by the pool spec.loadBalancer.poolRef names.
	poolRefField = "spec.loadBalancer.poolRef.name"
)

// fieldIndex is one field index of the manager's cache.
type fieldIndex struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

// hostIndexes are the indexes of the kinds every host serves; ciliumIndexes those of Cilium's
// LB-IPAM kinds (registered once it is served, watchCilium); announcerIndexes those of an
// announcer's kinds (watchAnnouncer).
func hostIndexes() []fieldIndex {
	return []fieldIndex{
		{&guestnetv1.GuestIngress{}, clusterscope.ClusterNameField, clusterscope.IndexByClusterName},
		{&guestnetv1.GuestIngress{}, addressField, func(o client.Object) []string {
			return ingress.AddressKeys(ingress.ClaimOf(o.(*guestnetv1.GuestIngress)).Addresses())
		}},
		{&guestnetv1.GuestIngress{}, poolRefField, func(o client.Object) []string {
			if ref := o.(*guestnetv1.GuestIngress).Spec.LoadBalancer.PoolRef; ref != nil {
				return []string{ref.Name}
			}
			return nil
		}},
		{&corev1.Service{}, addressField, func(o client.Object) []string {
			return ingress.AddressKeys(ipPrefixes(ingress.ServiceIPs(o.(*corev1.Service))))
		}},
		{&corev1.Service{}, madeForField, indexByMadeFor},
	}
}

func ciliumIndexes() []fieldIndex {
	return []fieldIndex{
		{ingress.NewPool(), addressField, func(o client.Object) []string {
			return ingress.AddressKeys(ingress.PoolBlocks(o.(*unstructured.Unstructured)))
		}},
		{ingress.NewPool(), madeForField, indexByMadeFor},
		{ingress.NewL2Policy(), madeForField, indexByMadeFor},
	}
}

func announcerIndexes(kinds []*unstructured.Unstructured) []fieldIndex {
	out := make([]fieldIndex, 0, len(kinds))
	for _, kind := range kinds {
		out = append(out, fieldIndex{kind, madeForField, indexByMadeFor})
	}
	return out
}

func indexByMadeFor(o client.Object) []string {
	if key, ok := ownership.GuestIngressOf(o); ok {
		return []string{key.String()}
	}
	return nil
}

func addIndexes(ctx context.Context, indexer client.FieldIndexer, indexes []fieldIndex) error {
	for _, i := range indexes {
		if err := indexer.IndexField(ctx, i.obj, i.field, i.extract); err != nil {
			return fmt.Errorf("indexing %T by %s: %w", i.obj, i.field, err)
		}
	}
	return nil
}

func ipPrefixes(ips []netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, len(ips))
	for i, ip := range ips {
		out[i] = netip.PrefixFrom(ip, ip.BitLen())
	}
	return out
}

// --- claimants ------------------------------------------------------------------------------

// entangledClaimants are the other GuestIngresses whose claims are entangled with self's
// (ingress.EntangledVia), with what each holds: each claimant's neighbours are the
// GuestIngresses that ask for, or whose pool or host Service holds, address space under one
// of the keys of what it asks for and holds.
func (r *Reconciler) entangledClaimants(ctx context.Context, w *hostWorld, self ingress.Claimant) ([]ingress.Claimant, error) {
	return ingress.EntangledVia(self, func(c ingress.Claimant) ([]ingress.Claimant, error) {
		var out []ingress.Claimant
		for _, key := range addressKeysToAsk(slices.Concat(c.Wants().Addresses(), c.Held.Addresses())) {
			near, err := r.claimantsAt(ctx, w, key)
			if err != nil {
				return nil, err
			}
			out = append(out, near...)
		}
		return out, nil
	})
}

// claimantsAt are the claimants filed under the address key (every one for ""), once per
// reconcile.
func (r *Reconciler) claimantsAt(ctx context.Context, w *hostWorld, key string) ([]ingress.Claimant, error) {
	if near, ok := w.near[key]; ok {
		return near, nil
	}
	var keys []types.NamespacedName
	gis := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, gis, readOnly, atAddress(key)); err != nil {
		return nil, fmt.Errorf("listing GuestIngresses: %w", err)
	}
	for i := range gis.Items {
		keys = append(keys, client.ObjectKeyFromObject(&gis.Items[i]))
	}
	// Who holds address space there: the GuestIngresses of the pools and host Services.
	holders := []client.ObjectList{&corev1.ServiceList{}}
	if r.Cilium.Installed() {
		holders = append(holders, listOf(ingress.PoolGVK))
	}
	for _, list := range holders {
		if err := r.Client.List(ctx, list, readOnly, atAddress(key)); err != nil && !optional.IsMissing(err) {
			return nil, fmt.Errorf("listing what holds address space: %w", err)
		}
		if err := meta.EachListItem(list, func(o runtime.Object) error {
			if k, ok := ownership.GuestIngressOf(o.(client.Object)); ok {
				keys = append(keys, k)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	var near []ingress.Claimant
	for _, k := range keys {
		c, ok, err := r.claimant(ctx, w, k)
		if err != nil {
			return nil, err
		}
		if ok && !slices.ContainsFunc(near, func(n ingress.Claimant) bool { return n.GuestIngress == c.GuestIngress }) {
			near = append(near, c)
		}
	}
	w.near[key] = near
	return near, nil
}

// claimant is the GuestIngress key as a claimant, with what it holds (its eligibility is read
// by eligibleClaimants, for those that matter); ok is false when it does not exist or is in a
// namespace this instance does not watch.
func (r *Reconciler) claimant(ctx context.Context, w *hostWorld, key types.NamespacedName) (ingress.Claimant, bool, error) {
	if c, ok := w.claimants[key]; ok {
		return c, c.GuestIngress != nil, nil
	}
	if r.WatchNamespace != "" && key.Namespace != r.WatchNamespace {
		// A namespace this instance's cache does not hold: its GuestIngresses are another
		// instance's, and their pools count here as pools guestnet does not manage.
		return ingress.Claimant{}, false, nil
	}
	gi := &guestnetv1.GuestIngress{}
	if err := r.Client.Get(ctx, key, gi, readOnly); err != nil {
		if client.IgnoreNotFound(err) != nil {
			return ingress.Claimant{}, false, fmt.Errorf("getting GuestIngress %s: %w", key, err)
		}
		w.claimants[key] = ingress.Claimant{}
		return ingress.Claimant{}, false, nil
	}
	held, err := r.held(ctx, w, gi)
	if err != nil {
		return ingress.Claimant{}, false, err
	}
	c := ingress.Claimant{GuestIngress: gi, Held: held}
	w.claimants[key] = c
	return c, true, nil
}

// addressKeysToAsk are the address keys (atAddress) under which every claim that overlaps
// prefixes is filed: ingress.AddressQuery's, or "" (everything) when the index cannot narrow
// them down.
func addressKeysToAsk(prefixes []netip.Prefix) []string {
	keys, all := ingress.AddressQuery(prefixes)
	if all {
		return []string{""}
	}
	return keys
}

// atAddress selects what is filed under the address key; "" selects everything.
func atAddress(key string) client.ListOption {
	if key == "" {
		return &client.ListOptions{}
	}
	return client.MatchingFields{addressField: key}
}

// held is the address space gi's objects occupy on the host: the blocks of its own pool, and
// the IP its host Service requests or has when gi still asks for that IP (a host Service is in
// the tenant's namespace: what it requests counts only as far as gi's spec asks for it).
func (r *Reconciler) held(ctx context.Context, w *hostWorld, gi *guestnetv1.GuestIngress) (ingress.Claim, error) {
	var held ingress.Claim
	if pool := w.pools.Get(hostnames.Pool(gi)); pool != nil && ownership.IsOwnedBy(pool, gi) {
		held.Prefixes = ingress.PoolBlocks(pool)
	}
	services := &corev1.ServiceList{}
	if err := r.Client.List(ctx, services, readOnly, client.MatchingFields{madeForField: client.ObjectKeyFromObject(gi).String()}); err != nil {
		return held, fmt.Errorf("listing the host Services of GuestIngress %s: %w", client.ObjectKeyFromObject(gi), err)
	}
	if w.pools.err != nil {
		return held, w.pools.err
	}
	wants := ingress.ClaimOf(gi)
	for i := range services.Items {
		svc := &services.Items[i]
		if !ownership.IsOwnedBy(svc, gi) {
			continue
		}
		for _, ip := range ingress.ServiceIPs(svc) {
			if (ingress.Claim{IP: ip}).Collides(wants) {
				held.IP = ip
				return held, nil
			}
		}
	}
	return held, nil
}

// foreignPools are the pools that overlap what gi asks for and are not guestnet's for a
// GuestIngress that exists: an admin's, a shared one, or one of a GuestIngress that is gone.
func (r *Reconciler) foreignPools(ctx context.Context, w *hostWorld, gi *guestnetv1.GuestIngress) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, key := range addressKeysToAsk(ingress.PoolPrefixes(gi)) {
		pools := listOf(ingress.PoolGVK)
		if err := r.Client.List(ctx, pools, readOnly, atAddress(key)); err != nil {
			return nil, fmt.Errorf("listing CiliumLoadBalancerIPPools: %w", err)
		}
		for i := range pools.Items {
			pool := &pools.Items[i]
			if slices.ContainsFunc(out, func(p *unstructured.Unstructured) bool { return p.GetName() == pool.GetName() }) {
				continue
			}
			if owner, ok := ownership.GuestIngressOf(pool); ok {
				_, exists, err := r.claimant(ctx, w, owner)
				if err != nil {
					return nil, err
				}
				if exists {
					continue
				}
			}
			out = append(out, pool)
		}
	}
	return out, nil
}

// siblings are the other GuestIngresses of gi's namespace (a policy's per-namespace cap).
func (r *Reconciler) siblings(ctx context.Context, gi *guestnetv1.GuestIngress) ([]guestnetv1.GuestIngress, error) {
	list := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, list, readOnly, client.InNamespace(gi.Namespace)); err != nil {
		return nil, fmt.Errorf("listing GuestIngresses of namespace %s: %w", gi.Namespace, err)
	}
	return slices.DeleteFunc(list.Items, func(o guestnetv1.GuestIngress) bool { return o.Name == gi.Name }), nil
}

// ofCluster are the GuestIngresses of gi's Cluster, gi among them.
func (r *Reconciler) ofCluster(ctx context.Context, gi *guestnetv1.GuestIngress) ([]guestnetv1.GuestIngress, error) {
	list := &guestnetv1.GuestIngressList{}
	if err := clusterscope.ListOfCluster(ctx, r.Client, client.ObjectKey{Namespace: gi.Namespace, Name: gi.Spec.ClusterName}, list, readOnly); err != nil {
		return nil, fmt.Errorf("listing GuestIngresses of Cluster %s/%s: %w", gi.Namespace, gi.Spec.ClusterName, err)
	}
	return list.Items, nil
}

// madeFor are the host objects this instance made for the GuestIngress key: pools, L2
// policies and announcers annotated for it, host Services controlled by a GuestIngress of
// that name, each marked by this instance. (Services whose labels a tenant stripped are not
// in the cache; sweep finds those that a pool or L2 policy of the key names.)
func (r *Reconciler) madeFor(ctx context.Context, key types.NamespacedName) ([]client.Object, error) {
	lists := []client.ObjectList{&corev1.ServiceList{}}
	if r.Cilium.Installed() {
		lists = append(lists, listOf(ingress.PoolGVK), listOf(ingress.L2PolicyGVK))
	}
	for _, kind := range ingress.AnnouncerKinds().List() {
		if r.gateOf(kind).Installed() {
			lists = append(lists, listOf(kind.GroupVersionKind()))
		}
	}
	var out []client.Object
	for _, list := range lists {
		if err := r.Client.List(ctx, list, readOnly, client.MatchingFields{madeForField: key.String()}); err != nil {
			if optional.IsMissing(err) {
				continue
			}
			return nil, fmt.Errorf("listing what was made for GuestIngress %s: %w", key, err)
		}
		if err := meta.EachListItem(list, func(item runtime.Object) error {
			o := item.(client.Object)
			if k, ok := ownership.GuestIngressOf(o); ok && k == key && ownership.MadeByInstance(o, r.WatchFilterValue) {
				out = append(out, o)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// listOf is an empty list of the kind gvk (a Cilium, MetalLB or other unstructured kind).
func listOf(gvk schema.GroupVersionKind) *unstructured.UnstructuredList {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	return list
}

// cachedPools are the host's pools as one reconcile asks for them (policy.Pools): each by name
// from the manager's cache, every one only when a decision needs them all (a GuestIngress
// that lets LB-IPAM choose its IP). The cache's own objects (readOnly): never change them. A
// read that fails is kept in err, which the reconcile returns (policy.Pools has no errors).
type cachedPools struct {
	ctx    context.Context // the reconcile's: cachedPools lives as long as it
	reader client.Reader
	byName map[string]*unstructured.Unstructured
	all    []*unstructured.Unstructured
	err    error
}

// Get implements policy.Pools.
func (p *cachedPools) Get(name string) *unstructured.Unstructured {
	if pool, ok := p.byName[name]; ok {
		return pool
	}
	pool := ingress.NewPool()
	if err := p.reader.Get(p.ctx, client.ObjectKey{Name: name}, pool, readOnly); err != nil {
		if client.IgnoreNotFound(err) != nil && p.err == nil {
			p.err = fmt.Errorf("getting CiliumLoadBalancerIPPool %s: %w", name, err)
		}
		pool = nil
	}
	p.byName[name] = pool
	return pool
}

// All implements policy.Pools.
func (p *cachedPools) All() []*unstructured.Unstructured {
	if p.all != nil {
		return p.all
	}
	list := listOf(ingress.PoolGVK)
	if err := p.reader.List(p.ctx, list, readOnly); err != nil {
		if p.err == nil {
			p.err = fmt.Errorf("listing CiliumLoadBalancerIPPools: %w", err)
		}
		return nil
	}
	p.all = make([]*unstructured.Unstructured, len(list.Items))
	for i := range list.Items {
		p.all[i] = &list.Items[i]
	}
	slices.SortFunc(p.all, func(a, b *unstructured.Unstructured) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return p.all
}
