// Package ports computes the ports every worker VM of a guest cluster must accept on its
// KubeVirt masquerade interface, and how a worker template declares them.
//
// With masquerade networking, a VM whose interface lists ports receives only those ports:
// every other packet stays in the virt-launcher pod, which refuses it (docs/runbook.md, "a port the VMs do not declare"). The port set of a
// cluster is computed here, in one place, for every consumer: GuestIngress nodePorts,
// GuestWebhookBridge nodePort ranges, the guest Cilium tunnel, the kubelet, CAPK's SSH
// bootstrap check (per worker template, only when CAPK will SSH) and the ports users add
// themselves.
package ports

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Port is a port number and protocol as the masquerade interface forwards them.
type Port struct {
	Number   int32
	Protocol corev1.Protocol
}

// TCP builds a TCP Port.
func TCP(n int32) Port { return Port{Number: n, Protocol: corev1.ProtocolTCP} }

// UDP builds a UDP Port.
func UDP(n int32) Port { return Port{Number: n, Protocol: corev1.ProtocolUDP} }

// String renders the port as "22/TCP".
func (p Port) String() string { return fmt.Sprintf("%d/%s", p.Number, p.Protocol) }

func comparePorts(a, b Port) int {
	return cmp.Or(cmp.Compare(a.Number, b.Number), cmp.Compare(a.Protocol, b.Protocol))
}

// Requirement is a port that workers must accept, with why.
type Requirement struct {
	Port
	// Reasons say who needs the port, e.g. "kubelet" or "GuestIngress web port https".
	Reasons []string
}

// Set is a set of requirements, sorted by port and protocol, each port once.
type Set []Requirement

// NewSet merges requirements: a port needed for several reasons appears once with all of them.
func NewSet(reqs ...Requirement) Set {
	var s Set
	for _, r := range reqs {
		s = s.add(r)
	}
	return s
}

func (s Set) add(r Requirement) Set {
	i, found := slices.BinarySearchFunc(s, r.Port, func(e Requirement, p Port) int { return comparePorts(e.Port, p) })
	if found {
		for _, reason := range r.Reasons {
			if !slices.Contains(s[i].Reasons, reason) {
				s[i].Reasons = append(s[i].Reasons, reason)
			}
		}
		return s
	}
	return slices.Insert(s, i, Requirement{Port: r.Port, Reasons: slices.Clone(r.Reasons)})
}

// Union merges two sets.
func (s Set) Union(other Set) Set {
	out := slices.Clone(s)
	for _, r := range other {
		out = out.add(r)
	}
	return out
}

// Ports lists the set's ports in order.
func (s Set) Ports() []Port {
	if len(s) == 0 {
		return nil
	}
	out := make([]Port, len(s))
	for i, r := range s {
		out[i] = r.Port
	}
	return out
}

// Missing returns the requirements whose port is not among declared.
func (s Set) Missing(declared []Port) Set {
	var out Set
	for _, r := range s {
		if !slices.Contains(declared, r.Port) {
			out = append(out, r)
		}
	}
	return out
}

// String renders the set as "22/TCP, 10250/TCP".
func (s Set) String() string { return JoinPorts(s.Ports()) }

// JoinPorts renders ports as "22/TCP, 10250/TCP".
func JoinPorts(ports []Port) string {
	parts := make([]string, len(ports))
	for i, p := range ports {
		parts[i] = p.String()
	}
	return strings.Join(parts, ", ")
}

// SSHReason is why 22/TCP is required when it is: CAPK's bootstrap check SSHes into the VMs.
const SSHReason = "SSH: CAPK's ssh bootstrap check (KubevirtCluster not externally managed)"

// Base is what every worker needs whatever runs on it: the kubelet (logs, exec,
// metrics-server scrapes), and 22/TCP only when CAPK will SSH into the VMs for its bootstrap
// check (capkSSH: CAPKWillSSH of the worker's template). No port is declared only for an
// operator's SSH: 22 stays declarable (a template that lists it keeps it, the
// extra-worker-ports annotation and the topology variable's workerPorts add it), guestnet
// just never adds it on its own when CAPK does not SSH.
func Base(capkSSH bool) Set {
	set := NewSet(Requirement{Port: TCP(10250), Reasons: []string{"kubelet"}})
	if capkSSH {
		set = set.Union(NewSet(Requirement{Port: TCP(22), Reasons: []string{SSHReason}}))
	}
	return set
}

// KubevirtClusterGVK is CAPK's infrastructure cluster kind.
var KubevirtClusterGVK = KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtCluster")

// Where a KubevirtMachineTemplate says how CAPK checks that a VM is bootstrapped: CAPK
// v0.11.2 api/v1alpha1/kubevirtmachine_types.go, KubevirtMachineSpec.BootstrapCheckSpec
// (json virtualMachineBootstrapCheck), VirtualMachineBootstrapCheckSpec.CheckStrategy (json
// checkStrategy, enum none|ssh, default ssh), under the template's spec.template.spec.
var checkStrategyPath = []string{"spec", "template", "spec", "virtualMachineBootstrapCheck", "checkStrategy"}

// CAPKHasSSHKeys reports whether CAPK has SSH keys for the cluster's VMs, i.e. whether the
// Cluster's KubevirtCluster is not externally managed. In CAPK v0.11.2 an externally managed
// KubevirtCluster (CAPI's annotation cluster.x-k8s.io/managed-by present, whatever its value:
// cluster-api util/annotations IsExternallyManaged) is left alone by the KubevirtCluster
// controller, which then generates no keys (controllers/kubevirtcluster_controller.go
// Reconcile), and the KubevirtMachine controller fetches keys only when it is not
// (controllers/kubevirtmachine_controller.go reconcileNormal); the shipped templates'
// KubevirtCluster is managed by k0smotron. A KubevirtCluster guestnet cannot read (not
// created yet, another infrastructure kind) counts as one CAPK has keys for: 22 is then
// required where the template's checkStrategy asks for SSH, as before.
func CAPKHasSSHKeys(ctx context.Context, host client.Reader, cluster *clusterv1.Cluster) (bool, error) {
	ref := cluster.Spec.InfrastructureRef
	if ref.Kind != KubevirtClusterGVK.Kind || ref.APIGroup != KubevirtClusterGVK.Group || ref.Name == "" {
		return true, nil
	}
	kc := &unstructured.Unstructured{}
	kc.SetGroupVersionKind(KubevirtClusterGVK)
	switch err := host.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: ref.Name}, kc); {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading KubevirtCluster %s: %w", ref.Name, err)
	}
	_, external := kc.GetAnnotations()[clusterv1.ManagedByAnnotation]
	return !external, nil
}

// CAPKWillSSH reports whether CAPK SSHes into the VMs made from a worker template, given
// whether it has SSH keys for the cluster (CAPKHasSSHKeys). This is the one place that
// decides whether 22/TCP is required. CAPK v0.11.2 runs its bootstrap check only when it has
// keys (pkg/kubevirt/machine.go SupportsCheckingIsBootstrapped, called from
// controllers/kubevirtmachine_controller.go reconcileNormal), and the check SSHes only when
// the KubevirtMachine's checkStrategy is "ssh" or unset; "none" skips it
// (pkg/kubevirt/machine.go IsBootstrapped, IsBootstrappedWithSSH). KubevirtMachines get
// their spec from the MachineDeployment's KubevirtMachineTemplate, so its checkStrategy is
// the one read here. (CAPK also skips the check when the bootstrap data lacks its key;
// guestnet does not read bootstrap data and requires 22 then.)
func CAPKWillSSH(hasKeys bool, tmpl *unstructured.Unstructured) bool {
	if !hasKeys {
		return false
	}
	strategy, _, _ := unstructured.NestedString(tmpl.Object, checkStrategyPath...)
	return strategy == "" || strategy == "ssh"
}

// ForWorkers is what the workers made from tmpl must accept: the cluster's set (ForCluster),
// and 22/TCP when CAPK will SSH into them (CAPKWillSSH). Nothing when cluster is empty:
// nothing is known to be required.
func ForWorkers(cluster Set, hasKeys bool, tmpl *unstructured.Unstructured) Set {
	if len(cluster) == 0 {
		return nil
	}
	return cluster.Union(Base(CAPKWillSSH(hasKeys, tmpl)))
}

// Cilium's defaults when cilium-config does not set tunnel-port.
const (
	DefaultVXLANPort  = 8472
	DefaultGenevePort = 6081
)

// CiliumTunnel derives the tunnel port from the guest's kube-system/cilium-config data:
// routing-mode native means no tunnel; otherwise tunnel-protocol (or the older "tunnel" key)
// picks VXLAN (default) or Geneve, and tunnel-port overrides the protocol's default port (the
// field report's cluster used 8473, not 8472). A nil data map (no cilium-config) needs no port.
// The string says what was found, for status messages.
func CiliumTunnel(data map[string]string) (Set, string, error) {
	if data == nil {
		return nil, "no kube-system/cilium-config in the guest: no tunnel port required", nil
	}
	if data["routing-mode"] == "native" || data["tunnel"] == "disabled" {
		return nil, "guest Cilium uses native routing: no tunnel port required", nil
	}
	protocol := cmp.Or(data["tunnel-protocol"], data["tunnel"], "vxlan")
	var port int32
	switch protocol {
	case "vxlan":
		port = DefaultVXLANPort
	case "geneve":
		port = DefaultGenevePort
	default:
		return nil, "", fmt.Errorf("guest kube-system/cilium-config: unknown tunnel protocol %q", protocol)
	}
	if v := data["tunnel-port"]; v != "" && v != "0" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 || n > 65535 {
			return nil, "", fmt.Errorf("guest kube-system/cilium-config: invalid tunnel-port %q", v)
		}
		port = int32(n)
	}
	reason := fmt.Sprintf("Cilium %s tunnel", strings.ToUpper(protocol))
	return NewSet(Requirement{Port: UDP(port), Reasons: []string{reason}}),
		fmt.Sprintf("guest Cilium tunnels with %s on %d/UDP", protocol, port), nil
}

// ForGuestIngress is what a GuestIngress needs: the guest nodePort of each exposed port,
// fixed in spec or, when the guest allocates it, as last observed in status. None when the
// GuestIngress does not ask guestnet to declare its ports.
func ForGuestIngress(gi *guestnetv1.GuestIngress) Set {
	if gi.Spec.DeclarePorts != nil && !*gi.Spec.DeclarePorts {
		return nil
	}
	observed := map[string]int32{}
	for _, p := range gi.Status.Ports {
		observed[p.Name] = p.NodePort
	}
	var reqs []Requirement
	for _, p := range gi.Spec.Ports {
		nodePort := observed[p.Name]
		if p.NodePort != nil {
			nodePort = *p.NodePort
		}
		if nodePort == 0 {
			continue
		}
		reqs = append(reqs, Requirement{
			Port:    Port{Number: nodePort, Protocol: cmp.Or(p.Protocol, corev1.ProtocolTCP)},
			Reasons: []string{fmt.Sprintf("GuestIngress %s port %s", gi.Name, p.Name)},
		})
	}
	return NewSet(reqs...)
}

// ForBridge is what a GuestWebhookBridge needs: its whole nodePort range, declared once so
// bridging one more target does not roll the workers.
func ForBridge(gwb *guestnetv1.GuestWebhookBridge) Set {
	r := gwb.Spec.NodePortRange
	reqs := make([]Requirement, 0, r.Size)
	for n := r.Start; n < r.Start+r.Size; n++ {
		reqs = append(reqs, Requirement{Port: TCP(n), Reasons: []string{"GuestWebhookBridge " + gwb.Name + " nodePort range"}})
	}
	return NewSet(reqs...)
}

// ParseExtraPorts reads the Cluster's ExtraWorkerPortsAnnotation: comma-separated
// port[/protocol] items, protocol TCP (default) or UDP.
func ParseExtraPorts(value string) (Set, error) {
	var reqs []Requirement
	for item := range strings.SplitSeq(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		number, protocol, _ := strings.Cut(item, "/")
		n, err := strconv.ParseInt(number, 10, 32)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("annotation %s: %q is not a port (1-65535)", guestnetv1.ExtraWorkerPortsAnnotation, item)
		}
		p := TCP(int32(n))
		switch strings.ToUpper(protocol) {
		case "", "TCP":
		case "UDP":
			p.Protocol = corev1.ProtocolUDP
		default:
			return nil, fmt.Errorf("annotation %s: %q has protocol %q; use TCP or UDP", guestnetv1.ExtraWorkerPortsAnnotation, item, protocol)
		}
		reqs = append(reqs, Requirement{Port: p, Reasons: []string{"Cluster annotation " + guestnetv1.ExtraWorkerPortsAnnotation}})
	}
	return NewSet(reqs...), nil
}
