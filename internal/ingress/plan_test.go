package ingress

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// observed is the world of a reconcile where everything is in place: an admitted GuestIngress
// (fixed nodePorts 30080/30443, IP 10.2.6.220) of an existing Cluster, a reachable guest with a
// ClusterIP Service, no host objects yet.
func observed(mutate ...func(*Observed)) *Observed {
	gi := newGI(func(gi *guestnetv1.GuestIngress) { gi.CreationTimestamp = metav1.NewTime(t0) })
	o := &Observed{
		GuestIngress:   gi,
		Cluster:        &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a"}},
		Admission:      Admission{Admitted: true, Reason: guestnetv1.AdmittedReason, Announcement: Announcement{Interfaces: []string{"^eth0$"}}},
		Self:           Claimant{GuestIngress: gi, Eligible: true},
		GuestReachable: true,
		GuestService:   guestSvc(corev1.ServiceTypeClusterIP, sp("http", 80, 0), sp("https", 443, 0)),
	}
	for _, m := range mutate {
		m(o)
	}
	return o
}

func TestMakePlan(t *testing.T) {
	deleting := metav1.NewTime(time.Now())
	tests := []struct {
		name         string
		o            *Observed
		wantWithdraw bool
		wantRefusal  string // reason
		wantHost     bool
		check        func(g Gomega, p *Plan)
	}{
		{
			name:         "no Cluster: everything on the host goes",
			o:            observed(func(o *Observed) { o.Cluster = nil }),
			wantWithdraw: true,
		},
		{
			name:         "Cluster being deleted: the same",
			o:            observed(func(o *Observed) { o.Cluster.DeletionTimestamp = &deleting }),
			wantWithdraw: true,
		},
		{
			name: "not admitted: the same, whatever else holds",
			o: observed(func(o *Observed) {
				o.Admission = Admission{Reason: guestnetv1.NotAllowedReason, Message: "10.2.6.220 is outside the addresses of policy tenants"}
			}),
			wantWithdraw: true,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.WithdrawReason).To(Equal(guestnetv1.NotAllowedReason))
				g.Expect(p.WithdrawMessage).To(ContainSubstring("outside the addresses"))
			},
		},
		{
			name:        "an interface that is no regular expression: nothing changes anywhere",
			o:           observed(func(o *Observed) { o.Admission.Announcement = Announcement{Interfaces: []string{"^eth[0-9+$"}} }),
			wantRefusal: guestnetv1.InvalidSpecReason,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.Refusal.Message).To(ContainSubstring(`spec.loadBalancer.l2.interfaces[0]: "^eth[0-9+$" is not a regular expression`))
				g.Expect(p.GuestService).To(BeNil())
			},
		},
		{
			name: "an older claim that another one holds: refused, its objects stay",
			o: observed(func(o *Observed) {
				other := claimant("other", "web", -5, ip("10.2.6.220"), holding)
				o.Claimants = []Claimant{other}
			}),
			wantRefusal: guestnetv1.IPConflictReason,
		},
		{
			name: "lost a race: refused and withdrawn",
			o: observed(func(o *Observed) {
				o.Self.Held = ClaimOf(o.GuestIngress)
				o.Claimants = []Claimant{claimant("other", "web", -5, ip("10.2.6.220"), holding)}
			}),
			wantRefusal: guestnetv1.IPConflictReason, wantWithdraw: true,
		},
		{
			name: "an admin's pool overlaps: refused",
			o: observed(func(o *Observed) {
				o.ForeignPools = []*unstructured.Unstructured{poolWithBlocks("admin", map[string]any{"cidr": "10.2.6.0/24"})}
			}),
			wantRefusal: guestnetv1.PoolConflictReason,
		},
		{
			name:        "a Service of the name is someone else's: nothing changes",
			o:           observed(func(o *Observed) { o.Foreign = "Service k0smotron/tenant-a-web" }),
			wantRefusal: guestnetv1.HostObjectConflictReason,
		},
		{
			name: "guest unreachable: the host objects stay as they are",
			o:    observed(func(o *Observed) { o.GuestReachable, o.GuestService = false, nil }),
		},
		{
			name:     "everything in place: guest Service, pool, policy, host Service",
			o:        observed(),
			wantHost: true,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.GuestService).NotTo(BeNil())
				g.Expect(p.Pool).NotTo(BeNil())
				g.Expect(p.L2Policy).NotTo(BeNil())
				g.Expect(p.PortsUsable).To(BeTrue())
				g.Expect(toService(t, p.HostService).Spec.Ports[0].TargetPort.IntVal).To(Equal(int32(30080)))
				g.Expect(p.ReclassHostService).To(BeNil())
			},
		},
		{
			name:     "no guest Service yet, fixed nodePorts: the host side is built already",
			o:        observed(func(o *Observed) { o.GuestService = nil }),
			wantHost: true,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.GuestService).To(BeNil())
				g.Expect(p.HostService).NotTo(BeNil())
			},
		},
		{
			name: "a LoadBalancer guest Service without nodePorts: refused in the guest, no host Service",
			o: observed(func(o *Observed) {
				o.GuestService = guestSvc(corev1.ServiceTypeLoadBalancer, sp("http", 80, 0), sp("https", 443, 0))
				o.GuestService.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
			}),
			wantHost: true,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.NoNodePorts).To(ContainSubstring("allocateLoadBalancerNodePorts"))
				g.Expect(p.GuestService).To(BeNil())
				g.Expect(p.HostService).To(BeNil())
				g.Expect(p.PortsUsable).To(BeFalse())
			},
		},
		{
			name: "a new class: the host Service passes through ClusterIP",
			o: observed(func(o *Observed) {
				o.GuestIngress.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane"
				o.HostService = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a-web"},
					Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To("io.cilium/l2-announcer")}}
			}),
			wantHost: true,
			check: func(g Gomega, p *Plan) {
				step := toService(t, p.ReclassHostService)
				g.Expect(step.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP))
				g.Expect(step.Spec.LoadBalancerClass).To(BeNil())
				g.Expect(step.Spec.ExternalTrafficPolicy).To(BeEmpty())
				g.Expect(step.Annotations).To(HaveKeyWithValue(LBIPAMIPsAnnotation, "10.2.6.220"), "the IP stays requested")
				g.Expect(toService(t, p.HostService).Spec.LoadBalancerClass).To(Equal(ptr.To("io.cilium/bgp-control-plane")))
				g.Expect(p.L2Policy).To(BeNil(), "not Cilium's L2 announcer: guestnet's policy is deleted")
			},
		},
		{
			name:        "another GuestIngress of the Cluster owns the guest Service: nothing is written, in the guest or on the host",
			o:           observed(func(o *Observed) { o.GuestServiceRivals = GuestServiceRivals{Owner: "web-old"} }),
			wantRefusal: guestnetv1.GuestServiceClaimedReason,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.Refusal.Message).To(ContainSubstring("Service projectcontour/envoy in the guest is exposed by GuestIngress web-old of this namespace"))
				g.Expect(p.Refusal.Message).To(ContainSubstring("Point spec.guestService at another Service, or delete one of the two GuestIngresses"))
				g.Expect(p.GuestService).To(BeNil())
				g.Expect(p.TakesGuestService).To(BeFalse())
				g.Expect(p.ReleaseGuestService).To(BeNil(), "it holds nothing")
			},
		},
		{
			name:        "another GuestIngress still holds it: nothing is written until it has given it back",
			o:           observed(func(o *Observed) { o.GuestServiceRivals = GuestServiceRivals{Holder: "web-old"} }),
			wantRefusal: guestnetv1.GuestServiceClaimedReason,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.Refusal.Message).To(ContainSubstring("GuestIngress web-old of this namespace has not given Service projectcontour/envoy in the guest back yet"))
				g.Expect(p.TakesGuestService).To(BeFalse())
			},
		},
		{
			name: "it holds a Service another GuestIngress owns now: it gives it back, and takes nothing",
			o: observed(func(o *Observed) {
				o.GuestIngress.Status.GuestService = &guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"}
				o.GuestServiceRivals = GuestServiceRivals{Owner: "web-old"}
			}),
			wantRefusal: guestnetv1.GuestServiceClaimedReason,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.ReleaseGuestService).To(Equal(&guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"}))
				g.Expect(p.TakesGuestService).To(BeFalse())
			},
		},
		{
			name: "spec.guestService changed: the old one is given back, the new one taken",
			o: observed(func(o *Observed) {
				o.GuestIngress.Status.GuestService = &guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy-old"}
			}),
			wantHost: true,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.ReleaseGuestService).To(Equal(&guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy-old"}))
				g.Expect(p.TakesGuestService).To(BeTrue())
				g.Expect(p.GuestService).NotTo(BeNil())
			},
		},
		{
			name: "spec.guestService changed while not admitted: the old one is given back all the same",
			o: observed(func(o *Observed) {
				o.GuestIngress.Status.GuestService = &guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy-old"}
				o.Admission = Admission{Reason: guestnetv1.NoPolicyReason, Message: "no policy"}
			}),
			wantWithdraw: true,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.ReleaseGuestService).To(Equal(&guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy-old"}))
				g.Expect(p.TakesGuestService).To(BeFalse())
			},
		},
		{
			name:     "the Service it holds and names: kept, nothing given back",
			o:        observed(func(o *Observed) { o.GuestIngress.Status.GuestService = o.GuestIngress.Spec.GuestService.DeepCopy() }),
			wantHost: true,
			check: func(g Gomega, p *Plan) {
				g.Expect(p.ReleaseGuestService).To(BeNil())
				g.Expect(p.TakesGuestService).To(BeTrue())
			},
		},
		{
			name: "poolRef: no pool of guestnet's",
			o: observed(func(o *Observed) {
				o.GuestIngress.Spec.LoadBalancer.PoolRef = &guestnetv1.PoolReference{Name: "shared"}
			}),
			wantHost: true,
			check:    func(g Gomega, p *Plan) { g.Expect(p.Pool).To(BeNil()) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			p := MakePlan(tt.o)
			g.Expect(p.Withdraw).To(Equal(tt.wantWithdraw))
			if tt.wantRefusal == "" {
				g.Expect(p.Refusal).To(BeNil())
			} else {
				g.Expect(p.Refusal).NotTo(BeNil())
				g.Expect(p.Refusal.Reason).To(Equal(tt.wantRefusal))
			}
			g.Expect(p.Host).To(Equal(tt.wantHost))
			if !p.Host {
				g.Expect(p.HostService).To(BeNil())
				g.Expect(p.Pool).To(BeNil())
				g.Expect(p.L2Policy).To(BeNil())
			}
			if tt.check != nil {
				tt.check(g, p)
			}
		})
	}
}

func TestValidateSpec(t *testing.T) {
	g := NewWithT(t)
	gi := newGI(func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.Labels = map[string]string{"team": "web edge", "ok": "fine"}
		gi.Spec.LoadBalancer.Annotations = map[string]string{"bad key": "x"}
		gi.Spec.LoadBalancer.Class = "not a class"
	})
	problems := ValidateSpec(gi, Announcement{
		Interfaces:   []string{"^eth0$", "(["},
		NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Equals"}}},
	})
	g.Expect(problems).To(HaveLen(5))
	g.Expect(problems[0]).To(HavePrefix(`spec.loadBalancer.labels[team]: "web edge":`))
	g.Expect(problems[1]).To(HavePrefix(`spec.loadBalancer.annotations[bad key]: "bad key":`))
	g.Expect(problems[2]).To(HavePrefix(`spec.loadBalancer.class: "not a class":`))
	g.Expect(problems[3]).To(HavePrefix(`spec.loadBalancer.l2.interfaces[1]: "([" is not a regular expression`))
	g.Expect(problems[4]).To(HavePrefix(`spec.loadBalancer.l2.nodeSelector:`))
	g.Expect(ValidateSpec(newGI(), Announcement{Interfaces: []string{"^eth[0-9]+$"}})).To(BeEmpty())
}

// Whatever an earlier reconcile left in status, SetStatus sets every field and condition it
// owns from this reconcile's observation, plan and result.
func TestSetStatus(t *testing.T) {
	ready := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a-web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intOrString(30080)}, {Name: "https", Port: 443, TargetPort: intOrString(30443)},
		}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "10.2.6.220"}}}},
	}
	portsDeclared := &metav1.Condition{Type: guestnetv1.PortsDeclaredCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.PortsDeclaredReason}
	tests := []struct {
		name           string
		o              *Observed
		result         func(o *Observed, p *Plan) *Result
		wantSummarised []string
		wantIP         string
		wantConditions map[string]string // type -> reason; absent ones must not be there
	}{
		{
			name:           "no Cluster: only Admitted and ClusterAvailable, nothing of the chain",
			o:              observed(func(o *Observed) { o.Cluster = nil }),
			result:         func(*Observed, *Plan) *Result { return &Result{} },
			wantSummarised: []string{guestnetv1.AdmittedCondition, guestnetv1.ClusterAvailableCondition},
			wantConditions: map[string]string{guestnetv1.AdmittedCondition: guestnetv1.AdmittedReason},
		},
		{
			name:           "not admitted: Admitted says why",
			o:              observed(func(o *Observed) { o.Admission = Admission{Reason: guestnetv1.NoPolicyReason, Message: "no policy"} }),
			result:         func(*Observed, *Plan) *Result { return &Result{} },
			wantSummarised: []string{guestnetv1.AdmittedCondition, guestnetv1.ClusterAvailableCondition},
			wantConditions: map[string]string{guestnetv1.AdmittedCondition: guestnetv1.NoPolicyReason},
		},
		{
			name: "refused and withdrawn: the refusal, no host Service",
			o: observed(func(o *Observed) {
				o.Self.Held = ClaimOf(o.GuestIngress)
				o.Claimants = []Claimant{claimant("other", "web", -5, ip("10.2.6.220"), holding)}
			}),
			result:         func(*Observed, *Plan) *Result { return &Result{} },
			wantSummarised: []string{guestnetv1.AdmittedCondition, guestnetv1.ClusterAvailableCondition, guestnetv1.LoadBalancerReadyCondition, guestnetv1.EndpointsReadyCondition},
			wantConditions: map[string]string{
				guestnetv1.AdmittedCondition: guestnetv1.AdmittedReason, guestnetv1.LoadBalancerReadyCondition: guestnetv1.IPConflictReason,
				guestnetv1.EndpointsReadyCondition: guestnetv1.NoEndpointsReason,
			},
		},
		{
			name: "refused, objects kept: what they do is reported",
			o: observed(func(o *Observed) {
				o.ForeignPools = []*unstructured.Unstructured{poolWithBlocks("admin", map[string]any{"cidr": "10.2.6.0/24"})}
				o.HostService = ready
			}),
			result: func(o *Observed, _ *Plan) *Result {
				return &Result{HostService: o.HostService, ReadyEndpoints: 2, TotalEndpoints: 2}
			},
			wantSummarised: []string{guestnetv1.AdmittedCondition, guestnetv1.ClusterAvailableCondition, guestnetv1.LoadBalancerReadyCondition, guestnetv1.EndpointsReadyCondition},
			wantIP:         "10.2.6.220",
			wantConditions: map[string]string{
				guestnetv1.AdmittedCondition: guestnetv1.AdmittedReason, guestnetv1.LoadBalancerReadyCondition: guestnetv1.PoolConflictReason,
				guestnetv1.EndpointsReadyCondition: guestnetv1.ReadyReason,
			},
		},
		{
			name: "guest unreachable: what needs the guest is Unknown, the host side as it is",
			o:    observed(func(o *Observed) { o.GuestReachable, o.GuestService, o.HostService = false, nil, ready }),
			result: func(o *Observed, _ *Plan) *Result {
				return &Result{HostService: o.HostService, ReadyEndpoints: 1, TotalEndpoints: 1}
			},
			wantSummarised: SummarisedConditions,
			wantIP:         "10.2.6.220",
			wantConditions: map[string]string{
				guestnetv1.AdmittedCondition: guestnetv1.AdmittedReason, guestnetv1.GuestServiceReadyCondition: guestnetv1.GuestUnreachableReason,
				guestnetv1.LoadBalancerReadyCondition: guestnetv1.ReadyReason, guestnetv1.EndpointsReadyCondition: guestnetv1.ReadyReason,
				guestnetv1.PortsDeclaredCondition: guestnetv1.GuestUnreachableReason,
			},
		},
		{
			name: "the whole chain",
			o:    observed(func(o *Observed) { o.HostService = ready }),
			result: func(o *Observed, _ *Plan) *Result {
				return &Result{GuestService: o.GuestService, HostService: ready, ReadyEndpoints: 2, TotalEndpoints: 2, PortsDeclared: portsDeclared}
			},
			wantSummarised: SummarisedConditions,
			wantIP:         "10.2.6.220",
			wantConditions: map[string]string{
				guestnetv1.AdmittedCondition: guestnetv1.AdmittedReason, guestnetv1.GuestServiceReadyCondition: guestnetv1.ReadyReason,
				guestnetv1.LoadBalancerReadyCondition: guestnetv1.ReadyReason, guestnetv1.EndpointsReadyCondition: guestnetv1.ReadyReason,
				guestnetv1.PortsDeclaredCondition: guestnetv1.PortsDeclaredReason,
			},
		},
		{
			name: "the guest refused a fixed nodePort: the host Service stays, the holder is named",
			o:    observed(func(o *Observed) { o.HostService = ready }),
			result: func(o *Observed, _ *Plan) *Result {
				return &Result{GuestService: o.GuestService, HostService: ready, NodePortHeld: true, NodePortHolders: []string{"nodePort 30080 (port http) is allocated to Service a/b"},
					GuestRefused: "provided port is already allocated", ReadyEndpoints: 1, TotalEndpoints: 1, PortsDeclared: portsDeclared}
			},
			wantSummarised: SummarisedConditions,
			wantIP:         "10.2.6.220",
			wantConditions: map[string]string{
				guestnetv1.AdmittedCondition: guestnetv1.AdmittedReason, guestnetv1.GuestServiceReadyCondition: guestnetv1.NodePortConflictReason,
				guestnetv1.LoadBalancerReadyCondition: guestnetv1.ReadyReason, guestnetv1.EndpointsReadyCondition: guestnetv1.ReadyReason,
				guestnetv1.PortsDeclaredCondition: guestnetv1.PortsDeclaredReason,
			},
		},
		{
			name: "the host apiserver refused an object",
			o:    observed(),
			result: func(o *Observed, _ *Plan) *Result {
				return &Result{GuestService: o.GuestService, HostRejected: "The host apiserver refused Service x"}
			},
			wantConditions: map[string]string{
				guestnetv1.AdmittedCondition: guestnetv1.AdmittedReason, guestnetv1.GuestServiceReadyCondition: guestnetv1.ReadyReason,
				guestnetv1.LoadBalancerReadyCondition: guestnetv1.HostObjectRejectedReason, guestnetv1.EndpointsReadyCondition: guestnetv1.NoEndpointsReason,
				guestnetv1.PortsDeclaredCondition: guestnetv1.InternalErrorReason,
			},
			wantSummarised: SummarisedConditions,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			// What an earlier reconcile left: every field set, every condition True.
			gi := tt.o.GuestIngress
			gi.Status = guestnetv1.GuestIngressStatus{LoadBalancerIP: "10.9.9.9", HostService: "stale", ReadyEndpoints: 9}
			for _, c := range append([]string{guestnetv1.ReadyCondition}, SummarisedConditions...) {
				conditions.Set(gi, metav1.Condition{Type: c, Status: metav1.ConditionTrue, Reason: "Stale"})
			}
			p := MakePlan(tt.o)
			summarised := SetStatus(gi, tt.o, p, tt.result(tt.o, p))

			g.Expect(summarised).To(Equal(tt.wantSummarised))
			g.Expect(gi.Status.LoadBalancerIP).To(Equal(tt.wantIP))
			if tt.wantIP == "" {
				g.Expect(gi.Status.HostService).To(BeEmpty())
				g.Expect(gi.Status.ReadyEndpoints).To(BeZero())
			} else {
				g.Expect(gi.Status.HostService).To(Equal("tenant-a-web"))
			}
			for _, c := range SummarisedConditions {
				if c == guestnetv1.ClusterAvailableCondition {
					continue // the controller's (internal/clusterscope)
				}
				want, ok := tt.wantConditions[c]
				if !ok {
					g.Expect(conditions.Get(gi, c)).To(BeNil(), "%s should not be reported", c)
					continue
				}
				g.Expect(conditions.GetReason(gi, c)).To(Equal(want), "%s: %s", c, conditions.GetMessage(gi, c))
			}
		})
	}
}

func TestMessagesAreBounded(t *testing.T) {
	g := NewWithT(t)
	long := newGI()
	SetIPPending(long, &corev1.Service{}, nil, string(make([]byte, 5000)))
	g.Expect(len(conditions.GetMessage(long, guestnetv1.LoadBalancerReadyCondition))).To(BeNumerically("<=", MaxMessage))
}

func intOrString(i int32) intstr.IntOrString { return intstr.FromInt32(i) }
