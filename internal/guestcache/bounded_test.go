package guestcache

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
)

// The first watch of a capped kind starts only after one live count of that kind (a limit=1
// list); from then on the guest's cached client counts what its informer holds without any
// request, which is how clusterscope.GuestClient recounts a connected guest.
func TestBoundedCache_CountsLiveOnceThenFromTheInformer(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)
	h.cache.opts.Bounds = &guestbounds.Bounds{MaxObjects: 10}
	h.api.services.Store(3)
	h.reconcile()
	g.Expect(h.connected()).To(BeTrue())

	g.Expect(h.cache.Watch(h.ctx, h.key, h.watcher("services"))).To(Succeed())
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeEquivalentTo(1))
	g.Expect(h.api.countLists.Load()).To(BeEquivalentTo(len(guestbounds.Kinds)), "each kind counted live once, at connect, and not again before the informer starts")

	guest, err := h.cache.GetClient(h.ctx, h.key)
	g.Expect(err).NotTo(HaveOccurred())
	cached, ok := guest.(guestbounds.Cached)
	g.Expect(ok).To(BeTrue(), "the cached client says what its cache holds")
	requests := h.api.requests.Load()
	n, ok := cached.Count(corev1.SchemeGroupVersion.WithKind("Service"))
	g.Expect(ok).To(BeTrue())
	g.Expect(n).To(BeZero(), "what the informer holds (the played apiserver's watch sends none)")
	_, ok = cached.Count(guestbounds.Kinds[1])
	g.Expect(ok).To(BeFalse(), "no informer of webhook configurations: they hold nothing")
	g.Expect(guest.List(h.ctx, &corev1.ServiceList{})).To(Succeed())
	g.Expect(h.api.requests.Load()).To(Equal(requests), "counting and reading the cache ask the guest nothing")
	g.Expect(h.api.countLists.Load()).To(BeEquivalentTo(len(guestbounds.Kinds)))
}

// A guest that holds more of a kind than the cap gets no informer of it: the watch that would
// start it fails with guestbounds' error, and no watch is opened; once it shrank, the same
// watch is added.
func TestBoundedCache_NoInformerPastTheCap(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)
	h.cache.opts.Bounds = &guestbounds.Bounds{MaxObjects: 10}
	h.api.services.Store(11)
	h.reconcile()
	g.Expect(h.connected()).To(BeTrue())

	err := h.cache.Watch(h.ctx, h.key, h.watcher("services"))
	var tooLarge *guestbounds.TooLargeError
	g.Expect(errors.As(err, &tooLarge)).To(BeTrue(), "%v", err)
	guest, err := h.cache.GetClient(h.ctx, h.key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(errors.As(guest.List(h.ctx, &corev1.ServiceList{}), &tooLarge)).To(BeTrue(), "a cached read would start it too")
	_, err = h.cache.guest(h.key).current().cache.GetInformerForKind(h.ctx, corev1.SchemeGroupVersion.WithKind("Service"))
	g.Expect(errors.As(err, &tooLarge)).To(BeTrue(), "and so would an informer asked for by kind: %v", err)
	g.Consistently(h.api.watchesStarted.Load, time.Second).Should(BeZero())

	h.api.services.Store(3)
	g.Expect(h.cache.Watch(h.ctx, h.key, h.watcher("services"))).To(Succeed())
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeEquivalentTo(1), "the refused watch was not taken for added")
}

// The informers GetInformer gives are shared by kind and type for as long as they run: once
// one is removed, the next GetInformer gives the informer that replaces it, not the stopped
// one, and a watch added to it opens a watch of the guest again.
func TestBoundedCache_AnInformerRemovedIsNotGivenAgain(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)
	h.reconcile()
	g.Expect(h.connected()).To(BeTrue())
	cache := h.cache.guest(h.key).current().cache

	first, err := cache.GetInformer(h.ctx, &corev1.Service{})
	g.Expect(err).NotTo(HaveOccurred())
	again, err := cache.GetInformer(h.ctx, &corev1.Service{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(BeIdenticalTo(first), "one informer of a kind, shared")
	_, err = first.AddEventHandler(toolscache.ResourceEventHandlerFuncs{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeEquivalentTo(1))

	g.Expect(cache.RemoveInformer(h.ctx, &corev1.Service{})).To(Succeed())
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeZero(), "the removed informer stopped")
	next, err := cache.GetInformer(h.ctx, &corev1.Service{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(next).NotTo(BeIdenticalTo(first), "not the stopped informer")
	_, err = next.AddEventHandler(toolscache.ResourceEventHandlerFuncs{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeEquivalentTo(1), "the new informer watches")
}
