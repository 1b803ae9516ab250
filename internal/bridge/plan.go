package bridge

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/url"
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
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// Input is what a plan is made from.
type Input struct {
	Bridge *guestnetv1.GuestWebhookBridge
	// Targets are the selected targets (Select).
	Targets []Target
	// All are the targets of every APIService and webhook configuration of the guest, selected
	// or not (AllTargets): those this bridge rewrote and no longer selects are restored.
	All []Target
	// Host is the host copy of the bridge's records (its status.records).
	Host HostRecords
	// Claimants says, for every other bridge ("<namespace>/<name>") that a record or a
	// guestnet Service of the guest names, whether it exists: a record of a bridge that no
	// longer exists (its finalizer given up) claims nothing, and its target and Services are
	// taken over.
	Claimants map[string]bool
	// HostServices are the names of the bridge's host Services: a webhook whose url names one
	// points at the bridge.
	HostServices map[string]bool
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
	// Agents counts the guest's konnectivity agent Pods, ready or not: the guest apiserver
	// then sends its `cluster` egress, APIServices included, through konnectivity.
	Agents int
}

// Action is what the controller must write on a target's object.
type Action string

const (
	// NoAction means the object is as it should be.
	NoAction Action = ""
	// RewriteAction points the target at the bridge (first time, or a repair after a revert)
	// and stores its record; with only the record to repair, the clientConfig is left as it is.
	RewriteAction Action = "Rewrite"
	// ForgetAction drops guestnet's record: someone else changed the target since.
	ForgetAction Action = "Forget"
	// RestoreAction puts the recorded original back (when the target still holds what
	// guestnet wrote) and drops the record.
	RestoreAction Action = "Restore"
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
	// Withheld is what Message leaves out because it is not the tenant's to read (another
	// namespace's bridge), for the manager's log; "" when nothing.
	Withheld string
	// Warnings are worth knowing but break nothing.
	Warnings []string
	// Probe is filled by the controller for targets that go through the bridge.
	Probe *ProbeResult

	// Own is this bridge's record of the target as it stands (from whichever copy holds what
	// the target holds), nil when the bridge has not rewritten it. Desired is the record both
	// copies must hold after this reconcile (nil: none). A RestoreAction restores Own.
	Own, Desired *Record
	// Rewritten: the target holds what this bridge wrote (Own); its Service is the recorded
	// original. RecordOnly: a rewrite that only repairs the guest copy of the record (the
	// clientConfig is already right). TookOverFrom names the bridge, gone, whose record the
	// target carried.
	Rewritten    bool
	RecordOnly   bool
	TookOverFrom string

	// observed is the target as the guest holds it (Service is replaced by the recorded
	// original for a rewritten target).
	observed Target
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
	// LeftOut are the selected targets beyond MaxTargets: neither bridged nor restored.
	LeftOut []Target
	// Restores are the targets this bridge rewrote and no longer selects (RestoreAction), and
	// those it cannot restore because no copy of their record can be read (a Reason).
	Restores []TargetPlan
	// KeepServices: a target points at the bridge without a readable record, so which
	// Services it uses is unknown: none of the bridge's Services is deleted.
	KeepServices bool
	// host is the host copy the plan was made with.
	host HostRecords
}

// HostNamespace is where the bridge's host Services live: the Cluster's (and so the
// bridge's) namespace.
func HostNamespace(gwb *guestnetv1.GuestWebhookBridge) string { return gwb.Namespace }

// Named is the bridge id ("<namespace>/<name>", as a guest record names it) in words the
// tenant of gwb may read: "GuestWebhookBridge <name> of this namespace", or "another
// namespace's GuestWebhookBridge" (a guest record can name any namespace: whose bridges exist
// there is not this tenant's to learn).
func Named(id string, gwb *guestnetv1.GuestWebhookBridge) string {
	if sameNamespace(id, gwb) {
		_, name, _ := strings.Cut(id, "/")
		return fmt.Sprintf("GuestWebhookBridge %s of this namespace", name)
	}
	return "another namespace's GuestWebhookBridge"
}

func sameNamespace(id string, gwb *guestnetv1.GuestWebhookBridge) bool {
	ns, _, ok := strings.Cut(id, "/")
	return ok && ns == gwb.Namespace
}

// MakePlan decides, target by target, what the bridge does, and which Services (with which
// nodePorts) that takes.
func MakePlan(in Input) *Plan {
	p := &Plan{host: in.Host}
	me := ownership.BridgeID(in.Bridge)
	targets, leftOut := limit(in, me)
	p.LeftOut = leftOut
	backends := map[string]*Backend{}
	for _, t := range targets {
		tp := decide(in, t)
		if tp.Backend == nil && tp.Service != nil && tp.Reason == "" && (tp.Action == RewriteAction || tp.Rewritten) {
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
	limitRecords(p)
	skip := map[string]bool{}
	for _, t := range targets {
		skip[t.Key()] = true
	}
	for _, t := range leftOut {
		skip[t.Key()] = true
	}
	p.Restores = planRestores(in, me, func(t Target) bool { return !skip[t.Key()] })
	for _, tp := range append(slices.Clone(p.Targets), p.Restores...) {
		if tp.Reason == guestnetv1.RecordUnreadableReason {
			p.KeepServices = true
		}
	}
	return p
}

// PlanDeletion plans the restore of every target the bridge rewrote, for its deletion.
func PlanDeletion(in Input) *Plan {
	p := &Plan{host: in.Host}
	p.Restores = planRestores(in, ownership.BridgeID(in.Bridge), func(Target) bool { return true })
	return p
}

// limit keeps the first MaxTargets targets (those the bridge rewrote first, then by key) and
// returns the others apart: status.targets cannot hold more, and a target the bridge rewrote
// must never be dropped from its care because new ones appeared.
func limit(in Input, me string) (kept, leftOut []Target) {
	if len(in.Targets) <= guestnetv1.MaxTargets {
		return in.Targets, nil
	}
	ours := func(t Target) bool {
		return t.Record != nil && t.Record.Bridge == me || in.Host.Has(t.Key())
	}
	ordered := slices.Clone(in.Targets)
	slices.SortStableFunc(ordered, func(a, b Target) int {
		switch oa, ob := ours(a), ours(b); {
		case oa && !ob:
			return -1
		case ob && !oa:
			return 1
		}
		return strings.Compare(a.Key(), b.Key())
	})
	kept = ordered[:guestnetv1.MaxTargets]
	slices.SortFunc(kept, func(a, b Target) int { return strings.Compare(a.Key(), b.Key()) })
	return kept, ordered[guestnetv1.MaxTargets:]
}

// limitRecords blocks first rewrites that would take the records past MaxRecords (while
// earlier targets are still being restored): they wait for the next reconcile.
func limitRecords(p *Plan) {
	n := p.host.Len()
	for i := range p.Targets {
		tp := &p.Targets[i]
		if tp.Action != RewriteAction || tp.Rewritten || p.host.Has(tp.Key()) {
			continue
		}
		if n >= guestnetv1.MaxRecords {
			tp.Action, tp.Bridged, tp.Backend = NoAction, false, nil
			tp.Reason = guestnetv1.TooManyTargetsReason
			tp.Message = fmt.Sprintf("the bridge already holds %d records (targets bridged, and targets being restored): bridged once earlier targets are restored", n)
			continue
		}
		n++
	}
}

// decide classifies a target. A target to bridge gets Action and, through attachBackend,
// its backend; the service it must reach is left in tp.Service (for a rewritten target, the
// recorded original).
func decide(in Input, t Target) TargetPlan {
	tp := TargetPlan{Target: t, observed: t}
	me := ownership.BridgeID(in.Bridge)
	auto := in.Bridge.Spec.Mode != guestnetv1.BridgeModeAlways
	if t.IsWebhook() {
		tp.Warnings = weakenedWarnings(t)
	} else if t.InsecureSkipTLSVerify {
		tp.Warnings = []string{"insecureSkipTLSVerify is true: the guest apiserver does not verify the server's certificate (metrics-server's default); set caBundle instead to have it verified"}
	}
	host, hostErr := in.Host.Lookup(t.Key())
	guest := t.Record
	foreign := guest != nil && guest.Bridge != me
	mine := guest != nil && !foreign
	// hadRecord: this bridge rewrote the target at some point (a revert may have undone it).
	hadRecord := mine || in.Host.Has(t.Key())

	switch {
	case !t.Found:
		tp.Reason = guestnetv1.TargetNotFoundReason
		tp.Message = fmt.Sprintf("%s does not exist in the guest; guestnet bridges it once it is created", t)
		return tp
	case foreign && in.Claimants[guest.Bridge]:
		tp.Reason = guestnetv1.TargetClaimedReason
		tp.Message = fmt.Sprintf("%s is bridged by %s; remove it from one of the two bridges", t, Named(guest.Bridge, in.Bridge))
		if !sameNamespace(guest.Bridge, in.Bridge) {
			tp.Message = fmt.Sprintf("%s is bridged by another namespace's GuestWebhookBridge (its record in the guest says so); remove it from "+
				"the selection of this bridge, or ask the host admin", t)
			tp.Withheld = fmt.Sprintf("%s is bridged by GuestWebhookBridge %s", t, guest.Bridge)
		}
		return tp
	case foreign && holds(t, guest):
		// Rewritten by a bridge that no longer exists: this one takes it over, with its original.
		tp.TookOverFrom = guest.Bridge
		tp.Own = &Record{Bridge: me, Original: guest.Original, Written: guest.Written}
	case holds(t, host):
		tp.Own = host
	case mine && holds(t, guest):
		tp.Own = guest
	}
	if tp.Own != nil {
		tp.Rewritten = true
		original, err := recordedService(t, *tp.Own)
		if err != nil {
			tp.Reason, tp.Message = guestnetv1.RecordUnreadableReason, err.Error()
			tp.Desired = tp.Own
			return tp
		}
		tp.Service = original
		return tp
	}
	if pointsAtBridge(in, t) {
		tp.Reason = guestnetv1.RecordUnreadableReason
		tp.Message = recordUnreadableMessage(t, hostErr)
		return tp
	}

	switch {
	case t.IsWebhook() && t.Service == nil && hadRecord:
		tp.Action = ForgetAction
		tp.Message = fmt.Sprintf("clientConfig.url was changed to %s after guestnet bridged it: left alone, and not restored when the bridge goes", t.URL)
	case t.IsWebhook() && t.Service == nil:
		tp.Message = fmt.Sprintf("has clientConfig.url %s already (the guest apiserver dials it directly): left alone", t.URL)
	case t.Service == nil:
		tp.Message = "served by the guest apiserver itself (no service): nothing to bridge"
	case auto && !hadRecord && !t.IsWebhook() && t.Available == nil:
		tp.Reason = guestnetv1.WaitingForAvailabilityReason
		tp.Message = "mode Auto: waiting for the aggregator's first availability check before deciding whether the bridge is needed"
	case auto && !hadRecord && !t.IsWebhook() && t.Available.Status == apiregistrationv1.ConditionTrue:
		tp.Bridged = true
		tp.Message = "left alone (mode Auto): Available=True through its Service, the guest apiserver reaches it"
	case auto && !hadRecord && !t.IsWebhook() && in.Reach.Agents > 0:
		tp.Reason = guestnetv1.APIServiceViaKonnectivityReason
		tp.Message = fmt.Sprintf("not bridged (mode Auto): Available=%s through its Service, and the guest runs %d konnectivity agent pods: "+
			"the aggregator calls every APIService through them (the `cluster` egress), whatever Service it names, so the bridge cannot help. "+
			"Make the agents carry the traffic (docs/runbook.md#konnectivity-working-or-broken)", t.Available.Status, in.Reach.Agents)
	case auto && !hadRecord && t.IsWebhook() && in.Reach.Reaches:
		tp.Bridged = true
		tp.Message = "left alone (mode Auto): " + in.Reach.Evidence
	default:
		tp.Action = RewriteAction
	}
	return tp
}

// ownsService reports whether the bridge may apply over a guest Service: its own, or one of
// a bridge that no longer exists (left behind when that bridge gave up on an unreachable
// guest), which it adopts.
func (in Input) ownsService(svc *corev1.Service) bool {
	if ownership.IsBridgeObject(svc, in.Bridge) {
		return true
	}
	owner, ok := svc.GetAnnotations()[ownership.BridgeAnnotation]
	exists, known := in.Claimants[owner]
	return ok && svc.GetLabels()[ownership.ManagedByLabel] == ownership.ManagedByValue && known && !exists
}

// pointsAtBridge reports whether t calls one of the bridge's Services: a webhook whose url
// names a host Service of the bridge, an APIService whose service is a guest Service of it.
func pointsAtBridge(in Input, t Target) bool {
	if !t.IsWebhook() {
		if t.Service == nil {
			return false
		}
		svc := findService(in.GuestServices, t.Service.Namespace, t.Service.Name)
		return svc != nil && ownership.IsBridgeObject(svc, in.Bridge)
	}
	if t.Service != nil || t.URL == "" {
		return false
	}
	u, err := url.Parse(t.URL)
	if err != nil {
		return false
	}
	name, ok := strings.CutSuffix(u.Hostname(), "."+HostNamespace(in.Bridge)+".svc")
	return ok && in.HostServices[name]
}

func recordUnreadableMessage(t Target, hostErr error) string {
	var why []string
	if t.RecordErr != nil {
		why = append(why, "the guest copy: "+t.RecordErr.Error())
	} else {
		why = append(why, "the guest copy (annotation "+guestnetv1.BridgeOriginalAnnotation+") is missing")
	}
	if hostErr != nil {
		why = append(why, "the host copy: "+hostErr.Error())
	} else {
		why = append(why, "the host copy (status.records) is missing")
	}
	return fmt.Sprintf("it points at this bridge, but no copy of its record can be read (%s): guestnet does not know its original "+
		"and leaves it, and the bridge's Services, as they are. Put the original service reference back by hand and remove the annotation "+
		"(docs/runbook.md#bridge-record-unreadable)", strings.Join(why, "; "))
}

// recordedService is the original service of a rewritten target, from its record.
func recordedService(t Target, r Record) (*ServiceRef, error) {
	if t.IsWebhook() {
		s := &admissionregistrationv1.ServiceReference{}
		if err := json.Unmarshal(r.Original, s); err != nil || s.Name == "" {
			return nil, fmt.Errorf("%s: its record's original is not a service reference", t)
		}
		return &ServiceRef{Namespace: s.Namespace, Name: s.Name, Port: ptr.Deref(s.Port, 443), Path: ptr.Deref(s.Path, "")}, nil
	}
	s := &apiregistrationv1.ServiceReference{}
	if err := json.Unmarshal(r.Original, s); err != nil || s.Name == "" {
		return nil, fmt.Errorf("%s: its record's original is not a service reference", t)
	}
	return &ServiceRef{Namespace: s.Namespace, Name: s.Name, Port: ptr.Deref(s.Port, 443)}, nil
}

// planRestores plans, for every target of the guest this bridge has a record of (either copy)
// that restore accepts, the restore of its original. A target that points at the bridge with
// no readable record cannot be restored: it gets RecordUnreadable.
func planRestores(in Input, me string, restore func(Target) bool) []TargetPlan {
	var out []TargetPlan
	for _, t := range in.All {
		if !restore(t) {
			continue
		}
		host, hostErr := in.Host.Lookup(t.Key())
		mine := t.Record != nil && t.Record.Bridge == me
		tp := TargetPlan{Target: t}
		switch {
		case holds(t, host):
			tp.Own = host
		case mine && holds(t, t.Record):
			tp.Own = t.Record
		case pointsAtBridge(in, t) && (t.Record == nil || !mine):
			tp.Reason = guestnetv1.RecordUnreadableReason
			tp.Message = recordUnreadableMessage(t, hostErr)
			out = append(out, tp)
			continue
		case host != nil:
			tp.Own = host // the target holds something else: only the records go
		case mine:
			tp.Own = t.Record
		case in.Host.Has(t.Key()):
			tp.Own = &Record{Bridge: me} // an unreadable host entry of a target that does not point at the bridge: dropped
		default:
			continue
		}
		tp.Rewritten = holds(t, tp.Own)
		tp.Action = RestoreAction
		out = append(out, tp)
	}
	return out
}

// HostRecords are the entries of the host copy (status.records) after this reconcile's guest
// writes: the desired record of every target the bridge keeps bridged, the unreadable entries
// of targets left as they are, and nothing for restored targets or targets the guest no
// longer has. Before the guest writes, PendingHostRecords applies.
func (p *Plan) HostRecords() map[string]guestnetv1.BridgeRecord {
	out := map[string]guestnetv1.BridgeRecord{}
	for _, tp := range p.Targets {
		switch {
		case tp.Desired != nil:
			out[tp.Key()] = hostRecord(tp.Target, *tp.Desired)
		case tp.Reason == guestnetv1.RecordUnreadableReason || tp.Reason == guestnetv1.TargetNotFoundReason && p.host.Has(tp.Key()):
			// Left as they are: unreadable (for the user to fix), or the object is missing
			// for a moment (a Helm reinstall deletes and creates it).
			if e, ok := p.host.Entry(tp.Key()); ok {
				out[tp.Key()] = e
			}
		}
	}
	for _, t := range p.LeftOut {
		if e, ok := p.host.Entry(t.Key()); ok {
			out[t.Key()] = e
		}
	}
	for _, tp := range p.Restores {
		if tp.Action != RestoreAction {
			if e, ok := p.host.Entry(tp.Key()); ok {
				out[tp.Key()] = e
			}
		}
	}
	return out
}

// PendingHostRecords are the entries of the host copy to write before the guest: every entry
// the host copy has now, and the desired records of the targets about to be rewritten. So a
// record is in the host copy before its rewrite lands in the guest, and stays there until
// its restore has landed.
func (p *Plan) PendingHostRecords() map[string]guestnetv1.BridgeRecord {
	out := map[string]guestnetv1.BridgeRecord{}
	for _, key := range p.host.Keys() {
		e, _ := p.host.Entry(key)
		out[key] = e
	}
	for key, e := range p.HostRecords() {
		out[key] = e
	}
	return out
}

// HostRecordsChanged reports whether entries differ from the host copy the plan was made with.
func (p *Plan) HostRecordsChanged(entries map[string]guestnetv1.BridgeRecord) bool {
	current := map[string]guestnetv1.BridgeRecord{}
	for _, key := range p.host.Keys() {
		current[key], _ = p.host.Entry(key)
	}
	return !SameHostRecords(current, entries)
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
	held := map[int32]string{} // nodePort -> Service holding it, bridge's own excluded
	own := map[string]map[int32]int32{}
	for i := range in.GuestServices {
		svc := &in.GuestServices[i]
		ours := in.ownsService(svc) && svc.Spec.Type == corev1.ServiceTypeNodePort
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
			if n != 0 && inRange(r, n) && held[n] == "" && !taken[n] {
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
		if tp.Rewritten {
			tp.Desired = tp.Own // keep the record while the target stays rewritten
		}
		return
	}
	if tp.Reason == "" {
		for _, name := range b.guestServiceNames() {
			if svc := findService(in.GuestServices, b.Service.Namespace, name); svc != nil && !in.ownsService(svc) {
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
	me := ownership.BridgeID(in.Bridge)
	desired := &Record{Bridge: me, Original: tp.original, Written: tp.URL}
	if !tp.IsWebhook() {
		desired.Written = ServiceRef{Namespace: tp.APIServiceRef.Namespace, Name: tp.APIServiceRef.Name, Port: tp.Port}.String()
	}
	if tp.Rewritten {
		desired.Original = tp.Own.Original
	}
	if tp.Reason == "" && (len(compactJSON(desired.Original)) > guestnetv1.MaxRecordOriginal || len(desired.Written) > guestnetv1.MaxRecordWritten) {
		tp.Reason = guestnetv1.TargetNotBridgeableReason
		tp.Message = fmt.Sprintf("its record would be longer than guestnet keeps (%d characters of original service, %d of url): shorten the webhook's path",
			guestnetv1.MaxRecordOriginal, guestnetv1.MaxRecordWritten)
	}
	if tp.Reason != "" {
		// Nothing is rewritten while the bridge cannot work; a rewritten target stays as it
		// is (taking it back would not make it work), and so does its record.
		tp.Action = NoAction
		tp.Backend = nil
		tp.Desired = tp.Own
		return
	}
	tp.Desired = desired
	tp.Bridged = true
	holdsDesired := holds(tp.observed, desired)
	tp.RecordOnly = tp.Rewritten && holdsDesired
	if holdsDesired && tp.Record.Equal(desired) && tp.TookOverFrom == "" {
		tp.Action = NoAction
	} else {
		tp.Action = RewriteAction
	}
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

// ServiceKey names a guest Service of the bridge.
func ServiceKey(b *Backend, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: b.Service.Namespace, Name: name}
}
