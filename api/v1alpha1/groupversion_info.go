// Package v1alpha1 contains the guestnet API: GuestIngress and GuestWebhookBridge.
//
// +kubebuilder:object:generate=true
// +groupName=guestnet.addons.cluster.x-k8s.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every guestnet object.
	GroupVersion = schema.GroupVersion{Group: "guestnet.addons.cluster.x-k8s.io", Version: "v1alpha1"}

	// schemeBuilder registers the guestnet types with a runtime.Scheme (apimachinery's
	// builder: controller-runtime's scheme.Builder is deprecated for API packages).
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the guestnet types to a runtime.Scheme.
	AddToScheme = schemeBuilder.AddToScheme

	// objectTypes are the guestnet types; each *_types.go file adds its own in init.
	objectTypes = []runtime.Object{}
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, objectTypes...)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
