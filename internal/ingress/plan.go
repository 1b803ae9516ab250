package ingress

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	discoveryv1ac "k8s.io/client-go/applyconfigurations/discovery/v1"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// A reconcile of a GuestIngress observes the world (Observed), makes a Plan of it with the
// pure MakePlan, applies the plan (Result), and derives the status from the three
// (SetStatus). The controller (controllers/guestingress) does the reading and writing.

// Admission is what internal/policy decided for the GuestIngress (policy.Decision is this
// type: internal/policy builds on this package, so the type lives here).
type Admission struct {
	Admitted bool
	// Policy names the admitting policy ("" when none).
	Policy string
	// Reason (an Admitted condition reason) and Message say what is (not) allowed.
	Reason, Message string
	// Announcement is where the L2 announcement policy announces from.
	Announcement Announcement
	// Announcer gives and announces the IP (from the class and the admitting policy);
	// BGP is what a CiliumBGP route carries; MetalLB how MetalLB gives and announces it.
	Announcer Announcer
	BGP       BGPAnnouncement
	MetalLB   MetalLBAnnouncement
	// Detail is what Message leaves out because it is not the tenant's to read (which
	// policy that does not select the namespace would allow it, which of the platform's
	// pools stand in the way), for the manager's log; "" when nothing is left out.
	Detail string
}

// Observed is what one reconcile saw of the world, before it changed anything.
type Observed struct {
	GuestIngress *guestnetv1.GuestIngress
	// Cluster is the CAPI Cluster of spec.clusterName; nil when it does not exist.
	Cluster *clusterv1.Cluster
	// Admission is the policy's decision.
	Admission Admission

	// Self is the GuestIngress as a claimant (what it holds on the host); Claimants are the
	// other GuestIngresses whose claims are entangled with its own (Entangled).
	Self      Claimant
	Claimants []Claimant
	// ForeignPools are the CiliumLoadBalancerIPPools guestnet does not manage for a
	// GuestIngress it knows (an admin's, a shared one, an orphan).
	ForeignPools []*unstructured.Unstructured

	// GuestReachable: the guest apiserver answers; GuestService is then the Service of
	// spec.guestService (nil when it does not exist).
	GuestReachable bool
	GuestService   *corev1.Service
	// GuestServiceRivals are the other GuestIngresses of the Cluster that own or still hold
	// the guest Service of spec.guestService.
	GuestServiceRivals GuestServiceRivals

	// The host objects guestnet creates for this GuestIngress, nil when there is none.
	// Foreign names the first one whose name is taken by an object guestnet did not create
	// for this GuestIngress ("Service k0smotron/tenant-a-web"), "" when none is.
	HostService *corev1.Service
	Pool        *unstructured.Unstructured
	L2Policy    *unstructured.Unstructured
	Announcers  AnnouncerObjects
	Foreign     string
	// MissingAPI says, when the announcer the policy chose needs an API the host does not
	// serve (Cilium's BGP CRDs, MetalLB's), what is missing and what to install; "" otherwise.
	MissingAPI string
	// LocalEndpoints, with externalTrafficPolicy Local, are the worker endpoints the host
	// Service forwards to: the virt-launcher pods of the workers that run a ready endpoint of
	// the guest Service (nil when not observed).
	LocalEndpoints []Endpoint
	// RefPool is the pool spec.loadBalancer.poolRef names; nil when none or it does not exist.
	RefPool *unstructured.Unstructured
}

// Eligible reports whether the GuestIngress may hold host objects at all: its Cluster exists
// and is not being deleted, and a policy admits it. (Pause and deletion are decided before
// anything is observed.)
func (o *Observed) Eligible() bool {
	return o.Cluster != nil && o.Cluster.DeletionTimestamp.IsZero() && o.Admission.Admitted
}

// Refusal is why the GuestIngress gets none of its spec's changes on the host: a condition
// reason of LoadBalancerReady and its message (the tenant's), and what the message leaves out
// for the manager's log (Detail, "" when nothing).
type Refusal struct {
	Reason, Message, Detail string
}

// Plan is what the controller writes.
type Plan struct {
	// Withdraw: every host object of the GuestIngress is deleted (its Cluster is gone or
	// being deleted, it is not admitted, or its objects occupy address space another one
	// keeps); WithdrawReason and WithdrawMessage say why, for the events.
	Withdraw                        bool
	WithdrawReason, WithdrawMessage string
	// Refusal, when set, means nothing of the spec is applied (guest or host); the host
	// objects are deleted when Withdraw is also set, else left as they are.
	Refusal *Refusal

	// ReleaseGuestService is the guest Service guestnet holds for this GuestIngress
	// (status.guestService) and gives back first, restored and released as at deletion:
	// spec.guestService names another one, or another GuestIngress owns it. nil when none.
	// Giving back is never refused.
	ReleaseGuestService *guestnetv1.ObjectReference
	// TakesGuestService: guestnet may write to the guest Service of spec.guestService for
	// this GuestIngress (once the one it held is given back); status.guestService names it
	// from then on.
	TakesGuestService bool

	// GuestService is applied to the guest Service; nil when there is nothing to apply.
	GuestService *corev1ac.ServiceApplyConfiguration
	// NoNodePorts is set when the guest Service cannot carry nodePorts (GuestService).
	NoNodePorts string
	// Ports are the guest nodePorts behind the spec ports once GuestService is applied;
	// MissingPorts the spec ports the guest Service lacks; PortsUsable says whether the host
	// Service may forward to Ports.
	Ports        []guestnetv1.IngressPortStatus
	MissingPorts []guestnetv1.IngressPort
	PortsUsable  bool

	// Host is false when the host objects are left as they are (refused, or the guest cannot
	// be reached); then the fields below are unset.
	Host bool
	// Pool and L2Policy are applied; nil: guestnet's own (if any) is deleted. So are the
	// announcers' objects.
	Pool, L2Policy *unstructured.Unstructured
	Announcers     AnnouncerObjects
	// EndpointSlices are applied for a host Service without selector (externalTrafficPolicy
	// Local); none: guestnet's are deleted.
	EndpointSlices []*discoveryv1ac.EndpointSliceApplyConfiguration
	// HostService is applied; nil: the host Service is left as it is (its nodePorts are not
	// known or usable). ReclassHostService, when set, is applied first: the loadBalancerClass
	// of a LoadBalancer Service cannot change, so the Service passes through ClusterIP (and
	// keeps its name, UID and its request for the IP) to take the new class.
	HostService        *corev1ac.ServiceApplyConfiguration
	ReclassHostService *corev1ac.ServiceApplyConfiguration
}

// MakePlan decides what a reconcile writes, from what it observed.
func MakePlan(o *Observed) *Plan {
	gi := o.GuestIngress
	p := &Plan{}
	if o.Cluster == nil || !o.Cluster.DeletionTimestamp.IsZero() {
		// Its workers are gone (or going) with the Cluster: nothing is left to expose.
		p.Withdraw, p.WithdrawReason, p.WithdrawMessage = true, guestnetv1.ClusterNotFoundReason, "its Cluster is gone or being deleted"
		return p
	}
	// What guestnet holds in the guest and must give back is given back whatever else is
	// decided: the guest is the tenant's own, and giving back takes nothing.
	p.ReleaseGuestService = guestServiceToRelease(gi, o.GuestServiceRivals)
	if !o.Admission.Admitted {
		p.Withdraw, p.WithdrawReason, p.WithdrawMessage = true, o.Admission.Reason, "not admitted: "+o.Admission.Message
		return p
	}
	if problems := ValidateSpec(gi, o.Admission.Announcement); len(problems) > 0 {
		p.Refusal = &Refusal{Reason: guestnetv1.InvalidSpecReason, Message: invalidSpecMessage(problems)}
		return p
	}
	conflict := ForeignPoolConflict(gi, o.Self.Held, o.ForeignPools)
	if conflict == nil {
		conflict = Contest(o.Self, o.Claimants)
	}
	if conflict != nil {
		p.Refusal = &Refusal{Reason: conflict.Reason, Message: conflict.Message, Detail: conflict.Detail}
		if conflict.Release {
			p.Withdraw, p.WithdrawReason, p.WithdrawMessage = true, conflict.Reason, "its address space is kept by "+conflict.Who
		}
		return p
	}
	if o.Foreign != "" {
		p.Refusal = &Refusal{Reason: guestnetv1.HostObjectConflictReason, Message: hostObjectConflictMessage(o.Foreign)}
		return p
	}
	if refusal := guestServiceClaimed(gi, o.GuestServiceRivals); refusal != nil {
		p.Refusal = refusal
		return p
	}
	p.TakesGuestService = true
	if !o.GuestReachable {
		return p // ClusterAvailable says why; the host objects stay as they are
	}

	// Guest: what the Service will be once guestnet's configuration is applied.
	expected := o.GuestService
	if o.GuestService != nil {
		p.GuestService, p.NoNodePorts = GuestService(gi, o.GuestService)
		if p.NoNodePorts == "" {
			expected = ExpectedGuestService(gi, o.GuestService)
		}
	}
	var complete bool
	p.Ports, p.MissingPorts, complete = NodePorts(gi, expected)
	p.PortsUsable = complete && len(p.MissingPorts) == 0 && p.NoNodePorts == ""
	if p.NoNodePorts != "" {
		p.Ports, p.MissingPorts = nil, nil
	}

	if o.MissingAPI != "" {
		p.Refusal = &Refusal{Reason: guestnetv1.HostObjectRejectedReason, Message: o.MissingAPI}
		return p
	}

	// Host.
	p.Host = true
	a := o.Admission
	if a.Announcer.UsesCiliumLBIPAM() {
		p.Pool = Pool(gi)
	}
	announcers, err := BuildAnnouncers(gi, a)
	if err != nil {
		p.Host, p.Refusal = false, &Refusal{Reason: guestnetv1.InvalidSpecReason, Message: err.Error()}
		return p
	}
	p.Announcers = announcers
	policy, err := L2Policy(gi, o.Admission.Announcement)
	if err != nil {
		// ValidateSpec checked the selector; only a programming error gets here.
		p.Host, p.Refusal = false, &Refusal{Reason: guestnetv1.InvalidSpecReason, Message: err.Error()}
		return p
	}
	p.L2Policy = policy
	if p.PortsUsable {
		p.HostService = HostService(gi, NodePortMap(p.Ports), a)
		if Local(gi) {
			p.EndpointSlices = HostEndpointSlices(gi, NodePortMap(p.Ports), o.LocalEndpoints)
		}
		if live := o.HostService; live != nil && live.Spec.LoadBalancerClass != nil && *live.Spec.LoadBalancerClass != LoadBalancerClass(gi) {
			p.ReclassHostService = ReclassHostService(p.HostService)
		}
	}
	return p
}

// guestServiceToRelease is the guest Service gi holds (status.guestService) and must give
// back: one its spec no longer names, or one another GuestIngress owns. nil when none.
func guestServiceToRelease(gi *guestnetv1.GuestIngress, rivals GuestServiceRivals) *guestnetv1.ObjectReference {
	held := gi.Status.GuestService
	if held == nil || (*held == gi.Spec.GuestService && rivals.Owner == "") {
		return nil
	}
	return held.DeepCopy()
}

// ReclassHostService is the host Service as a ClusterIP Service: the step between two
// loadBalancerClasses. It keeps the Service's name, labels, annotations (the IP request) and
// ports, and drops what only a LoadBalancer Service has.
func ReclassHostService(desired *corev1ac.ServiceApplyConfiguration) *corev1ac.ServiceApplyConfiguration {
	step := *desired
	spec := *desired.Spec
	spec.Type = ptr.To(corev1.ServiceTypeClusterIP)
	spec.LoadBalancerClass = nil
	spec.ExternalTrafficPolicy = nil
	spec.AllocateLoadBalancerNodePorts = nil
	spec.HealthCheckNodePort = nil
	step.Spec = &spec
	return &step
}

// ValidateSpec checks what admission could not (a pattern on every map value or list item
// costs the apiserver too much; an object stored before a rule existed was never checked):
// the host Service's labels and annotations and class, the announcement's interfaces (Go
// regular expressions, as Cilium compiles them) and node selector. Each problem names the
// field.
func ValidateSpec(gi *guestnetv1.GuestIngress, a Announcement) []string {
	lb := gi.Spec.LoadBalancer
	var problems []string
	for _, k := range slices.Sorted(maps.Keys(lb.Labels)) {
		problems = appendInvalid(problems, fmt.Sprintf("spec.loadBalancer.labels[%s]", k), k, validation.IsQualifiedName(k))
		problems = appendInvalid(problems, fmt.Sprintf("spec.loadBalancer.labels[%s]", k), lb.Labels[k], validation.IsValidLabelValue(lb.Labels[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(lb.Annotations)) {
		problems = appendInvalid(problems, fmt.Sprintf("spec.loadBalancer.annotations[%s]", k), k, validation.IsQualifiedName(k))
	}
	problems = appendInvalid(problems, "spec.loadBalancer.class", LoadBalancerClass(gi), validation.IsQualifiedName(LoadBalancerClass(gi)))
	for i, re := range a.Interfaces {
		if _, err := regexp.Compile(re); err != nil {
			problems = append(problems, fmt.Sprintf("spec.loadBalancer.l2.interfaces[%d]: %q is not a regular expression: %v", i, re, err))
		}
	}
	if a.NodeSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(a.NodeSelector); err != nil {
			problems = append(problems, fmt.Sprintf("spec.loadBalancer.l2.nodeSelector: %v", err))
		}
	}
	return append(problems, familyProblems(gi)...)
}

// familyProblems: the host Service's families (IPFamilies) match its fixed IPs, and each has
// a range of its family when LB-IPAM or MetalLB chooses the IP from cidrs.
func familyProblems(gi *guestnetv1.GuestIngress) []string {
	lb := gi.Spec.LoadBalancer
	families := IPFamilies(gi)
	var problems []string
	if ips := RequestedAddrs(gi); len(ips) > 0 {
		var got []corev1.IPFamily
		for _, ip := range ips {
			got = append(got, FamilyOf(ip))
		}
		if !slices.Equal(got, families) {
			problems = append(problems, fmt.Sprintf("spec.loadBalancer.ipFamilies: %v, but the fixed IPs are %v: list the families of the IPs, in their order", families, got))
		}
		return problems
	}
	if len(lb.CIDRs) == 0 {
		return nil
	}
	for _, f := range families {
		if !slices.ContainsFunc(PoolPrefixes(gi), func(p netip.Prefix) bool { return FamilyOf(p.Addr()) == f }) {
			problems = append(problems, fmt.Sprintf("spec.loadBalancer.ipFamilies: %s, but no range of spec.loadBalancer.cidrs is %s: add one", f, f))
		}
	}
	return problems
}

func appendInvalid(problems []string, field, value string, errs []string) []string {
	if len(errs) == 0 {
		return problems
	}
	return append(problems, fmt.Sprintf("%s: %q: %s", field, value, strings.Join(errs, "; ")))
}

func invalidSpecMessage(problems []string) string {
	return fmt.Sprintf("guestnet cannot build the host objects from this spec, and changes nothing on the host until it is corrected: %s",
		strings.Join(problems, "; "))
}

func hostObjectConflictMessage(object string) string {
	return fmt.Sprintf("%s exists and was not created by guestnet for this GuestIngress; guestnet changes nothing of anyone else's, "+
		"nor any host object of this GuestIngress, until it is gone. Rename or delete that object, or rename this GuestIngress", object)
}
