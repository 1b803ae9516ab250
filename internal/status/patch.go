package status

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Patch writes what one reconcile changed on obj since before (the object as it was read):
// the whole status, conditions and observedGeneration included, in one status patch, then
// the rest (the finalizers) in one patch; nothing when nothing changed. Cluster API's patch
// helper writes the conditions and the other status fields in two patches, so a reconcile
// that changes both (each step of a creation does) costs two writes; guestnet is the only
// writer of its objects' status, so one suffices.
//
// The status patch carries before's resourceVersion: when before was stale (the cache had
// not seen guestnet's own last write, or the object changed since), the apiserver refuses it
// with a conflict, and the reconcile is retried on the fresh object instead of writing a
// status derived from an old one.
//
// written is true when something was written (before's resourceVersion is then replaced).
func Patch(ctx context.Context, c client.Client, before, obj client.Object) (written bool, err error) {
	data, err := client.MergeFrom(before).Data(obj)
	if err != nil {
		return false, err
	}
	changes := map[string]any{}
	if err := json.Unmarshal(data, &changes); err != nil {
		return false, err
	}
	if status, ok := changes["status"]; ok {
		delete(changes, "status")
		statusPatch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": before.GetResourceVersion()},
			"status":   status,
		})
		if err != nil {
			return false, err
		}
		// A copy receives the answer: obj keeps what the reconcile derived.
		if err := c.Status().Patch(ctx, obj.DeepCopyObject().(client.Object), client.RawPatch(types.MergePatchType, statusPatch)); err != nil {
			if apierrors.IsNotFound(err) && !obj.GetDeletionTimestamp().IsZero() {
				return false, nil // gone: nothing left to report on
			}
			return false, fmt.Errorf("patching status: %w", err)
		}
		written = true
	}
	if len(changes) == 0 {
		return written, nil
	}
	rest, err := json.Marshal(changes)
	if err != nil {
		return written, err
	}
	if err := c.Patch(ctx, obj.DeepCopyObject().(client.Object), client.RawPatch(types.MergePatchType, rest)); err != nil {
		return written, fmt.Errorf("patching metadata: %w", err)
	}
	return true, nil
}

// OwnWrites remembers, per object, the resourceVersions that guestnet's own last writes
// replaced. A reconcile that reads one of them reads from a cache that has not seen those
// writes yet: whatever it derived would be written on a stale object (and refused with a
// conflict). It can stop instead, because the writes' own watch events bring the object back
// as soon as the cache has them.
type OwnWrites struct {
	mu       sync.Mutex
	replaced map[types.NamespacedName][]string
}

// ownWritesKept is how many replaced versions are kept per object: a reconcile writes at
// most two (the finalizer, then the status).
const ownWritesKept = 4

// Stale is true when obj is a version an own write replaced.
func (w *OwnWrites) Stale(obj client.Object) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Contains(w.replaced[client.ObjectKeyFromObject(obj)], obj.GetResourceVersion())
}

// Replaced records that an own write replaced version resourceVersion of the object key.
func (w *OwnWrites) Replaced(key types.NamespacedName, resourceVersion string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.replaced == nil {
		w.replaced = map[types.NamespacedName][]string{}
	}
	kept := append(w.replaced[key], resourceVersion)
	w.replaced[key] = kept[max(0, len(kept)-ownWritesKept):]
}

// Forget drops what is known about an object that is gone.
func (w *OwnWrites) Forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.replaced, key)
}
