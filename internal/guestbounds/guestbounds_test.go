package guestbounds

import (
	"context"
	"fmt"
	"testing"
	"time"

	gm "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// guest answers metadata lists with n objects of every kind, as an apiserver pages them:
// remainingItemCount when it knows it (or not), a continue token while items are left.
type guest struct {
	client.Reader
	n         map[string]int
	remaining bool
	requests  int
}

func (g *guest) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
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
			b := &Bounds{MaxObjects: 250, now: func() time.Time { return now }}
			small := &guest{n: map[string]int{"ServiceList": 250, "APIServiceList": 30}, remaining: remaining}
			g.Expect(b.Check(ctx, key, small)).To(gm.Succeed(), "at the cap is within it")

			large := &guest{n: map[string]int{"ServiceList": 20000}, remaining: remaining}
			other := client.ObjectKey{Namespace: "ns", Name: "large"}
			err := b.Check(ctx, other, large)
			var tooLarge *TooLargeError
			g.Expect(err).To(gm.BeAssignableToTypeOf(tooLarge))
			g.Expect(err.Error()).To(gm.And(gm.ContainSubstring("more than 250 Services"), gm.ContainSubstring("--guest-max-objects")))
			if remaining {
				g.Expect(large.requests).To(gm.Equal(1), "one request of one item")
			} else {
				g.Expect(large.requests).To(gm.BeNumerically("<=", 1+251/pageSize+1), "pages stop past the cap")
			}

			// The count is kept, then taken again.
			requests := large.requests
			g.Expect(b.Check(ctx, other, large)).To(gm.HaveOccurred())
			g.Expect(large.requests).To(gm.Equal(requests))
			large.n["ServiceList"] = 10
			now = now.Add(DefaultCheckEvery)
			g.Expect(b.Check(ctx, other, large)).To(gm.Succeed(), "a guest that shrank is cached again")

			// Within the cap, the count is kept longer.
			large.n["ServiceList"] = 20000
			now = now.Add(DefaultCheckEvery)
			g.Expect(b.Check(ctx, other, large)).To(gm.Succeed(), "a count within the cap is kept %s", DefaultRecheckEvery)
			now = now.Add(DefaultRecheckEvery)
			g.Expect(b.Check(ctx, other, large)).To(gm.HaveOccurred(), "then taken again")
		})
	}
}

func TestNoCap(t *testing.T) {
	g := gm.NewWithT(t)
	large := &guest{n: map[string]int{"ServiceList": 20000}}
	g.Expect((&Bounds{MaxObjects: -1}).Check(context.Background(), client.ObjectKey{}, large)).To(gm.Succeed())
	g.Expect(large.requests).To(gm.BeZero())
	var b *Bounds
	g.Expect(b.Check(context.Background(), client.ObjectKey{}, large)).To(gm.Succeed())
}
