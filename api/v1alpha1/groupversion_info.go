// Package v1alpha1 contains the guestnet API: GuestIngress and GuestWebhookBridge.
//
// +kubebuilder:object:generate=true
// +groupName=guestnet.addons.cluster.x-k8s.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every guestnet object.
	GroupVersion = schema.GroupVersion{Group: "guestnet.addons.cluster.x-k8s.io", Version: "v1alpha1"}

	// SchemeBuilder registers the guestnet types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the guestnet types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
