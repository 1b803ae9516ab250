package bridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// patchOp is one operation of a JSON patch (RFC 6902).
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// GuestPatch is the JSON patch that turns observed into edited, a copy of it changed by the
// rewrites and restores above. It names only what guestnet owns: each webhook's
// clientConfig.url and clientConfig.service (spec.service of an APIService) and the record
// annotation, plus the resourceVersion guestnet read, so that the apiserver refuses it
// (Conflict) if anyone wrote the object since. Every other field, including those a newer
// guest apiserver has and guestnet's typed structs lack, is left exactly as the apiserver
// holds it: the patch does not carry it. nil means nothing changed. Anything else that
// differs between the two objects is an error, not a write.
func GuestPatch(observed, edited client.Object) ([]byte, error) {
	if reflect.TypeOf(observed) != reflect.TypeOf(edited) {
		return nil, fmt.Errorf("%s: edited object of another kind", observed.GetName())
	}
	// Work on copies: the fields the patch names are cleared in both, so that what is left
	// can be compared whole.
	observed, edited = observed.DeepCopyObject().(client.Object), edited.DeepCopyObject().(client.Object)
	var ops []patchOp
	switch o := observed.(type) {
	case *admissionregistrationv1.ValidatingWebhookConfiguration, *admissionregistrationv1.MutatingWebhookConfiguration:
		var err error
		if ops, err = clientConfigOps(observed, edited); err != nil {
			return nil, err
		}
	case *apiregistrationv1.APIService:
		e := edited.(*apiregistrationv1.APIService)
		ops = valueOps(ops, "/spec/service", o.Spec.Service, e.Spec.Service)
		o.Spec.Service, e.Spec.Service = nil, nil
	default:
		return nil, fmt.Errorf("%T is not a bridge target", observed)
	}
	ops = append(ops, annotationOps(observed, edited)...)
	for _, obj := range []client.Object{observed, edited} {
		annotations := obj.GetAnnotations()
		delete(annotations, guestnetv1.BridgeOriginalAnnotation)
		if len(annotations) == 0 {
			annotations = nil
		}
		obj.SetAnnotations(annotations)
	}
	if !equality.Semantic.DeepEqual(observed, edited) {
		return nil, fmt.Errorf("%s: the edit changes fields guestnet does not own", observed.GetName())
	}
	if len(ops) == 0 {
		return nil, nil
	}
	if observed.GetResourceVersion() == "" {
		return nil, errors.New("cannot patch an object without its resourceVersion")
	}
	ops = append([]patchOp{{Op: "replace", Path: "/metadata/resourceVersion", Value: observed.GetResourceVersion()}}, ops...)
	return json.Marshal(ops)
}

// clientConfigOps are the operations on each webhook's url and service; it clears both in
// observed and edited so that the caller can check that nothing else differs.
func clientConfigOps(observed, edited client.Object) ([]patchOp, error) {
	before, after := webhooksOf(observed), webhooksOf(edited)
	if len(before) != len(after) {
		return nil, fmt.Errorf("%s: the edit adds or removes webhooks", observed.GetName())
	}
	var ops []patchOp
	for i := range before {
		if before[i].name != after[i].name {
			return nil, fmt.Errorf("%s: the edit reorders webhooks", observed.GetName())
		}
		prefix := fmt.Sprintf("/webhooks/%d/clientConfig/", i)
		ops = valueOps(ops, prefix+"service", before[i].config.Service, after[i].config.Service)
		ops = valueOps(ops, prefix+"url", before[i].config.URL, after[i].config.URL)
		before[i].config.Service, after[i].config.Service = nil, nil
		before[i].config.URL, after[i].config.URL = nil, nil
	}
	return ops, nil
}

// valueOps adds the operation that turns the value at path from before into after (pointers;
// nil is absent).
func valueOps[T any](ops []patchOp, path string, before, after *T) []patchOp {
	switch {
	case before == nil && after == nil:
	case after == nil:
		ops = append(ops, patchOp{Op: "remove", Path: path})
	case before == nil:
		ops = append(ops, patchOp{Op: "add", Path: path, Value: after})
	case !reflect.DeepEqual(before, after):
		ops = append(ops, patchOp{Op: "replace", Path: path, Value: after})
	}
	return ops
}

// annotationOps are the operations on the record annotation.
func annotationOps(observed, edited client.Object) []patchOp {
	key := guestnetv1.BridgeOriginalAnnotation
	before, had := observed.GetAnnotations()[key]
	after, has := edited.GetAnnotations()[key]
	path := "/metadata/annotations/" + escapePointer(key)
	switch {
	case had && !has && len(observed.GetAnnotations()) == 1:
		// The record was the only annotation: the object goes back to having none.
		return []patchOp{{Op: "remove", Path: "/metadata/annotations"}}
	case had && !has:
		return []patchOp{{Op: "remove", Path: path}}
	case !has:
		return nil
	case !had && len(observed.GetAnnotations()) == 0:
		return []patchOp{{Op: "add", Path: "/metadata/annotations", Value: map[string]string{key: after}}}
	case !had:
		return []patchOp{{Op: "add", Path: path, Value: after}}
	case before != after:
		return []patchOp{{Op: "replace", Path: path, Value: after}}
	}
	return nil
}

// escapePointer escapes a JSON pointer segment (RFC 6901).
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
