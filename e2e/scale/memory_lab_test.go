package scale_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/controllers/clustercache"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

const (
	// memoryGuests guest clusters are connected for the memory guard.
	memoryGuests = 20
	// maxHeapPerGuestCluster bounds the manager's live heap per connected guest cluster (its
	// connection, the informers of the four kinds guestnet watches in a guest it exposes and
	// bridges and of its cilium-config, each with an event handler, and what they cache of a
	// guest holding only what a new apiserver holds). It is a count of bytes after a forced GC,
	// not a time: it does not depend on the machine's speed. Measured 2026-12-04
	// (docs/performance.md): internal/guestcache 233 KiB for the four kinds (152 KiB without
	// the handlers; CAPI's ClusterCache 610 KiB without them); the watch of cilium-config adds
	// 46 KiB (decision 14): 289 KiB.
	maxHeapPerGuestCluster = 330 << 10
	// maxGoroutinesPerGuestCluster bounds the goroutines per connected guest cluster (their
	// stacks are most of what it costs beside its heap: 69.5 goroutines, 232 KiB measured,
	// the informers' reflectors, queues, watch streams and event handlers; 13.1 of them the
	// watch of cilium-config).
	maxGoroutinesPerGuestCluster = 75
)

// The manager's live heap grows by a bounded amount per guest cluster it connects to
// (issue 21: a hosting provider plans with it; `make bench` measures the RSS at N=1,000).
// Connecting is what the manager's guest access costs whatever its controllers do: the test
// runs the guest access alone (no controllers), connects to memoryGuests guests of the lab's
// guest apiserver, and starts the informers guestnet's controllers start in each.
//
// It runs first in the package (file order), while the lab's guest holds only what a new
// apiserver holds, so that what each informer caches is the same on every run.
func TestScale_MemoryPerGuestCluster(t *testing.T) {
	if os.Getenv("SCALE_HEAP_PROFILE") != "" {
		runtime.MemProfileRate = 1 // every allocation from here on, for an exact breakdown
	}
	l := shared.Get(t)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var guests clustercache.ClusterCache
	_, stop, err := lab.RunManager(ctx, l, manager.Options{}, func(_ context.Context, _ ctrl.Manager, cc clustercache.ClusterCache, _ manager.Options) error {
		guests = cc
		return nil
	}, logr.Discard())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(stop()).To(Succeed()) }()

	// The base: the manager up, its host caches synced, no guest cluster yet.
	time.Sleep(2 * time.Second)
	base, baseStacks, baseGoroutines := liveHeap(), stacks(), runtime.NumGoroutine()
	writeHeapProfile(g, ".base")

	keys := make([]client.ObjectKey, memoryGuests)
	for i := range keys {
		gc, err := l.CreateGuestCluster(ctx, fmt.Sprintf("memory-%02d", i), "tenant", lab.WorkerTemplateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		keys[i] = client.ObjectKey{Namespace: gc.Namespace, Name: gc.Name}
	}
	// The next tests count the requests of a manager of their own: it must find no Cluster
	// of this one.
	defer func() {
		for _, key := range keys {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: key.Namespace}}
			g.Expect(client.IgnoreNotFound(l.Host.Client.Delete(ctx, ns))).To(Succeed())
		}
	}()
	for _, key := range keys {
		g.Eventually(func() error {
			_, err := guests.GetClient(ctx, key)
			return err
		}, time.Minute, 100*time.Millisecond).Should(Succeed(), "connecting to %s", key)
		// A watch of each kind with an event handler, as a controller's watch adds one: the
		// informer, and the handler's queue (client-go gives each handler a buffer of 1,024
		// notifications, 16 KiB).
		for _, kind := range []client.Object{
			&corev1.Service{},
			&admissionregistrationv1.ValidatingWebhookConfiguration{},
			&admissionregistrationv1.MutatingWebhookConfiguration{},
			&apiregistrationv1.APIService{},
		} {
			g.Expect(guests.Watch(ctx, key, handlerWatch{kind: kind})).To(Succeed(), "watching %T of %s", kind, key)
		}
	}
	for _, key := range keys {
		guest, err := guests.GetClient(ctx, key)
		g.Expect(err).NotTo(HaveOccurred())
		// Once each informer listed, a cached list answers.
		g.Eventually(func() error { return guest.List(ctx, &apiregistrationv1.APIServiceList{}) }, time.Minute).Should(Succeed())
	}
	// The watch of the guest's cilium-config alone (GuestIngresses and the workerports
	// controller add it, docs/decisions/0014-steady-state-reads.md): what it adds is logged.
	fourKinds, fourKindsGoroutines := liveHeap(), runtime.NumGoroutine()
	for _, key := range keys {
		g.Expect(guests.Watch(ctx, key, handlerWatch{kind: ports.CiliumConfig()})).To(Succeed(), "watching cilium-config of %s", key)
	}
	for _, key := range keys {
		guest, err := guests.GetClient(ctx, key)
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func() error {
			return client.IgnoreNotFound(guest.Get(ctx, ports.CiliumConfigKey, &corev1.ConfigMap{}))
		}, time.Minute).Should(Succeed())
	}
	t.Logf("per guest cluster, the watch of cilium-config: live heap %d B, %.1f goroutines",
		(liveHeap()-fourKinds)/memoryGuests, float64(runtime.NumGoroutine()-fourKindsGoroutines)/memoryGuests)
	perGuest := (liveHeap() - base) / memoryGuests
	stacksPerGuest := (stacks() - baseStacks) / memoryGuests
	goroutinesPerGuest := float64(runtime.NumGoroutine()-baseGoroutines) / memoryGuests
	writeHeapProfile(g, "")
	t.Logf("per guest cluster: live heap %d KiB, goroutine stacks %d KiB (%.1f goroutines); base heap %d KiB, %d guests",
		perGuest>>10, stacksPerGuest>>10, goroutinesPerGuest, base>>10, memoryGuests)
	g.Expect(perGuest).To(BeNumerically("<=", maxHeapPerGuestCluster),
		"the manager's live heap per guest cluster (docs/performance.md, \"Memory per guest cluster\")")
	g.Expect(goroutinesPerGuest).To(BeNumerically("<=", maxGoroutinesPerGuestCluster), "goroutines per guest cluster")
}

// handlerWatch watches kind with an event handler that does nothing, as a controller's watch
// (a Kind source) does: the informer's listener and its buffer.
type handlerWatch struct{ kind client.Object }

func (w handlerWatch) Name() string          { return fmt.Sprintf("memory-%T", w.kind) }
func (w handlerWatch) Object() client.Object { return w.kind }
func (w handlerWatch) Watch(c ctrlcache.Cache) error {
	informer, err := c.GetInformer(context.Background(), w.kind)
	if err != nil {
		return err
	}
	_, err = informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{})
	return err
}

// writeHeapProfile writes the heap profile to $SCALE_HEAP_PROFILE+suffix when it is set, for
// docs/performance.md's breakdown:
// `go tool pprof -sample_index=inuse_space -diff_base=<profile>.base <profile>`.
func writeHeapProfile(g Gomega, suffix string) {
	path := os.Getenv("SCALE_HEAP_PROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path + suffix)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pprof.Lookup("heap").WriteTo(f, 0)).To(Succeed())
	g.Expect(f.Close()).To(Succeed())
}

// stacks is the memory of the process's goroutine stacks in bytes.
func stacks() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.StackInuse)
}

// liveHeap is the process's live heap in bytes after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
