package guestwebhookbridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ssa"
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
	eventBridged  = "Bridged"
	eventRepaired = "Repaired"
	eventRestored = "Restored"
	eventForgot   = "LeftToUser"
	eventApplied  = "Applied"
	eventDeleted  = "Deleted"
	eventWarning  = "TargetWarning"

	actionRewrite = "Rewrite"
	actionRestore = "Restore"
	actionApply   = "Apply"
	actionDelete  = "Delete"

	guestWatcher = controllerName + "-guest"
)

// Requeue intervals: the certificates and endpoints of bridged targets change without an
// event guestnet sees (a server restarts with another certificate), so they are probed again.
const (
	recheckAfter = 5 * time.Minute
	retryAfter   = 10 * time.Second
)

// reconcileNormal bridges the selected targets once the guest cluster is reachable, and
// reports each of them. While the guest apiserver cannot be reached, nothing is changed:
// the host Services stay as they are.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	gwb := s.bridge
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, gwb, s.cluster)
	if s.cluster == nil {
		// The Cluster is gone (or never existed), and its guest with it: nothing is left to
		// restore. Remove the host Services; the bridge stays and waits for a Cluster.
		for _, c := range bridgeConditions {
			conditions.Delete(gwb, c)
		}
		gwb.Status.Targets, gwb.Status.BridgedTargets, gwb.Status.TotalTargets = nil, 0, 0
		return ctrl.Result{}, kerrors.NewAggregate([]error{err, r.deleteHostServices(ctx, s, nil)})
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
	if err := ports.ReportPortsDeclared(ctx, r.Client, guestClient, s.cluster, gwb, ports.ForBridge(gwb)); err != nil {
		return ctrl.Result{}, err
	}

	plan, err := r.makePlan(ctx, s)
	if err != nil {
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
	// carries a record always has its host Service (reconcileDelete relies on it).
	if err := r.deleteGuestServices(ctx, s, s.keepGuest); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.deleteHostServices(ctx, s, s.keepHost); err != nil {
		return ctrl.Result{}, err
	}
	r.probe(ctx, s, plan)

	r.recordWarnings(gwb, plan)
	gwb.Status.Targets = bridge.TargetStatuses(plan)
	gwb.Status.BridgedTargets, gwb.Status.TotalTargets = bridge.Counts(plan)
	bridge.SetTargetsBridgedCondition(gwb, plan)
	bridge.SetTargetsReachableCondition(gwb, plan)
	if conditions.IsTrue(gwb, guestnetv1.TargetsBridgedCondition) && conditions.IsTrue(gwb, guestnetv1.TargetsReachableCondition) {
		return ctrl.Result{RequeueAfter: recheckAfter}, nil
	}
	return ctrl.Result{RequeueAfter: retryAfter}, nil
}

// watchGuest makes the guest's APIService, webhook configuration and Service events reach
// the bridges of the cluster through the ClusterCache's per-cluster cache: a Helm or GitOps
// revert, a new target or a chart's reinstalled Service is noticed at once. The ClusterCache
// adds each watch once per connection.
func (r *Reconciler) watchGuest(ctx context.Context, s *scope) error {
	if r.controller == nil {
		return nil // unit tests drive the phases without a controller
	}
	key := client.ObjectKeyFromObject(s.cluster)
	toBridges := handler.EnqueueRequestsFromMapFunc(r.clusterToBridges(key))
	for _, kind := range []client.Object{
		&apiregistrationv1.APIService{},
		&admissionregistrationv1.ValidatingWebhookConfiguration{},
		&admissionregistrationv1.MutatingWebhookConfiguration{},
		&corev1.Service{},
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

// makePlan reads the guest and plans the bridge.
func (r *Reconciler) makePlan(ctx context.Context, s *scope) (*bridge.Plan, error) {
	obs, services, err := observeGuest(ctx, s.guestClient)
	if err != nil {
		return nil, err
	}
	s.observed = obs
	targets, err := bridge.Select(&s.bridge.Spec, obs)
	if err != nil {
		return nil, err
	}
	in := bridge.Input{Bridge: s.bridge, Targets: targets, GuestServices: services}
	if s.bridge.Spec.Mode != guestnetv1.BridgeModeAlways && needsReachability(targets) {
		agents, err := r.konnectivityAgents(ctx, s)
		if err != nil {
			return nil, err
		}
		in.Reach = bridge.GuestReachesServices(agents, obs.APIServices)
	}
	return bridge.MakePlan(in), nil
}

// observeGuest lists what targets are selected from, and every guest Service.
func observeGuest(ctx context.Context, guest client.Reader) (bridge.Observed, []corev1.Service, error) {
	apiServices := &apiregistrationv1.APIServiceList{}
	validating := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	mutating := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	services := &corev1.ServiceList{}
	for _, list := range []client.ObjectList{apiServices, validating, mutating, services} {
		if err := guest.List(ctx, list); err != nil {
			return bridge.Observed{}, nil, fmt.Errorf("listing %T in the guest: %w", list, err)
		}
	}
	return bridge.Observed{APIServices: apiServices.Items, ValidatingWebhooks: validating.Items, MutatingWebhooks: mutating.Items},
		services.Items, nil
}

// needsReachability reports whether mode Auto has a webhook to decide on: one that references
// a Service and that guestnet has not rewritten.
func needsReachability(targets []bridge.Target) bool {
	for _, t := range targets {
		if t.IsWebhook() && t.Service != nil && t.Record == nil {
			return true
		}
	}
	return false
}

// konnectivityAgents lists the guest's konnectivity agent pods, uncached: guestnet never
// caches the guest's Pods.
func (r *Reconciler) konnectivityAgents(ctx context.Context, s *scope) ([]corev1.Pod, error) {
	c, err := r.ClusterCache.GetUncachedClient(ctx, client.ObjectKeyFromObject(s.cluster))
	if err != nil {
		return nil, err
	}
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(bridge.KonnectivityNamespace),
		client.MatchingLabels{bridge.KonnectivityAgentLabel: bridge.KonnectivityAgentValue}); err != nil {
		return nil, fmt.Errorf("listing konnectivity agents in the guest: %w", err)
	}
	return pods.Items, nil
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
		if live != nil && !hostnames.IsBridgeObject(live, gwb) {
			plan.Block(b, guestnetv1.HostObjectConflictReason, fmt.Sprintf(
				"host Service %s exists and is not this bridge's; guestnet leaves it alone: rename or delete it", key))
			continue
		}
		svc, applied, err := ssa.EnsureService(ctx, r.Client, bridge.HostService(gwb, b), live)
		if err != nil {
			return err
		}
		if applied {
			r.recorder.Eventf(gwb, svc, corev1.EventTypeNormal, eventApplied, actionApply,
				"Applied host Service %s for guest Service %s (targetPort = guest nodePort)", key, b.Key())
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

// deleteHostServices deletes the bridge's host Services whose names keep lacks.
func (r *Reconciler) deleteHostServices(ctx context.Context, s *scope, keep map[string]bool) error {
	list := &corev1.ServiceList{}
	if err := r.Client.List(ctx, list, client.InNamespace(bridge.HostNamespace(s.bridge)), client.MatchingLabels(hostnames.SelectBridge(s.bridge))); err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		svc := &list.Items[i]
		if keep[svc.Name] || !hostnames.IsBridgeObject(svc, s.bridge) {
			continue
		}
		if err := r.Client.Delete(ctx, svc); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
			continue
		}
		r.recorder.Eventf(s.bridge, svc, corev1.EventTypeNormal, eventDeleted, actionDelete, "Deleted host Service %s/%s", svc.Namespace, svc.Name)
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
				r.recorder.Eventf(gwb, svc, corev1.EventTypeNormal, eventApplied, actionApply, "Applied Service %s in the guest", key)
			}
		}
	}
	s.keepGuest = keep
	return nil
}

// deleteGuestServices deletes the bridge's guest Services ("<namespace>/<name>") keep lacks.
func (r *Reconciler) deleteGuestServices(ctx context.Context, s *scope, keep map[string]bool) error {
	list := &corev1.ServiceList{}
	if err := s.guestClient.List(ctx, list, client.MatchingLabels(hostnames.SelectBridge(s.bridge))); err != nil {
		return fmt.Errorf("listing the bridge's Services in the guest: %w", err)
	}
	var errs []error
	for i := range list.Items {
		svc := &list.Items[i]
		if keep[client.ObjectKeyFromObject(svc).String()] || !hostnames.IsBridgeObject(svc, s.bridge) {
			continue
		}
		if err := s.guestClient.Delete(ctx, svc); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("deleting Service %s/%s in the guest: %w", svc.Namespace, svc.Name, err))
			continue
		}
		r.recorder.Eventf(s.bridge, svc, corev1.EventTypeNormal, eventDeleted, actionDelete, "Deleted Service %s/%s in the guest", svc.Namespace, svc.Name)
	}
	return kerrors.NewAggregate(errs)
}

// reconcileTargets rewrites the targets the plan bridges, drops records of targets someone
// else took over, and restores the targets this bridge rewrote that it no longer selects.
// Each guest object is written once, with all its changes.
func (r *Reconciler) reconcileTargets(ctx context.Context, s *scope, plan *bridge.Plan) error {
	me := hostnames.BridgeID(s.bridge)
	edits := newObjectEdits(s.observed)
	selected := map[string]bool{}
	for i := range plan.Targets {
		tp := &plan.Targets[i]
		selected[tp.Key()] = true
		switch tp.Action {
		case bridge.RewriteAction:
			note := fmt.Sprintf("Bridged %s: %s", tp.Target, describeRewrite(tp))
			reason := eventBridged
			if tp.Record != nil {
				reason, note = eventRepaired, fmt.Sprintf("Repaired %s (it no longer pointed at the bridge): %s", tp.Target, describeRewrite(tp))
			}
			edits.add(tp.Target, func(obj client.Object) (bool, error) {
				if tp.IsWebhook() {
					return bridge.RewriteWebhook(obj, tp.Webhook, tp.URL, me)
				}
				return bridge.RewriteAPIService(obj.(*apiregistrationv1.APIService), *tp.APIServiceRef, me)
			}, reason, note)
		case bridge.ForgetAction:
			edits.add(tp.Target, func(obj client.Object) (bool, error) { return bridge.ForgetWebhook(obj, tp.Webhook, me) },
				eventForgot, fmt.Sprintf("Left %s to its new owner: its url was changed after guestnet bridged it", tp.Target))
		}
	}
	r.addRestores(edits, me, func(t bridge.Target) bool { return !selected[t.Key()] })
	return edits.write(ctx, s.guestClient, r.recorder, s.bridge)
}

// addRestores adds a restore for every target this bridge rewrote that unselected accepts.
func (r *Reconciler) addRestores(edits *objectEdits, me string, unselected func(bridge.Target) bool) {
	for _, t := range recordedTargets(edits.observed) {
		if t.Record.Bridge != me || !unselected(t) {
			continue
		}
		edits.add(t, func(obj client.Object) (bool, error) {
			if t.IsWebhook() {
				return bridge.RestoreWebhook(obj, t.Webhook, me)
			}
			return bridge.RestoreAPIService(obj.(*apiregistrationv1.APIService), me)
		}, eventRestored, fmt.Sprintf("Restored the original service reference of %s", t))
	}
}

// recordedTargets are the targets of observed objects that carry a record.
func recordedTargets(obs bridge.Observed) []bridge.Target {
	var out []bridge.Target
	for i := range obs.APIServices {
		if t, err := bridge.APIServiceTarget(&obs.APIServices[i]); err == nil && t.Record != nil {
			out = append(out, t)
		}
	}
	for _, obj := range webhookConfigurations(obs) {
		ts, _ := bridge.WebhookTargets(obj)
		for _, t := range ts {
			if t.Record != nil {
				out = append(out, t)
			}
		}
	}
	return out
}

func webhookConfigurations(obs bridge.Observed) []client.Object {
	var out []client.Object
	for i := range obs.ValidatingWebhooks {
		out = append(out, &obs.ValidatingWebhooks[i])
	}
	for i := range obs.MutatingWebhooks {
		out = append(out, &obs.MutatingWebhooks[i])
	}
	return out
}

func describeRewrite(tp *bridge.TargetPlan) string {
	if tp.IsWebhook() {
		return fmt.Sprintf("clientConfig.url %s (was service %s), guest nodePort %d", tp.URL, tp.Service, tp.Backend.NodePort(tp.Port))
	}
	return fmt.Sprintf("service %s/%s (ExternalName for host Service %s; was %s), guest nodePort %d",
		tp.APIServiceRef.Namespace, tp.APIServiceRef.Name, tp.Backend.HostService, tp.Service, tp.Backend.NodePort(tp.Port))
}

// probe calls every target that goes through the bridge as the guest apiserver will: at
// its host Service, verifying the certificate for the name it dials. Probes run in parallel.
func (r *Reconciler) probe(ctx context.Context, s *scope, plan *bridge.Plan) {
	var wg sync.WaitGroup
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
		wg.Go(func() {
			insecure := !tp.IsWebhook() && tp.InsecureSkipTLSVerify
			tp.SetProbe(r.prober()(ctx, addr, tp.TLSServerName, tp.CABundle, insecure), s.bridge, addr)
		})
	}
	wg.Wait()
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
		r.recorder.Eventf(gwb, related[key], corev1.EventTypeWarning, eventWarning, actionRewrite, "%s", strings.Join(byObject[key], "; "))
	}
}

// --- deletion -----------------------------------------------------------------------------

// reconcileDelete restores every target this bridge rewrote, deletes its guest and host
// Services, then releases the object. While the guest apiserver cannot be reached the
// finalizer stays: the originals exist only in the guest.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	gwb := s.bridge
	if s.cluster == nil || !s.cluster.DeletionTimestamp.IsZero() {
		// The guest goes with its Cluster: nothing to restore.
		return r.release(ctx, s)
	}
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, gwb, s.cluster)
	if err != nil || guestClient == nil {
		rewrote, listErr := r.mayHaveRewritten(ctx, s)
		if listErr != nil {
			return ctrl.Result{}, listErr
		}
		if !rewrote {
			// Never bridged anything (e.g. the guest was never reachable): nothing to restore.
			return r.release(ctx, s)
		}
		conditions.Set(gwb, metav1.Condition{
			Type: guestnetv1.TargetsBridgedCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.DeletingReason,
			Message: "Waiting for the guest apiserver to restore the original APIServices and webhooks (see ClusterAvailable). " +
				"To give up on restoring them, remove the finalizer " + guestnetv1.GuestWebhookBridgeFinalizer,
		})
		return ctrl.Result{RequeueAfter: retryAfter}, err
	}
	s.guestClient = guestClient
	obs, _, err := observeGuest(ctx, guestClient)
	if err != nil {
		return ctrl.Result{}, err
	}
	s.observed = obs
	edits := newObjectEdits(obs)
	r.addRestores(edits, hostnames.BridgeID(gwb), func(bridge.Target) bool { return true })
	if err := edits.write(ctx, guestClient, r.recorder, gwb); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.deleteGuestServices(ctx, s, nil); err != nil {
		return ctrl.Result{}, err
	}
	return r.release(ctx, s)
}

// release deletes the bridge's host Services and removes the finalizer.
func (r *Reconciler) release(ctx context.Context, s *scope) (ctrl.Result, error) {
	if err := r.deleteHostServices(ctx, s, nil); err != nil {
		return ctrl.Result{}, err
	}
	controllerutil.RemoveFinalizer(s.bridge, guestnetv1.GuestWebhookBridgeFinalizer)
	return ctrl.Result{}, nil
}

// mayHaveRewritten reports, while the guest cannot be reached, whether it may hold targets
// this bridge rewrote: a target is rewritten only after its host Service exists, and unused
// host Services are deleted only after the targets are restored, so without host Services
// (and without bridged targets in status) there is nothing to wait for.
func (r *Reconciler) mayHaveRewritten(ctx context.Context, s *scope) (bool, error) {
	for _, t := range s.bridge.Status.Targets {
		if t.HostService != "" {
			return true, nil
		}
	}
	list := &corev1.ServiceList{}
	if err := r.Client.List(ctx, list, client.InNamespace(bridge.HostNamespace(s.bridge)), client.MatchingLabels(hostnames.SelectBridge(s.bridge))); err != nil {
		return false, err
	}
	for i := range list.Items {
		if hostnames.IsBridgeObject(&list.Items[i], s.bridge) {
			return true, nil
		}
	}
	return false, nil
}

// setReadyCondition summarises readyConditions into Ready.
func setReadyCondition(bridge *guestnetv1.GuestWebhookBridge) {
	clusterscope.SetReadyCondition(bridge, readyConditions...)
}
