package diagnose

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/kubeconfig"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// checkCluster: the Cluster is provisioned (there is a guest apiserver) and not paused.
func checkCluster(s *State) Result {
	r := Result{Check: CheckCluster, Object: s.Namespace + "/" + s.ClusterName}
	switch {
	case !clusterscope.IsProvisioned(s.Cluster):
		r.Verdict, r.Detail = Fail, "the Cluster's infrastructure is not provisioned: there is no guest apiserver yet"
		r.Fix = fmt.Sprintf("wait; kubectl describe cluster %s -n %s says what CAPI waits for", s.ClusterName, s.Namespace)
	case clusterscope.IsPaused(s.Cluster, s.Cluster):
		r.Verdict, r.Detail = Warn, "the Cluster is paused (spec.paused or the cluster.x-k8s.io/paused annotation): guestnet changes nothing"
		r.Fix = "lift the pause"
	default:
		r.Verdict, r.Detail = OK, "provisioned"
	}
	return r
}

// checkGuest: the guest apiserver answers through the Cluster's kubeconfig.
func checkGuest(s *State) Result {
	r := Result{Check: CheckGuest}
	g := s.Guest
	if refused, ok := kubeconfig.AsRefused(g.Err); ok {
		r.Verdict, r.Detail = Fail, fmt.Sprintf("guestnet's manager and diagnose do not use this kubeconfig, so the guest is not read: %v", refused)
		r.Fix, r.Runbook = fixKubeconfigRefused, rbKubeconfigRefused
		return r
	}
	if g.Err != nil {
		r.Verdict, r.Detail = Fail, fmt.Sprintf("the guest apiserver cannot be read through %s: %v", g.Source, g.Err)
		r.Fix, r.Runbook = fixGuestUnreachable, rbGuestUnreachable
		return r
	}
	r.Verdict, r.Detail = OK, fmt.Sprintf("the guest apiserver (%s) answers through %s", g.Version, g.Source)
	return r
}

// workerPods are the pods the worker selector selects: the worker VMs' virt-launcher pods.
func workerPods(s *State) []corev1.Pod {
	return matchingPods(s.Pods, virtlauncher.WorkerSelector(s.Namespace, s.ClusterName))
}

func matchingPods(pods []corev1.Pod, selector map[string]string) []corev1.Pod {
	if len(selector) == 0 {
		return nil
	}
	sel := labels.SelectorFromSet(selector)
	var out []corev1.Pod
	for _, p := range pods {
		if sel.Matches(labels.Set(p.Labels)) && p.DeletionTimestamp.IsZero() {
			out = append(out, p)
		}
	}
	return out
}

func countReady(pods []corev1.Pod) int {
	n := 0
	for i := range pods {
		for _, c := range pods[i].Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

// checkWorkers: virt-launcher pods selected by the labels CAPI/CAPK and KubeVirt guarantee,
// against the replicas the MachineDeployments want.
func checkWorkers(s *State) Result {
	r := Result{Check: CheckWorkers}
	sel := virtlauncher.FormatSelector(virtlauncher.WorkerSelector(s.Namespace, s.ClusterName))
	pods := workerPods(s)
	ready := countReady(pods)
	var desired int32
	for _, w := range s.Workers {
		desired += ptr.Deref(w.MachineDeployment.Spec.Replicas, 0)
	}
	if s.PodsErr != nil {
		r.Verdict, r.Detail = Warn, fmt.Sprintf("the pods of namespace %s cannot be read: %v", s.Namespace, s.PodsErr)
		r.Fix, r.Runbook = "run diagnose with an identity that may get and list pods there (the Services' checks rely on their EndpointSlices alone meanwhile)", rbNoWorkers
		return r
	}
	found := fmt.Sprintf("%d virt-launcher pods (%d ready) match %s", len(pods), ready, sel)
	want := fmt.Sprintf("the MachineDeployments want %d workers", desired)
	look := fmt.Sprintf("kubectl get vmi,pods -n %s -l %s", s.Namespace, sel)
	switch {
	case len(pods) == 0 && desired == 0:
		r.Verdict, r.Detail = Warn, found+"; the Cluster has no worker MachineDeployment with replicas"
		r.Fix, r.Runbook = "scale a worker MachineDeployment up: with no worker there is nothing to forward to", rbNoWorkers
	case len(pods) == 0:
		r.Verdict, r.Detail = Fail, found+"; "+want+": every host Service of the cluster has no endpoint"
		r.Fix, r.Runbook = "no worker VM runs: "+look+"; check the Machines (kubectl get machines -n "+s.Namespace+")", rbNoWorkers
	case ready == 0:
		r.Verdict, r.Detail = Fail, found+"; none is ready: every host Service of the cluster has no ready endpoint"
		r.Fix, r.Runbook = "check the worker VMs: "+look, rbNoWorkers
	case ready < len(pods) || int32(len(pods)) < desired:
		r.Verdict, r.Detail = Warn, found+"; "+want
		r.Fix, r.Runbook = "wait for the VMs to boot (they can take minutes), or check them: "+look, rbNoWorkers
	default:
		r.Verdict, r.Detail = OK, found+"; "+want
	}
	return r
}

// hostServices are the Services of the namespace that forward to the cluster's workers:
// guestnet's (labelled managed-by guestnet and with the cluster's name), and any other
// whose selector names the cluster or uses a label of the workers' virtualMachineTemplate
// metadata (the field report's first selector).
func hostServices(s *State) []corev1.Service {
	vmKeys := vmTemplateLabelKeys(s.Workers)
	var out []corev1.Service
	for _, svc := range s.Services {
		if len(svc.Spec.Selector) == 0 {
			continue
		}
		if isGuestnetService(&svc, s.ClusterName) ||
			svc.Spec.Selector[virtlauncher.ClusterNameLabel] == s.ClusterName ||
			len(selectorKeysIn(svc.Spec.Selector, vmKeys)) > 0 {
			out = append(out, svc)
		}
	}
	slices.SortFunc(out, func(a, b corev1.Service) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func isGuestnetService(svc *corev1.Service, cluster string) bool {
	return svc.Labels[ownership.ManagedByLabel] == ownership.ManagedByValue && svc.Labels[ownership.ClusterNameLabel] == cluster
}

// vmTemplateLabelKeys are the label keys of the worker templates'
// virtualMachineTemplate.metadata.labels that are not also on the VMI template (whose labels
// KubeVirt does copy to the virt-launcher pod): a selector using them selects nothing.
func vmTemplateLabelKeys(workers []ports.Workers) map[string]bool {
	keys := map[string]bool{}
	for _, w := range workers {
		if w.Template == nil {
			continue
		}
		vm, _, _ := unstructured.NestedStringMap(w.Template.Object, "spec", "template", "spec", "virtualMachineTemplate", "metadata", "labels")
		vmi, _, _ := unstructured.NestedStringMap(w.Template.Object, "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "metadata", "labels")
		for k := range vm {
			if _, copied := vmi[k]; !copied {
				keys[k] = true
			}
		}
	}
	for k := range virtlauncher.WorkerSelector("", "") {
		delete(keys, k)
	}
	return keys
}

func selectorKeysIn(selector map[string]string, keys map[string]bool) []string {
	var out []string
	for k := range selector {
		if keys[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func slicesOf(s *State, service string) []discoveryv1.EndpointSlice {
	var out []discoveryv1.EndpointSlice
	for _, es := range s.EndpointSlices {
		if es.Labels[discoveryv1.LabelServiceName] == service {
			out = append(out, es)
		}
	}
	return out
}

// checkServices: every Service that forwards to the workers has ready endpoints, selects
// with labels KubeVirt puts on the pods, and (not guestnet's: those are in the ports check)
// forwards to ports the workers declare.
func checkServices(s *State) []Result {
	var out []Result
	workerSel := virtlauncher.WorkerSelector(s.Namespace, s.ClusterName)
	vmKeys := vmTemplateLabelKeys(s.Workers)
	for _, svc := range hostServices(s) {
		r := Result{Check: CheckService, Object: svc.Name}
		sel := virtlauncher.FormatSelector(svc.Spec.Selector)
		matched := matchingPods(s.Pods, svc.Spec.Selector)
		eps := slicesOf(s, svc.Name)
		ready, total := ingress.CountEndpoints(eps)
		byVMLabels := selectorKeysIn(svc.Spec.Selector, vmKeys)
		look := fmt.Sprintf("kubectl get pods -n %s -o wide -l %s", s.Namespace, virtlauncher.FormatSelector(workerSel))
		switch {
		case ready > 0:
			r.Verdict, r.Detail = OK, fmt.Sprintf("%d of %d endpoints ready", ready, total)
		case s.PodsErr != nil:
			r.Verdict, r.Runbook = Fail, rbNoEndpoints
			r.Detail = fmt.Sprintf("no ready endpoint (%d endpoints) for its selector %s: requests are refused", total, sel)
			r.Fix = "check that the selector matches the worker pods: " + look
			if len(byVMLabels) > 0 {
				r.Detail += fmt.Sprintf("; it uses %s of virtualMachineTemplate.metadata.labels, which KubeVirt does not copy to virt-launcher pods", strings.Join(byVMLabels, ", "))
			}
		case len(byVMLabels) > 0:
			r.Verdict = Fail
			r.Detail = fmt.Sprintf("no ready endpoint: its selector %s uses %s of virtualMachineTemplate.metadata.labels, which KubeVirt does not copy to virt-launcher pods (it matches %d pods): requests are refused",
				sel, strings.Join(byVMLabels, ", "), len(matched))
			r.Fix = fmt.Sprintf("select the workers with %s, the labels CAPI/CAPK and KubeVirt put on every worker's virt-launcher pod (or let a GuestIngress create the Service)",
				virtlauncher.FormatSelector(workerSel))
			r.Runbook = rbNoEndpoints
		case len(matched) == 0:
			r.Verdict, r.Runbook = Fail, rbNoEndpoints
			r.Detail = fmt.Sprintf("no endpoint: its selector %s matches no pod in namespace %s: requests are refused", sel, s.Namespace)
			if isSubset(workerSel, svc.Spec.Selector) {
				r.Fix = "no worker VM runs: " + look
			} else {
				r.Fix = fmt.Sprintf("select the workers with %s, the labels CAPI/CAPK and KubeVirt put on every worker's virt-launcher pod", virtlauncher.FormatSelector(workerSel))
			}
		case countReady(matched) > 0 && len(eps) == 0:
			r.Verdict, r.Runbook = Warn, rbNoEndpoints
			r.Detail = fmt.Sprintf("its selector matches %d ready pods but it has no EndpointSlice yet", countReady(matched))
			r.Fix = "run diagnose again in a few seconds; if it stays, check the host's kube-controller-manager (EndpointSlice controller)"
		default:
			r.Verdict, r.Runbook = Fail, rbNoEndpoints
			r.Detail = fmt.Sprintf("no ready endpoint: %d pods match %s but none is ready: requests are refused", len(matched), sel)
			r.Fix = "check the worker VMs: kubectl get vmi,pods -n " + s.Namespace + " -l " + sel
		}
		if !isGuestnetService(&svc, s.ClusterName) {
			addUndeclaredTargetPorts(&r, &svc, s.Workers)
		}
		out = append(out, r)
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			out = append(out, checkLoadBalancer(s, &svc))
		}
	}
	return out
}

// addUndeclaredTargetPorts fails r when svc forwards to a port a worker template's
// masquerade ports list lacks: KubeVirt does not forward it into the VM, and the virt-launcher
// pod, which holds the address, refuses it (docs/node-identity-research.md).
func addUndeclaredTargetPorts(r *Result, svc *corev1.Service, workers []ports.Workers) {
	var reqs []ports.Requirement
	for _, sp := range svc.Spec.Ports {
		if sp.TargetPort.Type == intstr.String {
			continue // a named port: nothing to compare with the VMs' numbered ports
		}
		n := sp.TargetPort.IntVal
		if n == 0 {
			n = sp.Port
		}
		reqs = append(reqs, ports.Requirement{Port: ports.Port{Number: n, Protocol: cmp.Or(sp.Protocol, corev1.ProtocolTCP)}, Reasons: []string{"Service " + svc.Name}})
	}
	want := ports.NewSet(reqs...)
	var lacking []string
	var missing ports.Set
	for _, w := range workers {
		if w.TemplateErr != nil || w.Analysis.State == ports.AllPortsForwarded || w.Analysis.State == ports.NotMasquerade {
			continue
		}
		if m := want.Missing(w.Analysis.Declared); len(m) > 0 {
			lacking = append(lacking, fmt.Sprintf("KubevirtMachineTemplate %s lacks %s", w.Template.GetName(), m))
			missing = missing.Union(m)
		}
	}
	if len(lacking) == 0 {
		return
	}
	detail := fmt.Sprintf("it forwards to %s, which the workers do not declare (%s): KubeVirt's masquerade does not forward it into the VMs, and their virt-launcher pods refuse it",
		missing, strings.Join(lacking, "; "))
	if r.Verdict == Fail {
		r.Detail += "; also " + detail
		return
	}
	r.Verdict, r.Detail, r.Runbook = Fail, r.Detail+", but "+detail, rbUndeclaredPort
	r.Fix = fmt.Sprintf("declare %s on the workers: the Cluster annotation %s makes guestnet add them (a new template, then a rollout)",
		missing, "guestnet.addons.cluster.x-k8s.io/extra-worker-ports")
}

func isSubset(sub, set map[string]string) bool {
	for k, v := range sub {
		if set[k] != v {
			return false
		}
	}
	return true
}

// checkLoadBalancer: a LoadBalancer Service of the cluster has its IP.
func checkLoadBalancer(s *State, svc *corev1.Service) Result {
	r := Result{Check: CheckLoadBalancer, Object: svc.Name}
	var ips []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP+in.Hostname)
	}
	if len(ips) > 0 {
		r.Verdict, r.Detail = OK, "IP "+strings.Join(ips, ", ")
		return r
	}
	r.Verdict, r.Runbook = Fail, rbNoIP
	r.Detail = "no load-balancer IP"
	if c := ingress.ServiceCondition(svc, "cilium.io/IPAMRequestSatisfied"); c != nil {
		r.Detail += fmt.Sprintf(" (Cilium: %s %s: %s)", c.Type, c.Reason, c.Message)
	}
	r.Fix = fmt.Sprintf("check Cilium LB-IPAM: the pool must exist, be enabled, hold the IP and select the Service (kubectl get ippools; kubectl describe svc %s -n %s)", svc.Name, s.Namespace)
	return r
}

// checkPorts: each worker template declares every port the cluster requires, and its workers
// run it.
func checkPorts(s *State) []Result {
	if len(s.Workers) == 0 {
		return []Result{{Check: CheckPorts, Verdict: Warn, Runbook: rbNoWorkers,
			Detail: "the Cluster has no MachineDeployment with a KubevirtMachineTemplate: no worker ports to check",
			Fix:    "create the worker MachineDeployment; if it uses another infrastructure template, guestnet does not manage its ports"}}
	}
	var out []Result
	for _, w := range s.Workers {
		r := Result{Check: CheckPorts, Object: w.MachineDeployment.Name}
		switch {
		case w.TemplateErr != nil:
			r.Verdict, r.Detail = Fail, w.TemplateErr.Error()
			r.Fix, r.Runbook = "fix the MachineDeployment's infrastructureRef", rbWorkerRollout
		case w.Analysis.State == ports.AllPortsForwarded:
			r.Verdict, r.Detail = OK, fmt.Sprintf("KubevirtMachineTemplate %s: the masquerade interface has no ports list, every port reaches the VMs", w.Template.GetName())
		case w.Analysis.State == ports.NotMasquerade:
			r.Verdict, r.Detail = OK, fmt.Sprintf("KubevirtMachineTemplate %s: the pod network is not bound with masquerade, no ports list to keep", w.Template.GetName())
		case s.RequiredErr != nil:
			r.Verdict, r.Detail = Warn, fmt.Sprintf("KubevirtMachineTemplate %s declares %s; the required ports are unknown: %v", w.Template.GetName(), ports.JoinPorts(w.Analysis.Declared), s.RequiredErr)
			r.Fix, r.Runbook = fixGuestUnreachable, rbGuestUnreachable
		case len(w.Analysis.Missing) > 0:
			r.Verdict, r.Runbook = Fail, rbUndeclaredPort
			r.Detail = fmt.Sprintf("KubevirtMachineTemplate %s lacks %s: KubeVirt's masquerade does not forward these ports into the VMs (their virt-launcher pods refuse them)", w.Template.GetName(), describeRequirements(w.Analysis.Missing))
			r.Fix = missingPortsFix(s, w)
			switch w.Plan.Action {
			case ports.Reverted:
				r.Runbook = rbRepointStopped
				r.Detail += fmt.Sprintf("; %s set the MachineDeployment back to it after guestnet had repointed it at a copy that declares them, so guestnet no longer repoints it",
					w.Plan.RevertedByText())
			case ports.NameTaken:
				r.Runbook = rbRepointStopped
				r.Detail += "; guestnet does not adopt the object that holds the name of its copy: " + w.Plan.Conflict
			}
		default:
			if rolling, upToDate, desired := w.RollingOut(); rolling {
				r.Verdict, r.Runbook = Warn, rbWorkerRollout
				r.Detail = fmt.Sprintf("KubevirtMachineTemplate %s declares the %d required ports, but the MachineDeployment is rolling out to it: %d of %d workers run it; the others still drop the ports they lack",
					w.Template.GetName(), len(w.Required), upToDate, desired)
				r.Fix = fmt.Sprintf("wait for CAPI's rollout (kubectl get machinedeployment %s -n %s; kubectl get machines -n %s)", w.MachineDeployment.Name, s.Namespace, s.Namespace)
				break
			}
			r.Verdict = OK
			r.Detail = fmt.Sprintf("KubevirtMachineTemplate %s declares every required port (%s), and every worker runs it", w.Template.GetName(), w.Required)
		}
		out = append(out, r)
	}
	return out
}

func missingPortsFix(s *State, w ports.Workers) string {
	switch {
	case w.TopologyOwned():
		all := w.Required.Union(declaredSet(w.Analysis.Declared))
		return fmt.Sprintf("guestnet never edits topology-managed workers: set the Cluster topology variable guestnet to %s", ports.TopologyValue(all.Ports()))
	case s.Managed && w.Plan.Action == ports.Reverted:
		return "declare the ports in the template's source (the repository " + w.Plan.RevertedByText() + " applies): " + w.SourcePorts() +
			"; or, to let guestnet repoint once more, remove the MachineDeployment's annotation " + guestnetv1.RepointedFromAnnotation
	case s.Managed && w.Plan.Action == ports.NameTaken:
		return "delete or rename that object, or declare the ports in the template's source: " + w.SourcePorts()
	case s.Managed && w.Plan.Action == ports.WaitForRollout:
		return fmt.Sprintf("guestnet declares them in a new copy once CAPI has rolled the workers to this one: wait for the rollout (kubectl get machinedeployment %s -n %s)",
			w.MachineDeployment.Name, s.Namespace)
	case s.Managed:
		return "guestnet creates a KubevirtMachineTemplate <base>-<hash> that declares them and repoints the MachineDeployment, then CAPI rolls the workers; " +
			"if the MachineDeployment still points at this template after a minute, " + fixManager
	default:
		fix := "guestnet does not manage this cluster's workers (no GuestIngress or GuestWebhookBridge names it): create a new KubevirtMachineTemplate that declares them " +
			"and point the MachineDeployment at it (templates cannot be edited in place), or add the ports to the Cluster annotation " +
			"guestnet.addons.cluster.x-k8s.io/extra-worker-ports to have guestnet do it"
		if source := w.SourcePorts(); source != "" {
			fix += "; in the new template, " + source
		}
		return fix
	}
}

func declaredSet(declared []ports.Port) ports.Set {
	reqs := make([]ports.Requirement, len(declared))
	for i, p := range declared {
		reqs[i] = ports.Requirement{Port: p, Reasons: []string{"already declared"}}
	}
	return ports.NewSet(reqs...)
}

// describeRequirements renders "8473/UDP (Cilium VXLAN tunnel), 30080/TCP (GuestIngress web port http)".
func describeRequirements(set ports.Set) string {
	parts := make([]string, len(set))
	for i, r := range set {
		parts[i] = r.Port.String()
		if len(r.Reasons) > 0 {
			parts[i] += " (" + strings.Join(r.Reasons, ", ") + ")"
		}
	}
	return strings.Join(parts, ", ")
}

// checkTunnel: the guest Cilium's tunnel port, from its cilium-config, is declared on every
// worker template with a ports list ("works on one node only" otherwise).
func checkTunnel(s *State) Result {
	r := Result{Check: CheckTunnel}
	set, note, err := ports.CiliumTunnel(s.Guest.CiliumConfig)
	if err != nil {
		r.Verdict, r.Detail = Fail, err.Error()
		r.Fix, r.Runbook = "fix kube-system/cilium-config in the guest (tunnel-protocol, tunnel-port)", rbTunnelPort
		return r
	}
	if len(set) == 0 {
		r.Verdict, r.Detail = OK, note
		return r
	}
	var lacking []string
	for _, w := range s.Workers {
		if w.TemplateErr != nil || w.Analysis.State == ports.AllPortsForwarded || w.Analysis.State == ports.NotMasquerade {
			continue
		}
		if len(set.Missing(w.Analysis.Declared)) > 0 {
			lacking = append(lacking, fmt.Sprintf("KubevirtMachineTemplate %s (MachineDeployment %s)", w.Template.GetName(), w.MachineDeployment.Name))
		}
	}
	if len(lacking) == 0 {
		r.Verdict, r.Detail = OK, note+"; declared on every worker template"
		return r
	}
	r.Verdict, r.Runbook = Fail, rbTunnelPort
	r.Detail = fmt.Sprintf("%s, which %s does not declare: cross-node pod traffic is dropped (\"works on one node only\", Envoy 1/2 on all nodes but one)",
		note, strings.Join(lacking, ", "))
	r.Fix = fmt.Sprintf("declare %s on the workers (guestnet does it when it manages the cluster's workers: see the ports check)", set)
	return r
}
