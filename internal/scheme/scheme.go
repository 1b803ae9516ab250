// Package scheme is the one list of API types guestnet reads and writes, in the host cluster
// (Services, CAPI, guestnet's own kinds) and in guest clusters (APIServices, webhook
// configurations): the manager, `manager diagnose` and the lab all start from it.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// New returns a scheme with every type guestnet uses.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(clusterv1.AddToScheme(s))
	// Guest APIServices, which the GuestWebhookBridge repoints.
	utilruntime.Must(apiregistrationv1.AddToScheme(s))
	utilruntime.Must(guestnetv1.AddToScheme(s))
	return s
}
