package guestwebhookbridge_test

// Lab tests of the GuestWebhookBridge controller's skeleton against real host and guest
// apiservers, with CAPI's real ClusterCache connecting to the guest through the
// <cluster>-kubeconfig Secret. The behaviour both guestnet controllers share is written once,
// in controllers/internal/controllertest.
//
// Run with: make test TEST_PKGS=./controllers/guestwebhookbridge/... TEST_ARGS='-run TestGuestWebhookBridgeController -v'

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"context"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	ctrl "sigs.k8s.io/controller-runtime"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestwebhookbridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/internal/controllertest"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

func TestMain(m *testing.M) { controllertest.Main(m) }

func TestGuestWebhookBridgeController(t *testing.T) {
	controllertest.Run(t, controllertest.Kind{
		Name:      "GuestWebhookBridge",
		ShortName: "gwb",
		Finalizer: guestnetv1.GuestWebhookBridgeFinalizer,
		Columns:   []string{"NAME", "CLUSTER", "BRIDGED", "TOTAL", "READY", "AGE"},
		Empty:     func() controllertest.Object { return &guestnetv1.GuestWebhookBridge{} },
		New: func(ns, name, cluster string) controllertest.Object {
			return &guestnetv1.GuestWebhookBridge{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: guestnetv1.GuestWebhookBridgeSpec{
					ClusterName:        cluster,
					ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{"cert-manager-webhook"}},
				},
			}
		},
		ChangeSpec: func(obj controllertest.Object) {
			b := obj.(*guestnetv1.GuestWebhookBridge)
			if b.Spec.Mode == guestnetv1.BridgeModeAlways {
				b.Spec.Mode = guestnetv1.BridgeModeAuto
			} else {
				b.Spec.Mode = guestnetv1.BridgeModeAlways
			}
		},
		Setup: setupGuestWebhookBridge,
	})
}

// setupGuestWebhookBridge registers the GuestWebhookBridge controller on mgr, as main.go does.
func setupGuestWebhookBridge(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, o manager.Options) error {
	return (&guestwebhookbridge.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     cc,
		WatchFilterValue: o.WatchFilterValue,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.GuestWebhookBridgeConcurrency))
}
