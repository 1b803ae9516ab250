package guestcache

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
)

// boundedCache is a guest's cache that starts the first informer of a capped kind
// (guestbounds.Kinds) only after a live count of that kind in the guest (Bounds.CheckKind), and
// counts what the informers it started hold (guestbounds.Cached): a guest within the cap is
// counted again without a request, and a kind no informer held when it was last counted is
// counted before one holds it. Reads (Get, List) and watches (GetInformer) of a kind start
// its informer, so all four pass here.
type boundedCache struct {
	ctrlcache.Cache
	scheme  *runtime.Scheme
	bounds  *guestbounds.Bounds
	cluster client.ObjectKey
	live    client.Reader

	mu sync.Mutex
	// started holds, per capped kind, an empty object of each type (typed, metadata-only,
	// unstructured: each has its own informer) whose informer was let start.
	started map[schema.GroupKind]map[reflect.Type]client.Object
	// shared holds the informers GetInformer gave, per kind and type: the watches of one
	// informer share one listener (sharedInformer).
	shared map[informerKey]*sharedInformer
}

// storeInformer is an informer that shows its store (client-go's; controller-runtime's
// informer of one namespace among several does not).
type storeInformer interface{ GetStore() toolscache.Store }

// informerKey is one informer of a cache: its kind, and the type it holds.
type informerKey struct {
	gvk schema.GroupVersionKind
	typ reflect.Type
}

var _ guestbounds.Cached = &boundedCache{}

// admit counts gvk live before the first informer of obj's type starts, and remembers it.
func (c *boundedCache) admit(ctx context.Context, gvk schema.GroupVersionKind, obj client.Object) error {
	if !guestbounds.Capped(gvk) {
		return nil
	}
	t := reflect.TypeOf(obj)
	c.mu.Lock()
	_, ok := c.started[gvk.GroupKind()][t]
	c.mu.Unlock()
	if ok {
		return nil
	}
	if err := c.bounds.CheckKind(ctx, c.cluster, c.live, gvk); err != nil {
		return err
	}
	sample, ok := reflect.New(t.Elem()).Interface().(client.Object)
	if !ok {
		return nil
	}
	sample.GetObjectKind().SetGroupVersionKind(gvk) // metadata-only and unstructured need it
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started == nil {
		c.started = map[schema.GroupKind]map[reflect.Type]client.Object{}
	}
	if c.started[gvk.GroupKind()] == nil {
		c.started[gvk.GroupKind()] = map[reflect.Type]client.Object{}
	}
	c.started[gvk.GroupKind()][t] = sample
	return nil
}

// admitObject is admit for obj's kind.
func (c *boundedCache) admitObject(ctx context.Context, obj client.Object) error {
	gvk, err := apiutil.GVKForObject(obj, c.scheme)
	if err != nil {
		return nil //nolint:nilerr // not a kind of the scheme: the watch says so itself
	}
	return c.admit(ctx, gvk, obj)
}

func (c *boundedCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := c.admitObject(ctx, obj); err != nil {
		return err
	}
	return c.Cache.Get(ctx, key, obj, opts...)
}

func (c *boundedCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if gvk, item, ok := c.itemOf(list); ok {
		if err := c.admit(ctx, gvk, item); err != nil {
			return err
		}
	}
	return c.Cache.List(ctx, list, opts...)
}

// GetInformer gives the informer of obj's kind and type, whose event handlers share one
// listener (sharedInformer): controller-runtime's watches (source.Kind) add theirs here.
func (c *boundedCache) GetInformer(ctx context.Context, obj client.Object, opts ...ctrlcache.InformerGetOption) (ctrlcache.Informer, error) {
	if err := c.admitObject(ctx, obj); err != nil {
		return nil, err
	}
	informer, err := c.Cache.GetInformer(ctx, obj, opts...)
	if err != nil {
		return nil, err
	}
	gvk, err := apiutil.GVKForObject(obj, c.scheme)
	if err != nil {
		return informer, nil //nolint:nilerr // the informer exists: it is only not shared
	}
	key := informerKey{gvk: gvk, typ: reflect.TypeOf(obj)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.shared[key]; ok {
		return s, nil
	}
	if c.shared == nil {
		c.shared = map[informerKey]*sharedInformer{}
	}
	s := &sharedInformer{Informer: informer, list: c.holdings(informer, obj)}
	c.shared[key] = s
	return s, nil
}

// RemoveInformer stops the informer of obj's kind and type and forgets its sharing: the next
// GetInformer gives the informer that replaces it.
func (c *boundedCache) RemoveInformer(ctx context.Context, obj client.Object) error {
	if gvk, err := apiutil.GVKForObject(obj, c.scheme); err == nil {
		c.mu.Lock()
		delete(c.shared, informerKey{gvk: gvk, typ: reflect.TypeOf(obj)})
		c.mu.Unlock()
	}
	return c.Cache.RemoveInformer(ctx, obj)
}

// holdings says how to list what informer holds, for a handler added after the first: its
// store; or, for an informer of one object (a watch of one named object in its namespace,
// which controller-runtime runs without a store it shows: cilium-config), a read of that
// object. Nil when neither: such an informer gives each handler a listener of its own.
func (c *boundedCache) holdings(informer ctrlcache.Informer, obj client.Object) func(context.Context) ([]client.Object, error) {
	if s, ok := informer.(storeInformer); ok {
		return func(context.Context) ([]client.Object, error) {
			var objs []client.Object
			for _, item := range s.GetStore().List() {
				if o, ok := item.(client.Object); ok {
					objs = append(objs, o)
				}
			}
			return objs, nil
		}
	}
	if obj.GetName() == "" || obj.GetNamespace() == "" {
		return nil
	}
	key := client.ObjectKeyFromObject(obj)
	return func(ctx context.Context) ([]client.Object, error) {
		one, ok := obj.DeepCopyObject().(client.Object)
		if !ok {
			return nil, fmt.Errorf("guestcache: %T is not an object", obj)
		}
		if err := c.Cache.Get(ctx, key, one); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return nil, err
		}
		return []client.Object{one}, nil
	}
}

// GetInformerForKind gives the informer of gvk itself (guestnet's watches ask by object).
func (c *boundedCache) GetInformerForKind(ctx context.Context, gvk schema.GroupVersionKind, opts ...ctrlcache.InformerGetOption) (ctrlcache.Informer, error) {
	if obj, err := c.scheme.New(gvk); err == nil {
		if obj, ok := obj.(client.Object); ok {
			if err := c.admit(ctx, gvk, obj); err != nil {
				return nil, err
			}
		}
	}
	return c.Cache.GetInformerForKind(ctx, gvk, opts...)
}

// itemOf is the kind of list's items and an empty item of the type its informer holds.
func (c *boundedCache) itemOf(list client.ObjectList) (schema.GroupVersionKind, client.Object, bool) {
	gvk, err := apiutil.GVKForObject(list, c.scheme)
	if err != nil || !strings.HasSuffix(gvk.Kind, "List") {
		return gvk, nil, false
	}
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	switch list.(type) {
	case *metav1.PartialObjectMetadataList:
		return gvk, &metav1.PartialObjectMetadata{}, true
	case *unstructured.UnstructuredList:
		return gvk, &unstructured.Unstructured{}, true
	}
	obj, err := c.scheme.New(gvk)
	if err != nil {
		return gvk, nil, false
	}
	item, ok := obj.(client.Object)
	return gvk, item, ok
}

// Count is how many objects the informers of gvk this cache started hold (the most of any
// type's), from their stores: no request. False when none was started.
func (c *boundedCache) Count(gvk schema.GroupVersionKind) (int, bool) {
	c.mu.Lock()
	samples := make([]client.Object, 0, len(c.started[gvk.GroupKind()]))
	for _, obj := range c.started[gvk.GroupKind()] {
		samples = append(samples, obj)
	}
	c.mu.Unlock()
	n, counted := 0, false
	for _, obj := range samples {
		// Started already: GetInformer returns it (BlockUntilSynced false: a count never waits).
		informer, err := c.Cache.GetInformer(context.Background(), obj, ctrlcache.BlockUntilSynced(false))
		if err != nil {
			continue
		}
		s, ok := informer.(storeInformer)
		if !ok {
			continue
		}
		n, counted = max(n, len(s.GetStore().ListKeys())), true
	}
	return n, counted
}
