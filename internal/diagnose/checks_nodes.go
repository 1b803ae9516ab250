package diagnose

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// The node identity checks (docs/node-identity-research.md, section 7): on any cluster, with
// or without a GuestNodeIdentity, each guest Node's InternalIP must be its VM's virt-launcher
// pod IP, the Node must be initialized, and the guest Cilium must advertise that IP. One
// result per Node that is wrong, under the check that names its cause (uninitialized, a
// kubelet not in external mode, another address), and one OK line when none is.

// uninitializedGrace is how long a Node may carry the uninitialized taint before diagnose
// FAILs it: an initializer takes seconds.
const uninitializedGrace = time.Minute

// domainAnnotation is the annotation KubeVirt's virt-controller puts on a virt-launcher pod
// with the name of its VMI (kubevirt.io/api v1.9.0 core/v1 DomainAnnotation, set in
// pkg/virt-controller/services/template.go generatePodAnnotations). It is an annotation, not
// a label; CAPK's virtlauncher.MachineNameLabel is the label with the same name.
const domainAnnotation = "kubevirt.io/domain"

// kubeletPort is the kubelet's port the guest apiserver dials for logs, exec and metrics.
const kubeletPort = "10250"

// Default masquerade addresses of a VM: .2 of KubeVirt's default VM networks 10.0.2.0/24
// and fd10:0:2::/120 (kubevirt.io/api v1.9.0 core/v1 PodNetwork).
var defaultVMAddresses = []string{"10.0.2.2", "fd10:0:2::2"}

// nodeView is one guest Node with what the checks found about it.
type nodeView struct {
	node    *corev1.Node
	ips     []string     // its InternalIPs
	pods    []corev1.Pod // the running virt-launcher pods of its VM
	writers []string     // the field managers that wrote its addresses
	tainted bool
	// wrong is the first InternalIP that is not the VM's pod IP ("" when none); vm says it is
	// a masquerade address, dups name the other Nodes that have it too.
	wrong string
	vm    bool
	dups  []string
}

func (v *nodeView) onePod() bool { return len(v.pods) == 1 }

func (v *nodeView) podIPs() []string { return podIPs(&v.pods[0]) }

// podIPs are the pod's status.podIPs (its status.podIP when a writer set only that).
func podIPs(p *corev1.Pod) []string {
	var out []string
	for _, ip := range p.Status.PodIPs {
		out = append(out, ip.IP)
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		out = append(out, p.Status.PodIP)
	}
	return out
}

// kubeletOnly: no one but the kubelet wrote the addresses (or nothing says who did).
func (v *nodeView) kubeletOnly() bool {
	for _, w := range v.writers {
		if w != nodeidentity.KubeletFieldManager {
			return false
		}
	}
	return true
}

// nodeViews matches each guest Node with its VM's running virt-launcher pods: the Cluster's
// worker pods (virtlauncher.WorkerSelector) whose VMI (KubeVirt's kubevirt.io/domain
// annotation) or KubevirtMachine (CAPK's label) is the Node's machine
// (nodeidentity.MachineName: its providerID kubevirt://<name>, else its name).
func nodeViews(s *State) []nodeView {
	byMachine := map[string][]corev1.Pod{}
	for _, p := range workerPods(s) {
		if p.Status.Phase != corev1.PodRunning || len(podIPs(&p)) == 0 {
			continue
		}
		keys := []string{p.Annotations[domainAnnotation], p.Labels[virtlauncher.MachineNameLabel]}
		for i, k := range keys {
			if k != "" && !slices.Contains(keys[:i], k) {
				byMachine[k] = append(byMachine[k], p)
			}
		}
	}
	owners := map[string][]string{} // InternalIP -> Nodes
	views := make([]nodeView, len(s.Guest.Nodes))
	for i := range s.Guest.Nodes {
		n := &s.Guest.Nodes[i]
		v := nodeView{node: n, ips: nodeidentity.InternalIPs(n), pods: byMachine[nodeidentity.MachineName(n)],
			writers: nodeidentity.AddressWriters(n), tainted: nodeidentity.HasUninitializedTaint(n)}
		for _, ip := range v.ips {
			owners[ip] = append(owners[ip], n.Name)
		}
		views[i] = v
	}
	vmAddrs := vmAddresses(s)
	for i := range views {
		v := &views[i]
		for _, ip := range v.ips {
			dups := slices.DeleteFunc(slices.Clone(owners[ip]), func(name string) bool { return name == v.node.Name })
			vm := vmAddrs[ip]
			if vm || (v.onePod() && !slices.Contains(v.podIPs(), ip)) || (!v.onePod() && len(dups) > 0) {
				v.wrong, v.vm, v.dups = ip, vm, dups
				break
			}
		}
	}
	return views
}

// vmAddresses are KubeVirt's masquerade addresses of the VMs (.2 of the VM network): the
// defaults, and those of the vmNetworkCIDR and vmIPv6NetworkCIDR the worker templates set.
func vmAddresses(s *State) map[string]bool {
	out := map[string]bool{}
	for _, a := range defaultVMAddresses {
		out[a] = true
	}
	for _, w := range s.Workers {
		if w.Template == nil {
			continue
		}
		networks, _, _ := unstructured.NestedSlice(w.Template.Object, "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "networks")
		for _, n := range networks {
			m, ok := n.(map[string]any)
			if !ok {
				continue
			}
			for _, field := range []string{"vmNetworkCIDR", "vmIPv6NetworkCIDR"} {
				cidr, _, _ := unstructured.NestedString(m, "pod", field)
				if p, err := netip.ParsePrefix(cidr); err == nil {
					out[p.Masked().Addr().Next().Next().String()] = true
				}
			}
		}
	}
	return out
}

// checkNodes: every guest Node is initialized and has its VM's virt-launcher pod IP as
// InternalIP.
func checkNodes(s *State) []Result {
	g := s.Guest
	if g.NodesErr != nil {
		return []Result{{Check: CheckNodeAddress, Verdict: Warn, Runbook: rbNodeAddress,
			Detail: fmt.Sprintf("the guest's Nodes cannot be read: %v", g.NodesErr),
			Fix:    "run diagnose with a guest identity that may list Nodes (--guest-kubeconfig)"}}
	}
	var out []Result
	var notCompared []string
	compared := 0
	for _, v := range nodeViews(s) {
		switch {
		case v.tainted:
			out = append(out, uninitialized(s, &v))
		case v.wrong != "" && v.kubeletOnly():
			out = append(out, kubeletNotExternal(s, &v))
		case v.wrong != "" || len(v.ips) == 0:
			out = append(out, nodeAddress(s, &v))
		case v.onePod():
			compared++
		case len(v.pods) == 0:
			notCompared = append(notCompared, v.node.Name+" (no running virt-launcher pod of the Cluster's workers matches it)")
		default:
			notCompared = append(notCompared, fmt.Sprintf("%s (%d running virt-launcher pods: a live migration)", v.node.Name, len(v.pods)))
		}
	}
	if len(out) > 0 {
		return out
	}
	r := Result{Check: CheckNodeAddress, Verdict: OK}
	total := len(g.Nodes)
	switch {
	case total == 0:
		r.Detail = "the guest has no Node yet"
	case len(notCompared) == 0:
		r.Detail = fmt.Sprintf("the %d guest Nodes have their VM's virt-launcher pod IP as InternalIP", total)
	default:
		has := "have"
		if compared == 1 {
			has = "has"
		}
		slices.Sort(notCompared)
		r.Detail = fmt.Sprintf("%d of the %d guest Nodes %s its VM's virt-launcher pod IP as InternalIP; not compared: %s",
			compared, total, has, limitList(notCompared, 10))
		if s.PodsErr != nil {
			r.Detail += fmt.Sprintf(" (the pods of namespace %s cannot be read)", s.Namespace)
		}
	}
	if g.NodesTruncated {
		r.Detail += fmt.Sprintf("; the guest has more than %d Nodes: only the first %d were checked", maxGuestNodes, maxGuestNodes)
	}
	return []Result{r}
}

// uninitialized: the Node carries the taint of a kubelet in external cloud-provider mode, so
// nothing initialized it.
func uninitialized(s *State, v *nodeView) Result {
	r := Result{Check: CheckNodeUninitialized, Object: v.node.Name, Verdict: Fail, Runbook: rbNodeUninitialized}
	age := "an unknown time"
	young := false
	if created := v.node.CreationTimestamp.Time; !created.IsZero() && !s.Now.IsZero() {
		d := s.Now.Sub(created).Round(time.Second)
		age, young = d.String(), d < uninitializedGrace
	}
	address := "with no InternalIP"
	if len(v.ips) > 0 {
		address = "with InternalIP " + strings.Join(v.ips, ", ")
	}
	r.Detail = fmt.Sprintf("tainted %s for %s, %s: its kubelet runs in external cloud-provider mode and nothing initializes the Node: "+
		"pods that do not tolerate the taint are not scheduled there", nodeidentity.UninitializedTaint, age, address)
	if len(v.ips) == 0 {
		r.Detail += ", and `kubectl logs`/`exec` cannot reach it"
	}
	r.Fix = initializeFix(s)
	if young {
		r.Verdict, r.Fix = Warn, "run diagnose again in a minute; if it stays, "+r.Fix
	}
	return r
}

// kubeletNotExternal: the kubelet wrote a wrong address itself.
func kubeletNotExternal(s *State, v *nodeView) Result {
	return Result{Check: CheckKubeletMode, Object: v.node.Name, Verdict: Fail, Runbook: rbKubeletNotExternal,
		Detail: wrongAddress(v) + "; the kubelet wrote it itself: it does not run in external cloud-provider mode, " +
			"so it rewrites its addresses every 10 s and no initializer may set them; " + consequence(v),
		Fix: "run the kubelets in external cloud-provider mode: add --enable-cloud-provider to the K0sWorkerConfigTemplate's spec.args " +
			"(--cloud-provider=external for other kubelets), then roll the workers (the Nodes must register again) and have them initialized: " +
			createIdentity(s) + ", or run KubeVirt's cloud provider"}
}

// nodeAddress: the Node is initialized, with a wrong address or none.
func nodeAddress(s *State, v *nodeView) Result {
	r := Result{Check: CheckNodeAddress, Object: v.node.Name, Verdict: Fail, Runbook: rbNodeAddress}
	if v.wrong == "" {
		r.Detail = "no InternalIP, and no uninitialized taint: nothing initialized it and the taint was removed; `kubectl logs`/`exec` cannot reach it"
		r.Fix = createIdentity(s) + ", or run KubeVirt's cloud provider: either writes the VM's virt-launcher pod IP as the Node's InternalIP"
	} else {
		r.Detail = wrongAddress(v) + "; " + consequence(v)
		others := slices.DeleteFunc(slices.Clone(v.writers), func(w string) bool { return w == nodeidentity.KubeletFieldManager })
		r.Detail += "; written by " + strings.Join(others, ", ")
		r.Fix = fmt.Sprintf("%s wrote it: fix that initializer (KubeVirt's cloud provider writes the VMI's interface IPs), "+
			"or leave the Nodes to guestnet: %s and stop that initializer (guestnet leaves alone the Nodes another manager initialized: replace them)",
			strings.Join(others, ", "), createIdentity(s))
	}
	if gni := identityFix(s); gni != "" {
		r.Fix = gni
	}
	return r
}

// wrongAddress says what is wrong with the Node's wrong InternalIP.
func wrongAddress(v *nodeView) string {
	var what []string
	pod := ""
	if v.onePod() {
		pod = fmt.Sprintf("its virt-launcher pod IP %s (pod %s)", strings.Join(v.podIPs(), ", "), v.pods[0].Name)
	}
	switch {
	case v.vm && pod != "":
		what = append(what, "KubeVirt's masquerade address of the VM, not "+pod)
	case v.vm:
		what = append(what, "KubeVirt's masquerade address of the VM")
	case pod != "":
		what = append(what, "not its VM's "+strings.TrimPrefix(pod, "its "))
	}
	if len(v.dups) > 0 {
		s := ""
		if len(v.dups) > 1 {
			s = "s"
		}
		what = append(what, fmt.Sprintf("also the InternalIP of Node%s %s", s, limitList(v.dups, 5)))
	}
	out := fmt.Sprintf("InternalIP %s is %s", v.wrong, strings.Join(what, ", and "))
	if !v.onePod() {
		out += "; " + noPod(v)
	}
	return out
}

func noPod(v *nodeView) string {
	if len(v.pods) == 0 {
		return "no running virt-launcher pod of the Cluster's workers matches it"
	}
	return fmt.Sprintf("%d running virt-launcher pods match it (a live migration)", len(v.pods))
}

// consequence is what users see of a Node's wrong InternalIP.
func consequence(v *nodeView) string {
	if v.vm || v.onePod() {
		return fmt.Sprintf("`kubectl logs`, `exec` and metrics-server fail (dial tcp %s)", net.JoinHostPort(v.wrong, kubeletPort))
	}
	return "`kubectl logs`/`exec` may reach another Node's kubelet, and the guest CNI cannot tell these Nodes apart"
}

func createIdentity(s *State) string {
	return fmt.Sprintf("create a GuestNodeIdentity for Cluster %s (docs/node-identity.md)", s.ClusterName)
}

// initializeFix: what initializes the Nodes.
func initializeFix(s *State) string {
	if gni := identityFix(s); gni != "" {
		return gni
	}
	return createIdentity(s) + ": guestnet then writes each Node's VM's virt-launcher pod IP as its InternalIP and removes the taint; or run KubeVirt's cloud provider"
}

// identityFix points at the cluster's GuestNodeIdentity, when it has one: guestnet is then
// the initializer, and its NodeAddresses condition says why a Node is not right.
func identityFix(s *State) string {
	if len(s.NodeIdentities) == 0 {
		return ""
	}
	names := make([]string, len(s.NodeIdentities))
	for i, gni := range s.NodeIdentities {
		names[i] = gni.Name
	}
	slices.Sort(names)
	return fmt.Sprintf("GuestNodeIdentity %s initializes this Cluster's Nodes: its NodeAddresses condition says why this one is not (kubectl describe gni %s -n %s)",
		names[0], names[0], s.Namespace)
}

// checkCiliumNodes: each CiliumNode advertises its Node's InternalIP. Nothing when the guest
// has no CiliumNodes (no Cilium).
func checkCiliumNodes(s *State) []Result {
	g := s.Guest
	if g.CiliumNodesErr != nil {
		return []Result{{Check: CheckCiliumNode, Verdict: Warn, Runbook: rbCiliumNodeIP,
			Detail: fmt.Sprintf("the guest's CiliumNodes cannot be read: %v", g.CiliumNodesErr),
			Fix:    "run diagnose with a guest identity that may list ciliumnodes.cilium.io (--guest-kubeconfig)"}}
	}
	if len(g.CiliumNodes) == 0 {
		return nil
	}
	// The Nodes whose own address is right: a CiliumNode of another one is compared once its
	// Node's check passes (that check says what to do first).
	nodes := map[string]*corev1.Node{}
	for _, v := range nodeViews(s) {
		if !v.tainted && v.wrong == "" {
			nodes[v.node.Name] = v.node
		}
	}
	var out []Result
	compared := 0
	for _, cn := range g.CiliumNodes {
		node := nodes[cn.Name]
		if node == nil || len(nodeidentity.InternalIPs(node)) == 0 || len(cn.InternalIPs) == 0 {
			continue
		}
		compared++
		ips := nodeidentity.InternalIPs(node)
		stale := slices.DeleteFunc(slices.Clone(cn.InternalIPs), func(ip string) bool { return slices.Contains(ips, ip) })
		if len(stale) == 0 {
			continue
		}
		out = append(out, Result{Check: CheckCiliumNode, Object: cn.Name, Verdict: Fail, Runbook: rbCiliumNodeIP,
			Detail: fmt.Sprintf("names InternalIP %s, but Node %s's InternalIP is %s: its Cilium agent read the node IP when it started, before the Node had this one, "+
				"and its peers tunnel to %s: pod traffic from other nodes to this one is lost", strings.Join(stale, ", "), node.Name, strings.Join(ips, ", "), stale[0]),
			Fix: "restart that node's Cilium agent (it reads its node IP only at start): " +
				"kubectl --context guest -n kube-system delete pod -l k8s-app=cilium --field-selector spec.nodeName=" + node.Name})
	}
	if len(out) > 0 {
		return out
	}
	r := Result{Check: CheckCiliumNode, Verdict: OK}
	switch total := len(g.CiliumNodes); compared {
	case 0:
		r.Detail = fmt.Sprintf("no CiliumNode of a Node with a right InternalIP (%d CiliumNodes)", total)
	case total:
		r.Detail = fmt.Sprintf("the %d CiliumNodes name their Node's InternalIP", total)
	default:
		r.Detail = fmt.Sprintf("%d of the %d CiliumNodes name their Node's InternalIP; the others have no Node with a right InternalIP (see the Nodes' checks)", compared, total)
	}
	return []Result{r}
}

// limitList joins at most n items, saying how many more there are.
func limitList(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}
