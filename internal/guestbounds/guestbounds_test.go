package guestbounds

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	gm "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// guest answers metadata lists with n objects of every kind, as an apiserver pages them:
// remainingItemCount when it knows it (or not), a continue token while items are left.
type guest struct {
	client.Reader
	n         map[string]int
	remaining bool
	mu        sync.Mutex
	requests  int
}

func (g *guest) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	g.mu.Lock() // the kinds are counted at once
	defer g.mu.Unlock()
	g.requests++
	o := (&client.ListOptions{}).ApplyOptions(opts)
	l := list.(*metav1.PartialObjectMetadataList)
	n := g.n[l.GetObjectKind().GroupVersionKind().Kind]
	start := 0
	if o.Continue != "" {
		_, _ = fmt.Sscan(o.Continue, &start)
	}
	end := min(n, start+int(o.Limit))
	l.Items = make([]metav1.PartialObjectMetadata, end-start)
	if end < n {
		l.Continue = fmt.Sprint(end)
		if g.remaining {
			l.RemainingItemCount = ptr.To(int64(n - end))
		}
	}
	return nil
}

func TestCheck(t *testing.T) {
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "ns", Name: "c"}
	for _, remaining := range []bool{true, false} {
		t.Run(fmt.Sprintf("remainingItemCount=%v", remaining), func(t *testing.T) {
			g := gm.NewWithT(t)
			now := time.Now()
			b := &Bounds{MaxObjects: 250, RecheckEvery: 10 * time.Minute, now: func() time.Time { return now }}
			small := &guest{n: map[string]int{"ServiceList": 250, "APIServiceList": 30}, remaining: remaining}
			g.Expect(b.Check(ctx, key, small, nil)).To(gm.Succeed(), "at the cap is within it")

			large := &guest{n: map[string]int{"ServiceList": 20000}, remaining: remaining}
			other := client.ObjectKey{Namespace: "ns", Name: "large"}
			err := b.Check(ctx, other, large, nil)
			var tooLarge *TooLargeError
			g.Expect(err).To(gm.BeAssignableToTypeOf(tooLarge))
			g.Expect(err.Error()).To(gm.And(gm.ContainSubstring("more than 250 Services"), gm.ContainSubstring("--guest-max-objects")))
			// Every kind is counted (at once): the others hold nothing, one request each.
			if remaining {
				g.Expect(large.requests).To(gm.Equal(len(Kinds)), "one request of one item per kind")
			} else {
				g.Expect(large.requests).To(gm.BeNumerically("<=", 1+251/pageSize+1+len(Kinds)-1), "pages stop past the cap")
			}

			// The count is kept, then taken again.
			requests := large.requests
			g.Expect(b.Check(ctx, other, large, nil)).To(gm.HaveOccurred())
			g.Expect(large.requests).To(gm.Equal(requests))
			large.n["ServiceList"] = 10
			now = now.Add(DefaultCheckEvery)
			g.Expect(b.Check(ctx, other, large, nil)).To(gm.Succeed(), "a guest that shrank is cached again")

			// Within the cap, the count is kept longer.
			large.n["ServiceList"] = 20000
			now = now.Add(DefaultCheckEvery)
			g.Expect(b.Check(ctx, other, large, nil)).To(gm.Succeed(), "a count within the cap is kept %s", b.RecheckEvery)
			now = now.Add(b.RecheckEvery)
			g.Expect(b.Check(ctx, other, large, nil)).To(gm.HaveOccurred(), "then taken again")
		})
	}
}

func TestNoCap(t *testing.T) {
	g := gm.NewWithT(t)
	large := &guest{n: map[string]int{"ServiceList": 20000}}
	g.Expect((&Bounds{MaxObjects: -1}).Check(context.Background(), client.ObjectKey{}, large, nil)).To(gm.Succeed())
	g.Expect(large.requests).To(gm.BeZero())
	var b *Bounds
	g.Expect(b.Check(context.Background(), client.ObjectKey{}, large, nil)).To(gm.Succeed())
}

// cache plays what a connected guest's informers hold: n objects of each kind it has an
// informer of.
type cache map[string]int

func (c cache) Count(gvk schema.GroupVersionKind) (int, bool) {
	n, ok := c[gvk.Kind]
	return n, ok
}

// A connected guest within the cap is counted again from what its cache holds: no request,
// however often, and one that grew past the cap is noticed at the first recount after it
// grew (RecheckEvery). Over the cap, it is counted live again (it may shrink).
func TestCheck_AConnectedGuestIsRecountedFromItsCache(t *testing.T) {
	g := gm.NewWithT(t)
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "ns", Name: "c"}
	now := time.Now()
	b := &Bounds{MaxObjects: 250, now: func() time.Time { return now }}
	live := &guest{n: map[string]int{"ServiceList": 200}, remaining: true}
	cached := cache{"Service": 200} // only Services are watched: a GuestIngress's guest

	g.Expect(b.Check(ctx, key, live, cached)).To(gm.Succeed())
	g.Expect(live.requests).To(gm.Equal(len(Kinds)), "a guest counted for the first time is counted live")

	for range 100 {
		now = now.Add(DefaultRecheckEvery)
		g.Expect(b.Check(ctx, key, live, cached)).To(gm.Succeed())
	}
	g.Expect(live.requests).To(gm.Equal(len(Kinds)), "a guest within the cap costs no request at steady state")

	// It grows past the cap while connected: its informer holds more than the cap.
	live.n["ServiceList"], cached["Service"] = 300, 300
	g.Expect(b.Check(ctx, key, live, cached)).To(gm.Succeed(), "the count is kept RecheckEvery")
	now = now.Add(DefaultRecheckEvery)
	err := b.Check(ctx, key, live, cached)
	var tooLarge *TooLargeError
	g.Expect(err).To(gm.BeAssignableToTypeOf(tooLarge), "noticed at the first recount after it grew")
	g.Expect(err.Error()).To(gm.ContainSubstring("more than 250 Services (at least 300)"))
	g.Expect(live.requests).To(gm.Equal(len(Kinds)), "noticed without a live list")

	// Over the cap, the next count is live: it shrank.
	live.n["ServiceList"] = 10
	now = now.Add(DefaultCheckEvery)
	g.Expect(b.Check(ctx, key, live, cached)).To(gm.Succeed(), "a guest that shrank is served again")
	g.Expect(live.requests).To(gm.Equal(2*len(Kinds)), "counted live")

	// Without what its cache holds (a ClusterCache that does not say), counted live as before.
	other := client.ObjectKey{Namespace: "ns", Name: "other"}
	live.requests = 0
	g.Expect(b.Check(ctx, other, live, nil)).To(gm.Succeed())
	now = now.Add(DefaultRecheckEvery)
	g.Expect(b.Check(ctx, other, live, nil)).To(gm.Succeed())
	g.Expect(live.requests).To(gm.Equal(2 * len(Kinds)))
}

// The first informer of a kind no recount could see (none held it) starts only after a live
// count of that kind: a guest whose webhook configurations grew past the cap before its first
// bridge is refused then, not once they are cached.
func TestCheckKind(t *testing.T) {
	g := gm.NewWithT(t)
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "ns", Name: "c"}
	now := time.Now()
	b := &Bounds{MaxObjects: 250, now: func() time.Time { return now }}
	live := &guest{n: map[string]int{"ServiceList": 10}, remaining: true}
	webhooks := Kinds[1]

	g.Expect(b.Check(ctx, key, live, cache{"Service": 10})).To(gm.Succeed())
	g.Expect(b.CheckKind(ctx, key, live, webhooks)).To(gm.Succeed())
	g.Expect(live.requests).To(gm.Equal(len(Kinds)), "counted live less than CheckEvery ago: not again")
	g.Expect(b.CheckKind(ctx, key, live, corev1ConfigMaps)).To(gm.Succeed())
	g.Expect(live.requests).To(gm.Equal(len(Kinds)), "a kind that is not capped is not counted")

	now = now.Add(time.Hour)
	live.n["ValidatingWebhookConfigurationList"] = 300
	err := b.CheckKind(ctx, key, live, webhooks)
	g.Expect(err).To(gm.HaveOccurred())
	g.Expect(err.Error()).To(gm.ContainSubstring("more than 250 ValidatingWebhookConfigurations"))
	g.Expect(live.requests).To(gm.Equal(len(Kinds)+1), "one live list of that kind")
	g.Expect(b.Check(ctx, key, live, cache{"Service": 10})).To(gm.MatchError(err), "and the guest gets no client")
}

var corev1ConfigMaps = schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
