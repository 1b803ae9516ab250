package hostaddrs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Watcher keeps the host's own addresses (Read) current from a cache of its own, which holds
// only what Read lists: Nodes stripped to their addresses and pod CIDRs, the EndpointSlices of
// default/kubernetes and the ServiceCIDRs. The manager's cache holds
// only guestnet's Services and EndpointSlices and no Nodes, so these are watched apart.
// Controllers hear of every change of the Set through Source.
type Watcher struct {
	cache      ctrlcache.Cache
	noServices bool // the host serves no ServiceCIDRs

	mu          sync.Mutex
	current     Set
	err         error
	known       chan struct{} // closed once the cache synced and a Set was computed
	subscribers []chan event.GenericEvent
}

// knownTimeout bounds how long Reserved waits for the first Set: admission fails closed
// (the reconcile returns an error and is retried) rather than hold a worker.
const knownTimeout = 30 * time.Second

// NewWatcher makes a Watcher from mgr's config and adds it to mgr (it runs on every replica,
// as caches do).
func NewWatcher(mgr ctrl.Manager) (*Watcher, error) {
	_, err := mgr.GetRESTMapper().RESTMapping(networkingv1.SchemeGroupVersion.WithKind("ServiceCIDR").GroupKind(), "v1")
	noServiceCIDRs := meta.IsNoMatchError(err)
	if err != nil && !noServiceCIDRs {
		return nil, fmt.Errorf("looking up ServiceCIDRs: %w", err)
	}
	byObject := map[client.Object]ctrlcache.ByObject{
		&corev1.Node{}: {Transform: keepAddresses},
		&discoveryv1.EndpointSlice{}: {Namespaces: map[string]ctrlcache.Config{apiServerServiceNamespace: {
			LabelSelector: labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: apiServerServiceName})}}},
	}
	if !noServiceCIDRs {
		byObject[&networkingv1.ServiceCIDR{}] = ctrlcache.ByObject{}
	}
	c, err := ctrlcache.New(mgr.GetConfig(), ctrlcache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), ByObject: byObject,
		// Namespaced kinds other than those above are never read through this cache.
		DefaultNamespaces: map[string]ctrlcache.Config{apiServerServiceNamespace: {}},
	})
	if err != nil {
		return nil, fmt.Errorf("making the cache of host addresses: %w", err)
	}
	w := &Watcher{cache: c, noServices: noServiceCIDRs, known: make(chan struct{})}
	return w, mgr.Add(w)
}

// Fixed is a Watcher that knows set from the start and never changes (pure unit tests of
// the controllers, which run no cache).
func Fixed(set Set) *Watcher {
	w := &Watcher{current: set, known: make(chan struct{})}
	close(w.known)
	return w
}

// keepAddresses is a cache transform that keeps of a Node what Read reads: its name,
// addresses and pod CIDRs (a host's Nodes carry image lists and conditions guestnet never
// reads).
func keepAddresses(in any) (any, error) {
	n, ok := in.(*corev1.Node)
	if !ok {
		return in, nil
	}
	return &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}

// NeedLeaderElection is false: every replica keeps the Set (its controllers run when it leads; the Set must
// be known then).
func (w *Watcher) NeedLeaderElection() bool { return false }

// Start runs the cache, computes the Set once it synced, and again on every change of what it
// holds, telling the subscribers when the Set changed.
func (w *Watcher) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("hostaddrs")
	objs := []client.Object{&corev1.Node{}, &discoveryv1.EndpointSlice{}}
	if !w.noServices {
		objs = append(objs, &networkingv1.ServiceCIDR{})
	}
	var synced bool
	var syncedMu sync.Mutex
	changed := func() {
		syncedMu.Lock()
		defer syncedMu.Unlock()
		if synced {
			w.recompute(ctx, log)
		}
	}
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(any, any) { changed() },
		DeleteFunc: func(any) { changed() },
	}
	for _, o := range objs {
		inf, err := w.cache.GetInformer(ctx, o, ctrlcache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("watching %T for host addresses: %w", o, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	errs := make(chan error, 1)
	go func() { errs <- w.cache.Start(ctx) }()
	if !w.cache.WaitForCacheSync(ctx) {
		return errors.Join(errors.New("the cache of host addresses did not sync"), <-errs)
	}
	syncedMu.Lock()
	synced = true
	w.recompute(ctx, log)
	syncedMu.Unlock()
	close(w.known)
	return <-errs
}

// recompute reads the Set from the cache and tells the subscribers when it changed.
func (w *Watcher) recompute(ctx context.Context, log logr.Logger) {
	set, err := Read(ctx, w.cache)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.err = err
		return
	}
	before := w.current
	w.current, w.err = set, nil
	if set.Equal(before) {
		return
	}
	entries := set.Entries()
	log.Info("Host addresses changed: no GuestIngress gets them", "count", len(entries), "first", fmt.Sprint(entries[:min(len(entries), 20)]))
	for _, ch := range w.subscribers {
		select {
		case ch <- event.GenericEvent{Object: &corev1.Node{}}:
		default: // one is pending already: it brings the subscriber to the same Set
		}
	}
}

// Reserved is the host's own addresses now. Until the cache synced (at most knownTimeout),
// and when they cannot be read, it returns an error: nothing is admitted without them.
func (w *Watcher) Reserved(ctx context.Context) (Set, error) {
	timer := time.NewTimer(knownTimeout)
	defer timer.Stop()
	select {
	case <-w.known:
	case <-ctx.Done():
		return Set{}, ctx.Err()
	case <-timer.C:
		return Set{}, errors.New("the host's own addresses are not known yet (the cache of Nodes, EndpointSlices of default/kubernetes " +
			"and ServiceCIDRs has not synced: check guestnet's RBAC to list and watch them)")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return Set{}, fmt.Errorf("reading the host's own addresses: %w", w.err)
	}
	return w.current, nil
}

// Source is a source for a controller that calls h whenever the Set changes (with an object
// that carries nothing: the change may concern any GuestIngress or policy). Call it before
// the manager starts.
func (w *Watcher) Source(h handler.EventHandler) source.Source {
	ch := make(chan event.GenericEvent, 1)
	w.mu.Lock()
	w.subscribers = append(w.subscribers, ch)
	w.mu.Unlock()
	return source.Channel(ch, h)
}
