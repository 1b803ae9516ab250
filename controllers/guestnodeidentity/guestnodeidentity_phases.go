package guestnodeidentity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"
	reconcileresult "sigs.k8s.io/controller-runtime/pkg/reconcile"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeagent"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

const (
	agentNamespace = nodeagent.Namespace
	agentName      = nodeagent.Name
	// guestWatcher names the watches of the guest this controller adds to the ClusterCache.
	guestWatcher = controllerName + "-guest"
)

// readyConditions are the conditions Ready summarises, in the order their reasons win.
var readyConditions = []string{guestnetv1.ClusterAvailableCondition, guestnetv1.NodeAddressesCondition, guestnetv1.NodeAgentCondition}

// ownedConditions are all conditions this controller writes.
var ownedConditions = append([]string{guestnetv1.ReadyCondition, guestnetv1.PausedCondition, guestnetv1.ControlPlaneAddressCondition}, readyConditions...)

// setReadyCondition summarises readyConditions into Ready, and ControlPlaneAddress first when
// spec.controlPlane asks for one (the guest is reached at it).
func setReadyCondition(gni *guestnetv1.GuestNodeIdentity) {
	summarised := readyConditions
	if gni.Spec.ControlPlane != nil {
		summarised = append([]string{guestnetv1.ControlPlaneAddressCondition}, readyConditions...)
	}
	status.SetReadyCondition(gni, summarised...)
}

// reconcileNormal connects to the guest, writes the Nodes' addresses and applies the agent.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (reconcileresult.Result, error) {
	gni := s.gni
	// The control plane address first: without it the guest may not be reachable at all.
	poll, cpErr := r.reconcileControlPlane(ctx, s)
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, gni, s.cluster)
	if err != nil || guestClient == nil || cpErr != nil {
		// Not reachable yet: the Cluster watch or the ClusterCache connect event brings us back.
		return reconcileresult.Result{RequeueAfter: poll}, errors.Join(cpErr, err)
	}
	s.guestClient = guestClient
	if err := r.watchGuest(ctx, s); err != nil {
		return reconcileresult.Result{}, err
	}
	internalIPs, nodeErr := r.reconcileNodes(ctx, s)
	agentErr := r.reconcileAgent(ctx, s, false)
	again, ciliumErr := r.restartStaleCiliumAgents(ctx, s, internalIPs)
	result := reconcileresult.Result{RequeueAfter: poll}
	if again && (poll == 0 || ciliumRecheckEvery < poll) {
		result.RequeueAfter = ciliumRecheckEvery
	}
	return result, errors.Join(nodeErr, agentErr, ciliumErr)
}

// watchGuest watches the guest's Nodes (what Decide reads) and the agent's DaemonSet.
func (r *Reconciler) watchGuest(ctx context.Context, s *scope) error {
	if r.controller == nil {
		return nil // unit tests drive the phases without a controller
	}
	key := ctrl.ObjectKeyFromObject(s.cluster)
	toObjects := handler.EnqueueRequestsFromMapFunc(r.clusterToObjects(key))
	for _, w := range []struct {
		kind ctrl.Object
		pred predicate.Predicate
	}{
		{&corev1.Node{}, predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return nodeChanged(e.ObjectOld, e.ObjectNew) }}},
		{&appsv1.DaemonSet{}, predicate.NewPredicateFuncs(isAgentDaemonSet)},
	} {
		err := r.ClusterCache.Watch(ctx, key, clustercache.NewWatcher(clustercache.WatcherOptions{
			Name:         fmt.Sprintf("%s-%T", guestWatcher, w.kind),
			Watcher:      r.controller,
			Kind:         w.kind,
			EventHandler: toObjects,
			Predicates:   []predicate.Predicate{w.pred},
		}))
		if errors.Is(err, clustercache.ErrClusterNotConnected) {
			return nil // the connect event brings the object back
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// nodeReport is what reconcileNodes found, for the NodeAddresses condition.
type nodeReport struct {
	nodes, withPodIP int
	// byVerdict names the Nodes of each verdict but InSync and Write, sorted.
	byVerdict map[nodeidentity.Verdict][]string
	// writers are the other initializers seen.
	writers  []string
	external bool
	// failed is the first error of a Node write.
	failed error
}

// reconcileNodes writes each guest Node's addresses from its VM's pod and removes the taint,
// and returns the InternalIPs of the Nodes that have their pod IPs now, by name.
func (r *Reconciler) reconcileNodes(ctx context.Context, s *scope) (map[string][]string, error) {
	gni := s.gni
	nodes := &corev1.NodeList{}
	if err := s.guestClient.List(ctx, nodes); err != nil {
		return nil, fmt.Errorf("listing guest Nodes: %w", err)
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, ctrl.InNamespace(gni.Namespace),
		ctrl.MatchingLabels(virtlauncher.WorkerSelector(gni.Namespace, gni.Spec.ClusterName))); err != nil {
		return nil, fmt.Errorf("listing the workers' virt-launcher pods: %w", err)
	}
	withPodIP := map[string][]string{}
	rep := nodeReport{nodes: len(nodes.Items), byVerdict: map[nodeidentity.Verdict][]string{},
		external: gni.Spec.NodeAddresses == guestnetv1.NodeAddressesExternal}
	for i := range nodes.Items {
		node := &nodes.Items[i]
		d := nodeidentity.Decide(node, podsOf(pods.Items, nodeidentity.MachineName(node)), ownership.FieldManager)
		if d.Verdict == nodeidentity.NotAWorker {
			rep.nodes-- // not this Cluster's KubeVirt worker: not counted, left alone
			continue
		}
		switch {
		case d.Verdict == nodeidentity.InSync:
			rep.withPodIP++
			withPodIP[node.Name] = d.PodIPs
			continue
		case rep.external:
			if slices.Equal(d.InternalIPs, d.PodIPs) {
				rep.withPodIP++
			}
			continue
		case d.Verdict == nodeidentity.Write:
			if err := r.writeNode(ctx, s, node, d); err != nil {
				rep.failed = cmpOr(rep.failed, err)
				rep.byVerdict["WriteFailed"] = append(rep.byVerdict["WriteFailed"], node.Name)
				continue
			}
			rep.withPodIP++
			withPodIP[node.Name] = d.PodIPs
			continue
		case d.Verdict == nodeidentity.OtherInitializer:
			for _, w := range d.Writers {
				if !slices.Contains(rep.writers, w) {
					rep.writers = append(rep.writers, w)
				}
			}
		}
		rep.byVerdict[d.Verdict] = append(rep.byVerdict[d.Verdict], node.Name)
	}
	gni.Status.Nodes, gni.Status.NodesWithPodIP = int32(rep.nodes), int32(rep.withPodIP)
	setNodeAddressesCondition(gni, rep, s.cluster.Namespace)
	return withPodIP, rep.failed
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// podsOf are the pods of machine among the Cluster's worker pods.
func podsOf(pods []corev1.Pod, machine string) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Labels[virtlauncher.MachineNameLabel] == machine {
			out = append(out, p)
		}
	}
	return out
}

// writeNode writes node's addresses as a whole (the kubelet in external mode never touches
// them once set), then removes the uninitialized taint: a Node is schedulable only with the
// right address. Both are merge patches against the cached Node with optimistic locking, as
// guestnet's own field manager.
func (r *Reconciler) writeNode(ctx context.Context, s *scope, node *corev1.Node, d nodeidentity.Decision) error {
	if !slices.Equal(d.InternalIPs, d.PodIPs) {
		before := node.DeepCopy()
		node.Status.Addresses = nodeidentity.Addresses(node, d.PodIPs)
		if err := s.guestClient.Status().Patch(ctx, node, ctrl.MergeFromWithOptions(before, ctrl.MergeFromWithOptimisticLock{}),
			ctrl.FieldOwner(ownership.FieldManager)); err != nil {
			return fmt.Errorf("writing the addresses of guest Node %s: %w", node.Name, err)
		}
		r.written.wrote(ctrl.ObjectKeyFromObject(s.cluster), node.Name, time.Now())
		note := fmt.Sprintf("Guest Node %s: InternalIP %s, its VM's virt-launcher pod IP (was %s)",
			node.Name, strings.Join(d.PodIPs, ","), orNone(d.InternalIPs))
		record.Written(ctx, r.recorder, s.gni, record.Write{Type: corev1.EventTypeNormal, Reason: "NodeAddressesSet", Action: "Patch", Note: note})
	}
	if d.Tainted {
		before := node.DeepCopy()
		node.Spec.Taints = nodeidentity.WithoutUninitializedTaint(node)
		if err := s.guestClient.Patch(ctx, node, ctrl.MergeFromWithOptions(before, ctrl.MergeFromWithOptimisticLock{}),
			ctrl.FieldOwner(ownership.FieldManager)); err != nil {
			return fmt.Errorf("removing the taint %s of guest Node %s: %w", nodeidentity.UninitializedTaint, node.Name, err)
		}
		record.Written(ctx, r.recorder, s.gni, record.Write{Type: corev1.EventTypeNormal, Reason: "NodeInitialized", Action: "Patch",
			Note: fmt.Sprintf("Guest Node %s initialized: taint %s removed", node.Name, nodeidentity.UninitializedTaint)})
	}
	return nil
}

func orNone(ips []string) string {
	if len(ips) == 0 {
		return "none"
	}
	return strings.Join(ips, ",")
}

// setNodeAddressesCondition reports what reconcileNodes found.
func setNodeAddressesCondition(gni *guestnetv1.GuestNodeIdentity, rep nodeReport, namespace string) {
	c := metav1.Condition{Type: guestnetv1.NodeAddressesCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.NodeAddressesSetReason,
		Message: fmt.Sprintf("%d of %d guest Nodes have their VM's pod IP as InternalIP", rep.withPodIP, rep.nodes)}
	names := func(v nodeidentity.Verdict) string { return limitNames(rep.byVerdict[v]) }
	switch {
	case rep.external:
		c.Reason = guestnetv1.NodeAddressesExternalReason
		c.Message = fmt.Sprintf("spec.nodeAddresses is External: guestnet writes no Node (%d of %d have their pod IP as InternalIP)", rep.withPodIP, rep.nodes)
	case rep.failed != nil:
		c.Status, c.Reason = metav1.ConditionFalse, guestnetv1.InternalErrorReason
		c.Message = "Writing guest Nodes failed, retrying: " + rep.failed.Error()
	case len(rep.byVerdict[nodeidentity.KubeletOwned]) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, guestnetv1.KubeletNotExternalReason
		c.Message = fmt.Sprintf("The kubelets of Nodes %s set their own InternalIP (not their VM's pod IP), so they would revert guestnet's: "+
			"run them in external cloud-provider mode: add --enable-cloud-provider to the K0sWorkerConfigTemplate's spec.args "+
			"(--cloud-provider=external for other kubelets); Machines created from then on register for guestnet", names(nodeidentity.KubeletOwned))
	case len(rep.byVerdict[nodeidentity.NoWorkerPod]) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, guestnetv1.WorkerPodNotFoundReason
		c.Message = fmt.Sprintf("No running virt-launcher pod in namespace %s matches Nodes %s (by providerID kubevirt://<name> or Node name, and label %s): "+
			"check `kubectl get pods -n %s -l %s=<name>`; a Node of a VM that is gone waits for CAPI to delete it",
			namespace, names(nodeidentity.NoWorkerPod), virtlauncher.MachineNameLabel, namespace, virtlauncher.MachineNameLabel)
	case len(rep.byVerdict[nodeidentity.Migrating]) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, guestnetv1.WorkerPodNotFoundReason
		c.Message = fmt.Sprintf("Nodes %s have more than one running virt-launcher pod (a live migration): they keep their address until one pod is left", names(nodeidentity.Migrating))
	case rep.nodes == 0:
		c.Status, c.Reason = metav1.ConditionFalse, guestnetv1.NoNodesReason
		c.Message = "The guest has no Node yet"
	case len(rep.byVerdict[nodeidentity.OtherInitializer]) > 0:
		c.Reason = guestnetv1.InitializedElsewhereReason
		c.Message = fmt.Sprintf("Nodes %s were initialized by %s; guestnet leaves them alone (set spec.nodeAddresses: External to leave all Nodes to it)",
			names(nodeidentity.OtherInitializer), strings.Join(rep.writers, ", "))
	}
	conditions.Set(gni, c)
}

// limitNames renders at most 10 names, sorted, and how many more.
func limitNames(names []string) string {
	names = slices.Sorted(slices.Values(names))
	const most = 10
	if len(names) <= most {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:most], ", "), len(names)-most)
}

// agentParams are the agent's objects' parameters for s (remove: the opt-out rollout).
func (r *Reconciler) agentParams(s *scope, remove bool) (nodeagent.Params, bool) {
	ep := s.cluster.Spec.ControlPlaneEndpoint
	if ep.Host == "" || ep.Port == 0 {
		return nodeagent.Params{}, false
	}
	return nodeagent.Params{Image: r.AgentImage, APIServerHost: ep.Host, APIServerPort: ep.Port, Remove: remove}, true
}

// reconcileAgent applies the agent into the guest (remove: with --remove) and reports it.
func (r *Reconciler) reconcileAgent(ctx context.Context, s *scope, remove bool) error {
	gni := s.gni
	if r.AgentImage == "" {
		conditions.Set(gni, metav1.Condition{Type: guestnetv1.NodeAgentCondition, Status: metav1.ConditionFalse,
			Reason: guestnetv1.NodeAgentImageUnknownReason, Message: fmt.Sprintf("guestnet does not know its node agent's image (%v): "+
				"run the manager with --node-agent-image=<the manager's image>, or with POD_NAME and POD_NAMESPACE set from the downward API as the release's Deployment does", r.AgentImageError)})
		return nil
	}
	p, ok := r.agentParams(s, remove)
	if !ok {
		conditions.Set(gni, metav1.Condition{Type: guestnetv1.NodeAgentCondition, Status: metav1.ConditionFalse,
			Reason: guestnetv1.ClusterNotProvisionedReason, Message: "Waiting for the Cluster's spec.controlPlaneEndpoint: the agents reach the guest apiserver there"})
		return nil
	}
	live, err := getAgentDaemonSet(ctx, s.guestClient)
	if err != nil {
		return err
	}
	st, applied, err := nodeagent.Apply(ctx, s.guestClient, live, p)
	if err != nil {
		return err
	}
	if applied {
		record.Written(ctx, r.recorder, gni, record.Write{Type: corev1.EventTypeNormal, Reason: "NodeAgentApplied", Action: "Apply",
			Note: fmt.Sprintf("Applied guestnet's node agent in the guest (%s/%s, image %s, remove=%t)", agentNamespace, agentName, p.Image, remove)})
	}
	log.FromContext(ctx).V(4).Info("Node agent", "applied", applied, "status", st.String(), "rolledOut", st.RolledOut)
	gni.Status.AgentsReady = st.Ready
	setNodeAgentCondition(gni, st, applied, remove)
	return nil
}

// getAgentDaemonSet reads the agent's DaemonSet from the guest cache (nil when there is none).
func getAgentDaemonSet(ctx context.Context, c ctrl.Client) (*appsv1.DaemonSet, error) {
	ds := &appsv1.DaemonSet{}
	if err := c.Get(ctx, guestAgentDaemonSet, ds); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the node agent's DaemonSet in the guest: %w", err)
	}
	return ds, nil
}

// setNodeAgentCondition reports the agent's rollout.
func setNodeAgentCondition(gni *guestnetv1.GuestNodeIdentity, st nodeagent.Status, applied, remove bool) {
	c := metav1.Condition{Type: guestnetv1.NodeAgentCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.NodeAgentReadyReason,
		Message: fmt.Sprintf("guestnet's node agent runs on every guest Node (%s)", st)}
	switch {
	case remove:
		c.Status, c.Reason = metav1.ConditionFalse, guestnetv1.NodeAgentRemovingReason
		c.Message = fmt.Sprintf("Deleting: the agents take the node IP off lo and their nftables table (%s); guestnet then deletes them", st)
	case applied:
		c.Status, c.Reason = metav1.ConditionFalse, guestnetv1.NodeAgentRollingOutReason
		c.Message = fmt.Sprintf("Applied the agent's DaemonSet %s/%s in the guest; waiting for its rollout", agentNamespace, agentName)
	case !st.RolledOut:
		c.Status, c.Reason = metav1.ConditionFalse, guestnetv1.NodeAgentRollingOutReason
		c.Message = fmt.Sprintf("The agent's DaemonSet %s/%s is not rolled out: %s. An agent that stays unready says why in its log "+
			"(`kubectl -n %s logs ds/%s`, in the guest)", agentNamespace, agentName, st, agentNamespace, agentName)
	}
	conditions.Set(gni, c)
}

// reconcileDelete takes the agent out: first a rollout with --remove (each agent takes off
// what it put in its VM's kernel), then its objects, and last the control plane address (the
// guest is reached at it). The Nodes keep their addresses (they are
// right, and the kubelet in external mode does not write them again). A guest that is gone
// has nothing left to take out.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (reconcileresult.Result, error) {
	gni := s.gni
	gone, why, err := clusterscope.GuestGone(ctx, r.APIReader, gni.Namespace, gni.Spec.ClusterName, s.cluster)
	if err != nil {
		return reconcileresult.Result{}, err
	}
	if gone || gni.Annotations[guestnetv1.SkipGuestCleanupAnnotation] == "true" {
		if !gone {
			why = fmt.Sprintf("annotation %s=true", guestnetv1.SkipGuestCleanupAnnotation)
		}
		record.Written(ctx, r.recorder, gni, record.Write{Type: corev1.EventTypeWarning, Reason: guestnetv1.GuestGoneReason, Action: "Release",
			Note: fmt.Sprintf("Gave up on the guest (%s): the node agent and what it put in the VMs' kernels stay there", why)})
		if err := r.withdrawControlPlane(ctx, s, "the GuestNodeIdentity is deleted"); err != nil {
			return reconcileresult.Result{}, err
		}
		controllerutil.RemoveFinalizer(gni, guestnetv1.GuestNodeIdentityFinalizer)
		return reconcileresult.Result{}, nil
	}
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, gni, s.cluster)
	if err != nil || guestClient == nil {
		status.SetDeletingCondition(gni, "Waiting for the guest apiserver to take the node agent out (see ClusterAvailable); annotate with "+
			guestnetv1.SkipGuestCleanupAnnotation+"=true to give up")
		return reconcileresult.Result{}, err
	}
	s.guestClient = guestClient
	if err := r.watchGuest(ctx, s); err != nil {
		return reconcileresult.Result{}, err
	}
	live, err := getAgentDaemonSet(ctx, guestClient)
	if err != nil {
		return reconcileresult.Result{}, err
	}
	if live != nil && live.DeletionTimestamp == nil {
		if err := r.reconcileAgent(ctx, s, true); err != nil {
			return reconcileresult.Result{}, err
		}
		p, _ := r.agentParams(s, true)
		if live.Annotations[nodeagent.TemplateHashAnnotation] != nodeagent.TemplateHash(p) || !nodeagent.DaemonSetStatus(live).RolledOut {
			return reconcileresult.Result{}, nil // the DaemonSet watch brings it back
		}
	}
	removed, err := nodeagent.Delete(ctx, guestClient)
	if err != nil {
		return reconcileresult.Result{}, err
	}
	if !removed {
		return reconcileresult.Result{RequeueAfter: deletePoll}, nil
	}
	record.Written(ctx, r.recorder, gni, record.Write{Type: corev1.EventTypeNormal, Reason: "NodeAgentDeleted", Action: "Delete",
		Note: "The node agents took the node IP off lo and their nftables table in every VM; their objects are deleted from the guest"})
	// Last: the agents were reached through the control plane address.
	if err := r.withdrawControlPlane(ctx, s, "the GuestNodeIdentity is deleted"); err != nil {
		return reconcileresult.Result{}, err
	}
	controllerutil.RemoveFinalizer(gni, guestnetv1.GuestNodeIdentityFinalizer)
	return reconcileresult.Result{}, nil
}

// deletePoll is how soon a deletion looks again for the agent's objects to be gone (the
// namespace's deletion is not watched).
const deletePoll = 2 * time.Second
