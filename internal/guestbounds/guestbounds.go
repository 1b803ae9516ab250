// Package guestbounds caps what guestnet caches of one guest cluster. The ClusterCache keeps,
// per guest, an informer of every kind guestnet watches there (Services, webhook
// configurations, APIServices), each holding every object of that kind: a tenant who creates
// many objects in its own guest would make the manager that serves every tenant hold them
// all. Before a guest's client is handed out (clusterscope.GuestClient), its objects are
// counted with one metadata-only list request per kind (limit 1: the apiserver says how many
// are left); a guest with more than the cap of any kind gets no client: its GuestIngresses and
// GuestWebhookBridges report ClusterAvailable=False, reason GuestTooLarge, and guestnet
// starts no informer for it. The count of a guest over the cap is kept a minute (CheckEvery);
// a guest within it is counted again every minute (RecheckEvery) from what its cache holds,
// without a request (Cached), and the first informer of a kind is only started after a live
// count of that kind (CheckKind). docs/decisions/0009-bounded-guests.md, 0014.
package guestbounds

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultMaxObjects is the default cap per kind and guest.
const DefaultMaxObjects = 5000

// DefaultCheckEvery is how long the count of a guest over the cap is kept before it is taken
// again: how soon a guest that shrank is served again.
const DefaultCheckEvery = time.Minute

// DefaultRecheckEvery is how long the count of a guest within the cap is kept: how soon a
// guest that grew past it is noticed. Such a guest is connected and its recount reads what
// its informers hold (Cached): no request, so it can be as often as a guest over the cap.
const DefaultRecheckEvery = time.Minute

// pageSize is the page of the count's fallback (an apiserver that does not say how many
// items are left): metadata only, so a page is at most pageSize objects' metadata.
const pageSize = 100

// Kinds are the kinds counted: those guestnet caches per guest.
var Kinds = []schema.GroupVersionKind{
	corev1.SchemeGroupVersion.WithKind("Service"),
	admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfiguration"),
	admissionregistrationv1.SchemeGroupVersion.WithKind("MutatingWebhookConfiguration"),
	apiregistrationv1.SchemeGroupVersion.WithKind("APIService"),
}

// TooLargeError says that a guest holds more objects of a kind than guestnet caches.
type TooLargeError struct {
	Kind  string
	Count int
	Max   int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the guest holds more than %d %ss (at least %d), more than guestnet caches per guest cluster: "+
		"delete %ss in the guest until at most %d are left (or ask the provider admin to raise the manager's --guest-max-objects); "+
		"guestnet does nothing for this cluster until then and counts again every minute",
		e.Max, e.Kind, e.Count, e.Kind, e.Max)
}

// Bounds counts guests' objects and remembers the counts. The zero value caps at
// DefaultMaxObjects and counts again after DefaultCheckEvery.
type Bounds struct {
	// MaxObjects is the cap per kind; DefaultMaxObjects when zero, none when negative.
	MaxObjects int
	// CheckEvery is how long the count of a guest over the cap is kept; DefaultCheckEvery
	// when zero. RecheckEvery is that of a guest within it; DefaultRecheckEvery when zero.
	CheckEvery   time.Duration
	RecheckEvery time.Duration

	mu     sync.Mutex
	counts map[client.ObjectKey]count
	now    func() time.Time
}

type count struct {
	err error
	at  time.Time
	// live is when the guest was last counted live and found within the cap.
	live time.Time
}

// Cached is what a connected guest's cache holds: Count is how many objects of gvk its
// informers hold, without a request; false when no informer of gvk has started (then it
// holds none, and CheckKind counts the kind live before one starts).
type Cached interface {
	Count(gvk schema.GroupVersionKind) (n int, ok bool)
}

// Default is the manager's Bounds (main.go sets MaxObjects from its flag).
var Default = &Bounds{}

func (b *Bounds) max() int {
	if b.MaxObjects == 0 {
		return DefaultMaxObjects
	}
	return b.MaxObjects
}

// Check returns a *TooLargeError when the guest of cluster holds more objects of a kind than
// the cap; guest is an uncached reader of it. Counts younger than CheckEvery (RecheckEvery
// within the cap) are reused. A guest last found within the cap is counted again from
// cached, what its cache holds (no request); a guest counted for the first time, over the
// cap, or without cached, is counted live.
func (b *Bounds) Check(ctx context.Context, cluster client.ObjectKey, guest client.Reader, cached Cached) error {
	if b == nil || b.max() < 0 {
		return nil
	}
	b.mu.Lock()
	if b.now == nil {
		b.now = time.Now
	}
	c, known := b.counts[cluster]
	if known && b.now().Sub(c.at) < b.keep(c.err) {
		b.mu.Unlock()
		return c.err
	}
	b.mu.Unlock()

	if known && c.err == nil && cached != nil {
		err := b.countCached(cached)
		b.record(cluster, err, c.live)
		return err
	}
	err := b.count(ctx, guest, Kinds)
	if _, tooLarge := err.(*TooLargeError); err != nil && !tooLarge { //nolint:errorlint // count returns it unwrapped
		return fmt.Errorf("counting the guest's objects: %w", err)
	}
	b.record(cluster, err, time.Time{})
	return err
}

// CheckKind counts the objects of gvk in the guest of cluster live, before its cache starts
// the first informer of gvk (a kind Check found no informer of may have grown since): a
// *TooLargeError when there are more than the cap, which Check then returns too. It counts
// nothing for a kind that is not capped, or when the guest was counted live within the cap
// less than CheckEvery ago (its first informers start right after its first Check).
func (b *Bounds) CheckKind(ctx context.Context, cluster client.ObjectKey, guest client.Reader, gvk schema.GroupVersionKind) error {
	if b == nil || b.max() < 0 || !Capped(gvk) {
		return nil
	}
	b.mu.Lock()
	if b.now == nil {
		b.now = time.Now
	}
	c := b.counts[cluster]
	b.mu.Unlock()
	if c.err == nil && b.now().Sub(c.live) < cmp.Or(b.CheckEvery, DefaultCheckEvery) {
		return nil
	}
	err := b.count(ctx, guest, []schema.GroupVersionKind{gvk})
	switch err.(type) { //nolint:errorlint // count returns it unwrapped
	case nil:
		return nil
	case *TooLargeError:
		b.record(cluster, err, c.live)
		return err
	default:
		return fmt.Errorf("counting the guest's objects: %w", err)
	}
}

// Capped reports whether gvk is one of Kinds (any version).
func Capped(gvk schema.GroupVersionKind) bool {
	for _, k := range Kinds {
		if k.GroupKind() == gvk.GroupKind() {
			return true
		}
	}
	return false
}

// record keeps err as the count of cluster; live is when it was last counted live within the
// cap (now, when this count was live and within it).
func (b *Bounds) record(cluster client.ObjectKey, err error, live time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.counts == nil {
		b.counts = map[client.ObjectKey]count{}
	}
	now := b.now()
	if err == nil && live.IsZero() {
		live = now
	}
	b.counts[cluster] = count{err: err, at: now, live: live}
}

// keep is how long a count that ended with err is kept.
func (b *Bounds) keep(err error) time.Duration {
	if err != nil {
		return cmp.Or(b.CheckEvery, DefaultCheckEvery)
	}
	return cmp.Or(b.RecheckEvery, DefaultRecheckEvery)
}

// Forget drops what is known of cluster (its Cluster is gone).
func (b *Bounds) Forget(cluster client.ObjectKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.counts, cluster)
}

// countCached counts each kind the guest's cache holds, from the cache.
func (b *Bounds) countCached(cached Cached) error {
	limit := b.max()
	for _, gvk := range Kinds {
		if n, ok := cached.Count(gvk); ok && n > limit {
			return &TooLargeError{Kind: gvk.Kind, Count: n, Max: limit}
		}
	}
	return nil
}

// count counts each of kinds live, up to the cap plus one, all at once (one round trip to a
// guest apiserver, not one per kind); the first kind in the order of kinds that failed or is
// over the cap decides.
func (b *Bounds) count(ctx context.Context, guest client.Reader, kinds []schema.GroupVersionKind) error {
	limit := b.max()
	counts := make([]int, len(kinds))
	errs := make([]error, len(kinds))
	var wg sync.WaitGroup
	for i, gvk := range kinds {
		wg.Go(func() { counts[i], errs[i] = countKind(ctx, guest, gvk, limit) })
	}
	wg.Wait()
	for i, gvk := range kinds {
		if errs[i] != nil {
			return errs[i]
		}
		if counts[i] > limit {
			return &TooLargeError{Kind: gvk.Kind, Count: counts[i], Max: limit}
		}
	}
	return nil
}

// countKind counts the objects of gvk, stopping past limit: one request with limit 1 when
// the apiserver says how many items are left (remainingItemCount), else pages of pageSize.
func countKind(ctx context.Context, guest client.Reader, gvk schema.GroupVersionKind, limit int) (int, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := guest.List(ctx, list, client.Limit(1)); err != nil {
		return 0, fmt.Errorf("listing %ss: %w", gvk.Kind, err)
	}
	if list.Continue == "" {
		return len(list.Items), nil
	}
	if left := list.RemainingItemCount; left != nil {
		return len(list.Items) + int(*left), nil
	}
	n, cont := 0, ""
	for {
		page := &metav1.PartialObjectMetadataList{}
		page.SetGroupVersionKind(list.GroupVersionKind())
		if err := guest.List(ctx, page, client.Limit(pageSize), client.Continue(cont)); err != nil {
			return 0, fmt.Errorf("listing %ss: %w", gvk.Kind, err)
		}
		n += len(page.Items)
		if cont = page.Continue; cont == "" || n > limit {
			return n, nil
		}
	}
}
