package guestingress

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ssa"
)

// readyConditions are the conditions Ready summarises: Ready is True only when the whole
// chain works, from the guest Service to an IP with ready worker endpoints behind it.
var readyConditions = []string{
	guestnetv1.ClusterAvailableCondition,
	guestnetv1.GuestServiceReadyCondition,
	guestnetv1.LoadBalancerReadyCondition,
	guestnetv1.EndpointsReadyCondition,
	guestnetv1.PortsDeclaredCondition,
}

// exposureConditions describe objects that exist only while the Cluster does.
var exposureConditions = []string{
	guestnetv1.GuestServiceReadyCondition,
	guestnetv1.LoadBalancerReadyCondition,
	guestnetv1.EndpointsReadyCondition,
	guestnetv1.PortsDeclaredCondition,
}

// ownedConditions are all conditions this controller writes; the patch helper lets its
// values win over concurrent writers.
var ownedConditions = append([]string{guestnetv1.ReadyCondition, guestnetv1.PausedCondition}, readyConditions...)

// Event reasons of the changes guestnet makes (condition changes have their own events).
const (
	eventApplied        = "Applied"
	eventDeleted        = "Deleted"
	eventReleased       = "GuestServiceReleased"
	eventActionApply    = "Apply"
	eventActionDelete   = "Delete"
	guestServiceWatcher = controllerName + "-guest-services"
)

// reconcileNormal makes the guest Service and the host objects match the spec once the guest
// cluster is reachable, and reports what it found. While the guest apiserver cannot be
// reached, nothing is changed: the host objects stay as they are.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	gi := s.guestIngress
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, gi, s.cluster)
	if s.cluster == nil {
		// The Cluster is gone (or never existed): its workers went with it, so nothing is
		// left to expose. Remove what guestnet created for it; the GuestIngress stays and
		// waits for a Cluster of that name.
		for _, c := range exposureConditions {
			conditions.Delete(gi, c)
		}
		gi.Status.LoadBalancerIP, gi.Status.HostService, gi.Status.ReadyEndpoints = "", "", 0
		return ctrl.Result{}, kerrors.NewAggregate([]error{err, r.deleteHostObjects(ctx, s, false)})
	}
	if err != nil || guestClient == nil {
		// Not reachable yet: the Cluster watch or the ClusterCache connect event brings us back.
		return ctrl.Result{}, err
	}
	s.guestClient = guestClient
	if err := r.watchGuestServices(ctx, s); err != nil {
		return ctrl.Result{}, err
	}

	// A GuestIngress that asks for an IP (or range) another one keeps (it has it, or is
	// older) gets nothing, and the other one keeps working.
	all := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, all); err != nil {
		return ctrl.Result{}, err
	}
	if conflict := ingress.FindConflict(gi, all.Items); conflict != nil {
		ingress.SetLoadBalancerConflict(gi, conflict)
		ingress.SetNoHostService(gi)
		gi.Status.LoadBalancerIP, gi.Status.HostService, gi.Status.ReadyEndpoints = "", "", 0
		return ctrl.Result{}, r.deleteHostObjects(ctx, s, false)
	}

	if err := r.reconcileGuestService(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	// The workerports controller declares the ports; this object reports whether its own
	// are (the nodePorts just resolved into status.ports).
	if err := ports.ReportPortsDeclared(ctx, r.Client, guestClient, s.cluster, gi, ports.ForGuestIngress(gi)); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.reconcileHostObjects(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.reconcileEndpoints(ctx, s)
}

// watchGuestServices makes the guest's Service events reach the GuestIngresses that name
// them (and those whose fixed nodePorts another Service holds), through the ClusterCache's
// per-cluster cache: a reinstalled ingress controller, a changed nodePort or a freed
// nodePort is noticed at once. The ClusterCache adds each watch once per connection.
func (r *Reconciler) watchGuestServices(ctx context.Context, s *scope) error {
	if r.controller == nil {
		return nil // unit tests drive the phases without a controller
	}
	key := client.ObjectKeyFromObject(s.cluster)
	err := r.ClusterCache.Watch(ctx, key, clustercache.NewWatcher(clustercache.WatcherOptions{
		Name:         guestServiceWatcher,
		Watcher:      r.controller,
		Kind:         &corev1.Service{},
		EventHandler: handler.EnqueueRequestsFromMapFunc(r.guestServiceToGuestIngresses(key)),
	}))
	if errors.Is(err, clustercache.ErrClusterNotConnected) {
		return nil // the connect event brings the object back
	}
	return err
}

// --- guest side ---------------------------------------------------------------------------

// reconcileGuestService makes the guest Service a NodePort Service with the fixed nodePorts
// (server-side apply as field manager "guestnet", only those fields), resolves the nodePort
// of every spec port into status.ports and reports GuestServiceReady.
func (r *Reconciler) reconcileGuestService(ctx context.Context, s *scope) error {
	gi := s.guestIngress
	key := client.ObjectKey{Namespace: gi.Spec.GuestService.Namespace, Name: gi.Spec.GuestService.Name}
	live := &corev1.Service{}
	if err := s.guestClient.Get(ctx, key, live); err != nil {
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading Service %s in the guest: %w", key, err)
		}
		// Wait for it (the guest Service watch brings us back); meanwhile the host side
		// keeps (or gets, when the nodePorts are fixed) the last known nodePorts.
		ingress.SetGuestServiceNotFound(gi)
		resolved, _, complete := ingress.NodePorts(gi, nil)
		s.setNodePorts(resolved, complete)
		return nil
	}

	desired := ingress.GuestService(gi, live)
	upToDate, err := ssa.ServiceUpToDate(desired, live)
	if err != nil {
		return err
	}
	if !upToDate {
		applied, err := ssa.ApplyService(ctx, s.guestClient, desired)
		switch {
		case ssa.IsNodePortAllocated(err):
			holders, listErr := r.nodePortHolders(ctx, s)
			if listErr != nil {
				return listErr
			}
			ingress.SetNodePortConflict(gi, holders, ssa.APIErrorMessage(err))
			s.keepNodePorts()
			return nil
		case apierrors.IsInvalid(err):
			ingress.SetGuestServiceRejected(gi, err)
			s.keepNodePorts()
			return nil
		case err != nil:
			return fmt.Errorf("applying Service %s in the guest: %w", key, err)
		}
		r.recorder.Eventf(gi, nil, corev1.EventTypeNormal, eventApplied, eventActionApply,
			"Applied type and fixed nodePorts to Service %s in the guest (field manager %s)", key, hostnames.FieldManager)
		live = applied
	}

	resolved, missing, complete := ingress.NodePorts(gi, live)
	if len(missing) > 0 {
		ingress.SetGuestServicePortNotFound(gi, live, missing)
		gi.Status.Ports = resolved
		s.keepNodePorts()
		return nil
	}
	ingress.SetGuestServiceReady(gi, resolved)
	s.setNodePorts(resolved, complete)
	return nil
}

// setNodePorts records the resolved nodePorts in status and scope.
func (s *scope) setNodePorts(resolved []guestnetv1.IngressPortStatus, complete bool) {
	s.guestIngress.Status.Ports = resolved
	s.nodePorts = ingress.NodePortMap(resolved)
	s.nodePortsUsable = complete
}

// keepNodePorts leaves the host Service pointing where it points: the guest refused or lacks
// some port, and forwarding to a nodePort another Service holds would be worse.
func (s *scope) keepNodePorts() {
	s.nodePorts, s.nodePortsUsable = nil, false
}

// nodePortHolders names the guest Services that hold gi's fixed nodePorts.
func (r *Reconciler) nodePortHolders(ctx context.Context, s *scope) ([]string, error) {
	list := &corev1.ServiceList{}
	if err := s.guestClient.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing Services in the guest: %w", err)
	}
	return ingress.NodePortHolders(s.guestIngress, list.Items), nil
}

// --- host side ----------------------------------------------------------------------------

// reconcileHostObjects applies the pool (or checks the referenced one), the L2 policy and the
// host LoadBalancer Service, then reports LoadBalancerReady and the load-balancer IP.
func (r *Reconciler) reconcileHostObjects(ctx context.Context, s *scope) error {
	gi := s.guestIngress
	lb := gi.Spec.LoadBalancer

	// The pool: guestnet's own, or the shared one poolRef names.
	var pool *unstructured.Unstructured
	poolName := hostnames.Pool(gi)
	if desired := ingress.Pool(gi); desired != nil {
		live, foreign, err := r.applyObject(ctx, s, desired)
		if err != nil || foreign {
			return err
		}
		pool = live
	} else {
		poolName = lb.PoolRef.Name
		if err := r.deleteOwned(ctx, s, ingress.NewPool(), hostnames.Pool(gi), "", false); err != nil {
			return err
		}
		pool = ingress.NewPool()
		if err := r.Client.Get(ctx, client.ObjectKey{Name: poolName}, pool); err != nil {
			if !apierrors.IsNotFound(err) {
				return err
			}
			pool = nil
		}
	}

	// The L2 announcement policy, for Cilium's L2 announcer class only.
	policyName := ""
	desiredPolicy, err := ingress.L2Policy(gi, policy.Admit(policy.Input{GuestIngress: gi}).Announcement)
	if err != nil {
		return err
	}
	if desiredPolicy != nil {
		if _, foreign, err := r.applyObject(ctx, s, desiredPolicy); err != nil || foreign {
			return err
		}
		policyName = desiredPolicy.GetName()
	} else if err := r.deleteOwned(ctx, s, ingress.NewL2Policy(), hostnames.L2Policy(gi), "", false); err != nil {
		return err
	}

	// The Service: applied once every port has a usable nodePort; otherwise left as it is.
	svc, foreign, err := r.reconcileHostService(ctx, s)
	if err != nil || foreign {
		return err
	}
	s.hostService = svc

	gi.Status.HostService, gi.Status.LoadBalancerIP = "", ""
	if svc != nil {
		gi.Status.HostService = svc.Name
		gi.Status.LoadBalancerIP = ingress.LoadBalancerIP(svc)
	}

	switch {
	case lb.PoolRef != nil && pool == nil:
		ingress.SetPoolNotFound(gi)
	case pool != nil && poolConflict(pool) != nil:
		ingress.SetCiliumPoolConflict(gi, poolName, poolConflict(pool))
	case svc == nil:
		ingress.SetHostServicePending(gi, hostnames.HostService(gi))
	case gi.Status.LoadBalancerIP == "":
		ingress.SetIPPending(gi, svc, ingress.ServiceCondition(svc, ingress.IPAMRequestSatisfiedCondition), poolHint(gi, pool, svc))
	default:
		ingress.SetLoadBalancerReady(gi, svc, gi.Status.LoadBalancerIP, poolName, policyName)
	}
	return nil
}

// poolConflict is Cilium's PoolConflict condition of the pool when it is True.
func poolConflict(pool *unstructured.Unstructured) *metav1.Condition {
	if c := ingress.ObjectCondition(pool, ingress.PoolConflictCondition); c != nil && c.Status == metav1.ConditionTrue {
		return c
	}
	return nil
}

// poolHint explains why a referenced pool gives the Service no IP, when it does not select it.
func poolHint(gi *guestnetv1.GuestIngress, pool *unstructured.Unstructured, svc *corev1.Service) string {
	if gi.Spec.LoadBalancer.PoolRef == nil || pool == nil {
		return ""
	}
	if ok, err := ingress.SelectorMatchesService(pool, svc.Labels, svc.Namespace, svc.Name); err == nil && !ok {
		return fmt.Sprintf("the serviceSelector of CiliumLoadBalancerIPPool %s does not select Service %s/%s; select it by its labels "+
			"(e.g. %s=%s) or add them with spec.loadBalancer.labels", pool.GetName(), svc.Namespace, svc.Name,
			hostnames.ClusterNameLabel, gi.Spec.ClusterName)
	}
	return ""
}

// reconcileHostService applies the host Service when the nodePorts are usable and reads it
// otherwise. foreign is true (and LoadBalancerReady says so) when a Service of that name
// exists that guestnet did not create for this GuestIngress.
func (r *Reconciler) reconcileHostService(ctx context.Context, s *scope) (*corev1.Service, bool, error) {
	gi := s.guestIngress
	name := hostnames.HostService(gi)
	live, foreign, err := r.getHostObject(ctx, s, &corev1.Service{}, client.ObjectKey{Namespace: gi.Namespace, Name: name})
	if err != nil || foreign {
		return nil, foreign, err
	}
	svc, _ := live.(*corev1.Service)
	if !s.nodePortsUsable {
		return svc, false, nil
	}
	desired := ingress.HostService(gi, s.nodePorts)
	if svc != nil {
		// loadBalancerClass cannot be changed: a new class needs a new Service (and IP).
		if svc.Spec.LoadBalancerClass != nil && *svc.Spec.LoadBalancerClass != *desired.Spec.LoadBalancerClass {
			if err := r.deleteOwned(ctx, s, &corev1.Service{}, name, gi.Namespace, true); err != nil {
				return nil, false, err
			}
			return nil, false, nil // the deletion event brings the object back to create it anew
		}
		upToDate, err := ssa.ServiceUpToDate(desired, svc)
		if err != nil || upToDate {
			return svc, false, err
		}
	}
	applied, err := ssa.ApplyService(ctx, r.Client, desired)
	if err != nil {
		return nil, false, fmt.Errorf("applying host Service %s/%s: %w", gi.Namespace, name, err)
	}
	r.recorder.Eventf(gi, nil, corev1.EventTypeNormal, eventApplied, eventActionApply,
		"Applied host Service %s (ports %s)", name, hostPorts(gi, s.nodePorts))
	return applied, false, nil
}

func hostPorts(gi *guestnetv1.GuestIngress, nodePorts map[string]int32) string {
	parts := make([]string, len(gi.Spec.Ports))
	for i, p := range gi.Spec.Ports {
		parts[i] = fmt.Sprintf("%d->%d", p.Port, nodePorts[p.Name])
	}
	return strings.Join(parts, ", ")
}

// applyObject server-side applies a cluster-scoped Cilium object of gi unless it is up to
// date. foreign is true (and LoadBalancerReady says so) when an object of that name exists
// that guestnet did not create for this GuestIngress.
func (r *Reconciler) applyObject(ctx context.Context, s *scope, desired *unstructured.Unstructured) (*unstructured.Unstructured, bool, error) {
	empty := &unstructured.Unstructured{}
	empty.SetGroupVersionKind(desired.GroupVersionKind())
	live, foreign, err := r.getHostObject(ctx, s, empty, client.ObjectKey{Name: desired.GetName()})
	if err != nil || foreign {
		return nil, foreign, err
	}
	if u, ok := live.(*unstructured.Unstructured); ok && ingress.ObjectUpToDate(desired, u) {
		return u, false, nil
	}
	applied := desired.DeepCopy()
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied),
		client.FieldOwner(hostnames.FieldManager), client.ForceOwnership); err != nil {
		return nil, false, fmt.Errorf("applying %s %s: %w", desired.GetKind(), desired.GetName(), err)
	}
	r.recorder.Eventf(s.guestIngress, nil, corev1.EventTypeNormal, eventApplied, eventActionApply,
		"Applied %s %s", desired.GetKind(), desired.GetName())
	return applied, false, nil
}

// getHostObject reads a host object guestnet would own into obj: nil when it does not exist,
// foreign when it exists and is someone else's (then LoadBalancerReady says so). The cache
// holds only guestnet's objects; what it does not have is looked up in the apiserver.
func (r *Reconciler) getHostObject(ctx context.Context, s *scope, obj client.Object, key client.ObjectKey) (client.Object, bool, error) {
	err := r.Client.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, obj)
	}
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if !hostnames.IsOwnedBy(obj, s.guestIngress) {
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		if kind == "" {
			kind = "Service"
		}
		ingress.SetHostObjectConflict(s.guestIngress, kind, client.ObjectKeyFromObject(obj).String())
		return nil, true, nil
	}
	return obj, false, nil
}

// reconcileEndpoints counts the ready worker endpoints behind the host Service, from the
// EndpointSlices kube-controller-manager keeps for it, and reports EndpointsReady.
func (r *Reconciler) reconcileEndpoints(ctx context.Context, s *scope) error {
	gi := s.guestIngress
	if s.hostService == nil {
		gi.Status.ReadyEndpoints = 0
		ingress.SetNoHostService(gi)
		return nil
	}
	slices := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, slices, client.InNamespace(gi.Namespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: s.hostService.Name,
		hostnames.ManagedByLabel:     hostnames.ManagedByValue,
	}); err != nil {
		return err
	}
	ready, total := ingress.CountEndpoints(slices.Items)
	gi.Status.ReadyEndpoints = ready
	ingress.SetEndpoints(gi, gi.Namespace, s.hostService.Name, ready, total)
	return nil
}

// --- deletion -----------------------------------------------------------------------------

// reconcileDelete undoes what reconcileNormal did, then releases the object: it deletes the
// host Service, pool and policy guestnet created for this GuestIngress (nothing else), and
// gives the guest Service's fields back (see releaseGuestService).
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	if err := r.deleteHostObjects(ctx, s, true); err != nil {
		return ctrl.Result{}, err
	}
	released, err := r.releaseGuestService(ctx, s)
	if err != nil || !released {
		return ctrl.Result{}, err
	}
	controllerutil.RemoveFinalizer(s.guestIngress, guestnetv1.GuestIngressFinalizer)
	return ctrl.Result{}, nil
}

// releaseGuestService gives back what guestnet applied to the guest Service: an apply of an
// empty configuration as guestnet drops its ownership of the type and the fixed nodePorts.
// Fields another manager (the user's Helm, kubectl) owns keep their values; fields only
// guestnet owned go back to the apiserver's defaults (a ClusterIP Service that guestnet had
// turned into a NodePort one is ClusterIP again, its nodePorts gone). Nothing is to give back
// when the Cluster is gone, being deleted or was never provisioned. released is false while
// the guest cannot be reached: the ClusterCache's connect event brings the object back.
func (r *Reconciler) releaseGuestService(ctx context.Context, s *scope) (bool, error) {
	gi := s.guestIngress
	if s.cluster == nil || !s.cluster.DeletionTimestamp.IsZero() || !clusterscope.IsProvisioned(s.cluster) {
		return true, nil
	}
	guestClient, err := r.ClusterCache.GetClient(ctx, client.ObjectKeyFromObject(s.cluster))
	if err != nil {
		clusterscope.SetClusterAvailableCondition(gi, s.cluster, err)
		if errors.Is(err, clustercache.ErrClusterNotConnected) {
			return false, nil
		}
		return false, err
	}
	live := &corev1.Service{}
	key := client.ObjectKey{Namespace: gi.Spec.GuestService.Namespace, Name: gi.Spec.GuestService.Name}
	if err := guestClient.Get(ctx, key, live); err != nil {
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	release := ingress.Release(live)
	if upToDate, err := ssa.ServiceUpToDate(release, live); err != nil || upToDate {
		return err == nil, err
	}
	if _, err := ssa.ApplyService(ctx, guestClient, release); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("releasing Service %s in the guest: %w", key, err)
	}
	r.recorder.Eventf(gi, nil, corev1.EventTypeNormal, eventReleased, eventActionApply,
		"Gave back the fields guestnet applied to Service %s in the guest", key)
	return true, nil
}

// deleteHostObjects deletes the host Service, pool and L2 policy guestnet created for the
// GuestIngress, if they exist. thorough also looks past the cache (at deletion, so that
// nothing is left behind).
func (r *Reconciler) deleteHostObjects(ctx context.Context, s *scope, thorough bool) error {
	gi := s.guestIngress
	return kerrors.NewAggregate([]error{
		r.deleteOwned(ctx, s, &corev1.Service{}, hostnames.HostService(gi), gi.Namespace, thorough),
		r.deleteOwned(ctx, s, ingress.NewPool(), hostnames.Pool(gi), "", thorough),
		r.deleteOwned(ctx, s, ingress.NewL2Policy(), hostnames.L2Policy(gi), "", thorough),
	})
}

// deleteOwned deletes the object of that kind (obj) and name if guestnet created it for the
// GuestIngress; anything else of that name is left alone.
func (r *Reconciler) deleteOwned(ctx context.Context, s *scope, obj client.Object, name, namespace string, thorough bool) error {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	err := r.Client.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) && thorough && r.APIReader != nil {
		err = r.APIReader.Get(ctx, key, obj)
	}
	if err != nil {
		return client.IgnoreNotFound(err)
	}
	if !hostnames.IsOwnedBy(obj, s.guestIngress) || !obj.GetDeletionTimestamp().IsZero() {
		return nil
	}
	uid := obj.GetUID()
	if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil {
		return client.IgnoreNotFound(err)
	}
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if kind == "" {
		kind = "Service"
	}
	r.recorder.Eventf(s.guestIngress, nil, corev1.EventTypeNormal, eventDeleted, eventActionDelete, "Deleted %s %s", kind, key)
	return nil
}

// setReadyCondition summarises readyConditions into Ready.
func setReadyCondition(guestIngress *guestnetv1.GuestIngress) {
	clusterscope.SetReadyCondition(guestIngress, readyConditions...)
}
