package policy

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// Names of what a tenant may not learn about: another namespace, its GuestIngress and
// Cluster, a policy that does not select the tenant's namespace and its selector, the
// platform's pools. Each is distinctive, so a message that leaks one is found.
const (
	secretNamespace = "zebra-otherns"
	secretGI        = "okapi-gi"
	secretCluster   = "quokka-cluster"
	secretPolicy    = "axolotl-policy"
	secretLabel     = "ibis-label"
	secretPool      = "narwhal-pool"
)

var secrets = []string{secretNamespace, secretGI, secretCluster, secretPolicy, secretLabel, secretPool}

// Every message a tenant reads about its GuestIngress (the Admitted, LoadBalancerReady and
// other conditions, and the notes of the events guestnet records in its namespace) names
// only objects of the tenant's own namespace and policies that select it: another
// namespace's GuestIngresses, their Clusters and pools, policies that do not select the
// namespace and their selectors, and the platform's pools are never named. Each case builds
// the message from a situation that involves them. What they leave out goes to the
// manager's log (Decision.Detail, ingress.Withheld), and all of it does.
func TestMessagesNameOnlyTheTenantsOwnObjects(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-ns", Labels: map[string]string{corev1.LabelMetadataName: "tenant-ns"}}}
	tenant := func(lb guestnetv1.LoadBalancerSpec) *guestnetv1.GuestIngress {
		return &guestnetv1.GuestIngress{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "web", UID: "uid-web", CreationTimestamp: metav1.NewTime(t0.Add(time.Minute))},
			Spec: guestnetv1.GuestIngressSpec{
				ClusterName:  "tenant-a",
				GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
				Ports:        []guestnetv1.IngressPort{{Name: "http", Port: 80, NodePort: ptr.To[int32](30080), Protocol: corev1.ProtocolTCP}},
				LoadBalancer: lb,
			},
		}
	}
	other := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: secretGI, UID: "uid-other", CreationTimestamp: metav1.NewTime(t0)},
		Spec:       guestnetv1.GuestIngressSpec{ClusterName: secretCluster, LoadBalancer: guestnetv1.LoadBalancerSpec{CIDRs: []string{"10.2.6.0/24"}}},
	}
	// A policy of another namespace (its selector names a label of it) that would allow
	// everything, and one that selects the tenant's namespace.
	foreignPolicy := guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: secretPolicy},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{secretLabel: "yes"}},
			Addresses:         []string{"10.0.0.0/8"},
			L2Announcement:    &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$"}},
		},
	}
	ownPolicy := guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "tenants"},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns.Name}},
			Addresses:         []string{"10.2.0.0/16"},
			L2Announcement:    &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$"}},
		},
	}
	// The platform's pool: no serviceSelector (it selects every Service), blocks 10.2.7.0/24.
	platformPool := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"blocks": []any{map[string]any{"cidr": "10.2.7.0/24"}}}}}
	platformPool.SetGroupVersionKind(ingress.PoolGVK)
	platformPool.SetName(secretPool)
	// The pool guestnet made for the other namespace's GuestIngress (its name embeds the
	// namespace and the Cluster).
	otherPool := ingress.Pool(other)
	otherPool.SetName(hostnames.Pool(other))

	var messages, withheld []string
	admit := func(gi *guestnetv1.GuestIngress, policies []guestnetv1.GuestIngressPolicy, pools ...*unstructured.Unstructured) Decision {
		byName := PoolMap{}
		for _, p := range pools {
			byName[p.GetName()] = p
		}
		d := Admit(Input{GuestIngress: gi, Namespace: ns, Policies: policies, Pools: byName})
		messages, withheld = append(messages, d.Message), append(withheld, d.Detail)
		return d
	}
	// plan makes the plan and the status of gi (admitted by ownPolicy) in world o.
	plan := func(gi *guestnetv1.GuestIngress, mutate func(*ingress.Observed)) {
		o := &ingress.Observed{
			GuestIngress:   gi,
			Cluster:        &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "tenant-a"}},
			Admission:      admit(gi, []guestnetv1.GuestIngressPolicy{ownPolicy}),
			Self:           ingress.Claimant{GuestIngress: gi, Eligible: true},
			GuestReachable: true,
		}
		mutate(o)
		p := ingress.MakePlan(o)
		messages = append(messages, p.WithdrawMessage)
		if p.Refusal != nil {
			messages = append(messages, p.Refusal.Message)
		}
		ingress.SetStatus(gi, o, p, &ingress.Result{})
		withheld = append(withheld, ingress.Withheld(gi, o, p)...)
		for _, c := range gi.Status.Conditions {
			messages = append(messages, c.Message)
		}
	}

	t.Run("a policy that does not select the namespace would allow it", func(t *testing.T) {
		d := admit(tenant(guestnetv1.LoadBalancerSpec{IP: "10.9.0.1"}), []guestnetv1.GuestIngressPolicy{foreignPolicy})
		NewWithT(t).Expect(d.Reason).To(Equal(guestnetv1.NoPolicyReason))
		d = admit(tenant(guestnetv1.LoadBalancerSpec{IP: "10.9.0.1"}), []guestnetv1.GuestIngressPolicy{foreignPolicy, ownPolicy})
		NewWithT(t).Expect(d.Reason).To(Equal(guestnetv1.NotAllowedReason))
	})
	t.Run("a platform pool could hand out the IP", func(t *testing.T) {
		d := admit(tenant(guestnetv1.LoadBalancerSpec{CIDRs: []string{"10.2.8.0/29"}}), []guestnetv1.GuestIngressPolicy{ownPolicy}, platformPool)
		NewWithT(t).Expect(d.Reason).To(Equal(guestnetv1.NotAllowedReason))
	})
	t.Run("another namespace's GuestIngress holds the IP", func(t *testing.T) {
		gi := tenant(guestnetv1.LoadBalancerSpec{IP: "10.2.6.9"})
		plan(gi, func(o *ingress.Observed) {
			holder := ingress.Claimant{GuestIngress: other, Eligible: true, Held: ingress.ClaimOf(other)}
			o.Self.Held = ingress.Claim{IP: ingress.ClaimOf(gi).IP} // so that it must release
			o.Claimants = []ingress.Claimant{holder}
		})
		NewWithT(t).Expect(conditionReason(gi, guestnetv1.LoadBalancerReadyCondition)).To(Equal(guestnetv1.IPConflictReason))
	})
	t.Run("another namespace's GuestIngress holds overlapping ranges", func(t *testing.T) {
		gi := tenant(guestnetv1.LoadBalancerSpec{CIDRs: []string{"10.2.6.128/25"}})
		plan(gi, func(o *ingress.Observed) {
			o.Claimants = []ingress.Claimant{{GuestIngress: other, Eligible: true, Held: ingress.ClaimOf(other)}}
		})
		NewWithT(t).Expect(conditionReason(gi, guestnetv1.LoadBalancerReadyCondition)).To(Equal(guestnetv1.PoolConflictReason))
	})
	t.Run("a platform pool overlaps the ranges", func(t *testing.T) {
		gi := tenant(guestnetv1.LoadBalancerSpec{CIDRs: []string{"10.2.7.0/28"}})
		plan(gi, func(o *ingress.Observed) {
			o.Self.Held = ingress.Claim{Prefixes: ingress.PoolPrefixes(gi)}
			o.ForeignPools = []*unstructured.Unstructured{platformPool, otherPool}
		})
		NewWithT(t).Expect(conditionReason(gi, guestnetv1.LoadBalancerReadyCondition)).To(Equal(guestnetv1.PoolConflictReason))
	})
	t.Run("Cilium reports the pool conflicting with another", func(t *testing.T) {
		gi := tenant(guestnetv1.LoadBalancerSpec{CIDRs: []string{"10.2.9.0/28"}})
		plan(gi, func(o *ingress.Observed) {
			o.Pool = ingress.Pool(gi)
			o.Pool.SetName(hostnames.Pool(gi))
			o.Pool.SetLabels(ownership.SelectGuestIngress(gi))
			o.Pool.Object["status"] = map[string]any{"conditions": []any{map[string]any{
				"type": ingress.PoolConflictCondition, "status": "True", "reason": "cidr_overlap",
				"message": "Pool conflicts since range '10.2.9.0/28' overlaps range '10.2.9.0/24' from IP Pool '" + secretPool + "'",
			}}}
		})
		NewWithT(t).Expect(conditionReason(gi, guestnetv1.LoadBalancerReadyCondition)).To(Equal(guestnetv1.PoolConflictReason))
	})

	g := NewWithT(t)
	g.Expect(len(messages)).To(BeNumerically(">", 10), "the cases built their messages")
	var leaks []string
	for _, m := range messages {
		for _, s := range secrets {
			if strings.Contains(m, s) {
				leaks = append(leaks, s+" in: "+m)
			}
		}
	}
	g.Expect(leaks).To(BeEmpty())
	// What the messages leave out is the admin's, in the manager's log: all of it.
	for _, s := range secrets {
		g.Expect(strings.Join(withheld, "\n")).To(ContainSubstring(s), "the manager's log would not name %s", s)
	}
}

func conditionReason(gi *guestnetv1.GuestIngress, conditionType string) string {
	for _, c := range gi.Status.Conditions {
		if c.Type == conditionType {
			return c.Reason
		}
	}
	return ""
}
