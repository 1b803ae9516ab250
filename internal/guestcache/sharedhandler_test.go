package guestcache

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// These tests run client-go's informer over a ListWatch the test plays (a list, then a watch
// it feeds), wrapped to count the listeners it is given, and the handlers record what they
// are handed.

// Every handler of one informer gets what client-go would give it with a listener of its own
// (the initial list as adds, then every event), while the informer has one listener; the
// listener goes with the last handler.
func TestSharedInformer_OneListenerForEveryHandler(t *testing.T) {
	g := NewWithT(t)
	f := startInformer(t, nil, configMap("a"), configMap("b"))

	first := &recorder{}
	firstReg, err := f.shared.AddEventHandler(first)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(firstReg.HasSynced).Should(BeTrue())
	g.Eventually(first.got).Should(ConsistOf("add a initial", "add b initial"))

	// Added once the informer synced: the initial list at once, from the store.
	second := &recorder{}
	secondReg, err := f.shared.AddEventHandler(second)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(second.got()).To(ConsistOf("add a initial", "add b initial"))
	g.Expect(secondReg.HasSynced()).To(BeTrue())
	g.Expect(f.listeners()).To(Equal(1), "both handlers share one listener")

	f.watch.Add(configMap("c"))
	f.watch.Modify(withData(configMap("a")))
	f.watch.Delete(configMap("b"))
	for _, r := range []*recorder{first, second} {
		// The initial list in the store's order, then the events in theirs.
		g.Eventually(r.got).Should(HaveLen(5))
		g.Expect(r.got()[:2]).To(ConsistOf("add a initial", "add b initial"))
		g.Expect(r.got()[2:]).To(Equal([]string{"add c", "update a", "delete b"}))
	}

	g.Expect(f.shared.RemoveEventHandler(firstReg)).To(Succeed())
	f.watch.Add(configMap("d"))
	g.Eventually(second.got).Should(ContainElement("add d"))
	g.Consistently(first.got, 200*time.Millisecond).ShouldNot(ContainElement("add d"), "a removed handler gets nothing")
	g.Expect(f.listeners()).To(Equal(1))
	g.Expect(f.shared.RemoveEventHandler(firstReg)).NotTo(Succeed(), "removed already")

	g.Expect(f.shared.RemoveEventHandler(secondReg)).To(Succeed())
	g.Expect(f.listeners()).To(Equal(0), "the listener goes with the last handler")
	g.Expect(secondReg.HasSynced()).To(BeFalse(), "a removed handler's registration, without a listener")

	// A new first handler gets a new listener, and the initial list through it.
	third := &recorder{}
	thirdReg, err := f.shared.AddEventHandler(third)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(thirdReg.HasSynced).Should(BeTrue())
	g.Eventually(third.got).Should(ConsistOf("add a initial", "add c initial", "add d initial"))
	g.Expect(f.listeners()).To(Equal(1))
}

// A handler added before the informer's first list is stored, one that asks for resyncs, or
// one of an informer whose holdings cannot be listed gets a listener of its own: client-go
// replays a partly stored list exactly; a shared listener cannot resync for one handler.
func TestSharedInformer_OwnListenerBeforeTheFirstListAndForResyncs(t *testing.T) {
	g := NewWithT(t)
	listed := make(chan struct{})
	f := startInformer(t, listed, configMap("a"))

	first, second := &recorder{}, &recorder{}
	_, err := f.shared.AddEventHandler(first)
	g.Expect(err).NotTo(HaveOccurred())
	secondReg, err := f.shared.AddEventHandler(second)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.listeners()).To(Equal(2), "the informer has not listed yet")
	close(listed)
	g.Eventually(secondReg.HasSynced).Should(BeTrue())
	g.Eventually(first.got).Should(Equal([]string{"add a initial"}))
	g.Eventually(second.got).Should(Equal([]string{"add a initial"}))

	_, err = f.shared.AddEventHandlerWithResyncPeriod(&recorder{}, time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.listeners()).To(Equal(3))
	_, err = f.shared.AddEventHandler(&recorder{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.listeners()).To(Equal(3), "synced: shared")

	// An informer whose holdings cannot be listed cannot replay them: a listener each.
	f.shared.list = nil
	late := &recorder{}
	lateReg, err := f.shared.AddEventHandler(late)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.listeners()).To(Equal(4))
	g.Eventually(lateReg.HasSynced).Should(BeTrue())
	g.Eventually(late.got).Should(Equal([]string{"add a initial"}))
}

type informerFixture struct {
	shared *sharedInformer
	watch  *watch.FakeWatcher
	count  *countingInformer
}

func (f informerFixture) listeners() int { return f.count.listeners() }

// startInformer runs client-go's informer of ConfigMaps over a list of objs (after listed is
// closed, when it is not nil) and a watch the test feeds.
func startInformer(t *testing.T, listed <-chan struct{}, objs ...*corev1.ConfigMap) informerFixture {
	fake := watch.NewFake()
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			if listed != nil {
				select {
				case <-listed:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			list := &corev1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}
			for _, o := range objs {
				list.Items = append(list.Items, *o)
			}
			return list, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return fake, nil },
	}
	informer := toolscache.NewSharedIndexInformer(listThenWatch{lw}, &corev1.ConfigMap{}, 0, toolscache.Indexers{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go informer.RunWithContext(ctx)
	count := &countingInformer{SharedIndexInformer: informer}
	shared := &sharedInformer{Informer: count, list: func(context.Context) ([]client.Object, error) {
		var out []client.Object
		for _, o := range informer.GetStore().List() {
			out = append(out, o.(client.Object))
		}
		return out, nil
	}}
	return informerFixture{shared: shared, watch: fake, count: count}
}

// listThenWatch is a ListWatch without the watch-list semantics (a watch that starts with
// the list's objects and a bookmark), which the test's watch does not play.
type listThenWatch struct{ *toolscache.ListWatch }

func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

// countingInformer counts the listeners client-go's informer was given and not taken back.
type countingInformer struct {
	toolscache.SharedIndexInformer
	mu sync.Mutex
	n  int
}

func (c *countingInformer) AddEventHandlerWithOptions(h toolscache.ResourceEventHandler, o toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.SharedIndexInformer.AddEventHandlerWithOptions(h, o)
}

func (c *countingInformer) RemoveEventHandler(reg toolscache.ResourceEventHandlerRegistration) error {
	c.mu.Lock()
	c.n--
	c.mu.Unlock()
	return c.SharedIndexInformer.RemoveEventHandler(reg)
}

func (c *countingInformer) listeners() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// recorder records the notifications it is handed, in order.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) record(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, s)
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *recorder) OnAdd(obj any, initial bool) {
	s := "add " + obj.(*corev1.ConfigMap).Name
	if initial {
		s += " initial"
	}
	r.record(s)
}

func (r *recorder) OnUpdate(_, obj any) { r.record("update " + obj.(*corev1.ConfigMap).Name) }

func (r *recorder) OnDelete(obj any) { r.record("delete " + obj.(*corev1.ConfigMap).Name) }

func configMap(name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, ResourceVersion: "1"}}
}

func withData(cm *corev1.ConfigMap) *corev1.ConfigMap {
	cm.Data = map[string]string{"tunnel-port": "8473"}
	cm.ResourceVersion = "2"
	return cm
}
