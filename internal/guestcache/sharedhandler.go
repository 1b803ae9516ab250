package guestcache

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// sharedInformer gives the event handlers that guestnet's controllers add to one informer of
// a guest (the GuestIngress and workerports controllers both watch cilium-config; the
// GuestIngress and bridge controllers both watch Services) one listener of that informer:
// client-go gives every listener a buffer of 1,024 notifications (16 KiB) and two goroutines,
// about 23 KiB per guest and handler (docs/performance.md, "Memory per guest cluster").
//
// The listener hands each notification to every handler in turn, as client-go's own listener
// hands it to one: a handler must not block (controller-runtime's only map and enqueue). A
// handler added after the first gets what the informer holds as initial adds, as client-go
// does for a listener added to a running informer; since those come from the store, a handler
// may see an object's add twice, or the delete of an object it never saw added, which
// handlers that enqueue a reconcile do not mind. A handler that asks for resyncs of its own
// gets a listener of its own.
type sharedInformer struct {
	ctrlcache.Informer
	// list lists what the informer holds, for a handler added after the first (nil: it
	// cannot, and each handler after the first gets a listener of its own).
	list func(ctx context.Context) ([]client.Object, error)

	mu       sync.RWMutex
	listener toolscache.ResourceEventHandlerRegistration
	handlers []*sharedHandler
}

// sharedHandler is one handler of a sharedInformer, and its registration.
type sharedHandler struct {
	toolscache.ResourceEventHandler
	informer *sharedInformer
}

// HasSynced is the shared listener's: the informer synced and its initial list was handed
// on (false once the last handler was removed and the listener with it).
func (h *sharedHandler) HasSynced() bool {
	reg := h.informer.listenerReg()
	return reg != nil && reg.HasSynced()
}

func (h *sharedHandler) HasSyncedChecker() toolscache.DoneChecker {
	if reg := h.informer.listenerReg(); reg != nil {
		return reg.HasSyncedChecker()
	}
	return h.informer.Informer.HasSyncedChecker()
}

func (i *sharedInformer) listenerReg() toolscache.ResourceEventHandlerRegistration {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.listener
}

func (i *sharedInformer) AddEventHandler(handler toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.AddEventHandlerWithOptions(handler, toolscache.HandlerOptions{})
}

func (i *sharedInformer) AddEventHandlerWithOptions(handler toolscache.ResourceEventHandler, options toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	if options.ResyncPeriod != nil && *options.ResyncPeriod > 0 {
		return i.Informer.AddEventHandlerWithOptions(handler, options)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.listener != nil && (i.list == nil || !i.Informer.HasSynced()) {
		// What the informer holds cannot be listed; or, before its first list is stored,
		// the store holds a part of it that the listener may have handed on already:
		// client-go's own listener replays it exactly.
		return i.Informer.AddEventHandlerWithOptions(handler, options)
	}
	h := &sharedHandler{ResourceEventHandler: handler, informer: i}
	if i.listener == nil {
		// The first handler: client-go hands the listener the initial list.
		reg, err := i.Informer.AddEventHandlerWithOptions(sharedListener{i}, options)
		if err != nil {
			return nil, err
		}
		i.listener = reg
	} else {
		// The listener cannot hand on while the lock is held: what the synced store holds
		// now is this handler's initial list, and every later notification follows it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		objs, err := i.list(ctx)
		if err != nil {
			return nil, err
		}
		for _, obj := range objs {
			handler.OnAdd(obj, true)
		}
	}
	i.handlers = append(i.handlers, h)
	return h, nil
}

func (i *sharedInformer) AddEventHandlerWithResyncPeriod(handler toolscache.ResourceEventHandler, resyncPeriod time.Duration) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.AddEventHandlerWithOptions(handler, toolscache.HandlerOptions{ResyncPeriod: &resyncPeriod})
}

// RemoveEventHandler removes a handler; the listener goes with the last one.
func (i *sharedInformer) RemoveEventHandler(reg toolscache.ResourceEventHandlerRegistration) error {
	h, ok := reg.(*sharedHandler)
	if !ok {
		return i.Informer.RemoveEventHandler(reg) // a handler with a listener of its own
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	n := len(i.handlers)
	i.handlers = slices.DeleteFunc(i.handlers, func(x *sharedHandler) bool { return x == h })
	if len(i.handlers) == n {
		return errors.New("guestcache: the handler is not one of this informer's")
	}
	if len(i.handlers) > 0 || i.listener == nil {
		return nil
	}
	err := i.Informer.RemoveEventHandler(i.listener)
	i.listener = nil
	return err
}

// sharedListener is the one handler the informer has: it hands each notification to every
// handler of i.
type sharedListener struct{ i *sharedInformer }

func (l sharedListener) each(f func(toolscache.ResourceEventHandler)) {
	l.i.mu.RLock()
	defer l.i.mu.RUnlock()
	for _, h := range l.i.handlers {
		f(h.ResourceEventHandler)
	}
}

func (l sharedListener) OnAdd(obj any, isInInitialList bool) {
	l.each(func(h toolscache.ResourceEventHandler) { h.OnAdd(obj, isInInitialList) })
}

func (l sharedListener) OnUpdate(oldObj, newObj any) {
	l.each(func(h toolscache.ResourceEventHandler) { h.OnUpdate(oldObj, newObj) })
}

func (l sharedListener) OnDelete(obj any) {
	l.each(func(h toolscache.ResourceEventHandler) { h.OnDelete(obj) })
}
