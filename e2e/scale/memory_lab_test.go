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
	// bridges and of its cilium-config, with the seven watches guestnet's controllers add to
	// them, and what they cache of a guest holding only what a new apiserver holds). It is a
	// count of bytes after a forced GC, not a time: it does not depend on the machine's speed.
	// Measured 2026-12-05 (docs/performance.md): 290 KiB, the watches of one informer sharing
	// its listener (internal/guestcache.sharedInformer); a listener per watch measured 327
	// KiB (two more listeners' buffers, 16 KiB each), which this bound does not let pass.
	maxHeapPerGuestCluster = 310 << 10
	// maxGoroutinesPerGuestCluster bounds the goroutines per connected guest cluster (their
	// stacks are most of what it costs beside its heap: 69.5 goroutines, 236 KiB measured,
	// about 13 per informer: reflector, queue, watch stream, listener; a listener per watch
	// adds 4).
	maxGoroutinesPerGuestCluster = 72
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
	}
	// A guest guestnet exposes (a GuestIngress): its Services and its cilium-config (one
	// ConfigMap, docs/decisions/0014-steady-state-reads.md), watched as the controllers watch
	// them: a watch with an event handler each, the GuestIngress controller's of both kinds
	// and the workerports controller's of cilium-config. Each informer starts with its first
	// watch; the watches of one informer share one listener (client-go gives each listener a
	// buffer of 1,024 notifications, 16 KiB, and two goroutines).
	watchAll(ctx, g, guests, keys,
		handlerWatch{by: "guestingress", kind: &corev1.Service{}},
		handlerWatch{by: "guestingress", kind: ports.CiliumConfig()},
		handlerWatch{by: "workerports", kind: ports.CiliumConfig()})
	exposedHeap, exposedStacks, exposedGoroutines := liveHeap(), stacks(), runtime.NumGoroutine()
	t.Logf("per guest cluster it exposes (Services, cilium-config): live heap %d KiB, goroutine stacks %d KiB (%.1f goroutines)",
		(exposedHeap-base)/memoryGuests>>10, (exposedStacks-baseStacks)/memoryGuests>>10, float64(exposedGoroutines-baseGoroutines)/memoryGuests)
	// And bridges (a GuestWebhookBridge): its webhook configurations and APIServices, and
	// the bridge controller's watch of the Services.
	watchAll(ctx, g, guests, keys,
		handlerWatch{by: "bridge", kind: &admissionregistrationv1.ValidatingWebhookConfiguration{}},
		handlerWatch{by: "bridge", kind: &admissionregistrationv1.MutatingWebhookConfiguration{}},
		handlerWatch{by: "bridge", kind: &apiregistrationv1.APIService{}},
		handlerWatch{by: "bridge", kind: &corev1.Service{}})
	t.Logf("per guest cluster, what bridging adds: live heap %d KiB, goroutine stacks %d KiB (%.1f goroutines)",
		(liveHeap()-exposedHeap)/memoryGuests>>10, (stacks()-exposedStacks)/memoryGuests>>10, float64(runtime.NumGoroutine()-exposedGoroutines)/memoryGuests)
	perGuest := (liveHeap() - base) / memoryGuests
	stacksPerGuest := (stacks() - baseStacks) / memoryGuests
	goroutinesPerGuest := float64(runtime.NumGoroutine()-baseGoroutines) / memoryGuests
	writeHeapProfile(g, "")
	t.Logf("per guest cluster it exposes and bridges: live heap %d KiB, goroutine stacks %d KiB (%.1f goroutines); base heap %d KiB, %d guests",
		perGuest>>10, stacksPerGuest>>10, goroutinesPerGuest, base>>10, memoryGuests)
	g.Expect(perGuest).To(BeNumerically("<=", maxHeapPerGuestCluster),
		"the manager's live heap per guest cluster (docs/performance.md, \"Memory per guest cluster\")")
	g.Expect(goroutinesPerGuest).To(BeNumerically("<=", maxGoroutinesPerGuestCluster), "goroutines per guest cluster")
}

// watchAll starts each of watches in the guest of each of keys, and waits until a cached
// read of each kind answers (its informer listed).
func watchAll(ctx context.Context, g Gomega, guests clustercache.ClusterCache, keys []client.ObjectKey, watches ...handlerWatch) {
	for _, key := range keys {
		for _, w := range watches {
			g.Expect(guests.Watch(ctx, key, w)).To(Succeed(), "watch %s of %s", w.Name(), key)
		}
	}
	for _, key := range keys {
		guest, err := guests.GetClient(ctx, key)
		g.Expect(err).NotTo(HaveOccurred())
		for _, w := range watches {
			g.Eventually(func() error {
				obj := w.kind.DeepCopyObject().(client.Object)
				return client.IgnoreNotFound(guest.Get(ctx, client.ObjectKeyFromObject(w.kind), obj))
			}, time.Minute).Should(Succeed(), "a cached read of %T in %s", w.kind, key)
		}
	}
}

// handlerWatch is a controller's (by) watch of kind with an event handler that does nothing,
// as a controller's watch (a Kind source) adds one to the informer.
type handlerWatch struct {
	by   string
	kind client.Object
}

func (w handlerWatch) Name() string          { return fmt.Sprintf("memory-%s-%T", w.by, w.kind) }
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
// `go tool pprof -sample_index=inuse_space -diff_base=<profile>.base <profile>`; and every
// goroutine's stack and its creator to $SCALE_HEAP_PROFILE+suffix+".goroutines" (which
// goroutines an informer costs, and whose they are).
func writeHeapProfile(g Gomega, suffix string) {
	path := os.Getenv("SCALE_HEAP_PROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path + suffix)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pprof.Lookup("heap").WriteTo(f, 0)).To(Succeed())
	g.Expect(f.Close()).To(Succeed())
	f, err = os.Create(path + suffix + ".goroutines")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pprof.Lookup("goroutine").WriteTo(f, 2)).To(Succeed())
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
