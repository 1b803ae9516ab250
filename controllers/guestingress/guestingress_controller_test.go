package guestingress_test

// Lab tests of the GuestIngress controller's skeleton against real host and guest
// apiservers, with CAPI's real ClusterCache connecting to the guest through the
// <cluster>-kubeconfig Secret. The behaviour both guestnet controllers share is written once,
// in controllers/internal/controllertest.
//
// Run with: make test TEST_PKGS=./controllers/guestingress/... TEST_ARGS='-run TestGuestIngressController -v'

import (
	"fmt"
	"hash/fnv"
	"os"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	"context"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	ctrl "sigs.k8s.io/controller-runtime"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/internal/controllertest"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

func TestMain(m *testing.M) { controllertest.Main(m) }

func TestGuestIngressController(t *testing.T) {
	controllertest.Run(t, controllertest.Kind{
		Name:      "GuestIngress",
		ShortName: "gi",
		Finalizer: guestnetv1.GuestIngressFinalizer,
		Columns:   []string{"NAME", "CLUSTER", "IP", "ENDPOINTS", "READY", "AGE"},
		Empty:     func() controllertest.Object { return &guestnetv1.GuestIngress{} },
		New: func(ns, name, cluster string) controllertest.Object {
			return &guestnetv1.GuestIngress{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: guestnetv1.GuestIngressSpec{
					ClusterName:  cluster,
					GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
					// An IP of its own: claims of other tests' namespaces (other managers) are
					// real claims, and overlapping ones would be refused.
					LoadBalancer: guestnetv1.LoadBalancerSpec{IP: uniqueIP(ns + "/" + name)},
				},
			}
		},
		ChangeSpec: func(obj controllertest.Object) {
			gi := obj.(*guestnetv1.GuestIngress)
			gi.Spec.LoadBalancer.Annotations = map[string]string{"test.guestnet.dev/change": utilrand.String(8)}
		},
		Setup: setupGuestIngress,
		// What a GuestIngress holds on the host is compared with what its policy admits on
		// every reconcile, paused or not (docs/decisions/0008-held-within-admitted.md).
		DerivedWhilePaused: []string{guestnetv1.AdmittedCondition},
	})
}

// uniqueIP is an address of 10.3.0.0/16 derived from key.
func uniqueIP(key string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	sum := h.Sum32()
	return fmt.Sprintf("10.3.%d.%d", (sum>>8)%256, sum%254+1)
}

// Every condition reason a GuestIngress can carry is explained in docs/guestingress.md and
// listed in docs/api.md: the reasons of guestingress_types.go, and those of Admitted.
func TestDocsNameEveryGuestIngressReason(t *testing.T) {
	src, err := os.ReadFile("../../api/v1alpha1/guestingress_types.go")
	if err != nil {
		t.Fatal(err)
	}
	policySrc, err := os.ReadFile("../../api/v1alpha1/guestingresspolicy_types.go")
	if err != nil {
		t.Fatal(err)
	}
	// Of the policy's file, the Admitted reasons only: those after are the policy's own.
	admitted, _, found := strings.Cut(string(policySrc), "// Ready condition reasons of a GuestIngressPolicy")
	if !found {
		t.Fatal("guestingresspolicy_types.go no longer has the comment that ends the Admitted reasons")
	}
	// And the reasons of the optional APIs and bounds (CiliumLBIPAMNotInstalled, GuestTooLarge).
	limits, err := os.ReadFile("../../api/v1alpha1/limits_types.go")
	if err != nil {
		t.Fatal(err)
	}
	reasons := regexp.MustCompile(`(?m)^\s+\w+Reason\s+=\s+"(\w+)"`).FindAllStringSubmatch(string(src)+admitted+string(limits), -1)
	if len(reasons) < 15 {
		t.Fatalf("found only %d reasons: the pattern no longer matches the API", len(reasons))
	}
	for _, doc := range []string{"../../docs/guestingress.md", "../../docs/api.md"} {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reasons {
			if !strings.Contains(string(text), "`"+r[1]+"`") {
				t.Errorf("%s does not name the reason %s", doc, r[1])
			}
		}
	}
}

// setupGuestIngress registers the GuestIngress controller on mgr, as main.go does.
func setupGuestIngress(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, o manager.Options) error {
	return (&guestingress.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     cc,
		WatchFilterValue: o.WatchFilterValue,
		WatchNamespace:   o.WatchNamespace,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.GuestIngressConcurrency))
}
