package ingress

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// GuestService is what guestnet server-side applies to the guest ingress controller's
// Service (live, as read from the guest): type NodePort, the fixed nodePort of each spec port
// the Service has, and the record of what the Service had in those fields before guestnet
// took them over (OriginalGuestServiceAnnotation, see Restore). Nothing else: the Service's
// other fields stay with their owners (Helm, kubectl), and a port the Service does not have is
// never added (that is GuestServicePortNotFound). Ports whose nodePort guestnet only follows
// are left out entirely, so the guest's allocation stays the guest's.
//
// A LoadBalancer Service that allocates nodePorts already serves them: its type is left
// alone. One that does not (allocateLoadBalancerNodePorts: false), a headless and an
// ExternalName Service cannot carry nodePorts without guestnet changing something of the
// user's (a LoadBalancer made NodePort loses its loadBalancerClass and its load-balancer IP):
// refusal then says what the user should change, and the configuration is nil. Any other type
// is applied as NodePort on every apply, also when the Service is NodePort already: under
// server-side apply, leaving the type out would give up guestnet's ownership and the field
// would fall back to ClusterIP. Ports are listed in the Service's own order, so that the
// configuration compares equal to what guestnet owns on an unchanged Service.
func GuestService(gi *guestnetv1.GuestIngress, live *corev1.Service) (ac *corev1ac.ServiceApplyConfiguration, refusal string) {
	if refusal := cannotCarryNodePorts(gi, live); refusal != "" {
		return nil, refusal
	}
	owned := ownedByGuestnet(live)
	previous := readRecord(live)
	var record originalRecord

	ac = corev1ac.Service(live.Name, live.Namespace)
	spec := corev1ac.ServiceSpec()
	set := false
	if live.Spec.Type != corev1.ServiceTypeLoadBalancer {
		spec.WithType(corev1.ServiceTypeNodePort)
		record.Type = live.Spec.Type
		if owned.Spec != nil && owned.Spec.Type != nil {
			record.Type = previous.Type // guestnet's value: what the user had is in the record
		}
		if record.Type == corev1.ServiceTypeNodePort {
			record.Type = "" // nothing to give back
		}
		set = true
	}
	for _, lp := range live.Spec.Ports {
		p, ok := specPort(gi, lp)
		if !ok || p.NodePort == nil {
			continue
		}
		spec.WithPorts(corev1ac.ServicePort().
			WithPort(lp.Port).
			WithProtocol(protocolOf(lp)).
			WithNodePort(*p.NodePort))
		original := recordedNodePort{Port: lp.Port, Protocol: protocolOf(lp), NodePort: lp.NodePort}
		if ownsNodePort(owned, lp) {
			original.NodePort = previous.nodePort(lp)
		}
		if original.NodePort != *p.NodePort {
			record.NodePorts = append(record.NodePorts, original)
		}
		set = true
	}
	if !set {
		return ac, ""
	}
	ac.WithSpec(spec)
	if value := record.String(); value != "" {
		ac.WithAnnotations(map[string]string{guestnetv1.OriginalGuestServiceAnnotation: value})
	}
	return ac, ""
}

// cannotCarryNodePorts says why the Service cannot carry nodePorts without guestnet changing
// something of the user's, "" when it can.
func cannotCarryNodePorts(gi *guestnetv1.GuestIngress, svc *corev1.Service) string {
	ref := guestServiceRef(gi)
	switch {
	case svc.Spec.Type == corev1.ServiceTypeLoadBalancer && !HasNodePorts(svc):
		return fmt.Sprintf("Service %s in the guest is a LoadBalancer Service with allocateLoadBalancerNodePorts: false: it has no nodePorts to forward to, "+
			"and making it NodePort would drop its loadBalancerClass and release its load-balancer IP, so guestnet changes nothing. "+
			"Set allocateLoadBalancerNodePorts to true (or remove it) on the Service, e.g. in the ingress controller's chart values", ref)
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return fmt.Sprintf("Service %s in the guest is an ExternalName Service: it has no nodePorts and cannot have any. "+
			"Point spec.guestService at the ingress controller's own Service", ref)
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return fmt.Sprintf("Service %s in the guest is headless (clusterIP: None): a headless Service cannot be NodePort. "+
			"Point spec.guestService at a Service with a cluster IP, or give the Service one (recreate it without clusterIP: None)", ref)
	}
	return ""
}

// ExpectedGuestService is the guest Service as it is once the configuration of GuestService
// is applied: type NodePort (unless LoadBalancer) and the fixed nodePorts.
func ExpectedGuestService(gi *guestnetv1.GuestIngress, live *corev1.Service) *corev1.Service {
	svc := live.DeepCopy()
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		svc.Spec.Type = corev1.ServiceTypeNodePort
	}
	for i, lp := range svc.Spec.Ports {
		if p, ok := specPort(gi, lp); ok && p.NodePort != nil {
			svc.Spec.Ports[i].NodePort = *p.NodePort
		}
	}
	return svc
}

// Release is the configuration that gives back everything guestnet applied to a guest
// Service: an apply with no fields drops guestnet's ownership (and the record). Restore's
// patches come first, so the fields guestnet changed have their original values back.
func Release(live *corev1.Service) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(live.Name, live.Namespace)
}

// RestoreFieldManager is the field manager of the patches that put the user's values back.
const RestoreFieldManager = "guestnet-restore"

// RestorePatch is one JSON patch that puts back a value guestnet changed on the guest Service.
type RestorePatch struct {
	// What says what it restores, for events: "type ClusterIP", "nodePort 30080 of port 80/TCP".
	What  string
	Patch []byte
}

// Restore lists the patches that give the guest Service back what the record
// (OriginalGuestServiceAnnotation) says it had before guestnet changed it: its type, then
// each nodePort. Each patch tests the values it relies on, so it applies only to the Service
// it was made for. recorded is false when the Service carries no readable record (removed or
// edited by someone): then only the release is left, and fields only guestnet owned go back to
// the apiserver's defaults.
func Restore(live *corev1.Service) (patches []RestorePatch, recorded bool) {
	raw, ok := live.Annotations[guestnetv1.OriginalGuestServiceAnnotation]
	if !ok {
		return nil, false
	}
	record, err := parseRecord(raw)
	if err != nil {
		return nil, false
	}
	restoredType := live.Spec.Type
	if record.Type != "" && record.Type != live.Spec.Type {
		patches = append(patches, RestorePatch{What: "type " + string(record.Type), Patch: jsonPatch(
			op{Op: "test", Path: "/spec/type", Value: live.Spec.Type},
			op{Op: "replace", Path: "/spec/type", Value: record.Type},
		)})
		restoredType = record.Type
	}
	if restoredType != corev1.ServiceTypeNodePort && restoredType != corev1.ServiceTypeLoadBalancer {
		return patches, true // no nodePorts: the apiserver drops them with the type
	}
	for _, rp := range record.NodePorts {
		i := slices.IndexFunc(live.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Port == rp.Port && protocolOf(sp) == rp.Protocol })
		if rp.NodePort == 0 || i < 0 || live.Spec.Ports[i].NodePort == rp.NodePort {
			continue
		}
		patches = append(patches, nodePortPatch(live, i, rp.NodePort))
	}
	return patches, true
}

// RestoreDropped lists the patches that give the guest Service back the nodePort the record
// says it had, for each port whose nodePort guestnet fixed but gi no longer fixes: a port
// dropped from spec.ports, or one whose spec.ports[].nodePort was removed (guestnet follows
// it from then on). They come before the apply of GuestService, which then gives up
// guestnet's ownership of those nodePorts and their entries in the record, and keeps the
// rest. A port whose record has no nodePort (the Service had none: guestnet made it
// NodePort) keeps the one it has until the type is given back.
func RestoreDropped(gi *guestnetv1.GuestIngress, live *corev1.Service) []RestorePatch {
	owned := ownedByGuestnet(live)
	record := readRecord(live)
	var patches []RestorePatch
	for i, lp := range live.Spec.Ports {
		if !ownsNodePort(owned, lp) {
			continue
		}
		if p, ok := specPort(gi, lp); ok && p.NodePort != nil {
			continue // still fixed
		}
		if original := record.nodePort(lp); original != 0 && original != lp.NodePort {
			patches = append(patches, nodePortPatch(live, i, original))
		}
	}
	return patches
}

// nodePortPatch puts nodePort back on the port at index i of live, if that port and its
// nodePort are still what live says.
func nodePortPatch(live *corev1.Service, i int, nodePort int32) RestorePatch {
	lp := live.Spec.Ports[i]
	path := fmt.Sprintf("/spec/ports/%d", i)
	return RestorePatch{What: fmt.Sprintf("nodePort %d of port %d/%s", nodePort, lp.Port, protocolOf(lp)), Patch: jsonPatch(
		op{Op: "test", Path: path + "/port", Value: lp.Port},
		op{Op: "test", Path: path + "/nodePort", Value: lp.NodePort},
		op{Op: "replace", Path: path + "/nodePort", Value: nodePort},
	)}
}

// LeftInGuest describes what guestnet changed on the guest Service and cannot give back when
// the guest is gone, for the event that says so.
func LeftInGuest(gi *guestnetv1.GuestIngress) string {
	var fixed []string
	for _, p := range gi.Spec.Ports {
		if p.NodePort != nil {
			fixed = append(fixed, fmt.Sprintf("%d (%s)", *p.NodePort, p.Name))
		}
	}
	what := "type NodePort (unless it was a LoadBalancer Service)"
	if len(fixed) > 0 {
		what += " and nodePorts " + strings.Join(fixed, ", ")
	}
	return fmt.Sprintf("Service %s in the guest may keep what guestnet set on it: %s, and the annotation %s with the values it had before",
		guestServiceRef(gi), what, guestnetv1.OriginalGuestServiceAnnotation)
}

// originalRecord is the value of OriginalGuestServiceAnnotation: what the guest Service had in
// each field guestnet took over, before guestnet changed it.
type originalRecord struct {
	// Type is the Service's type before guestnet made it NodePort ("" when guestnet did not
	// change it).
	Type corev1.ServiceType `json:"type,omitempty"`
	// NodePorts are the nodePorts of the ports whose nodePort guestnet changed (0: none).
	NodePorts []recordedNodePort `json:"nodePorts,omitempty"`
}

type recordedNodePort struct {
	Port     int32           `json:"port"`
	Protocol corev1.Protocol `json:"protocol"`
	NodePort int32           `json:"nodePort,omitempty"`
}

func (r originalRecord) String() string {
	if r.Type == "" && len(r.NodePorts) == 0 {
		return ""
	}
	data, _ := json.Marshal(r) // plain strings and numbers: cannot fail
	return string(data)
}

func (r originalRecord) nodePort(lp corev1.ServicePort) int32 {
	for _, rp := range r.NodePorts {
		if rp.Port == lp.Port && rp.Protocol == protocolOf(lp) {
			return rp.NodePort
		}
	}
	return 0
}

func parseRecord(raw string) (originalRecord, error) {
	var r originalRecord
	err := json.Unmarshal([]byte(raw), &r)
	return r, err
}

// readRecord is the Service's record; empty when it has none or it cannot be read.
func readRecord(svc *corev1.Service) originalRecord {
	r, _ := parseRecord(svc.Annotations[guestnetv1.OriginalGuestServiceAnnotation])
	return r
}

// ownedByGuestnet is what guestnet's field manager applied to the Service (empty when nothing).
func ownedByGuestnet(svc *corev1.Service) *corev1ac.ServiceApplyConfiguration {
	owned, err := corev1ac.ExtractService(svc, ownership.FieldManager)
	if err != nil {
		return &corev1ac.ServiceApplyConfiguration{}
	}
	return owned
}

func ownsNodePort(owned *corev1ac.ServiceApplyConfiguration, lp corev1.ServicePort) bool {
	if owned.Spec == nil {
		return false
	}
	return slices.ContainsFunc(owned.Spec.Ports, func(p corev1ac.ServicePortApplyConfiguration) bool {
		return p.NodePort != nil && ptr.Deref(p.Port, 0) == lp.Port && ptr.Deref(p.Protocol, corev1.ProtocolTCP) == protocolOf(lp)
	})
}

// op is one JSON patch operation.
type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

func jsonPatch(ops ...op) []byte {
	data, _ := json.Marshal(ops) // plain strings and numbers: cannot fail
	return data
}

// HasNodePorts reports whether a Service of this type allocates nodePorts: NodePort, and
// LoadBalancer unless allocateLoadBalancerNodePorts is false.
func HasNodePorts(svc *corev1.Service) bool {
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort:
		return true
	case corev1.ServiceTypeLoadBalancer:
		return ptr.Deref(svc.Spec.AllocateLoadBalancerNodePorts, true)
	}
	return false
}

func protocolOf(p corev1.ServicePort) corev1.Protocol {
	if p.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return p.Protocol
}

// specPort finds the spec port that names the Service port lp (same number and protocol).
func specPort(gi *guestnetv1.GuestIngress, lp corev1.ServicePort) (guestnetv1.IngressPort, bool) {
	for _, p := range gi.Spec.Ports {
		if p.Port == lp.Port && Protocol(p) == protocolOf(lp) {
			return p, true
		}
	}
	return guestnetv1.IngressPort{}, false
}

// servicePort finds the Service port that spec port p names.
func servicePort(svc *corev1.Service, p guestnetv1.IngressPort) (corev1.ServicePort, bool) {
	for _, sp := range svc.Spec.Ports {
		if sp.Port == p.Port && protocolOf(sp) == Protocol(p) {
			return sp, true
		}
	}
	return corev1.ServicePort{}, false
}

// NodePorts resolves the guest nodePort behind every spec port of gi. From the guest Service
// (svc, nil when it does not exist) when it has the port and a nodePort; else the one last
// observed (gi's status.ports); else, when fixed in spec and the Service does not exist yet,
// the fixed one. missing lists the spec ports the existing Service lacks (or that have no
// nodePort yet). complete is true when every spec port has a nodePort.
func NodePorts(gi *guestnetv1.GuestIngress, svc *corev1.Service) (resolved []guestnetv1.IngressPortStatus, missing []guestnetv1.IngressPort, complete bool) {
	observed := map[string]int32{}
	for _, p := range gi.Status.Ports {
		observed[p.Name] = p.NodePort
	}
	complete = true
	for _, p := range gi.Spec.Ports {
		var nodePort int32
		if svc != nil {
			if sp, ok := servicePort(svc, p); ok && sp.NodePort != 0 && HasNodePorts(svc) {
				nodePort = sp.NodePort
			} else {
				missing = append(missing, p)
			}
		}
		if nodePort == 0 {
			nodePort = observed[p.Name]
		}
		if nodePort == 0 && svc == nil && p.NodePort != nil {
			nodePort = *p.NodePort
		}
		if nodePort == 0 {
			complete = false
		}
		resolved = append(resolved, guestnetv1.IngressPortStatus{Name: p.Name, Port: p.Port, NodePort: nodePort})
	}
	return resolved, missing, complete
}

// NodePortMap turns resolved ports into port name -> nodePort.
func NodePortMap(resolved []guestnetv1.IngressPortStatus) map[string]int32 {
	m := make(map[string]int32, len(resolved))
	for _, p := range resolved {
		m[p.Name] = p.NodePort
	}
	return m
}

// NodePortHolders names, for each fixed nodePort of gi, the other guest Services that hold
// it: "30080 (port http) is allocated to Service projectcontour/other". The nodePort range
// is shared by every Service and protocol of a cluster.
func NodePortHolders(gi *guestnetv1.GuestIngress, services []corev1.Service) []string {
	var out []string
	for _, p := range gi.Spec.Ports {
		if p.NodePort == nil {
			continue
		}
		var holders []string
		for _, svc := range services {
			if svc.Namespace == gi.Spec.GuestService.Namespace && svc.Name == gi.Spec.GuestService.Name {
				continue
			}
			if slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.NodePort == *p.NodePort }) {
				holders = append(holders, svc.Namespace+"/"+svc.Name)
			}
		}
		if len(holders) > 0 {
			slices.Sort(holders)
			out = append(out, fmt.Sprintf("nodePort %d (port %s) is allocated to Service %s", *p.NodePort, p.Name, strings.Join(holders, ", ")))
		}
	}
	return out
}

// FixedNodePorts lists gi's fixed nodePorts.
func FixedNodePorts(gi *guestnetv1.GuestIngress) []int32 {
	var out []int32
	for _, p := range gi.Spec.Ports {
		if p.NodePort != nil {
			out = append(out, *p.NodePort)
		}
	}
	return out
}

// ServicePortsString renders a Service's ports as "80/TCP, 443/TCP" for messages.
func ServicePortsString(svc *corev1.Service) string {
	parts := make([]string, 0, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		parts = append(parts, fmt.Sprintf("%d/%s", p.Port, protocolOf(p)))
	}
	if len(parts) == 0 {
		return "no ports"
	}
	return strings.Join(parts, ", ")
}

// GuestServiceRivals are the other GuestIngresses of gi's Cluster that stand between gi and
// the guest Service of its spec.guestService (see GuestServiceRivalsOf). guestnet writes to a
// guest Service for one GuestIngress only: applies of two with different ports would undo
// each other forever (they share the field manager) and corrupt the record.
type GuestServiceRivals struct {
	// Owner names the GuestIngress that owns the Service when it is not gi: the oldest
	// (creationTimestamp, then name) of those of the Cluster that name it and may hold
	// anything (as claimants of address space: Cluster there, nothing paused or being deleted,
	// admitted; a claim that cannot hold anything blocks nobody).
	Owner string
	// Holder names another GuestIngress whose status.guestService says it has not given the
	// Service back yet: nobody else takes the Service before it has.
	Holder string
}

// GuestServiceRivalsOf finds gi's rivals among all (every GuestIngress guestnet knows; gi may
// be among them); eligible says whether one may hold anything. The owner is the oldest of the
// Cluster's GuestIngresses that name the Service and are eligible (gi among them when it is);
// when none is, gi is left to itself (it writes nothing anyway). The Cluster's GuestIngresses
// are those of gi's namespace with its spec.clusterName: a guest Service of another
// namespace's Cluster is another guest's.
func GuestServiceRivalsOf(gi *guestnetv1.GuestIngress, all []guestnetv1.GuestIngress, eligible func(*guestnetv1.GuestIngress) bool) GuestServiceRivals {
	var r GuestServiceRivals
	var owner *guestnetv1.GuestIngress
	if eligible(gi) {
		owner = gi
	}
	for i := range all {
		other := &all[i]
		if other.Namespace != gi.Namespace || other.Name == gi.Name || other.Spec.ClusterName != gi.Spec.ClusterName {
			continue
		}
		if held := other.Status.GuestService; held != nil && *held == gi.Spec.GuestService && (r.Holder == "" || other.Name < r.Holder) {
			r.Holder = other.Name
		}
		if other.Spec.GuestService == gi.Spec.GuestService && other.DeletionTimestamp.IsZero() &&
			(owner == nil || olderThan(other, owner)) && eligible(other) {
			owner = other
		}
	}
	if owner != nil && owner != gi {
		r.Owner = owner.Name
	}
	return r
}

// olderThan orders GuestIngresses by creationTimestamp, then name (timestamps have a
// resolution of a second): every reconcile decides the same.
func olderThan(a, b *guestnetv1.GuestIngress) bool {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c < 0
	}
	return a.Name < b.Name
}

// guestServiceClaimed is the refusal of a GuestIngress whose guest Service another
// GuestIngress of its Cluster (always one of its namespace) owns or still holds; nil when
// there is none.
func guestServiceClaimed(gi *guestnetv1.GuestIngress, r GuestServiceRivals) *Refusal {
	ref := guestServiceRef(gi)
	switch {
	case r.Owner != "":
		return &Refusal{Reason: guestnetv1.GuestServiceClaimedReason, Message: fmt.Sprintf(
			"Service %s in the guest is exposed by GuestIngress %s of this namespace, created earlier: guestnet writes to a guest Service "+
				"for one GuestIngress only, and changes nothing for this one, in the guest or on the host. Point spec.guestService at another "+
				"Service, or delete one of the two GuestIngresses (this one takes the Service over once %s is gone)", ref, r.Owner, r.Owner)}
	case r.Holder != "":
		return &Refusal{Reason: guestnetv1.GuestServiceClaimedReason, Message: fmt.Sprintf(
			"GuestIngress %s of this namespace has not given Service %s in the guest back yet; guestnet does so for it as soon as the "+
				"guest apiserver answers, and changes nothing for this GuestIngress, in the guest or on the host, until then", r.Holder, ref)}
	}
	return nil
}
