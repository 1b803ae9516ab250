package guestwebhookbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/klog/v2"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ssa"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
)

// readyConditions are the conditions Ready summarises. Those the controller does not report
// yet count as Unknown, so Ready cannot claim a bridge that does not exist.
var readyConditions = []string{
	guestnetv1.ClusterAvailableCondition,
	guestnetv1.TargetsBridgedCondition,
	guestnetv1.TargetsReachableCondition,
	guestnetv1.PortsDeclaredCondition,
}

// bridgeConditions describe the targets; they go with the Cluster.
var bridgeConditions = []string{
	guestnetv1.TargetsBridgedCondition,
	guestnetv1.TargetsReachableCondition,
	guestnetv1.PortsDeclaredCondition,
}

// ownedConditions are all conditions this controller writes; the patch helper lets its
// values win over concurrent writers.
var ownedConditions = append([]string{guestnetv1.ReadyCondition, guestnetv1.PausedCondition}, readyConditions...)

// Event reasons of the changes guestnet makes (condition changes have their own events).
const (
	eventBridged       = "Bridged"
	eventRepaired      = "Repaired"
	eventRestored      = "Restored"
	eventForgot        = "LeftToUser"
	eventApplied       = "Applied"
	eventDeleted       = "Deleted"
	eventWarning       = "TargetWarning"
	eventRecorded      = "Recorded"
	eventCleanupSkiped = "GuestCleanupSkipped"

	actionRewrite = "Rewrite"
	actionApply   = "Apply"
	actionDelete  = "Delete"
	actionRecord  = "Record"
	actionRelease = "Release"

	guestWatcher = controllerName + "-guest"
)

// recheckAfter is the safety interval of what guestnet cannot watch: a bridged target's
// certificate and server (a server restarts with another certificate), the konnectivity
// agents. Within it, probes and reads are repeated only when their inputs
// change (memo).
const recheckAfter = 5 * time.Minute

// reconcileNormal bridges the selected targets once the guest cluster is reachable, and
// reports each of them. While the guest apiserver cannot be reached, nothing is changed:
// the host Services stay as they are.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	gwb := s.bridge
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, gwb, s.cluster)
	if s.cluster == nil {
		// The Cluster is gone (or never existed), and its guest with it. Remove the host
		// Services; the records stay (status.records), for a Cluster of that name coming back.
		for _, c := range bridgeConditions {
			conditions.Delete(gwb, c)
		}
		gwb.Status.Targets, gwb.Status.BridgedTargets, gwb.Status.TotalTargets = nil, 0, 0
		return ctrl.Result{}, kerrors.NewAggregate([]error{err, r.deleteHostServices(ctx, s, nil, r.Client)})
	}
	if err == nil && guestClient == nil && conditions.GetReason(gwb, guestnetv1.ClusterAvailableCondition) == guestnetv1.GuestTooLargeReason {
		// Too large to cache (internal/guestbounds): no event says that it shrank, count again.
		return ctrl.Result{RequeueAfter: guestbounds.DefaultCheckEvery}, nil
	}
	if err != nil || guestClient == nil {
		// Not reachable yet: the Cluster watch or the ClusterCache connect event brings us back.
		return ctrl.Result{}, err
	}
	s.guestClient = guestClient
	if err := r.watchGuest(ctx, s); err != nil {
		return ctrl.Result{}, err
	}

	// The workerports controller declares the ports; this object reports whether its own are.
	// cilium-config comes from the guest's cache (its change reaches the bridge through the
	// rollout the workerports controller starts: the MachineDeployment watch).
	if err := ports.ReportPortsDeclared(ctx, r.Client, guestClient, s.cluster, gwb, ports.ForBridge(gwb)); err != nil {
		return ctrl.Result{}, err
	}

	plan, err := r.makePlan(ctx, s)
	if err != nil || plan == nil {
		return ctrl.Result{}, err
	}
	if err := r.reconcileHostServices(ctx, s, plan); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.reconcileGuestServices(ctx, s, plan); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.reconcileTargets(ctx, s, plan); err != nil {
		return ctrl.Result{}, err
	}
	// Services go only after the targets that used them are restored: a guest object that
	// carries a record always has its host Service (reconcileDelete relies on it). While a
	// target points at the bridge without a readable record, none goes: which it uses is
	// unknown.
	if !plan.KeepServices {
		if err := r.deleteGuestServices(ctx, s, s.keepGuest, s.guestClient); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.deleteHostServices(ctx, s, s.keepHost, r.Client); err != nil {
			return ctrl.Result{}, err
		}
	}
	next := r.probe(ctx, s, plan)
	if s.reliesOnEgress {
		// Webhooks left alone on the guest's own egress: look again soon (egressChecks).
		next = min(next, egressRecheckAfter)
	}

	r.recordWarnings(gwb, plan)
	gwb.Status.Targets = bridge.TargetStatuses(plan)
	gwb.Status.BridgedTargets, gwb.Status.TotalTargets = bridge.Counts(plan)
	bridge.SetTargetsBridgedCondition(gwb, plan)
	bridge.SetTargetsReachableCondition(gwb, plan)
	// Everything else that can change comes with an event (guest and host watches); what
	// cannot be watched is checked again when its safety interval ends.
	return ctrl.Result{RequeueAfter: next}, nil
}

// watchGuest makes the guest's APIService, webhook configuration and Service events reach
// the bridges of the cluster whose plan they can change (bridge.TargetMatters,
// bridge.ServiceMatters) through the ClusterCache's per-cluster cache: a Helm or GitOps
// revert, a new target or a chart's reinstalled Service is noticed at once, without the
// guest's other bridges replanning first. The ClusterCache adds each watch once per
// connection.
func (r *Reconciler) watchGuest(ctx context.Context, s *scope) error {
	if r.controller == nil {
		return nil // unit tests drive the phases without a controller
	}
	key := client.ObjectKeyFromObject(s.cluster)
	// Only the bridges whose plan the object can change.
	targetToBridges := handler.EnqueueRequestsFromMapFunc(r.guestTargetToBridges(key))
	for kind, toBridges := range map[client.Object]handler.EventHandler{
		&apiregistrationv1.APIService{}:                           targetToBridges,
		&admissionregistrationv1.ValidatingWebhookConfiguration{}: targetToBridges,
		&admissionregistrationv1.MutatingWebhookConfiguration{}:   targetToBridges,
		&corev1.Service{}: handler.EnqueueRequestsFromMapFunc(r.guestServiceToBridges(key)),
	} {
		err := r.ClusterCache.Watch(ctx, key, clustercache.NewWatcher(clustercache.WatcherOptions{
			Name:         fmt.Sprintf("%s-%T", guestWatcher, kind),
			Watcher:      r.controller,
			Kind:         kind,
			EventHandler: toBridges,
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

// makePlan reads the guest and plans the bridge. A nil plan without error: the spec cannot
// be used, and the conditions say so. The guest Services the plan looked up are kept for the
// guest Service events (guestServiceToBridges).
func (r *Reconciler) makePlan(ctx context.Context, s *scope) (*bridge.Plan, error) {
	plan, err := r.planGuest(ctx, s)
	var keys sets.Set[string]
	if plan != nil {
		keys = plan.GuestServiceKeys()
	}
	r.memo().setServiceKeys(s.bridge.UID, keys)
	return plan, err
}

// planGuest is makePlan without the keeping.
func (r *Reconciler) planGuest(ctx context.Context, s *scope) (*bridge.Plan, error) {
	obs, services, err := observeGuest(ctx, s.guestClient)
	if err != nil {
		return nil, err
	}
	s.observed = obs
	me := ownership.BridgeID(s.bridge)
	host := bridge.ReadHostRecords(me, s.bridge.Status.Records)
	targets, err := bridge.Select(&s.bridge.Spec, obs, host)
	if err != nil {
		setInvalidSpec(s.bridge, err)
		return nil, nil
	}
	in, err := r.planInput(ctx, s, obs, services, host, r.Client)
	if err != nil {
		return nil, err
	}
	in.Targets = targets
	if s.bridge.Spec.Mode != guestnetv1.BridgeModeAlways && needsReachability(targets) {
		agents, err := r.konnectivityAgents(ctx, s)
		if err != nil {
			return nil, err
		}
		in.Reach = bridge.GuestReachesServices(agents, obs.APIServices, nil)
		if in.Reach.Reaches {
			// Ready agent Pods are no proof: ask the guest apiserver to reach the Services.
			in.Reach = bridge.GuestReachesServices(agents, obs.APIServices, r.egressChecks(ctx, s, targets))
		}
		s.reliesOnEgress = in.Reach.Reaches
	}
	plan := bridge.MakePlan(in)
	logWithheld(ctx, s.bridge, plan)
	return plan, nil
}

// logWithheld logs at the default level what the status of a target leaves out because it
// is not the tenant's to read (another namespace's bridge: bridge.TargetPlan.Withheld), when
// the target's message changes: the admin's side of it.
func logWithheld(ctx context.Context, gwb *guestnetv1.GuestWebhookBridge, plan *bridge.Plan) {
	for i := range plan.Targets {
		tp := &plan.Targets[i]
		if tp.Withheld == "" || slices.ContainsFunc(gwb.Status.Targets, func(st guestnetv1.TargetStatus) bool {
			return st.Kind == tp.Kind && st.Name == tp.Name && st.Webhook == tp.Webhook && st.Message == tp.Message
		}) {
			continue
		}
		ctrl.LoggerFrom(ctx).Info("Not in the GuestWebhookBridge's status (not the tenant's to read): "+tp.Withheld, "reason", tp.Reason)
	}
}

// planInput is the input of a plan but the selection: every target of the guest, the host
// copy of the records, the bridges that records of other bridges name and that exist, and
// the bridge's host Services (listed through hostReader).
func (r *Reconciler) planInput(ctx context.Context, s *scope, obs bridge.Observed, services []corev1.Service, host bridge.HostRecords, hostReader client.Reader) (bridge.Input, error) {
	in := bridge.Input{Bridge: s.bridge, All: bridge.AllTargets(obs), Host: host, GuestServices: services,
		Claimants: map[string]bool{}, HostServices: map[string]bool{}}
	me := ownership.BridgeID(s.bridge)
	var others []string
	for _, t := range in.All {
		if t.Record != nil && t.Record.Bridge != me {
			others = append(others, t.Record.Bridge)
		}
	}
	for i := range services {
		if id, ok := services[i].Annotations[ownership.BridgeAnnotation]; ok && id != me &&
			services[i].Labels[ownership.ManagedByLabel] == ownership.ManagedByValue {
			others = append(others, id)
		}
	}
	liveReads := 0
	for _, id := range others {
		if _, known := in.Claimants[id]; known {
			continue
		}
		if liveReads >= maxClaimantReads {
			// The guest names more bridges than the cache knows: each costs a host read per
			// reconcile, and the guest chooses them. Past the budget, a bridge counts as
			// existing, which takes over nothing and deletes nothing.
			in.Claimants[id] = true
			continue
		}
		exists, live, err := r.bridgeExists(ctx, id)
		if err != nil {
			return in, err
		}
		if live {
			liveReads++
		}
		in.Claimants[id] = exists
	}
	list, err := r.listHostServices(ctx, s, hostReader)
	if err != nil {
		return in, err
	}
	for _, svc := range list {
		in.HostServices[svc.Name] = true
	}
	return in, nil
}

// bridgeExists reports whether the GuestWebhookBridge id ("<namespace>/<name>") exists: from
// the cache, and from the apiserver before saying no (a bridge the cache has not seen yet
// must not lose its targets).
//
// live says whether it asked the apiserver. The IDs come from the guest: planInput reads at
// most maxClaimantReads of them live per reconcile.
func (r *Reconciler) bridgeExists(ctx context.Context, id string) (exists, live bool, err error) {
	ns, name, ok := strings.Cut(id, "/")
	if !ok {
		return false, false, nil // not a bridge's name: a record nobody can claim
	}
	key := client.ObjectKey{Namespace: ns, Name: name}
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(guestnetv1.GroupVersion.WithKind("GuestWebhookBridge"))
	if err := r.Client.Get(ctx, key, &guestnetv1.GuestWebhookBridge{}); err == nil {
		return true, false, nil
	}
	switch err := r.APIReader.Get(ctx, key, obj); {
	case err == nil:
		return true, true, nil
	case apierrors.IsNotFound(err):
		return false, true, nil
	default:
		return false, true, fmt.Errorf("reading GuestWebhookBridge %s, named by a record in the guest: %w", id, err)
	}
}

// maxClaimantReads is how many bridges a guest names that the cache does not hold are looked
// up in the host apiserver per reconcile.
const maxClaimantReads = 8

// setInvalidSpec reports a spec that passed admission but cannot be used.
func setInvalidSpec(gwb *guestnetv1.GuestWebhookBridge, err error) {
	conditions.Set(gwb, metav1.Condition{
		Type: guestnetv1.TargetsBridgedCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.InvalidSpecReason,
		Message: bridge.Truncate(fmt.Sprintf("The spec cannot be used: %v; fix it (guestnet changes nothing until then)", err), 1024),
	})
	conditions.Delete(gwb, guestnetv1.TargetsReachableCondition)
}

// observeGuest lists what targets are selected from, and every guest Service. From the guest
// cache they are the cache's own objects, not copies (client.UnsafeDisableDeepCopy): every
// reconcile lists every guest Service, and copying them cost more than the rest of the
// reconcile (docs/performance.md). Nothing may change them: bridge.Apply works on a copy.
func observeGuest(ctx context.Context, guest client.Reader) (bridge.Observed, []corev1.Service, error) {
	apiServices := &apiregistrationv1.APIServiceList{}
	validating := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	mutating := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	services := &corev1.ServiceList{}
	for _, list := range []client.ObjectList{apiServices, validating, mutating, services} {
		if err := guest.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return bridge.Observed{}, nil, fmt.Errorf("listing %T in the guest: %w", list, err)
		}
	}
	return bridge.Observed{APIServices: apiServices.Items, ValidatingWebhooks: validating.Items, MutatingWebhooks: mutating.Items},
		services.Items, nil
}

// needsReachability reports whether mode Auto has a target to decide on: one that references
// a Service and that guestnet has not rewritten (a webhook needs the evidence, an APIService
// whether the guest runs konnectivity).
func needsReachability(targets []bridge.Target) bool {
	for _, t := range targets {
		if t.Service != nil && t.Record == nil {
			return true
		}
	}
	return false
}

// egressRecheckAfter is how long the evidence that the guest apiserver reaches guest Services
// (the agents, the egress checks) is kept while webhooks are left alone on it: agents that
// stop change nothing guestnet watches, and until the evidence is read again the webhooks
// left alone fail.
const egressRecheckAfter = 30 * time.Second

// egressChecks asks the guest apiserver to reach the Service of every webhook mode Auto has
// to decide on (a GET through its service proxy, which dials through the `cluster` egress,
// as a webhook call does), at most once per egressRecheckAfter per Service.
func (r *Reconciler) egressChecks(ctx context.Context, s *scope, targets []bridge.Target) []bridge.EgressCheck {
	key := client.ObjectKeyFromObject(s.cluster)
	refs := bridge.EgressRefs(targets)
	checks := make([]bridge.EgressCheck, 0, len(refs))
	for _, ref := range refs {
		v, _ := r.memo().readFor("egress/"+key.String()+"/"+ref.String(), egressRecheckAfter, func() (any, error) {
			cfg, err := r.ClusterCache.GetRESTConfig(ctx, key)
			if err != nil {
				return bridge.CheckEgress(ref, 0, nil, err), nil
			}
			return bridge.ProbeEgress(ctx, cfg, ref), nil
		})
		checks = append(checks, v.(bridge.EgressCheck))
	}
	return checks
}

// konnectivityAgents lists the guest's konnectivity agent pods, uncached (guestnet never
// caches the guest's Pods), at most once per egressRecheckAfter per cluster.
func (r *Reconciler) konnectivityAgents(ctx context.Context, s *scope) ([]corev1.Pod, error) {
	key := client.ObjectKeyFromObject(s.cluster)
	v, err := r.memo().readFor("konnectivity-agents/"+key.String(), egressRecheckAfter, func() (any, error) {
		c, err := r.ClusterCache.GetUncachedClient(ctx, key)
		if err != nil {
			return nil, err
		}
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace(bridge.KonnectivityNamespace),
			client.MatchingLabels{bridge.KonnectivityAgentLabel: bridge.KonnectivityAgentValue}); err != nil {
			return nil, fmt.Errorf("listing konnectivity agents in the guest: %w", err)
		}
		return pods.Items, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]corev1.Pod), nil
}

// --- host side ----------------------------------------------------------------------------

// reconcileHostServices applies the host Service of every backend in use, and notes them in
// s.keepHost (the others are deleted once the targets are restored). A Service of the same name that is not
// the bridge's is left alone, and its backend's targets are not bridged.
func (r *Reconciler) reconcileHostServices(ctx context.Context, s *scope, plan *bridge.Plan) error {
	gwb := s.bridge
	s.hostServices = map[string]*corev1.Service{}
	keep := map[string]bool{}
	for _, b := range plan.Backends {
		if !plan.Used(b) {
			continue
		}
		keep[b.HostService] = true
		key := client.ObjectKey{Namespace: bridge.HostNamespace(gwb), Name: b.HostService}
		live, err := r.getHostService(ctx, key)
		if err != nil {
			return err
		}
		if live != nil && !ownership.IsBridgeObject(live, gwb) {
			plan.Block(b, guestnetv1.HostObjectConflictReason, fmt.Sprintf(
				"host Service %s exists and is not this bridge's; guestnet leaves it alone: rename or delete it", key))
			continue
		}
		svc, applied, err := ssa.EnsureService(ctx, r.Client, bridge.HostService(gwb, b), live)
		if err != nil {
			return err
		}
		if applied {
			r.recordWrite(ctx, gwb, svc, corev1.EventTypeNormal, eventApplied, actionApply,
				fmt.Sprintf("Applied host Service %s for guest Service %s (targetPort = guest nodePort)", key, b.Key()),
				repairKind(gwb, b.HostService, metrics.RepairBridgeHostService))
		}
		s.hostServices[b.HostService] = svc
	}
	s.keepHost = keep
	return nil
}

// getHostService reads a host Service: from the cache when it is guestnet's (the cache holds
// only those), else from the apiserver, to find a Service of someone else's in the way.
func (r *Reconciler) getHostService(ctx context.Context, key client.ObjectKey) (*corev1.Service, error) {
	svc := &corev1.Service{}
	err := r.Client.Get(ctx, key, svc)
	if apierrors.IsNotFound(err) && r.APIReader != nil {
		err = r.APIReader.Get(ctx, key, svc)
	}
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading host Service %s: %w", key, err)
	}
	return svc, nil
}

// listHostServices lists the bridge's host Services through reader (the cache, or the
// apiserver when deleting: a Service created just before must not be missed).
func (r *Reconciler) listHostServices(ctx context.Context, s *scope, reader client.Reader) ([]corev1.Service, error) {
	list := &corev1.ServiceList{}
	if err := reader.List(ctx, list, client.InNamespace(bridge.HostNamespace(s.bridge)), client.MatchingLabels(ownership.SelectBridge(s.bridge))); err != nil {
		return nil, fmt.Errorf("listing the bridge's host Services: %w", err)
	}
	return slices.DeleteFunc(list.Items, func(svc corev1.Service) bool { return !ownership.IsBridgeObject(&svc, s.bridge) }), nil
}

// deleteHostServices deletes the bridge's host Services (listed through reader) whose names
// keep lacks.
func (r *Reconciler) deleteHostServices(ctx context.Context, s *scope, keep map[string]bool, reader client.Reader) error {
	list, err := r.listHostServices(ctx, s, reader)
	if err != nil {
		return err
	}
	var errs []error
	for i := range list {
		svc := &list[i]
		if keep[svc.Name] {
			continue
		}
		if err := r.Client.Delete(ctx, svc); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
			continue
		}
		r.recordWrite(ctx, s.bridge, svc, corev1.EventTypeNormal, eventDeleted, actionDelete, fmt.Sprintf("Deleted host Service %s/%s", svc.Namespace, svc.Name), "")
	}
	return kerrors.NewAggregate(errs)
}

// --- guest side ---------------------------------------------------------------------------

// reconcileGuestServices applies the NodePort (and, for APIServices, ExternalName) Service of
// every backend in use, and notes them in s.keepGuest.
func (r *Reconciler) reconcileGuestServices(ctx context.Context, s *scope, plan *bridge.Plan) error {
	gwb := s.bridge
	keep := map[string]bool{}
	for _, b := range plan.Backends {
		if !plan.Used(b) || s.hostServices[b.HostService] == nil {
			continue
		}
		desired := []*corev1ac.ServiceApplyConfiguration{bridge.GuestNodePortService(gwb, b)}
		if b.APIService {
			desired = append(desired, bridge.GuestExternalNameService(gwb, b))
		}
		for _, d := range desired {
			key := client.ObjectKey{Namespace: *d.Namespace, Name: *d.Name}
			keep[key.String()] = true
			live := &corev1.Service{}
			if err := s.guestClient.Get(ctx, key, live); apierrors.IsNotFound(err) {
				live = nil
			} else if err != nil {
				return fmt.Errorf("reading Service %s in the guest: %w", key, err)
			}
			svc, applied, err := ssa.EnsureService(ctx, s.guestClient, d, live)
			switch {
			case ssa.IsNodePortAllocated(err):
				// Another Service took the nodePort since the plan was made: the next
				// reconcile (its event) picks another one.
				plan.Block(b, guestnetv1.NodePortConflictReason, "the guest refused the nodePort: "+ssa.APIErrorMessage(err)+"; guestnet picks another one")
				continue
			case apierrors.IsInvalid(err):
				plan.Block(b, guestnetv1.TargetNotBridgeableReason, fmt.Sprintf("the guest refused Service %s: %s; "+
					"check spec.nodePortRange against the guest apiserver's --service-node-port-range", key, ssa.APIErrorMessage(err)))
				continue
			case err != nil:
				return err
			case applied:
				r.recordWrite(ctx, gwb, svc, corev1.EventTypeNormal, eventApplied, actionApply, fmt.Sprintf("Applied Service %s in the guest", key),
					repairKind(gwb, b.HostService, metrics.RepairBridgeGuestService))
			}
		}
	}
	s.keepGuest = keep
	return nil
}

// deleteGuestServices deletes the bridge's guest Services ("<namespace>/<name>") keep lacks,
// listed and deleted through guest.
func (r *Reconciler) deleteGuestServices(ctx context.Context, s *scope, keep map[string]bool, guest client.Client) error {
	list := &corev1.ServiceList{}
	if err := guest.List(ctx, list, client.MatchingLabels(ownership.SelectBridge(s.bridge))); err != nil {
		return fmt.Errorf("listing the bridge's Services in the guest: %w", err)
	}
	var errs []error
	for i := range list.Items {
		svc := &list.Items[i]
		if keep[client.ObjectKeyFromObject(svc).String()] || !ownership.IsBridgeObject(svc, s.bridge) {
			continue
		}
		if err := guest.Delete(ctx, svc); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("deleting Service %s/%s in the guest: %w", svc.Namespace, svc.Name, err))
			continue
		}
		r.recordWrite(ctx, s.bridge, svc, corev1.EventTypeNormal, eventDeleted, actionDelete, fmt.Sprintf("Deleted Service %s/%s in the guest", svc.Namespace, svc.Name), "")
	}
	return kerrors.NewAggregate(errs)
}

// reconcileTargets writes what the plan asks of the guest's APIServices and webhook
// configurations (rewrites, forgets, restores), each object once, and keeps the host copy of
// the records in step: the records of targets about to be rewritten are stored in
// status.records before the guest objects are written, and the records of restored targets
// are removed only after the restores landed. A crash between any two writes leaves every
// original in at least one copy.
func (r *Reconciler) reconcileTargets(ctx context.Context, s *scope, plan *bridge.Plan) error {
	return r.writeTargets(ctx, s, plan, s.observed, s.guestClient)
}

func (r *Reconciler) writeTargets(ctx context.Context, s *scope, plan *bridge.Plan, obs bridge.Observed, guest client.Client) error {
	pending := plan.PendingHostRecords()
	if plan.HostRecordsChanged(pending) {
		if err := r.writeHostRecords(ctx, s, pending); err != nil {
			return err
		}
	}
	if err := r.writeGuestObjects(ctx, s, plan, obs, guest); err != nil {
		return err
	}
	if final := plan.HostRecords(); !bridge.SameHostRecords(pending, final) {
		return r.writeHostRecords(ctx, s, final)
	}
	return nil
}

// writeHostRecords stores entries as the bridge's status.records, in a patch of that field
// alone, and lets the deferred patch of the reconcile know (it would write them again).
func (r *Reconciler) writeHostRecords(ctx context.Context, s *scope, entries map[string]guestnetv1.BridgeRecord) error {
	records := bridge.HostRecordsStatus(entries)
	body, err := json.Marshal(map[string]any{"status": map[string]any{"records": records}})
	if err != nil {
		return err
	}
	obj := s.bridge.DeepCopy()
	if err := r.Client.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("storing the records in status.records: %w", err)
	}
	s.bridge.Status.Records = records
	if err := s.recordsStored(records, r.Client); err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).Info(fmt.Sprintf("Stored %d records in status.records", len(records)), "reason", eventRecorded)
	return nil
}

func describeRewrite(tp *bridge.TargetPlan) string {
	if tp.IsWebhook() {
		return fmt.Sprintf("clientConfig.url %s (was service %s), guest nodePort %d", tp.URL, tp.Service, tp.Backend.NodePort(tp.Port))
	}
	return fmt.Sprintf("service %s/%s (ExternalName for host Service %s; was %s), guest nodePort %d",
		tp.APIServiceRef.Namespace, tp.APIServiceRef.Name, tp.Backend.HostService, tp.Service, tp.Backend.NodePort(tp.Port))
}

// probe calls every target that goes through the bridge as the guest apiserver will: at
// its host Service, verifying the certificate for the name it dials. A target whose probe
// inputs (bridge.ProbeInputs) did not change since its last probe keeps that answer until
// recheckAfter (a failure, with backoff, from firstRetryAfter); the others are probed, in
// parallel. It returns when the next answer expires.
func (r *Reconciler) probe(ctx context.Context, s *scope, plan *bridge.Plan) time.Duration {
	m := r.memo()
	uid := s.bridge.UID
	next := recheckAfter
	keep := map[string]bool{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range plan.Targets {
		tp := &plan.Targets[i]
		// Targets rewritten in this reconcile were written (reconcileTargets returned no error).
		if !tp.ViaBridge() || tp.Reason != "" {
			continue
		}
		svc := s.hostServices[tp.Backend.HostService]
		if svc == nil || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		addr := net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(tp.Port)))
		insecure := !tp.IsWebhook() && tp.InsecureSkipTLSVerify
		endpoints, err := r.readyEndpoints(ctx, svc, tp.Port)
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Reading the endpoints of a host Service; probing anyway", "Service", klog.KObj(svc))
		}
		inputs := bridge.ProbeInputs{Addr: addr, ServerName: tp.TLSServerName, CABundle: tp.CABundle, Insecure: insecure,
			Endpoints: endpoints, Recheck: s.bridge.Annotations[guestnetv1.RecheckAnnotation]}.Key()
		keep[tp.Key()] = true
		if result, left, ok := m.probe(uid, tp.Key(), inputs); ok {
			tp.SetProbe(result, s.bridge, addr)
			next = min(next, max(time.Second, left))
			continue
		}
		wg.Go(func() {
			fresh := r.prober()(ctx, addr, tp.TLSServerName, tp.CABundle, insecure)
			if ctx.Err() != nil {
				return // cancelled: not an answer
			}
			result, kept := m.storeProbe(uid, tp.Key(), inputs, fresh)
			if fresh.Detail != result.Detail {
				ctrl.LoggerFrom(ctx).V(1).Info("Target still unanswered; its status keeps the first failure", "target", tp.Key(), "failure", fresh.Detail)
			}
			mu.Lock()
			tp.SetProbe(result, s.bridge, addr)
			next = min(next, kept)
			mu.Unlock()
		})
	}
	wg.Wait()
	m.keepProbes(uid, keep)
	return next
}

// readyEndpoints are the ready endpoints of a host Service's port ("<address>:<port>"), from
// the cache: an input of its probes.
func (r *Reconciler) readyEndpoints(ctx context.Context, svc *corev1.Service, port int32) ([]string, error) {
	list := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, list, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return nil, err
	}
	portName := ""
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			portName = p.Name
		}
	}
	var out []string
	for _, slice := range list.Items {
		for _, ep := range slice.Endpoints {
			if !ptr.Deref(ep.Conditions.Ready, false) {
				continue
			}
			for _, p := range slice.Ports {
				if ptr.Deref(p.Name, "") == portName {
					for _, a := range ep.Addresses {
						out = append(out, net.JoinHostPort(a, strconv.Itoa(int(ptr.Deref(p.Port, 0)))))
					}
				}
			}
		}
	}
	return out, nil
}

func (r *Reconciler) prober() func(ctx context.Context, addr, serverName string, caBundle []byte, insecure bool) bridge.ProbeResult {
	if r.Probe != nil {
		return r.Probe
	}
	return bridge.Probe
}

// recordWarnings emits a Warning event per guest object for the target warnings that status
// did not carry yet.
func (r *Reconciler) recordWarnings(gwb *guestnetv1.GuestWebhookBridge, plan *bridge.Plan) {
	before := map[string]string{}
	for _, t := range gwb.Status.Targets {
		before[string(t.Kind)+"/"+t.Name+"/"+t.Webhook] = t.Message
	}
	var objects []string
	byObject := map[string][]string{}
	related := map[string]client.Object{}
	for _, tp := range plan.Targets {
		old := before[string(tp.Kind)+"/"+tp.Name+"/"+tp.Webhook]
		for _, w := range tp.Warnings {
			if strings.Contains(old, w) {
				continue
			}
			key := string(tp.Kind) + "/" + tp.Name
			if _, ok := byObject[key]; !ok {
				objects = append(objects, key)
				related[key] = targetObject(tp.Target)
			}
			byObject[key] = append(byObject[key], fmt.Sprintf("%s: %s", tp.Target, w))
		}
	}
	for _, key := range objects {
		r.recorder.Eventf(gwb, related[key], corev1.EventTypeWarning, eventWarning, actionRewrite, "%s", bridge.Truncate(strings.Join(byObject[key], "; "), maxEventNote))
	}
}

// --- deletion -----------------------------------------------------------------------------

// reconcileDelete restores every target this bridge rewrote, deletes its guest and host
// Services, then releases the object. It reads the guest and its own records from the
// apiservers, not from caches that may lag the last write. While the guest apiserver cannot
// be reached the finalizer stays (the originals are still in the guest, to be put back),
// until the guest is gone for good (its Cluster or <cluster>-kubeconfig Secret deleted) or an
// admin gives up on it (SkipGuestCleanupAnnotation): then the host side is cleaned, the
// finalizer goes, and an event lists what was left in the guest.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	gwb := s.bridge
	if gwb.Annotations[guestnetv1.SkipGuestCleanupAnnotation] == "true" {
		return r.giveUp(ctx, s, eventCleanupSkiped, fmt.Sprintf("annotation %s=true", guestnetv1.SkipGuestCleanupAnnotation))
	}
	gone, why, err := clusterscope.GuestGone(ctx, r.APIReader, gwb.Namespace, gwb.Spec.ClusterName, s.cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	if gone {
		return r.giveUp(ctx, s, guestnetv1.GuestGoneReason, why)
	}
	live, err := r.liveRecords(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, gwb, s.cluster)
	var uncached client.Client
	if err == nil && guestClient != nil {
		uncached, err = r.ClusterCache.GetUncachedClient(ctx, client.ObjectKeyFromObject(s.cluster))
	}
	if err != nil || uncached == nil {
		hostServices, listErr := r.listHostServices(ctx, s, r.APIReader)
		if listErr != nil {
			return ctrl.Result{}, listErr
		}
		if live.Len() == 0 && len(hostServices) == 0 {
			// Never rewrote anything (a target is rewritten only after its record is stored
			// and its host Service exists): nothing to restore.
			return r.release(ctx, s)
		}
		conditions.Set(gwb, metav1.Condition{
			Type: guestnetv1.TargetsBridgedCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.DeletingReason,
			Message: fmt.Sprintf("Waiting for the guest apiserver to restore %d rewritten targets (see ClusterAvailable). "+
				"guestnet gives up by itself once the Cluster or its %s-kubeconfig Secret is deleted; to give up now, "+
				"annotate the bridge with %s=true (the targets then keep the bridge's url and record, see the runbook)",
				live.Len(), gwb.Spec.ClusterName, guestnetv1.SkipGuestCleanupAnnotation),
		})
		// The ClusterCache's connect event, the Cluster and the Secret bring it back; the
		// error, if any, is retried with backoff.
		return ctrl.Result{}, err
	}
	s.guestClient = uncached
	obs, services, err := observeGuest(ctx, uncached)
	if err != nil {
		return ctrl.Result{}, err
	}
	in, err := r.planInput(ctx, s, obs, services, live, r.APIReader)
	if err != nil {
		return ctrl.Result{}, err
	}
	plan := bridge.PlanDeletion(in)
	if err := r.writeTargets(ctx, s, plan, obs, uncached); err != nil {
		return ctrl.Result{}, err
	}
	if stuck := unrestorable(plan); len(stuck) > 0 {
		// Nothing to put back for them: the admin decides (fix the record, or give up).
		conditions.Set(gwb, metav1.Condition{
			Type: guestnetv1.TargetsBridgedCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.RecordUnreadableReason,
			Message: bridge.Truncate(fmt.Sprintf("Deleting: %d targets cannot be restored: %s. Put their original service back and remove "+
				"the annotation %s, or annotate the bridge with %s=true to leave them as they are",
				len(stuck), strings.Join(stuck, "; "), guestnetv1.BridgeOriginalAnnotation, guestnetv1.SkipGuestCleanupAnnotation), 4096),
		})
		return ctrl.Result{}, nil
	}
	if err := r.deleteGuestServices(ctx, s, nil, uncached); err != nil {
		return ctrl.Result{}, err
	}
	return r.release(ctx, s)
}

// liveRecords reads the bridge's host copy of its records from the apiserver: the cache may
// not hold the records stored by the last reconcile yet.
func (r *Reconciler) liveRecords(ctx context.Context, s *scope) (bridge.HostRecords, error) {
	live := &guestnetv1.GuestWebhookBridge{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.bridge), live); err != nil {
		return bridge.HostRecords{}, fmt.Errorf("reading the bridge's records: %w", err)
	}
	s.bridge.Status.Records = live.Status.Records
	if err := s.recordsStored(live.Status.Records, r.Client); err != nil {
		return bridge.HostRecords{}, err
	}
	return bridge.ReadHostRecords(ownership.BridgeID(s.bridge), live.Status.Records), nil
}

func unrestorable(p *bridge.Plan) []string {
	var out []string
	for _, tp := range p.Restores {
		if tp.Reason != "" {
			out = append(out, fmt.Sprintf("%s: %s", tp.Target, bridge.Truncate(tp.Message, 300)))
		}
	}
	return out
}

// giveUp cleans the host side and releases the bridge without restoring the guest (gone for
// good, or given up on), recording what it leaves there, from the host copy of the records.
func (r *Reconciler) giveUp(ctx context.Context, s *scope, reason, why string) (ctrl.Result, error) {
	live, err := r.liveRecords(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	var left []string
	for _, key := range live.Keys() {
		e, _ := live.Entry(key)
		left = append(left, bridge.DescribeRecord(e))
	}
	note := fmt.Sprintf("Gave up on the guest (%s): guestnet had rewritten nothing there", why)
	if len(left) > 0 {
		note = fmt.Sprintf("Gave up on the guest (%s): %d targets keep the bridge's rewrite and record there: %s", why, len(left), strings.Join(left, "; "))
	}
	eventType := corev1.EventTypeWarning
	if len(left) == 0 {
		eventType = corev1.EventTypeNormal
	}
	r.recordWrite(ctx, s.bridge, nil, eventType, reason, actionRelease, note, "")
	return r.release(ctx, s)
}

// release deletes the bridge's host Services and removes the finalizer.
func (r *Reconciler) release(ctx context.Context, s *scope) (ctrl.Result, error) {
	if err := r.deleteHostServices(ctx, s, nil, r.APIReader); err != nil {
		return ctrl.Result{}, err
	}
	r.memo().forget(s.bridge.UID)
	controllerutil.RemoveFinalizer(s.bridge, guestnetv1.GuestWebhookBridgeFinalizer)
	return ctrl.Result{}, nil
}

// setReadyCondition summarises readyConditions into Ready.
func setReadyCondition(bridge *guestnetv1.GuestWebhookBridge) {
	status.SetReadyCondition(bridge, readyConditions...)
}
