package metrics

import (
	"context"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

func TestCountersRegisteredWithEverySeries(t *testing.T) {
	g := NewWithT(t)
	families, err := ctrlmetrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	series := map[string]int{}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "guestnet_") {
			series[f.GetName()] = len(f.GetMetric())
		}
	}
	// Every label value exists from the start (at 0), and nothing else.
	g.Expect(series).To(Equal(map[string]int{
		RepairsName:          len(RepairKinds),
		WorkerRolloutsName:   1,
		ConflictsRefusedName: len(ConflictReasons),
		PolicyRefusalsName:   len(PolicyRefusalReasons),
	}))
}

func TestRepaired(t *testing.T) {
	g := NewWithT(t)
	before := testutil.ToFloat64(repairs.WithLabelValues(string(RepairPool)))
	Repaired(RepairPool)
	g.Expect(testutil.ToFloat64(repairs.WithLabelValues(string(RepairPool)))).To(Equal(before + 1))
}

func TestConditionChanged(t *testing.T) {
	tests := []struct {
		name                 string
		condType, st, reason string
		conflicts, refusals  float64
		conflictR, refusalR  string
	}{
		{name: "a conflict", condType: guestnetv1.LoadBalancerReadyCondition, st: "False", reason: guestnetv1.IPConflictReason,
			conflicts: 1, conflictR: guestnetv1.IPConflictReason},
		{name: "a bridge's conflict", condType: guestnetv1.TargetsBridgedCondition, st: "False", reason: guestnetv1.TargetClaimedReason,
			conflicts: 1, conflictR: guestnetv1.TargetClaimedReason},
		{name: "Ready repeats the reason: not counted twice", condType: guestnetv1.ReadyCondition, st: "False", reason: guestnetv1.IPConflictReason,
			conflictR: guestnetv1.IPConflictReason},
		{name: "a policy refusal", condType: guestnetv1.AdmittedCondition, st: "False", reason: guestnetv1.QuotaExceededReason,
			refusals: 1, refusalR: guestnetv1.QuotaExceededReason},
		{name: "admitted is no refusal", condType: guestnetv1.AdmittedCondition, st: "True", reason: guestnetv1.AdmittedReason,
			refusalR: guestnetv1.NotAllowedReason},
		{name: "an unknown reason is no new label value", condType: guestnetv1.LoadBalancerReadyCondition, st: "False", reason: "SomethingElse",
			conflictR: guestnetv1.IPConflictReason},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			conflicts := func() float64 {
				if tt.conflictR == "" {
					return 0
				}
				return testutil.ToFloat64(conflictsRefused.WithLabelValues(tt.conflictR))
			}
			refusals := func() float64 {
				if tt.refusalR == "" {
					return 0
				}
				return testutil.ToFloat64(policyRefusals.WithLabelValues(tt.refusalR))
			}
			conflictsBefore, refusalsBefore := conflicts(), refusals()
			ConditionChanged(tt.condType, tt.st, tt.reason)
			g.Expect(conflicts() - conflictsBefore).To(Equal(tt.conflicts))
			g.Expect(refusals() - refusalsBefore).To(Equal(tt.refusals))
			g.Expect(testutil.CollectAndCount(conflictsRefused)).To(Equal(len(ConflictReasons)))
			g.Expect(testutil.CollectAndCount(policyRefusals)).To(Equal(len(PolicyRefusalReasons)))
		})
	}
}

func cond(t, status, reason string) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionStatus(status), Reason: reason}
}

func gi(name, cluster string, conds ...metav1.Condition) *guestnetv1.GuestIngress {
	return &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: name},
		Spec:       guestnetv1.GuestIngressSpec{ClusterName: cluster},
		Status:     guestnetv1.GuestIngressStatus{Conditions: conds},
	}
}

func TestCollector(t *testing.T) {
	g := NewWithT(t)
	unreachable := cond(guestnetv1.ClusterAvailableCondition, "False", guestnetv1.GuestUnreachableReason)
	bridge := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "webhooks"},
		Spec:       guestnetv1.GuestWebhookBridgeSpec{ClusterName: "tenant-a"},
		Status: guestnetv1.GuestWebhookBridgeStatus{
			BridgedTargets: 3, TotalTargets: 4,
			Targets: []guestnetv1.TargetStatus{
				{Name: "a", Bridged: true, Reachable: ptr.To(true)},
				{Name: "b", Bridged: true, Reachable: ptr.To(false)},
				{Name: "c", Bridged: true},
				{Name: "d"},
			},
			Conditions: []metav1.Condition{
				unreachable,
				cond(guestnetv1.TargetsBridgedCondition, "False", guestnetv1.TargetNotFoundReason),
				cond(guestnetv1.TargetsReachableCondition, "False", guestnetv1.TLSNameMismatchReason),
			},
		},
	}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(
		gi("web", "tenant-a", cond(guestnetv1.ReadyCondition, "True", guestnetv1.ReadyReason)),
		// Same cluster as the bridge: counted once.
		gi("admin", "tenant-a", cond(guestnetv1.ReadyCondition, "False", guestnetv1.GuestUnreachableReason), unreachable),
		gi("other", "tenant-b", cond(guestnetv1.ReadyCondition, "False", guestnetv1.GuestUnreachableReason), unreachable),
		gi("new", "tenant-c"),
		gi("refused", "tenant-d", cond(guestnetv1.ReadyCondition, "False", guestnetv1.KubeconfigRefusedReason),
			cond(guestnetv1.ClusterAvailableCondition, "False", guestnetv1.KubeconfigRefusedReason)),
		gi("large", "tenant-e", cond(guestnetv1.ReadyCondition, "False", guestnetv1.GuestTooLargeReason),
			cond(guestnetv1.ClusterAvailableCondition, "False", guestnetv1.GuestTooLargeReason)),
		bridge,
	).Build()
	collector := &Collector{Reader: c}

	want := `
# HELP guestnet_bridge_targets Targets of the GuestWebhookBridges: bridged and not_bridged by the reason of the bridge's TargetsBridged condition, unreachable by the reason of its TargetsReachable condition.
# TYPE guestnet_bridge_targets gauge
guestnet_bridge_targets{reason="TLSNameMismatch",state="unreachable"} 1
guestnet_bridge_targets{reason="TargetNotFound",state="bridged"} 3
guestnet_bridge_targets{reason="TargetNotFound",state="not_bridged"} 1
# HELP guestnet_guest_clusters_unreachable Guest clusters whose apiserver guestnet cannot reach or will not use: a GuestIngress or GuestWebhookBridge of theirs has ClusterAvailable=False with reason GuestUnreachable, KubeconfigRefused or GuestTooLarge.
# TYPE guestnet_guest_clusters_unreachable gauge
guestnet_guest_clusters_unreachable 4
# HELP guestnet_guestingresses GuestIngresses by the status and reason of their Ready condition.
# TYPE guestnet_guestingresses gauge
guestnet_guestingresses{reason="GuestTooLarge",status="False"} 1
guestnet_guestingresses{reason="GuestUnreachable",status="False"} 2
guestnet_guestingresses{reason="KubeconfigRefused",status="False"} 1
guestnet_guestingresses{reason="NoCondition",status="Unknown"} 1
guestnet_guestingresses{reason="Ready",status="True"} 1
`
	g.Expect(testutil.CollectAndCompare(collector, strings.NewReader(want))).To(Succeed())

	// A deleted object is gone from the gauges at the next scrape: nothing to take back.
	g.Expect(c.Delete(context.Background(), gi("other", "tenant-b"))).To(Succeed())
	g.Expect(c.Delete(context.Background(), bridge)).To(Succeed())
	want = `
# HELP guestnet_guest_clusters_unreachable Guest clusters whose apiserver guestnet cannot reach or will not use: a GuestIngress or GuestWebhookBridge of theirs has ClusterAvailable=False with reason GuestUnreachable, KubeconfigRefused or GuestTooLarge.
# TYPE guestnet_guest_clusters_unreachable gauge
guestnet_guest_clusters_unreachable 3
# HELP guestnet_guestingresses GuestIngresses by the status and reason of their Ready condition.
# TYPE guestnet_guestingresses gauge
guestnet_guestingresses{reason="GuestTooLarge",status="False"} 1
guestnet_guestingresses{reason="GuestUnreachable",status="False"} 1
guestnet_guestingresses{reason="KubeconfigRefused",status="False"} 1
guestnet_guestingresses{reason="NoCondition",status="Unknown"} 1
guestnet_guestingresses{reason="Ready",status="True"} 1
`
	g.Expect(testutil.CollectAndCompare(collector, strings.NewReader(want))).To(Succeed())
}

func TestCollectorReportsOnlyWhenElected(t *testing.T) {
	g := NewWithT(t)
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(gi("web", "tenant-a")).Build()
	elected := make(chan struct{})
	collector := &Collector{Reader: c, Elected: elected}
	g.Expect(testutil.CollectAndCount(collector)).To(Equal(0))
	close(elected)
	g.Expect(testutil.CollectAndCount(collector)).To(Equal(2)) // one GuestIngress series, unreachable clusters
}

func TestCollectorLint(t *testing.T) {
	g := NewWithT(t)
	c := fake.NewClientBuilder().WithScheme(scheme.New()).Build()
	problems, err := testutil.CollectAndLint(&Collector{Reader: c})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(problems).To(BeEmpty())
	for _, m := range []prometheus.Collector{repairs, workerRollouts, conflictsRefused, policyRefusals} {
		problems, err := testutil.CollectAndLint(m)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(problems).To(BeEmpty())
	}
}
