package ports

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Consumers are the guestnet objects of one cluster whose ports the workers must accept.
type Consumers struct {
	Ingresses []*guestnetv1.GuestIngress
	Bridges   []*guestnetv1.GuestWebhookBridge
	// NodeIdentities need the base ports and the guest tunnel's (the kubelet at the node IP,
	// the tunnel between the Nodes' InternalIPs), which every cluster gets: listed so that a
	// cluster with only a GuestNodeIdentity has them declared.
	NodeIdentities []*guestnetv1.GuestNodeIdentity
}

// Empty reports whether no guestnet object serves the cluster.
func (c Consumers) Empty() bool {
	return len(c.Ingresses) == 0 && len(c.Bridges) == 0 && len(c.NodeIdentities) == 0
}

// ListConsumers lists the GuestIngresses, GuestWebhookBridges and GuestNodeIdentities, not
// being deleted, that name cluster, in the Cluster's namespace.
func ListConsumers(ctx context.Context, host client.Reader, cluster *clusterv1.Cluster) (Consumers, error) {
	var c Consumers
	identities := &guestnetv1.GuestNodeIdentityList{}
	if err := host.List(ctx, identities, client.InNamespace(cluster.Namespace)); err != nil {
		return c, err
	}
	for i := range identities.Items {
		if gni := &identities.Items[i]; gni.Spec.ClusterName == cluster.Name && gni.DeletionTimestamp.IsZero() {
			c.NodeIdentities = append(c.NodeIdentities, gni)
		}
	}
	ingresses := &guestnetv1.GuestIngressList{}
	if err := host.List(ctx, ingresses, client.InNamespace(cluster.Namespace)); err != nil {
		return c, err
	}
	for i := range ingresses.Items {
		if gi := &ingresses.Items[i]; gi.Spec.ClusterName == cluster.Name && gi.DeletionTimestamp.IsZero() {
			c.Ingresses = append(c.Ingresses, gi)
		}
	}
	bridges := &guestnetv1.GuestWebhookBridgeList{}
	if err := host.List(ctx, bridges, client.InNamespace(cluster.Namespace)); err != nil {
		return c, err
	}
	for i := range bridges.Items {
		if gwb := &bridges.Items[i]; gwb.Spec.ClusterName == cluster.Name && gwb.DeletionTimestamp.IsZero() {
			c.Bridges = append(c.Bridges, gwb)
		}
	}
	return c, nil
}

// ForCluster is everything every worker of cluster must accept: the kubelet's port, the guest
// Cilium tunnel (kube-system/cilium-config, read through guest), the ports of every consumer,
// and the Cluster's extra-worker-ports annotation. 22/TCP for CAPK's SSH bootstrap check
// depends on each worker template: ListWorkers adds it where CAPK will SSH (ForWorkers,
// Workers.Required). The note says what was found about the tunnel.
func ForCluster(ctx context.Context, guest client.Reader, cluster *clusterv1.Cluster, consumers Consumers) (Set, string, error) {
	cm := &corev1.ConfigMap{}
	var ciliumConfig map[string]string
	switch err := guest.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "cilium-config"}, cm); {
	case err == nil:
		ciliumConfig = cm.Data
		if ciliumConfig == nil {
			ciliumConfig = map[string]string{}
		}
	case !apierrors.IsNotFound(err):
		return nil, "", fmt.Errorf("reading kube-system/cilium-config in the guest: %w", err)
	}
	set, note, err := CiliumTunnel(ciliumConfig)
	if err != nil {
		return nil, "", err
	}
	set = Base(false).Union(set)

	extra, err := ParseExtraPorts(cluster.Annotations[guestnetv1.ExtraWorkerPortsAnnotation])
	if err != nil {
		return nil, "", err
	}
	set = set.Union(extra)
	for _, gi := range consumers.Ingresses {
		set = set.Union(ForGuestIngress(gi))
	}
	for _, gwb := range consumers.Bridges {
		set = set.Union(ForBridge(gwb))
	}
	return set, note, nil
}

// Workers is one worker MachineDeployment of a cluster and what its template declares.
type Workers struct {
	MachineDeployment *clusterv1.MachineDeployment
	// Template is the KubevirtMachineTemplate the MachineDeployment points at (nil when
	// TemplateErr is set).
	Template    *unstructured.Unstructured
	TemplateErr error
	// Required is what this template must declare: the cluster's set and, when CAPK will SSH
	// into these VMs, 22/TCP (ForWorkers); Analysis and Plan are made against it. Empty
	// when nothing is known to be required.
	Required Set
	Analysis Analysis
	// Plan is what guestnet does about it (the workerports controller applies it; the
	// PortsDeclared conditions and diagnose report it).
	Plan Plan
	// OldMachines is how many Machines the MachineDeployment's MachineSets on another template
	// than its own still have (or are asked to have).
	OldMachines int32
}

// TopologyOwned reports whether the MachineDeployment belongs to a ClusterClass topology:
// the topology controller owns it, so guestnet never edits it.
func (w *Workers) TopologyOwned() bool {
	_, ok := w.MachineDeployment.Labels[clusterv1.ClusterTopologyOwnedLabel]
	return ok
}

// RollingOut reports whether CAPI is still replacing workers, and how many of the desired
// workers run the current template. Until CAPI has observed the MachineDeployment's current
// generation its status describes the previous template, so none counts as up to date.
func (w *Workers) RollingOut() (rolling bool, upToDate, desired int32) {
	md := w.MachineDeployment
	desired = ptr.Deref(md.Spec.Replicas, 0)
	if md.Status.ObservedGeneration >= md.Generation {
		upToDate = ptr.Deref(md.Status.UpToDateReplicas, 0)
	}
	// CAPI observes a new template before it counts the old MachineSet's Machines as out of
	// date: while those Machines exist, they are what is not up to date.
	if w.OldMachines > 0 {
		upToDate = max(0, min(upToDate, desired-w.OldMachines))
	}
	rolling = upToDate < desired || w.OldMachines > 0 || conditions.IsTrue(md, clusterv1.MachineDeploymentRollingOutCondition)
	return rolling, upToDate, desired
}

// oldMachines counts, per MachineDeployment name, the Machines of its MachineSets (the more
// of desired and current replicas) whose template is not the MachineDeployment's.
func oldMachines(mds []clusterv1.MachineDeployment, machineSets []clusterv1.MachineSet) map[string]int32 {
	template := map[string]string{}
	for _, md := range mds {
		template[md.Name] = md.Spec.Template.Spec.InfrastructureRef.Name
	}
	old := map[string]int32{}
	for _, ms := range machineSets {
		md := ms.Labels[clusterv1.MachineDeploymentNameLabel]
		current, ok := template[md]
		if !ok || ms.Spec.Template.Spec.InfrastructureRef.Name == current {
			continue
		}
		old[md] += max(ptr.Deref(ms.Spec.Replicas, 0), ptr.Deref(ms.Status.Replicas, 0))
	}
	return old
}

// ListWorkers reads the cluster's MachineDeployments that use KubevirtMachineTemplates,
// analyses each template against what it must declare (required, the cluster's set, plus
// 22/TCP where CAPK will SSH into its VMs: ForWorkers) and plans what guestnet does about
// each (no plan when required is empty: nothing is known to be required).
func ListWorkers(ctx context.Context, host client.Reader, cluster *clusterv1.Cluster, required Set) ([]Workers, error) {
	mds := &clusterv1.MachineDeploymentList{}
	if err := host.List(ctx, mds, client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}); err != nil {
		return nil, err
	}
	machineSets := &clusterv1.MachineSetList{}
	if err := host.List(ctx, machineSets, client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}); err != nil {
		return nil, err
	}
	old := oldMachines(mds.Items, machineSets.Items)
	// Whether CAPK has SSH keys for the cluster's VMs: read once, when a template needs it.
	var hasKeys *bool
	var out []Workers
	for i := range mds.Items {
		md := &mds.Items[i]
		ref := md.Spec.Template.Spec.InfrastructureRef
		if md.Spec.ClusterName != cluster.Name || ref.Kind != KubevirtMachineTemplateGVK.Kind || ref.APIGroup != KubevirtMachineTemplateGVK.Group {
			continue
		}
		w := Workers{MachineDeployment: md, OldMachines: old[md.Name]}
		tmpl := &unstructured.Unstructured{}
		tmpl.SetGroupVersionKind(KubevirtMachineTemplateGVK)
		if err := host.Get(ctx, client.ObjectKey{Namespace: md.Namespace, Name: ref.Name}, tmpl); err != nil {
			switch {
			case apierrors.IsNotFound(err):
				w.TemplateErr = fmt.Errorf("KubevirtMachineTemplate %s (MachineDeployment %s) does not exist", ref.Name, md.Name)
			case meta.IsNoMatchError(err):
				w.TemplateErr = fmt.Errorf("KubevirtMachineTemplate %s (MachineDeployment %s) cannot exist: the host apiserver does not serve "+
					"KubevirtMachineTemplates (install Cluster API Provider KubeVirt)", ref.Name, md.Name)
			default:
				return nil, err
			}
		} else {
			w.Template = tmpl
			if len(required) > 0 && hasKeys == nil {
				keys, err := CAPKHasSSHKeys(ctx, host, cluster)
				if err != nil {
					return nil, err
				}
				hasKeys = &keys
			}
			w.Required = ForWorkers(required, hasKeys != nil && *hasKeys, tmpl)
			if w.Analysis, err = Analyze(tmpl, w.Required); err != nil {
				w.TemplateErr = err
			}
		}
		w.Plan = Plan{Action: NoAction}
		if len(required) > 0 {
			if err := planWorkers(ctx, host, &w, cluster); err != nil {
				return nil, err
			}
		}
		out = append(out, w)
	}
	return out, nil
}

// TopologyValue is the value of the ClusterClass variable guestnet.workerPorts that declares
// ports on topology-managed workers (templates/clusterclass-kubevirt-guestnet.yaml). The
// variable's ingress and webhookBridge fields are left out: the ClusterClass patch declares
// their ports from them, and the message that gives this value says to keep them.
func TopologyValue(ports []Port) string {
	type entry struct {
		Port     int32  `json:"port"`
		Protocol string `json:"protocol"`
	}
	entries := make([]entry, len(ports))
	for i, p := range ports {
		entries[i] = entry{Port: p.Number, Protocol: string(p.Protocol)}
	}
	data, _ := json.Marshal(map[string]any{"workerPorts": entries})
	return string(data)
}

// SetPortsDeclaredCondition sets PortsDeclared on obj: whether the ports obj needs (own) are
// declared on every worker template of the cluster and every worker runs that template.
// For topology-managed workers the message gives the full variable value (everything the
// workers need, Workers.Required, and what they declare already), since the variable
// replaces the list as a whole.
func SetPortsDeclaredCondition(obj conditions.Setter, own Set, workers []Workers) {
	conditions.Set(obj, portsDeclaredCondition(own, workers))
}

func portsDeclaredCondition(own Set, workers []Workers) metav1.Condition {
	c := metav1.Condition{Type: guestnetv1.PortsDeclaredCondition, Status: metav1.ConditionFalse}
	if len(own) == 0 {
		c.Status, c.Reason = metav1.ConditionTrue, guestnetv1.PortsNotRequestedReason
		c.Message = "No ports to declare (spec.declarePorts is false, or no nodePort is known yet)"
		return c
	}
	if len(workers) == 0 {
		c.Status, c.Reason = metav1.ConditionUnknown, guestnetv1.NoWorkersReason
		c.Message = "The Cluster has no MachineDeployment with a KubevirtMachineTemplate yet: nothing to declare ports on"
		return c
	}

	var templateErrs, elsewhere, missing, topology, reverted, taken, rolling, forwarded, notMasquerade []string
	for _, w := range workers {
		md := w.MachineDeployment.Name
		if w.Template != nil {
			if where := VMsElsewhere(w.Template); where != "" {
				elsewhere = append(elsewhere, fmt.Sprintf("CAPK creates the VMs of MachineDeployment %s in %s, not in the Cluster's namespace %s: "+
					"guestnet's host Services select the workers' virt-launcher pods in the Cluster's namespace only, so these workers get no traffic through them; "+
					"let CAPK create the VMs in the Cluster's namespace", md, where, w.Template.GetNamespace()))
			}
		}
		switch {
		case w.TemplateErr != nil:
			templateErrs = append(templateErrs, w.TemplateErr.Error()+": fix the MachineDeployment's infrastructureRef")
		case w.Analysis.State == AllPortsForwarded:
			forwarded = append(forwarded, md)
		case w.Analysis.State == NotMasquerade:
			notMasquerade = append(notMasquerade, md)
		default:
			lacking := own.Missing(w.Analysis.Declared)
			if len(lacking) == 0 {
				if isRolling, upToDate, desired := w.RollingOut(); isRolling {
					rolling = append(rolling, fmt.Sprintf("MachineDeployment %s is rolling out to KubevirtMachineTemplate %s: %d of %d workers run it",
						md, w.Template.GetName(), upToDate, desired))
				}
				continue
			}
			if w.TopologyOwned() {
				all := w.Required.Union(NewSet(declaredAsRequirements(w.Analysis.Declared)...))
				topology = append(topology, fmt.Sprintf("MachineDeployment %s belongs to the Cluster topology and its KubevirtMachineTemplate %s lacks %s; "+
					"guestnet never edits topology-managed workers: set the Cluster topology variable guestnet to %s "+
					"(keep its ingress and webhookBridge as they are: the ClusterClass declares their ports itself)",
					md, w.Template.GetName(), lacking, TopologyValue(all.Ports())))
				continue
			}
			switch w.Plan.Action {
			case Reverted:
				reverted = append(reverted, fmt.Sprintf("MachineDeployment %s was set back to KubevirtMachineTemplate %s, which lacks %s, by %s after guestnet had repointed it at a copy that declares them; "+
					"guestnet does not fight that writer (a GitOps tool re-applying its source would roll the workers twice, forever) and no longer repoints this MachineDeployment: "+
					"declare the ports in the template's source: %s (manager diagnose prints it too)",
					md, w.Template.GetName(), lacking, w.Plan.RevertedByText(), w.SourcePorts()))
			case NameTaken:
				taken = append(taken, fmt.Sprintf("KubevirtMachineTemplate %s (MachineDeployment %s) lacks %s, and guestnet does not adopt the object that holds the name of its copy: %s; "+
					"delete or rename that object, or declare the ports in the template's source: %s",
					w.Template.GetName(), md, lacking, w.Plan.Conflict, w.SourcePorts()))
			case WaitForRollout:
				_, upToDate, desired := w.RollingOut()
				missing = append(missing, fmt.Sprintf("KubevirtMachineTemplate %s (MachineDeployment %s) lacks %s: guestnet declares them in a new copy once CAPI has rolled the workers to this one (%d of %d workers run it)",
					w.Template.GetName(), md, lacking, upToDate, desired))
			default:
				missing = append(missing, fmt.Sprintf("KubevirtMachineTemplate %s (MachineDeployment %s) lacks %s: guestnet is creating a copy that declares them and repointing the MachineDeployment, then CAPI rolls the workers",
					w.Template.GetName(), md, lacking))
			}
		}
	}
	switch {
	case len(templateErrs) > 0:
		c.Reason, c.Message = guestnetv1.WorkerTemplateErrorReason, strings.Join(templateErrs, "; ")
	case len(elsewhere) > 0:
		c.Reason, c.Message = guestnetv1.WorkersElsewhereReason, strings.Join(elsewhere, "; ")
	case len(topology) > 0:
		c.Reason, c.Message = guestnetv1.TopologyVariableRequiredReason, strings.Join(topology, "; ")
	case len(reverted) > 0:
		c.Reason, c.Message = guestnetv1.RepointRevertedReason, strings.Join(reverted, "; ")
	case len(taken) > 0:
		c.Reason, c.Message = guestnetv1.TemplateNameTakenReason, strings.Join(taken, "; ")
	case len(missing) > 0:
		c.Reason, c.Message = guestnetv1.PortsMissingReason, strings.Join(missing, "; ")
	case len(rolling) > 0:
		c.Reason, c.Message = guestnetv1.RollingOutReason, strings.Join(rolling, "; ")
	case len(notMasquerade) == len(workers):
		c.Status, c.Reason = metav1.ConditionTrue, guestnetv1.NotMasqueradeReason
		c.Message = "The workers' pod network is not bound with masquerade: there is no ports list to keep"
	case len(forwarded)+len(notMasquerade) == len(workers):
		c.Status, c.Reason = metav1.ConditionTrue, guestnetv1.AllPortsForwardedReason
		c.Message = "The workers' masquerade interface has no ports list: every port reaches the VMs"
	default:
		c.Status, c.Reason = metav1.ConditionTrue, guestnetv1.PortsDeclaredReason
		c.Message = fmt.Sprintf("%s declared on every worker template, and every worker runs it", own)
	}
	return c
}

func declaredAsRequirements(ports []Port) []Requirement {
	out := make([]Requirement, len(ports))
	for i, p := range ports {
		out[i] = Requirement{Port: p, Reasons: []string{"already declared"}}
	}
	return out
}

// ReportPortsDeclared sets PortsDeclared on obj, a GuestIngress or GuestWebhookBridge of
// cluster that needs the ports own: it computes the cluster's whole port set (for the
// topology variable value) and reads the workers, as the workerports controller does.
func ReportPortsDeclared(ctx context.Context, host, guest client.Reader, cluster *clusterv1.Cluster, obj conditions.Setter, own Set) error {
	consumers, err := ListConsumers(ctx, host, cluster)
	if err != nil {
		return err
	}
	clusterSet, _, err := ForCluster(ctx, guest, cluster, consumers)
	if err != nil {
		return err
	}
	workers, err := ListWorkers(ctx, host, cluster, clusterSet)
	if err != nil {
		return err
	}
	SetPortsDeclaredCondition(obj, own, workers)
	return nil
}
