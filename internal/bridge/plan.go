package bridge

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// Input is what a plan is made from.
type Input struct {
	Bridge  *guestnetv1.GuestWebhookBridge
	Targets []Target
	// GuestServices are all Services of the guest: the targets' Services, the bridge's own,
	// and every nodePort in use.
	GuestServices []corev1.Service
	// Reach is, in mode Auto, whether the guest apiserver reaches guest Services by itself.
	Reach Reachability
}

// Reachability is the evidence that the guest apiserver reaches guest Services by itself
// (a working konnectivity), in which case mode Auto leaves service references alone.
type Reachability struct {
	Reaches  bool
	Evidence string
}

// Action is what the controller must write on a target's object.
type Action string

const (
	// NoAction: the object is as it should be.
	NoAction Action = ""
	// RewriteAction: point the target at the bridge (first time, or a repair after a revert).
	RewriteAction Action = "Rewrite"
	// ForgetAction: drop guestnet's record; someone else changed the target since.
	ForgetAction Action = "Forget"
)

// TargetPlan is the plan for one target.
type TargetPlan struct {
	Target
	Action Action
	// Backend and Port are the guest Service port the bridged target reaches (nil/0 when not bridged).
	Backend *Backend
	Port    int32
	// URL (webhooks) or APIServiceRef (APIServices) is what the target must hold.
	URL           string
	APIServiceRef *apiregistrationv1.ServiceReference
	// TLSServerName is the name the target's certificate must carry for the guest apiserver.
	TLSServerName string
	// Bridged: repointed (or left alone because the guest apiserver reaches it).
	Bridged bool
	// Reason is the condition reason of a problem ("" when there is none); Message says what
	// is going on and, for a problem, what to do.
	Reason  string
	Message string
	// Warnings are worth knowing but break nothing.
	Warnings []string
	// Probe is filled by the controller for targets that go through the bridge.
	Probe *ProbeResult

	// rewritten: the target holds what guestnet wrote (IsRewritten of the target as
	// observed; Service is replaced by the recorded original below, so IsRewritten(tp.Target)
	// no longer tells).
	rewritten bool
}

// ViaBridge reports whether the target's calls go through the bridge's Services.
func (p *TargetPlan) ViaBridge() bool { return p.Backend != nil }

// Backend is one guest Service that bridged targets call, and what the bridge keeps for it.
type Backend struct {
	// Service is the guest Service (the chart's), left untouched.
	Service *corev1.Service
	Ports   []BackendPort
	// NodePortService (guest), ExternalNameService (guest, only for APIServices) and
	// HostService (host, the Cluster's namespace) are the names of the bridge's Services.
	NodePortService     string
	ExternalNameService string
	HostService         string
	// APIService is true when an APIService calls it: the ExternalName Service is needed.
	APIService bool
}

// Key is "<namespace>/<name>" of the guest Service.
func (b *Backend) Key() string { return b.Service.Namespace + "/" + b.Service.Name }

// BackendPort is one port of a backend's guest Service, with the bridge's nodePort for it.
type BackendPort struct {
	Name       string
	Port       int32
	TargetPort intstr.IntOrString
	// NodePort is 0 when the range had none left.
	NodePort int32
}

// PortName is the port's name on the bridge's Services (a Service with several ports must
// name them).
func (p BackendPort) PortName() string {
	if p.Name != "" {
		return p.Name
	}
	return "port-" + strconv.Itoa(int(p.Port))
}

// Plan is what one reconcile makes of the guest.
type Plan struct {
	Targets  []TargetPlan
	Backends []*Backend
}

// HostNamespace is where the bridge's host Services live: the Cluster's (and so the
// bridge's) namespace.
func HostNamespace(gwb *guestnetv1.GuestWebhookBridge) string { return gwb.Namespace }

// MakePlan decides, target by target, what the bridge does, and which Services (with which
// nodePorts) that takes.
func MakePlan(in Input) *Plan {
	p := &Plan{}
	backends := map[string]*Backend{}
	for _, t := range in.Targets {
		tp := decide(in, t)
		if tp.Backend == nil && tp.Service != nil && tp.Reason == "" && (tp.Action == RewriteAction || IsRewritten(t)) {
			attachBackend(in, &tp, backends, *tp.Service)
		}
		p.Targets = append(p.Targets, tp)
	}
	hostNames := map[string]bool{}
	for _, key := range sortedKeys(backends) {
		b := backends[key]
		if hostNames[b.HostService] {
			// "<cluster>-<namespace>-<service>" can be the same for two guest Services
			// (namespace "a-b", service "c" and namespace "a", service "b-c").
			b.HostService = hostnames.BridgeHostServiceDisambiguated(in.Bridge.Spec.ClusterName, b.Service.Namespace, b.Service.Name)
		}
		hostNames[b.HostService] = true
		p.Backends = append(p.Backends, b)
	}
	allocateNodePorts(in, p)
	for i := range p.Targets {
		finish(in, &p.Targets[i])
	}
	return p
}

// decide classifies a target. A target to bridge gets Action and, through attachBackend,
// its backend; the service it must reach is left in tp.Service (for a rewritten target, the
// recorded original).
func decide(in Input, t Target) TargetPlan {
	tp := TargetPlan{Target: t}
	me := hostnames.BridgeID(in.Bridge)
	auto := in.Bridge.Spec.Mode != guestnetv1.BridgeModeAlways
	if t.IsWebhook() {
		tp.Warnings = weakenedWarnings(t)
	} else if t.InsecureSkipTLSVerify {
		tp.Warnings = []string{"insecureSkipTLSVerify is true: the guest apiserver does not verify the server's certificate (metrics-server's default); set caBundle instead to have it verified"}
	}

	switch {
	case !t.Found:
		tp.Reason = guestnetv1.TargetNotFoundReason
		tp.Message = fmt.Sprintf("%s does not exist in the guest; guestnet bridges it once it is created", t)
	case t.Record != nil && t.Record.Bridge != me:
		tp.Reason = guestnetv1.TargetClaimedReason
		tp.Message = fmt.Sprintf("%s is bridged by GuestWebhookBridge %s; remove it from one of the two bridges", t, t.Record.Bridge)
	case IsRewritten(t):
		tp.rewritten = true
		original, err := recordedService(t)
		if err != nil {
			tp.Reason, tp.Message = guestnetv1.TargetNotBridgeableReason, err.Error()
			return tp
		}
		tp.Service = original
	case t.IsWebhook() && t.Service == nil && t.Record != nil:
		tp.Action = ForgetAction
		tp.Message = fmt.Sprintf("clientConfig.url was changed to %s after guestnet bridged it: left alone, and not restored when the bridge goes", t.URL)
	case t.IsWebhook() && t.Service == nil:
		tp.Message = fmt.Sprintf("has clientConfig.url %s already (the guest apiserver dials it directly): left alone", t.URL)
	case t.Service == nil:
		tp.Message = "served by the guest apiserver itself (no service): nothing to bridge"
	case auto && t.Record == nil && !t.IsWebhook() && t.Available == nil:
		tp.Reason = guestnetv1.WaitingForAvailabilityReason
		tp.Message = "mode Auto: waiting for the aggregator's first availability check before deciding whether the bridge is needed"
	case auto && t.Record == nil && !t.IsWebhook() && t.Available.Status == apiregistrationv1.ConditionTrue:
		tp.Bridged = true
		tp.Message = "left alone (mode Auto): Available=True through its Service, the guest apiserver reaches it"
	case auto && t.Record == nil && t.IsWebhook() && in.Reach.Reaches:
		tp.Bridged = true
		tp.Message = "left alone (mode Auto): " + in.Reach.Evidence
	default:
		tp.Action = RewriteAction
	}
	return tp
}

// recordedService is the original service of a rewritten target, from its record.
func recordedService(t Target) (*ServiceRef, error) {
	if t.IsWebhook() {
		s := &admissionregistrationv1.ServiceReference{}
		if err := json.Unmarshal(t.Record.Original, s); err != nil {
			return nil, fmt.Errorf("%s: unreadable record in annotation %s: %w", t, guestnetv1.BridgeOriginalAnnotation, err)
		}
		return &ServiceRef{Namespace: s.Namespace, Name: s.Name, Port: ptr.Deref(s.Port, 443), Path: ptr.Deref(s.Path, "")}, nil
	}
	s := &apiregistrationv1.ServiceReference{}
	if err := json.Unmarshal(t.Record.Original, s); err != nil {
		return nil, fmt.Errorf("%s: unreadable record in annotation %s: %w", t, guestnetv1.BridgeOriginalAnnotation, err)
	}
	return &ServiceRef{Namespace: s.Namespace, Name: s.Name, Port: ptr.Deref(s.Port, 443)}, nil
}

// attachBackend resolves the guest Service a target must reach and adds the port to its
// backend; a Service that cannot be bridged gives the target a reason instead.
func attachBackend(in Input, tp *TargetPlan, backends map[string]*Backend, ref ServiceRef) {
	svc := findService(in.GuestServices, ref.Namespace, ref.Name)
	if svc == nil {
		tp.Reason = guestnetv1.GuestServiceNotFoundReason
		tp.Message = fmt.Sprintf("its Service %s/%s does not exist in the guest; guestnet bridges it once it is created", ref.Namespace, ref.Name)
		return
	}
	if len(svc.Spec.Selector) == 0 {
		tp.Reason = guestnetv1.TargetNotBridgeableReason
		tp.Message = fmt.Sprintf("its Service %s/%s has no selector (endpoints kept by hand): a NodePort Service cannot follow its pods; give the Service a selector", ref.Namespace, ref.Name)
		return
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == ref.Port })
	if i < 0 || (svc.Spec.Ports[i].Protocol != "" && svc.Spec.Ports[i].Protocol != corev1.ProtocolTCP) {
		tp.Reason = guestnetv1.TargetNotBridgeableReason
		tp.Message = fmt.Sprintf("its Service %s/%s has no TCP port %d (it has %s); fix the reference or the Service", ref.Namespace, ref.Name, ref.Port, servicePorts(svc))
		return
	}
	key := ref.Namespace + "/" + ref.Name
	b := backends[key]
	if b == nil {
		b = &Backend{
			Service:             svc,
			NodePortService:     hostnames.BridgeNodePortService(svc.Name),
			ExternalNameService: hostnames.BridgeExternalNameService(svc.Name),
			HostService:         hostnames.BridgeHostService(in.Bridge.Spec.ClusterName, svc.Namespace, svc.Name),
		}
		backends[key] = b
	}
	if !slices.ContainsFunc(b.Ports, func(p BackendPort) bool { return p.Port == ref.Port }) {
		sp := svc.Spec.Ports[i]
		b.Ports = append(b.Ports, BackendPort{Name: sp.Name, Port: sp.Port, TargetPort: targetPort(sp)})
		slices.SortFunc(b.Ports, func(x, y BackendPort) int { return int(x.Port - y.Port) })
	}
	if !tp.IsWebhook() {
		b.APIService = true
	}
	tp.Backend, tp.Port = b, ref.Port
}

func targetPort(sp corev1.ServicePort) intstr.IntOrString {
	if sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "" || sp.TargetPort.IntVal != 0 {
		return sp.TargetPort
	}
	return intstr.FromInt32(sp.Port) // unset targetPort means the port itself
}

// allocateNodePorts gives every backend port a nodePort of the bridge's range: the one the
// bridge's NodePort Service has already (stable across restarts and reconciles), else the
// lowest one no other guest Service holds. Ports left without one make their targets
// NodePortRangeExhausted.
func allocateNodePorts(in Input, p *Plan) {
	r := in.Bridge.Spec.NodePortRange
	inRange := func(n int32) bool { return n >= r.Start && n < r.Start+r.Size }
	held := map[int32]string{} // nodePort -> Service holding it, bridge's own excluded
	own := map[string]map[int32]int32{}
	for i := range in.GuestServices {
		svc := &in.GuestServices[i]
		ours := hostnames.IsBridgeObject(svc, in.Bridge) && svc.Spec.Type == corev1.ServiceTypeNodePort
		for _, sp := range svc.Spec.Ports {
			if sp.NodePort == 0 {
				continue
			}
			if ours {
				key := svc.Namespace + "/" + svc.Name
				if own[key] == nil {
					own[key] = map[int32]int32{}
				}
				own[key][sp.Port] = sp.NodePort
				continue
			}
			held[sp.NodePort] = svc.Namespace + "/" + svc.Name
		}
	}
	// The bridge's NodePort Services that no backend needs any more hold their nodePorts
	// until they are deleted, at the end of the reconcile.
	inPlan := map[string]bool{}
	for _, b := range p.Backends {
		inPlan[b.Service.Namespace+"/"+b.NodePortService] = true
	}
	for key, ports := range own {
		if !inPlan[key] {
			for _, n := range ports {
				held[n] = key
			}
		}
	}
	taken := map[int32]bool{}
	// Keep the nodePorts already in use first, so that a new target never takes one away.
	for _, b := range p.Backends {
		current := own[b.Service.Namespace+"/"+b.NodePortService]
		for i := range b.Ports {
			n := current[b.Ports[i].Port]
			if n != 0 && inRange(n) && held[n] == "" && !taken[n] {
				b.Ports[i].NodePort = n
				taken[n] = true
			}
		}
	}
	for _, b := range p.Backends {
		for i := range b.Ports {
			if b.Ports[i].NodePort != 0 {
				continue
			}
			for n := r.Start; n < r.Start+r.Size; n++ {
				if held[n] == "" && !taken[n] {
					b.Ports[i].NodePort = n
					taken[n] = true
					break
				}
			}
		}
	}
	for i := range p.Targets {
		tp := &p.Targets[i]
		if tp.Backend == nil || tp.Backend.NodePort(tp.Port) != 0 {
			continue
		}
		var holders []string
		for n := r.Start; n < r.Start+r.Size; n++ {
			if h := held[n]; h != "" {
				holders = append(holders, fmt.Sprintf("%d (%s)", n, h))
			}
		}
		tp.Reason = guestnetv1.NodePortRangeExhaustedReason
		tp.Message = fmt.Sprintf("no free nodePort in spec.nodePortRange %d-%d for %s", r.Start, r.Start+r.Size-1, tp.Service)
		if len(holders) > 0 {
			tp.Message += "; other guest Services hold " + strings.Join(holders, ", ")
		}
		tp.Message += ": widen the range or move it (the workers declare the new range, which rolls them)"
	}
}

// NodePort is the bridge's nodePort for port of the backend, 0 when it has none.
func (b *Backend) NodePort(port int32) int32 {
	for _, p := range b.Ports {
		if p.Port == port {
			return p.NodePort
		}
	}
	return 0
}

// finish fills in what a bridged target must hold, and checks that the bridge's guest
// Service names are free.
func finish(in Input, tp *TargetPlan) {
	b := tp.Backend
	if b == nil {
		if tp.Reason != "" {
			tp.Action = NoAction // its Service cannot be bridged: nothing is rewritten
		}
		return
	}
	if tp.Reason == "" {
		for _, name := range b.guestServiceNames() {
			if svc := findService(in.GuestServices, b.Service.Namespace, name); svc != nil && !hostnames.IsBridgeObject(svc, in.Bridge) {
				tp.Reason = guestnetv1.HostObjectConflictReason
				tp.Message = fmt.Sprintf("the guest already has a Service %s/%s that is not this bridge's; rename or delete it", svc.Namespace, name)
			}
		}
	}
	hostNS := HostNamespace(in.Bridge)
	if tp.IsWebhook() {
		tp.URL = hostnames.BridgeURL(hostNS, b.HostService, tp.Port, tp.Service.Path)
		tp.TLSServerName = hostnames.ServiceDNSName(hostNS, b.HostService)
	} else {
		tp.APIServiceRef = &apiregistrationv1.ServiceReference{Namespace: b.Service.Namespace, Name: b.ExternalNameService, Port: ptr.To(tp.Port)}
		tp.TLSServerName = hostnames.ServiceDNSName(b.Service.Namespace, b.ExternalNameService)
	}
	if tp.Reason != "" {
		// Nothing is rewritten while the bridge cannot work; a rewritten target stays as it
		// is (taking it back would not make it work).
		tp.Action = NoAction
		tp.Backend = nil
		return
	}
	if tp.rewritten && (tp.IsWebhook() && tp.URL == tp.Target.URL || !tp.IsWebhook() && sameAPIServiceRef(tp.APIServiceRef, tp.Record.Written)) {
		tp.Action = NoAction
	} else {
		tp.Action = RewriteAction
	}
	tp.Bridged = true
}

// guestServiceNames are the bridge's guest Services for the backend.
func (b *Backend) guestServiceNames() []string {
	if b.APIService {
		return []string{b.NodePortService, b.ExternalNameService}
	}
	return []string{b.NodePortService}
}

// weakenedWarnings names what the field report's workaround weakens on a webhook; guestnet
// never changes these, it only says so.
func weakenedWarnings(t Target) []string {
	var w []string
	if ptr.Deref(t.FailurePolicy, admissionregistrationv1.Fail) == admissionregistrationv1.Ignore {
		w = append(w, "failurePolicy is Ignore: requests pass unchecked whenever the webhook fails; with the bridge in place, set it back to Fail (the chart default)")
	}
	if n := ptr.Deref(t.TimeoutSeconds, 10); n < 10 {
		w = append(w, fmt.Sprintf("timeoutSeconds is %d, shortened below the default 10; set it back", n))
	}
	return w
}

func findService(services []corev1.Service, namespace, name string) *corev1.Service {
	for i := range services {
		if services[i].Namespace == namespace && services[i].Name == name {
			return &services[i]
		}
	}
	return nil
}

func servicePorts(svc *corev1.Service) string {
	var parts []string
	for _, p := range svc.Spec.Ports {
		parts = append(parts, fmt.Sprintf("%d/%s", p.Port, cmp.Or(string(p.Protocol), "TCP")))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// BridgeServiceKey names a guest Service of the bridge.
func BridgeServiceKey(b *Backend, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: b.Service.Namespace, Name: name}
}
