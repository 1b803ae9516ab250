// Package scale guards, in `make test`, what guestnet's cost per guest cluster is made of, in
// the counts that do not depend on the machine's speed (docs/performance.md; `make bench` measures the
// times). A fleet of guest clusters is created; the manager's requests are counted from the
// apiservers' audit logs (host and guest), not from the manager's own word.
//
// Run with: make test TEST_PKGS=./e2e/scale/... TEST_ARGS='-v'
package scale_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/test/metricstest"
)

var shared = lab.Shared{DirPrefix: "guestnet-scale", Options: lab.Options{Audit: true}}

func TestMain(m *testing.M) { shared.Main(m) }

const (
	// fleetSize guest clusters, every bridgeEvery-th with a GuestWebhookBridge.
	fleetSize   = 20
	bridgeEvery = 5
	// resync is the test manager's SyncPeriod: the steady state is watched over a full one.
	resync = 15 * time.Second
	// quiet is how long the manager must not write before a phase counts as settled: longer
	// than client-go's event library waits (10 s) before it retries an event write that
	// failed (a series update that raced the event's creation), so that no creation event
	// lands in the next phase.
	quiet = 12 * time.Second

	// maxWritesPerGuestIngress bounds what creating one GuestIngress costs (events apart): the
	// finalizer, the guest Service, pool, L2 policy and host Service (5), and one status write
	// per step of progress it reports (guest not connected yet, applied, IP assigned, first
	// and second worker endpoint ready: at most 5). docs/performance.md says why a target of 6
	// would hide progress.
	maxWritesPerGuestIngress = 10
	// maxPolicyWritesPerGuestIngress bounds the lab policy's status writes per member: its
	// counts of selected namespaces and admitted GuestIngresses change once each (2; a few
	// more when the policy's own events interleave: 2.35 measured).
	maxPolicyWritesPerGuestIngress = 3
	// maxWritesPerBridge bounds one GuestWebhookBridge of a webhook and an APIService.
	maxWritesPerBridge = 14
)

// A fleet converges with a bounded number of writes per object, and then, over a full resync,
// the manager writes nothing and reads nothing its cache could answer, in host and guest.
func TestScale_WritesPerObjectAndASilentSteadyState(t *testing.T) {
	l := shared.Get(t)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err := lab.StartCiliumStandIn(ctx, l)
	g.Expect(err).NotTo(HaveOccurred())

	hostLog, err := l.Host.AuditLog()
	g.Expect(err).NotTo(HaveOccurred())
	guestLog, err := l.Guest.AuditLog()
	g.Expect(err).NotTo(HaveOccurred())
	next := func() phase {
		host, err := hostLog.Next(manager.Name)
		g.Expect(err).NotTo(HaveOccurred())
		guest, err := guestLog.Next(manager.Name)
		g.Expect(err).NotTo(HaveOccurred())
		return phase{host: host, guest: guest}
	}

	// The manager binary, with its default flags but a short resync, and guests within the cap
	// recounted several times within it: a recount of a connected guest reads its cache, not
	// the guest apiserver (internal/guestbounds, docs/decisions/0014-steady-state-reads.md).
	mgr := l.StartManagerBinary(t, lab.ManagerFlags{SyncPeriod: resync, Args: []string{"--guest-recount-period=" + (resync / 3).String()}})
	next() // the manager's start (lists, watches, leader election: none)

	// GuestIngresses first, then bridges: each phase's writes are its objects' own.
	var members []*lab.FleetMember
	for i := range fleetSize {
		m, err := l.CreateFleetMember(ctx, i, lab.FleetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		members = append(members, m)
	}
	for _, m := range members {
		eventuallyReady(ctx, g, l.Host.Client, m.GuestIngress)
	}
	creation := settle(t, next)
	creation.log(t, "GuestIngress creation")
	g.Expect(creation.writes(ofGuestIngresses)).To(BeNumerically("<=", maxWritesPerGuestIngress*fleetSize),
		"writes to create %d GuestIngresses:\n%s", fleetSize, creation.counts(isWriteNotEvent))
	g.Expect(creation.writes(policyStatus)).To(BeNumerically("<=", maxPolicyWritesPerGuestIngress*fleetSize+5),
		"writes of the policy's status while %d GuestIngresses were created:\n%s", fleetSize, creation.counts(isWriteNotEvent))

	bridges := 0
	for i := 0; i < fleetSize; i += bridgeEvery {
		g.Expect(l.AddFleetBridge(ctx, members[i])).To(Succeed())
		bridges++
	}
	for _, m := range members {
		if m.Bridge != nil {
			eventuallyBridged(ctx, g, l.Host.Client, m.Bridge)
		}
	}
	bridging := settle(t, next)
	bridging.log(t, "GuestWebhookBridge creation")
	g.Expect(bridging.writes(notEvents)).To(BeNumerically("<=", maxWritesPerBridge*bridges),
		"writes to create %d GuestWebhookBridges:\n%s", bridges, bridging.counts(isWriteNotEvent))

	// Some GuestIngresses are paused, as a tenant or clusterctl move would: one by its own
	// annotation, one by its Cluster's spec.paused. Still admitted, they keep their host objects,
	// and the check that what they hold stays within what is admitted (which runs while
	// paused, docs/decisions/0008-held-within-admitted.md) costs nothing at steady state.
	paused := []*lab.FleetMember{members[1], members[6]}
	g.Expect(l.Host.Client.Patch(ctx, members[1].GuestIngress.DeepCopy(),
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"cluster.x-k8s.io/paused":"true"}}}`)))).To(Succeed())
	g.Expect(l.Host.Client.Patch(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: members[6].Cluster.Namespace, Name: members[6].Cluster.Name}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"paused":true}}`)))).To(Succeed())
	for _, m := range paused {
		eventuallyPaused(ctx, g, l.Host.Client, m.GuestIngress)
	}
	pausing := settle(t, next)
	pausing.log(t, "pausing")
	g.Expect(pausing.writes(notEvents)).To(BeNumerically("<=", len(paused)), "a paused GuestIngress writes its Paused condition only:\n%s",
		pausing.counts(isWriteNotEvent))

	// Steady state: wait until every GuestIngress was reconciled again by the resync (nothing
	// else changes), then count.
	before, since := reconciles(g, mgr, "guestingress"), time.Now()
	g.Eventually(func() float64 { return reconciles(g, mgr, "guestingress") - before }).
		WithTimeout(4 * resync).WithPolling(time.Second).Should(BeNumerically(">=", fleetSize))
	steady := settle(t, next)
	resynced, window := reconciles(g, mgr, "guestingress")-before, time.Since(since)
	steady.log(t, fmt.Sprintf("steady state (%v GuestIngress reconciles in %v)", resynced, window.Round(time.Second)))
	// A resync reconciles each GuestIngress once, through its own watch: the resync of the
	// objects mapped to it (its host Service, pool, Cluster, the other GuestIngresses) adds
	// nothing, else each resync costs the fleet times the watches (docs/performance.md).
	g.Expect(resynced).To(BeNumerically("<=", fleetSize*resyncWaves(window)),
		"GuestIngress reconciles in %v of steady state, by %d GuestIngresses resynced every %v", window, fleetSize, resync)
	g.Expect(steady.writes(all)).To(BeZero(), "writes at steady state:\n%s", steady.counts(isWrite))
	g.Expect(steady.reads()).To(BeZero(), "live reads at steady state:\n%s", steady.counts(isRead))
	for _, m := range paused {
		gi := m.GuestIngress
		name := hostnames.Pool(gi)
		g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Name: name}, ingress.NewPool())).To(Succeed(), "a paused, admitted GuestIngress keeps its pool")
		g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Name: name}, ingress.NewL2Policy())).To(Succeed(), "and its L2 policy")
		g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Namespace: gi.Namespace, Name: hostnames.HostService(gi)}, &corev1.Service{})).To(Succeed(), "and its host Service")
	}
}

// eventuallyPaused waits until the GuestIngress reports Paused=True, and is still admitted.
func eventuallyPaused(ctx context.Context, g *WithT, c client.Client, gi *guestnetv1.GuestIngress) {
	g.Eventually(func(g Gomega) {
		got := &guestnetv1.GuestIngress{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(gi), got)).To(Succeed())
		g.Expect(conditions.IsTrue(got, guestnetv1.PausedCondition)).To(BeTrue(), "%s: %v", gi.Namespace, got.Status.Conditions)
		g.Expect(conditions.IsTrue(got, guestnetv1.AdmittedCondition)).To(BeTrue(), "%s: %v", gi.Namespace, got.Status.Conditions)
	}).WithTimeout(3 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
}

// phase is the manager's requests during one phase, to the host and to the guest.
type phase struct{ host, guest []lab.AuditRequest }

func (p *phase) add(q phase) {
	p.host, p.guest = append(p.host, q.host...), append(p.guest, q.guest...)
}

// settle collects the requests of a phase until the manager has not written for `quiet`.
func settle(t *testing.T, next func() phase) phase {
	t.Helper()
	var p phase
	lastWrite := time.Now()
	deadline := lastWrite.Add(3 * time.Minute)
	for time.Since(lastWrite) < quiet {
		if time.Now().After(deadline) {
			t.Fatalf("the manager never stopped writing:\n%s", p.counts(isWrite))
		}
		time.Sleep(250 * time.Millisecond)
		q := next()
		if q.writes(all) > 0 {
			lastWrite = time.Now()
		}
		p.add(q)
	}
	return p
}

func all(lab.AuditRequest) bool               { return true }
func notEvents(r lab.AuditRequest) bool       { return r.Resource() != "events" }
func isWrite(r lab.AuditRequest) bool         { return r.Write() }
func isWriteNotEvent(r lab.AuditRequest) bool { return r.Write() && notEvents(r) }
func isRead(r lab.AuditRequest) bool          { return r.Read() }

func (p phase) writes(filter func(lab.AuditRequest) bool) int {
	n := 0
	for _, r := range append(p.host[:len(p.host):len(p.host)], p.guest...) {
		if r.Write() && filter(r) {
			n++
		}
	}
	return n
}

func (p phase) reads() int {
	n := 0
	for _, r := range append(p.host[:len(p.host):len(p.host)], p.guest...) {
		if r.Read() {
			n++
		}
	}
	return n
}

// counts prints the requests filter keeps by apiserver, verb and resource.
func (p phase) counts(filter func(lab.AuditRequest) bool) string {
	var b strings.Builder
	for _, side := range []struct {
		name string
		reqs []lab.AuditRequest
	}{{"host", p.host}, {"guest", p.guest}} {
		b.WriteString(lab.FormatCounts(lab.CountBy(side.reqs, func(r lab.AuditRequest) string {
			if !filter(r) {
				return ""
			}
			return side.name + " " + r.Verb + " " + r.Resource()
		})))
	}
	return b.String()
}

func (p phase) log(t *testing.T, name string) {
	t.Helper()
	status := 0
	for _, r := range append(p.host[:len(p.host):len(p.host)], p.guest...) {
		if r.Write() && strings.HasSuffix(r.Resource(), "/status") {
			status++
		}
	}
	t.Logf("%s: %d writes (%d of them status, %d events), %d live reads:\n%s", name,
		p.writes(all), status, p.writes(all)-p.writes(notEvents), p.reads(),
		p.counts(func(r lab.AuditRequest) bool { return r.Write() || r.Read() }))
}

// resyncWaves is the most resyncs of one informer that a window can hold: controller-runtime
// gives each informer a period of 0.9 to 1.1 times the SyncPeriod (pkg/cache/internal,
// calculateResyncPeriod), and the window may begin in one.
func resyncWaves(window time.Duration) float64 {
	return float64(window)/(0.9*float64(resync)) + 1
}

// reconciles is how many reconciles the manager's controller has done, from its /metrics.
func reconciles(g Gomega, mgr *lab.ManagerBinary, controller string) float64 {
	return metricstest.Series(g, mgr, "controller_runtime_reconcile_total", "controller")[controller]
}

func eventuallyReady(ctx context.Context, g *WithT, c client.Client, gi *guestnetv1.GuestIngress) {
	g.Eventually(func(g Gomega) {
		got := &guestnetv1.GuestIngress{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(gi), got)).To(Succeed())
		g.Expect(conditions.IsTrue(got, guestnetv1.ReadyCondition)).To(BeTrue(), "%s: %v", gi.Namespace, got.Status.Conditions)
		g.Expect(got.Status.ReadyEndpoints).To(BeNumerically(">", 0))
	}).WithTimeout(3 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
}

// eventuallyBridged waits until both targets are bridged (nothing carries traffic in the lab:
// the bridge stays not Ready, TargetsReachable False).
func eventuallyBridged(ctx context.Context, g *WithT, c client.Client, gwb *guestnetv1.GuestWebhookBridge) {
	g.Eventually(func(g Gomega) {
		got := &guestnetv1.GuestWebhookBridge{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(gwb), got)).To(Succeed())
		g.Expect(conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition)).To(BeTrue(), "%s: %v", gwb.Namespace, got.Status.Conditions)
		g.Expect(got.Status.BridgedTargets).To(BeEquivalentTo(2))
		g.Expect(conditions.Get(got, guestnetv1.TargetsReachableCondition)).NotTo(BeNil())
		g.Expect(conditions.Get(got, guestnetv1.TargetsReachableCondition).Status).NotTo(Equal(metav1.ConditionUnknown))
	}).WithTimeout(3 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
}

func policyStatus(r lab.AuditRequest) bool     { return r.Resource() == "guestingresspolicies/status" }
func ofGuestIngresses(r lab.AuditRequest) bool { return notEvents(r) && !policyStatus(r) }

// Two GuestIngresses of one Cluster on one guest Service, with different ports: the older
// one owns the Service, the other is refused (GuestServiceClaimed) and writes nothing. They
// do not apply over each other: once settled, over a full resync, the manager writes nothing
// to the host or to the guest.
func TestScale_TwoGuestIngressesOnOneGuestServiceWriteNothing(t *testing.T) {
	l := shared.Get(t)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err := lab.StartCiliumStandIn(ctx, l)
	g.Expect(err).NotTo(HaveOccurred())
	hostLog, err := l.Host.AuditLog()
	g.Expect(err).NotTo(HaveOccurred())
	guestLog, err := l.Guest.AuditLog()
	g.Expect(err).NotTo(HaveOccurred())
	next := func() phase {
		host, err := hostLog.Next(manager.Name)
		g.Expect(err).NotTo(HaveOccurred())
		guest, err := guestLog.Next(manager.Name)
		g.Expect(err).NotTo(HaveOccurred())
		return phase{host: host, guest: guest}
	}

	const member = 900 // outside the fleet of the test above
	m, err := l.CreateFleetMember(ctx, member, lab.FleetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	mgr := l.StartManagerBinary(t, lab.ManagerFlags{Namespace: m.GuestIngress.Namespace, SyncPeriod: resync})
	eventuallyReady(ctx, g, l.Host.Client, m.GuestIngress)

	second := m.GuestIngress.DeepCopy()
	second.ObjectMeta = metav1.ObjectMeta{Namespace: m.GuestIngress.Namespace, Name: "web-2"}
	second.Spec.Ports = second.Spec.Ports[1:] // https alone, on the member's https nodePort
	second.Spec.LoadBalancer.IP = "10.98.203.250"
	g.Expect(l.Host.Client.Create(ctx, second)).To(Succeed())
	settled := settle(t, next)
	settled.log(t, "a second GuestIngress on the guest Service")
	got := &guestnetv1.GuestIngress{}
	g.Expect(l.Host.Client.Get(ctx, client.ObjectKeyFromObject(second), got)).To(Succeed())
	g.Expect(conditions.GetReason(got, guestnetv1.LoadBalancerReadyCondition)).To(Equal(guestnetv1.GuestServiceClaimedReason), "%v", got.Status.Conditions)
	eventuallyReady(ctx, g, l.Host.Client, m.GuestIngress)

	before := reconciles(g, mgr, "guestingress")
	g.Eventually(func() float64 { return reconciles(g, mgr, "guestingress") - before }).
		WithTimeout(4 * resync).WithPolling(time.Second).Should(BeNumerically(">=", 2))
	steady := settle(t, next)
	steady.log(t, fmt.Sprintf("steady state (%v of GuestIngress reconciles by the resync)", reconciles(g, mgr, "guestingress")-before))
	g.Expect(steady.writes(all)).To(BeZero(), "writes at steady state:\n%s", steady.counts(isWrite))
}
