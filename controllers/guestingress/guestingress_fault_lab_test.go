package guestingress_test

// Fault test of the GuestIngress reconcile: the manager "crashes" (internal/test/faultclient)
// after its 1st, 2nd, ... Nth write, in the host or the guest, while it creates a GuestIngress's
// chain and while it deletes it; a fresh manager then takes over. Whatever write the crash
// interrupted, the result is the one a run without a crash reaches: the same host Service,
// pool, policy, guest Service fields and status, nothing lost, nothing twice; and after the
// deletion, the guest Service exactly as the user had it.
//
// Run with: make test TEST_PKGS=./controllers/guestingress/... TEST_ARGS='-run TestGuestIngressFault -v'

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/test/faultclient"
)

func TestGuestIngressFault_ACrashAtAnyWriteConverges(t *testing.T) {
	t.Parallel()
	// A recording run, without a crash: how many writes creation and deletion make, and
	// what they end at.
	rec := newPhaseEnv(t, envOptions{manual: true})
	budget := faultclient.NewBudget(-1, nil)
	rec.runManager(faultSetup(budget))
	original := rec.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := rec.createCluster("tenant-a", 1)
	gi := rec.createGuestIngress("web", gc.Name)
	rec.eventuallyReady(gi)
	creation := rec.settled(budget)
	golden := rec.snapshot(gi)
	rec.g.Expect(rec.host.Delete(rec.ctx, gi)).To(Succeed())
	rec.eventuallyGone(gi)
	deletion := rec.settled(budget)[len(creation):]
	rec.g.Expect(rec.getGuestService().Spec).To(Equal(original.Spec))
	t.Logf("creation writes %d:\n  %s", len(creation), strings.Join(creation, "\n  "))
	t.Logf("deletion writes %d:\n  %s", len(deletion), strings.Join(deletion, "\n  "))
	rec.g.Expect(len(creation)).To(BeNumerically(">=", 5), "guest Service, pool, policy, host Service, finalizer, status")

	// How many status patches a run makes depends on when the lab's stand-ins answer, so a
	// run may converge in fewer writes than the recording. Every run makes every other write
	// and a status patch: a crash after fewer writes than those must happen.
	creationSure, deletionSure := objectWrites(creation), objectWrites(deletion)
	for n := 1; n < len(creation); n++ {
		t.Run(fmt.Sprintf("creation, crash after %d writes", n), func(t *testing.T) {
			t.Parallel()
			e := newPhaseEnv(t, envOptions{manual: true})
			original := e.createGuestService(corev1.ServiceTypeClusterIP, nil)
			gc := e.createCluster("tenant-a", 1)
			giKey := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "web"}}
			e.crashAfter(n, n < creationSure, func() bool { return e.isReady(giKey) }, func() { e.createGuestIngress("web", gc.Name) })

			e.runManager(faultSetup(faultclient.NewBudget(-1, nil)))
			gi := e.eventuallyReady(&guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "web"}})
			e.g.Eventually(func() string { return e.snapshot(gi) }).WithTimeout(waitTimeout).WithPolling(poll).Should(Equal(golden))

			e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
			e.eventuallyGone(gi)
			e.g.Expect(e.getGuestService().Spec).To(Equal(original.Spec))
		})
	}
	for n := 1; n < len(deletion); n++ {
		t.Run(fmt.Sprintf("deletion, crash after %d writes", n), func(t *testing.T) {
			t.Parallel()
			e := newPhaseEnv(t, envOptions{manual: true})
			original := e.createGuestService(corev1.ServiceTypeClusterIP, nil)
			gc := e.createCluster("tenant-a", 1)
			stop := e.runManager(faultSetup(faultclient.NewBudget(-1, nil)))
			gi := e.createGuestIngress("web", gc.Name)
			e.eventuallyReady(gi)
			e.g.Expect(stop()).To(Succeed())
			e.crashAfter(n, n < deletionSure, func() bool { return e.isGone(gi) }, func() { e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed()) })

			e.runManager(faultSetup(faultclient.NewBudget(-1, nil)))
			e.eventuallyGone(gi)
			e.g.Expect(e.getGuestService().Spec).To(Equal(original.Spec))
			e.g.Expect(e.getGuestService().Annotations).To(Equal(original.Annotations))
			e.g.Expect(managers(e.getGuestService())).NotTo(ContainElement(ownership.FieldManager))
			e.expectNoHostObjects()
		})
	}
}

// crashAfter runs a manager whose n+1st write fails as if it had crashed, does what starts the
// work, and returns once the manager crashed (and is stopped). When the crash is not sure
// (mustCrash false), a run that reaches done and then writes nothing for two seconds, in n
// writes or fewer, is accepted as one with nothing left to crash at.
func (e *phaseEnv) crashAfter(n int, mustCrash bool, done func() bool, start func()) {
	e.t.Helper()
	crashed := make(chan struct{})
	budget := faultclient.NewBudget(n, func() { close(crashed) })
	stop := e.runManager(faultSetup(budget))
	start()
	deadline := time.After(waitTimeout)
	last, since := 0, time.Now()
	for {
		select {
		case <-crashed:
			e.g.Expect(stop()).To(Succeed())
			e.t.Logf("crashed after: %s", strings.Join(budget.Recorded(), "; "))
			return
		case <-deadline:
			e.t.Fatalf("no crash: fewer than %d writes (%v)", n+1, budget.Recorded())
		case <-time.After(poll):
		}
		if now := len(budget.Recorded()); now != last {
			last, since = now, time.Now()
		}
		if !mustCrash && time.Since(since) > 2*time.Second && done() {
			e.g.Expect(stop()).To(Succeed())
			e.t.Logf("converged in %d writes, no %dth write to crash at: %s", last, n+1, strings.Join(budget.Recorded(), "; "))
			return
		}
	}
}

// objectWrites counts the distinct writes that are not status patches, plus one status patch:
// the writes every run makes, whatever the timing (a reconcile on a cache that has not yet
// seen the last write may repeat one, as the recording may show).
func objectWrites(writes []string) int {
	distinct := map[string]bool{}
	for _, w := range writes {
		if !strings.HasPrefix(w, "patch/status ") {
			distinct[w] = true
		}
	}
	return len(distinct) + 1
}

// settled waits until the manager has not written for two seconds, and returns its writes.
func (e *phaseEnv) settled(budget *faultclient.Budget) []string {
	e.t.Helper()
	count := func() int { return len(writesOf(budget)) }
	last, since := count(), time.Now()
	e.g.Eventually(func() bool {
		if now := count(); now != last {
			last, since = now, time.Now()
		}
		return time.Since(since) > 2*time.Second
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(BeTrue())
	return writesOf(budget)
}

// isReady reports whether gi is Ready with its status complete (as eventuallyReady waits for).
func (e *phaseEnv) isReady(gi *guestnetv1.GuestIngress) bool {
	got := &guestnetv1.GuestIngress{}
	if err := e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), got); err != nil {
		return false
	}
	return conditions.IsTrue(got, guestnetv1.ReadyCondition) && got.Status.LoadBalancerIP != "" && got.Status.ReadyEndpoints > 0
}

// isGone reports whether gi no longer exists.
func (e *phaseEnv) isGone(gi *guestnetv1.GuestIngress) bool {
	return apierrors.IsNotFound(e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), &guestnetv1.GuestIngress{}))
}

func writesOf(b *faultclient.Budget) []string { return b.Recorded() }

// snapshot renders what guestnet keeps for the GuestIngress "web" of Cluster tenant-a, with the
// test's own names and addresses replaced, so that two environments compare equal: the host
// Service, pool and policy (and that there is exactly one of each), the guest Service's fields
// and the GuestIngress's status.
func (e *phaseEnv) snapshot(gi *guestnetv1.GuestIngress) string {
	e.t.Helper()
	svcs := &corev1.ServiceList{}
	e.g.Expect(e.host.List(e.ctx, svcs, client.InNamespace(e.ns), client.MatchingLabels(ownership.SelectGuestIngress(gi)))).To(Succeed())
	pools, policies := e.listCilium(ingress.PoolGVK.Kind, gi), e.listCilium(ingress.L2PolicyGVK.Kind, gi)
	got := e.getGuestIngress(gi)
	guest := e.getGuestService()
	type hostService struct {
		Labels, Annotations map[string]string
		Spec                any
	}
	var hostServices []hostService
	for _, s := range svcs.Items {
		hostServices = append(hostServices, hostService{Labels: s.Labels, Annotations: s.Annotations, Spec: map[string]any{
			"type": s.Spec.Type, "selector": s.Spec.Selector, "class": s.Spec.LoadBalancerClass, "etp": s.Spec.ExternalTrafficPolicy,
			"ports": portsOf(s.Spec.Ports, false), "owners": len(s.OwnerReferences),
		}})
	}
	var conds []string
	for _, c := range got.Status.Conditions {
		conds = append(conds, c.Type+"="+string(c.Status)+" "+c.Reason)
	}
	slices.Sort(conds)
	status := got.Status.DeepCopy()
	status.Conditions, status.ObservedGeneration = nil, 0
	data, err := json.MarshalIndent(map[string]any{
		"hostServices": hostServices, "pools": pools, "policies": policies,
		"guestService": map[string]any{"type": guest.Spec.Type, "ports": portsOf(guest.Spec.Ports, true), "annotations": guest.Annotations},
		"status":       status, "conditions": conds,
	}, "", " ")
	e.g.Expect(err).NotTo(HaveOccurred())
	out := strings.ReplaceAll(string(data), string(got.UID), "UID")
	for i := int32(19); i >= 0; i-- {
		out = strings.ReplaceAll(out, fmt.Sprint(e.nodePort(i)), fmt.Sprintf("NODEPORT%d", i))
	}
	return strings.NewReplacer(e.ns, "NS", e.guestNS, "GUESTNS", e.lbNet+".", "LBNET.").Replace(out)
}

func portsOf(ports []corev1.ServicePort, withNodePort bool) []string {
	var out []string
	for _, p := range ports {
		s := fmt.Sprintf("%s %d/%s -> %s", p.Name, p.Port, p.Protocol, p.TargetPort.String())
		if withNodePort {
			s += fmt.Sprintf(" nodePort %d", p.NodePort)
		}
		out = append(out, s)
	}
	return out
}

// listCilium lists the pools or policies labelled for gi: their specs, labels and annotations.
func (e *phaseEnv) listCilium(kind string, gi *guestnetv1.GuestIngress) []any {
	e.t.Helper()
	list := &unstructured.UnstructuredList{}
	gvk := ingress.PoolGVK
	if kind == ingress.L2PolicyGVK.Kind {
		gvk = ingress.L2PolicyGVK
	}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(kind + "List"))
	e.g.Expect(e.host.List(e.ctx, list, client.MatchingLabels(ownership.SelectGuestIngress(gi)))).To(Succeed())
	var out []any
	for _, u := range list.Items {
		out = append(out, map[string]any{"name": u.GetName(), "labels": u.GetLabels(), "annotations": u.GetAnnotations(), "spec": u.Object["spec"]})
	}
	return out
}

// expectNoHostObjects checks that nothing labelled for the GuestIngress "web" is left on the host.
func (e *phaseEnv) expectNoHostObjects() {
	e.t.Helper()
	gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "web"}}
	svcs := &corev1.ServiceList{}
	e.g.Expect(e.host.List(e.ctx, svcs, client.InNamespace(e.ns), client.MatchingLabels(ownership.SelectGuestIngress(gi)))).To(Succeed())
	e.g.Expect(svcs.Items).To(BeEmpty())
	e.g.Expect(e.listCilium(ingress.PoolGVK.Kind, gi)).To(BeEmpty())
	e.g.Expect(e.listCilium(ingress.L2PolicyGVK.Kind, gi)).To(BeEmpty())
}

// faultSetup registers the GuestIngress controller with host and guest clients whose writes
// are charged to budget.
func faultSetup(budget *faultclient.Budget) lab.SetupFunc {
	return func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, o manager.Options) error {
		return (&guestingress.Reconciler{
			Client:         faultclient.Wrap(mgr.GetClient(), budget),
			APIReader:      mgr.GetAPIReader(),
			ClusterCache:   faultCache{ClusterCache: cc, budget: budget},
			WatchNamespace: o.WatchNamespace,
		}).SetupWithManager(ctx, mgr, controller.Options{})
	}
}

// faultCache hands out guest clients whose writes are charged to the budget.
type faultCache struct {
	clustercache.ClusterCache
	budget *faultclient.Budget
}

func (fc faultCache) GetClient(ctx context.Context, cluster client.ObjectKey) (client.Client, error) {
	c, err := fc.ClusterCache.GetClient(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return faultclient.Wrap(c, fc.budget), nil
}

func (fc faultCache) GetUncachedClient(ctx context.Context, cluster client.ObjectKey) (client.Client, error) {
	c, err := fc.ClusterCache.GetUncachedClient(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return faultclient.Wrap(c, fc.budget), nil
}
