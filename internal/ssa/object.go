package ssa

import (
	"bytes"
	"context"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// Deciding whether an apply to an unstructured object (Cilium's kinds, whose schema guestnet
// does not compile in) would change anything, and applying it.

// ObjectUpToDate is ServiceUpToDate for unstructured objects: every value of desired is in live, and guestnet's field
// manager owns nothing desired lacks (else an apply would remove it, e.g. a label the user
// removed from spec.loadBalancer.labels).
func ObjectUpToDate(desired, live *unstructured.Unstructured) bool {
	if !Subset(desired.Object, live.Object) {
		return false
	}
	owned, ok := ownedFields(live, ownership.FieldManager)
	if !ok {
		return false
	}
	upToDate := true
	owned.Iterate(func(p fieldpath.Path) {
		if upToDate && !hasPath(desired.Object, p) {
			upToDate = false
		}
	})
	return upToDate
}

// ownedFields is the field set manager applied to obj; ok is false when it cannot be read.
func ownedFields(obj metav1.Object, manager string) (*fieldpath.Set, bool) {
	for _, e := range obj.GetManagedFields() {
		if e.Manager != manager || e.Operation != metav1.ManagedFieldsOperationApply || e.Subresource != "" {
			continue
		}
		set := &fieldpath.Set{}
		if e.FieldsV1 == nil || set.FromJSON(bytes.NewReader(e.FieldsV1.GetRawBytes())) != nil {
			return nil, false
		}
		return set, true
	}
	return nil, false
}

// hasPath reports whether the object holds a value at p. Only field-name paths are
// resolved (the Cilium fields guestnet sets are maps and atomic lists); any other path
// element counts as absent, which errs on the side of applying.
func hasPath(obj map[string]any, p fieldpath.Path) bool {
	var cur any = obj
	for _, pe := range p {
		if pe.FieldName == nil {
			return false
		}
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[*pe.FieldName]; !ok {
			return false
		}
	}
	return true
}

// Subset reports whether every value of want is in have: maps key by key, lists element by
// element (same length), scalars equal.
func Subset(want, have any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			hv, ok := h[k]
			if !ok || !Subset(v, hv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !Subset(w[i], h[i]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(want, have)
	}
}

// ApplyObject server-side applies desired as fieldManager, forcing only the fields it lists;
// desired receives the object the apiserver answered with.
func ApplyObject(ctx context.Context, c client.Client, desired *unstructured.Unstructured, fieldManager string) error {
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(desired), applyOptions(fieldManager)...)
}

// applyOptions are the options of every apply guestnet makes.
func applyOptions(fieldManager string) []client.ApplyOption {
	return []client.ApplyOption{client.FieldOwner(fieldManager), client.ForceOwnership}
}
