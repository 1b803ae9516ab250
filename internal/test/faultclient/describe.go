package faultclient

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// applyObject lets an apply configuration be described like an object.
type applyObject struct{ runtime.ApplyConfiguration }

func (applyObject) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (a applyObject) DeepCopyObject() runtime.Object { return a }

func typeName(obj runtime.Object) string {
	if a, ok := obj.(applyObject); ok {
		obj := fmt.Sprintf("%T", a.ApplyConfiguration)
		return strings.TrimSuffix(obj[strings.LastIndex(obj, ".")+1:], "ApplyConfiguration")
	}
	t := fmt.Sprintf("%T", obj)
	return t[strings.LastIndex(t, ".")+1:]
}
