package guestingress

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ssa"
)

// Event reasons of the changes guestnet makes (condition changes have their own events).
// Deletions a refusal causes carry the refusal's reason instead, as Warnings.
const (
	eventApplied        = "Applied"
	eventDeleted        = "Deleted"
	eventReleased       = "GuestServiceReleased"
	eventRestored       = "GuestServiceRestored"
	eventActionApply    = "Apply"
	eventActionDelete   = "Delete"
	eventActionRestore  = "Restore"
	eventRecorded       = "Recorded"
	guestServiceWatcher = controllerName + "-guest-services"
	ciliumConfigWatcher = controllerName + "-cilium-config"
)

// reconcileNormal observes the world, plans with pure functions (internal/ingress.MakePlan)
// and applies the plan. The status is derived from the three afterwards (updateStatus).
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	if !r.Cilium.Installed() {
		// Nothing to build the chain on: CiliumLBIPAMNotInstalled, and the gate brings every
		// GuestIngress back once Cilium is installed.
		s.ciliumMissing = r.Cilium.Message()
		return ctrl.Result{}, nil
	}
	s.err = r.observe(ctx, s)
	if s.err == nil && s.notTriedYet {
		// A manager that has just started: the ClusterCache's first try brings it back.
		return ctrl.Result{}, nil
	}
	if s.err == nil {
		s.plan = ingress.MakePlan(s.observed)
		s.err = r.apply(ctx, s)
	}
	if s.err == nil && clusterscope.IsGuestTooLarge(s.guestErr) {
		// No event says that the guest shrank: count again.
		return ctrl.Result{RequeueAfter: guestbounds.DefaultCheckEvery}, nil
	}
	if s.err == nil && isLocalPlan(s) {
		// No watch follows the guest's endpoints (they are read live): look again.
		return ctrl.Result{RequeueAfter: localEndpointsResync}, nil
	}
	return ctrl.Result{}, s.err
}

// --- observe ------------------------------------------------------------------------------------

// observe reads everything the plan is made from into s.observed: the guest connection, the
// address space other GuestIngresses hold and ask for, the pools guestnet does not manage and
// the guest Service, on top of what observeHost read (reconcileHeld did, before pause and
// deletion were looked at). It changes nothing.
func (r *Reconciler) observe(ctx context.Context, s *scope) error {
	gi := s.guestIngress
	if s.cluster != nil && s.cluster.DeletionTimestamp.IsZero() {
		s.guestClient, s.guestErr = clusterscope.GuestClient(ctx, r.ClusterCache, s.cluster)
		if clusterscope.KeepsReport(gi, s.guestErr) {
			s.notTriedYet = true // what the last reconcile reported stands until then
			return nil
		}
		if s.guestErr != nil && !errors.Is(s.guestErr, clustercache.ErrClusterNotConnected) && !clusterscope.IsGuestTooLarge(s.guestErr) {
			return s.guestErr
		}
	}
	if s.host == nil {
		if err := r.observeHost(ctx, s); err != nil {
			return err
		}
	}
	w, o := s.world, s.host
	o.Cluster, o.GuestReachable = s.cluster, s.guestClient != nil
	var err error
	if o.GuestServiceRivals, err = r.guestServiceRivals(ctx, w, gi); err != nil {
		return err
	}
	if o.Eligible() {
		held, err := r.held(ctx, w, gi)
		if err != nil {
			return err
		}
		o.Self = ingress.Claimant{GuestIngress: gi, Held: held, Eligible: true}
		if o.Claimants, err = r.entangledClaimants(ctx, w, o.Self); err != nil {
			return err
		}
		if err := r.eligibleClaimants(ctx, w, o.Claimants); err != nil {
			return err
		}
		if o.ForeignPools, err = r.foreignPools(ctx, w, gi); err != nil {
			return err
		}
	}
	if s.guestClient != nil && o.Eligible() {
		if err := r.watchGuest(ctx, s); err != nil {
			return err
		}
		o.GuestService = &corev1.Service{}
		key := client.ObjectKey{Namespace: gi.Spec.GuestService.Namespace, Name: gi.Spec.GuestService.Name}
		if err := s.guestClient.Get(ctx, key, o.GuestService); err != nil {
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("reading Service %s in the guest: %w", key, err)
			}
			o.GuestService = nil // GuestServiceNotFound: the guest Service watch brings us back
		}
	}
	s.observed = o
	if s.guestClient != nil && o.Eligible() && ingress.Local(gi) {
		return r.observeLocalEndpoints(ctx, s)
	}
	return nil
}

// observeHost reads what a reconcile knows of the host before it looks at anything else: what
// admission reads (s.world), the policy's decision for the GuestIngress and its host objects
// (s.host, s.admissionInput). It changes nothing.
func (r *Reconciler) observeHost(ctx context.Context, s *scope) error {
	gi := s.guestIngress
	w, err := r.readHost(ctx)
	if err != nil {
		return err
	}
	o := &ingress.Observed{GuestIngress: gi, Cluster: s.cluster}
	in, admission, err := r.admit(ctx, w, gi)
	if err != nil {
		return err
	}
	o.Admission = admission
	if err := r.observeHostObjects(ctx, w, o); err != nil {
		return err
	}
	if w.pools.err != nil {
		return w.pools.err
	}
	s.world, s.host, s.admissionInput = w, o, in
	return nil
}

// hostWorld is what one reconcile reads from the manager's cache: what admission reads (every
// pool, MetalLB pool and GuestIngressPolicy, the namespaces) and, as they are asked for, the
// claims near the GuestIngress's own (guestingress_claims.go). Its objects are the cache's
// own, not copies (readOnly): nothing may change them. What a reconcile writes is built anew
// (internal/ingress) or read with Get, which copies.
type hostWorld struct {
	// pools are the host's pools, read as asked for (policy.Input.Pools).
	pools *cachedPools
	// allMetalLBPools are every MetalLB pool, guestnet's and the platform's.
	allMetalLBPools []unstructured.Unstructured
	policies        []guestnetv1.GuestIngressPolicy
	namespaces      map[string]*corev1.Namespace
	// host are the host's own addresses (internal/hostaddrs).
	host hostaddrs.Set
	// claimants are the GuestIngresses read as claimants (an empty one: it does not exist),
	// near the claimants filed under each address key read.
	claimants map[types.NamespacedName]ingress.Claimant
	near      map[string][]ingress.Claimant
}

func (r *Reconciler) readHost(ctx context.Context) (*hostWorld, error) {
	w := &hostWorld{pools: &cachedPools{ctx: ctx, reader: r.Client, byName: map[string]*unstructured.Unstructured{}},
		namespaces: map[string]*corev1.Namespace{},
		claimants:  map[types.NamespacedName]ingress.Claimant{}, near: map[string][]ingress.Claimant{}}
	var err error
	if w.host, err = r.HostAddresses.Reserved(ctx); err != nil {
		return nil, err
	}
	if w.allMetalLBPools, err = r.listMetalLBPools(ctx); err != nil {
		return nil, err
	}
	policies := &guestnetv1.GuestIngressPolicyList{}
	if err := r.Client.List(ctx, policies, readOnly); err != nil {
		return nil, fmt.Errorf("listing GuestIngressPolicies: %w", err)
	}
	w.policies = policies.Items
	return w, nil
}

// readOnly lists the cache's own objects instead of deep copies of them. Every GuestIngress
// reconcile and several event mappers read many GuestIngresses and pools: copying them cost
// memory and CPU in proportion to the fleet on each (docs/performance.md). The objects so
// read must never be changed.
var readOnly = client.UnsafeDisableDeepCopy

// listGuestIngresses lists every GuestIngress (the cache's objects, readOnly: never change
// them): for what concerns them all (a policy, the host's own addresses).
func (r *Reconciler) listGuestIngresses(ctx context.Context) ([]guestnetv1.GuestIngress, error) {
	list := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, list, readOnly); err != nil {
		return nil, fmt.Errorf("listing GuestIngresses: %w", err)
	}
	return list.Items, nil
}

// admit asks the policy (Reconciler.Admit) whether gi is admitted, and returns what it was
// asked with.
func (r *Reconciler) admit(ctx context.Context, w *hostWorld, gi *guestnetv1.GuestIngress) (policy.Input, ingress.Admission, error) {
	ns, ok := w.namespaces[gi.Namespace]
	if !ok {
		ns = &corev1.Namespace{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: gi.Namespace}, ns); err != nil {
			if !apierrors.IsNotFound(err) {
				return policy.Input{}, ingress.Admission{}, fmt.Errorf("getting Namespace %s: %w", gi.Namespace, err)
			}
			ns = nil
		}
		w.namespaces[gi.Namespace] = ns
	}
	siblings, err := r.siblings(ctx, gi)
	if err != nil {
		return policy.Input{}, ingress.Admission{}, err
	}
	in := policy.Input{GuestIngress: gi, Namespace: ns, Policies: w.policies, Siblings: siblings, Pools: w.pools, Host: w.host,
		MetalLBPools: w.metalLBPools()}
	decision := r.Admit(in)
	return in, decision, w.pools.err // (a pool the decision could not read)
}

// guestServiceRivals are the GuestIngresses of gi's Cluster that own or still hold its guest
// Service (ingress.GuestServiceRivalsOf); one owns it only while it may hold anything
// (eligible), as a claim of address space: an older one refused by its policy does not keep
// a newer admitted one from the Service.
func (r *Reconciler) guestServiceRivals(ctx context.Context, w *hostWorld, gi *guestnetv1.GuestIngress) (ingress.GuestServiceRivals, error) {
	ofCluster, err := r.ofCluster(ctx, gi)
	if err != nil {
		return ingress.GuestServiceRivals{}, err
	}
	rivals := ingress.GuestServiceRivalsOf(gi, ofCluster, func(other *guestnetv1.GuestIngress) bool {
		if err != nil {
			return false
		}
		var ok bool
		ok, err = r.eligible(ctx, w, other)
		return ok
	})
	return rivals, err
}

// eligibleClaimants sets whether each claimant may hold anything: its Cluster exists and is
// not being deleted, neither it nor its Cluster is paused, it is not being deleted, and a
// policy admits it.
func (r *Reconciler) eligibleClaimants(ctx context.Context, w *hostWorld, claimants []ingress.Claimant) error {
	for i := range claimants {
		eligible, err := r.eligible(ctx, w, claimants[i].GuestIngress)
		if err != nil {
			return err
		}
		claimants[i].Eligible = eligible
	}
	return nil
}

func (r *Reconciler) eligible(ctx context.Context, w *hostWorld, gi *guestnetv1.GuestIngress) (bool, error) {
	if !gi.DeletionTimestamp.IsZero() {
		return false, nil
	}
	cluster, err := clusterscope.GetCluster(ctx, r.Client, gi.Namespace, gi.Spec.ClusterName)
	if err != nil || cluster == nil || !cluster.DeletionTimestamp.IsZero() || clusterscope.IsPaused(gi, cluster) {
		return false, err
	}
	_, a, err := r.admit(ctx, w, gi)
	return a.Admitted, err
}

// observeHostObjects reads the host Service, pool and L2 policy guestnet creates for the
// GuestIngress, and the pool poolRef names.
func (r *Reconciler) observeHostObjects(ctx context.Context, w *hostWorld, o *ingress.Observed) error {
	gi := o.GuestIngress
	svc, foreign, err := r.getHostObject(ctx, gi, &corev1.Service{}, client.ObjectKey{Namespace: gi.Namespace, Name: hostnames.HostService(gi)})
	if err != nil {
		return err
	}
	if foreign != "" {
		o.Foreign = foreign
	} else if svc != nil {
		o.HostService = svc.(*corev1.Service)
	}
	if pool := w.pools.Get(hostnames.Pool(gi)); pool != nil {
		if ownership.IsOwnedBy(pool, gi) {
			o.Pool = pool
		} else if ingress.OwnsPool(gi) && o.Foreign == "" {
			o.Foreign = "CiliumLoadBalancerIPPool " + pool.GetName()
		}
	}
	policyObj, foreign, err := r.getHostObject(ctx, gi, ingress.NewL2Policy(), client.ObjectKey{Name: hostnames.L2Policy(gi)})
	if err != nil {
		return err
	}
	if foreign != "" && ingress.AnnouncesL2(gi) && o.Foreign == "" {
		o.Foreign = foreign
	} else if policyObj != nil {
		o.L2Policy = policyObj.(*unstructured.Unstructured)
	}
	if ref := gi.Spec.LoadBalancer.PoolRef; ref != nil {
		o.RefPool = w.pools.Get(ref.Name)
	}
	return r.observeAnnouncers(ctx, o)
}

// getHostObject reads a host object guestnet would own into obj: nil when it does not exist;
// foreign names it ("Service k0smotron/tenant-a-web") when it exists and is someone else's.
// The cache holds only guestnet's Services; a Service it does not have is looked up in the
// apiserver.
func (r *Reconciler) getHostObject(ctx context.Context, gi *guestnetv1.GuestIngress, obj client.Object, key client.ObjectKey) (client.Object, string, error) {
	err := r.Client.Get(ctx, key, obj)
	if _, isService := obj.(*corev1.Service); apierrors.IsNotFound(err) && isService {
		err = r.APIReader.Get(ctx, key, obj)
	}
	if apierrors.IsNotFound(err) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("getting %s %s: %w", kindOf(obj), key, err)
	}
	if !ownership.IsOwnedBy(obj, gi) {
		return nil, kindOf(obj) + " " + key.String(), nil
	}
	return obj, "", nil
}

func kindOf(obj client.Object) string {
	if kind := obj.GetObjectKind().GroupVersionKind().Kind; kind != "" {
		return kind
	}
	switch obj.(type) {
	case *corev1.Service:
		return "Service"
	case *discoveryv1.EndpointSlice:
		return "EndpointSlice"
	}
	return fmt.Sprintf("%T", obj)
}

// watchGuest makes the guest's Service events reach the GuestIngresses that name them (and
// those whose fixed nodePorts another Service holds), through the ClusterCache's per-cluster
// cache: a reinstalled ingress controller, a changed nodePort or a freed nodePort is noticed
// at once. A change of the guest's cilium-config (the tunnel port, PortsDeclared) reaches
// every GuestIngress of the Cluster. The ClusterCache adds each watch once per connection.
func (r *Reconciler) watchGuest(ctx context.Context, s *scope) error {
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
	if err != nil {
		return err
	}
	return ports.WatchCiliumConfig(ctx, r.ClusterCache, key, ciliumConfigWatcher, r.controller, handler.EnqueueRequestsFromMapFunc(
		clusterscope.GuestToObjects(r.Client, key, func() client.ObjectList { return &guestnetv1.GuestIngressList{} })))
}

// --- apply --------------------------------------------------------------------------------------

// apply writes the plan: the withdrawal of the host objects, or the guest Service, the pool,
// the L2 policy and the host Service; then it reads what the status reports of the result
// (endpoints, ports declared). A write the apiserver refuses as invalid is recorded in the
// result (a condition), not returned.
func (r *Reconciler) apply(ctx context.Context, s *scope) error {
	o, p := s.observed, s.plan
	res := &ingress.Result{GuestService: o.GuestService, HostService: o.HostService, HeldGuestService: s.guestIngress.Status.GuestService}
	s.result = res
	if err := r.giveBackHeldGuestService(ctx, s); err != nil {
		return err
	}
	if p.TakesGuestService && res.HeldGuestService == nil {
		res.HeldGuestService = s.guestIngress.Spec.GuestService.DeepCopy()
	}
	if p.Withdraw {
		res.HostService = nil
		// What observeHost found (the host Service also past the cache, whose labels a tenant
		// may have stripped).
		return kerrors.NewAggregate([]error{
			r.deleteObject(ctx, s, o.HostService, corev1.EventTypeWarning, p.WithdrawReason, p.WithdrawMessage),
			r.deleteObject(ctx, s, o.Pool, corev1.EventTypeWarning, p.WithdrawReason, p.WithdrawMessage),
			r.deleteObject(ctx, s, o.L2Policy, corev1.EventTypeWarning, p.WithdrawReason, p.WithdrawMessage),
			r.deleteAnnouncers(ctx, s, corev1.EventTypeWarning, p.WithdrawReason, p.WithdrawMessage),
		})
	}
	if err := r.applyGuestService(ctx, s); err != nil {
		return err
	}
	if p.Host {
		if err := r.applyHostObjects(ctx, s); err != nil {
			return err
		}
	}
	if err := r.readEndpoints(ctx, s); err != nil {
		return err
	}
	if p.Refusal == nil && s.guestClient != nil {
		return r.assessPortsDeclared(ctx, s)
	}
	return nil
}

// giveBackHeldGuestService gives back the guest Service the plan releases (the one
// status.guestService names, which this GuestIngress no longer takes), restored and released
// as at deletion (releaseGuestService). It stays held while that cannot be done (the guest
// cannot be reached): nothing else is taken meanwhile.
func (r *Reconciler) giveBackHeldGuestService(ctx context.Context, s *scope) error {
	held := s.plan.ReleaseGuestService
	if held == nil || s.guestClient == nil {
		return nil
	}
	released, err := r.releaseGuestService(ctx, s, client.ObjectKey{Namespace: held.Namespace, Name: held.Name})
	if err != nil || !released {
		return err
	}
	s.result.HeldGuestService = nil
	return nil
}

// applyGuestService applies the guest Service's configuration unless it is up to date. The
// nodePorts of ports guestnet no longer fixes are given back first (giveBackDropped), and
// status.guestService names the Service before anything is written to it
// (storeGuestService).
func (r *Reconciler) applyGuestService(ctx context.Context, s *scope) error {
	gi, res, desired := s.guestIngress, s.result, s.plan.GuestService
	live := s.observed.GuestService
	if desired == nil || live == nil || !sameRef(res.HeldGuestService, gi.Spec.GuestService) {
		return nil // (not the Service this GuestIngress holds: the one it held is not given back yet)
	}
	if dropped := ingress.RestoreDropped(gi, live); len(dropped) > 0 {
		if err := r.storeGuestService(ctx, s); err != nil {
			return err
		}
		given, err := r.giveBackDropped(ctx, s, live)
		if err != nil || given == nil {
			return err // (gone: the guest Service watch brings the GuestIngress back)
		}
		live, res.GuestService = given, given
		if desired, _ = ingress.GuestService(gi, live); desired == nil {
			return nil
		}
	}
	if upToDate, err := ssa.ServiceUpToDate(desired, live); err != nil || upToDate {
		return err
	}
	if err := r.storeGuestService(ctx, s); err != nil {
		return err
	}
	key := client.ObjectKey{Namespace: *desired.Namespace, Name: *desired.Name}
	applied, err := ssa.ApplyService(ctx, s.guestClient, desired)
	switch {
	case ssa.IsNodePortAllocated(err):
		list := &corev1.ServiceList{}
		if err := s.guestClient.List(ctx, list); err != nil {
			return fmt.Errorf("listing Services in the guest: %w", err)
		}
		res.NodePortHeld, res.NodePortHolders, res.GuestRefused = true, ingress.NodePortHolders(gi, list.Items), ssa.APIErrorMessage(err)
		return nil
	case apierrors.IsInvalid(err):
		res.GuestRefused = ssa.APIErrorMessage(err)
		return nil
	case err != nil:
		return fmt.Errorf("applying Service %s in the guest: %w", key, err)
	}
	record.Written(ctx, r.recorder, gi, record.Write{Type: corev1.EventTypeNormal, Reason: eventApplied, Action: eventActionApply,
		Object: applied, Repair: repairKind(gi, metrics.RepairGuestService),
		Note: fmt.Sprintf("Applied type and fixed nodePorts to Service %s in the guest (field manager %s)", key, ownership.FieldManager)})
	res.GuestService = applied
	return nil
}

// giveBackDropped puts back, on the guest Service, the nodePorts the record keeps for ports
// guestnet no longer fixes (ingress.RestoreDropped), from the Service as the guest apiserver
// holds it (the cache may lag the record): the apply that follows drops them from guestnet's
// fields and from the record. It returns the Service as it is then, nil when it is gone.
func (r *Reconciler) giveBackDropped(ctx context.Context, s *scope, cached *corev1.Service) (*corev1.Service, error) {
	reader, err := r.ClusterCache.GetUncachedClient(ctx, client.ObjectKeyFromObject(s.cluster))
	if err != nil {
		return nil, err
	}
	key := client.ObjectKeyFromObject(cached)
	live := &corev1.Service{}
	if err := reader.Get(ctx, key, live); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	patches := ingress.RestoreDropped(s.guestIngress, live)
	if gone, err := r.giveBack(ctx, s.guestIngress, s.guestClient, live, patches); err != nil || gone {
		return nil, err
	}
	if err := reader.Get(ctx, key, live); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return live, nil
}

// storeGuestService stores status.guestService, the Service of spec.guestService, before
// guestnet first writes to it for this GuestIngress: a patch of that field alone, so that
// whatever happens next (a crash, a changed spec) the GuestIngress says which Service to give
// back. The deferred status patch then goes on from the stored version.
func (r *Reconciler) storeGuestService(ctx context.Context, s *scope) error {
	gi := s.guestIngress
	if sameRef(gi.Status.GuestService, gi.Spec.GuestService) {
		return nil
	}
	ref := gi.Spec.GuestService
	written := s.before.DeepCopy()
	written.Status.GuestService = ref.DeepCopy()
	if err := r.Client.Status().Patch(ctx, written, client.MergeFromWithOptions(s.before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("storing status.guestService: %w", err)
	}
	r.ownWrites.Replaced(client.ObjectKeyFromObject(gi), s.before.ResourceVersion)
	for _, obj := range []*guestnetv1.GuestIngress{s.before, gi} {
		obj.Status.GuestService = ref.DeepCopy()
		obj.ResourceVersion = written.ResourceVersion
	}
	ctrl.LoggerFrom(ctx).Info(fmt.Sprintf("Stored status.guestService %s/%s before writing to that Service in the guest", ref.Namespace, ref.Name),
		"reason", eventRecorded)
	return nil
}

// sameRef reports whether held names the guest Service ref.
func sameRef(held *guestnetv1.ObjectReference, ref guestnetv1.ObjectReference) bool {
	return held != nil && *held == ref
}

// applyHostObjects applies the pool and L2 policy (or deletes guestnet's when the spec no
// longer needs them) and the host Service (when its nodePorts are usable and the guest took
// the fixed ones), through ClusterIP when its class changes.
func (r *Reconciler) applyHostObjects(ctx context.Context, s *scope) (err error) {
	gi, o, p, res := s.guestIngress, s.observed, s.plan, s.result
	if err := r.ensureObject(ctx, s, p.Pool, o.Pool); err != nil {
		return err
	}
	if err := r.ensureObject(ctx, s, p.L2Policy, o.L2Policy); err != nil {
		return err
	}
	if err := r.applyAnnouncers(ctx, s); err != nil {
		return err
	}
	if p.HostService == nil || res.GuestRefused != "" || res.HostRejected != "" {
		return nil // the host Service keeps forwarding where it does
	}
	defer func() {
		if err == nil && res.HostRejected == "" {
			err = r.applyEndpointSlices(ctx, s)
		}
	}()
	for _, step := range []*corev1ac.ServiceApplyConfiguration{p.ReclassHostService, p.HostService} {
		if step == nil {
			continue
		}
		svc, applied, err := ssa.EnsureService(ctx, r.Client, step, res.HostService)
		if apierrors.IsInvalid(err) {
			res.HostRejected = fmt.Sprintf("The host apiserver refused Service %s/%s: %s", gi.Namespace, *step.Name, ssa.APIErrorMessage(err))
			return nil
		}
		if err != nil {
			return err
		}
		if applied {
			repair := repairKind(gi, metrics.RepairHostService)
			if !slices.Equal(gi.Status.Ports, p.Ports) {
				repair = "" // following nodePorts the guest changed is no repair
			}
			record.Written(ctx, r.recorder, gi, record.Write{Type: corev1.EventTypeNormal, Reason: eventApplied, Action: eventActionApply,
				Object: svc, Repair: repair,
				Note: fmt.Sprintf("Applied host Service %s (type %s, ports %s)", svc.Name, svc.Spec.Type, hostPorts(gi, ingress.NodePortMap(p.Ports)))})
		}
		res.HostService = svc
	}
	return nil
}

// ensureObject server-side applies desired (a Cilium or MetalLB object) unless live is up
// to date with it; with desired nil it deletes live (guestnet's object of that name), if any.
func (r *Reconciler) ensureObject(ctx context.Context, s *scope, desired, live *unstructured.Unstructured) error {
	if desired == nil {
		return r.deleteObject(ctx, s, live, corev1.EventTypeNormal, eventDeleted, "the spec no longer needs it")
	}
	if live != nil && ssa.ObjectUpToDate(desired, live) {
		return nil
	}
	applied := desired.DeepCopy()
	err := ssa.ApplyObject(ctx, r.Client, applied, ownership.FieldManager)
	if apierrors.IsInvalid(err) {
		s.result.HostRejected = fmt.Sprintf("The host apiserver refused %s %s: %s", desired.GetKind(), desired.GetName(), ssa.APIErrorMessage(err))
		return nil
	}
	if err != nil {
		return fmt.Errorf("applying %s %s: %w", desired.GetKind(), desired.GetName(), err)
	}
	kind := metrics.RepairAnnouncer
	switch desired.GroupVersionKind().GroupKind() {
	case ingress.PoolGVK.GroupKind():
		kind = metrics.RepairPool
	case ingress.L2PolicyGVK.GroupKind():
		kind = metrics.RepairL2Policy
	}
	record.Written(ctx, r.recorder, s.guestIngress, record.Write{Type: corev1.EventTypeNormal, Reason: eventApplied, Action: eventActionApply,
		Object: applied, Repair: repairKind(s.guestIngress, kind), Note: fmt.Sprintf("Applied %s %s", desired.GetKind(), desired.GetName())})
	return nil
}

func hostPorts(gi *guestnetv1.GuestIngress, nodePorts map[string]int32) string {
	parts := make([]string, len(gi.Spec.Ports))
	for i, p := range gi.Spec.Ports {
		parts[i] = fmt.Sprintf("%d->%d", p.Port, nodePorts[p.Name])
	}
	return strings.Join(parts, ", ")
}

// readEndpoints counts the ready worker endpoints behind the host Service, from the
// EndpointSlices kube-controller-manager keeps for it.
func (r *Reconciler) readEndpoints(ctx context.Context, s *scope) error {
	svc := s.result.HostService
	if svc == nil {
		return nil
	}
	slices := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, slices, client.InNamespace(svc.Namespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: svc.Name,
		ownership.ManagedByLabel:     ownership.ManagedByValue,
	}); err != nil {
		return err
	}
	s.result.ReadyEndpoints, s.result.TotalEndpoints = ingress.CountEndpoints(slices.Items)
	return nil
}

// assessPortsDeclared asks internal/ports whether the workers declare the nodePorts status.ports
// will report (the workerports controller is the one that declares them).
func (r *Reconciler) assessPortsDeclared(ctx context.Context, s *scope) error {
	gi := s.guestIngress.DeepCopy()
	gi.Status.Ports = ingress.StatusPorts(gi, s.plan, s.result.HostService)
	if err := ports.ReportPortsDeclared(ctx, r.Client, s.guestClient, s.cluster, gi, ports.ForGuestIngress(gi)); err != nil {
		return err
	}
	s.result.PortsDeclared = conditions.Get(gi, guestnetv1.PortsDeclaredCondition)
	return nil
}

// --- deletion -----------------------------------------------------------------------------

// reconcileDelete undoes what reconcileNormal did, then releases the object: it deletes the
// host Service, pool and policy guestnet created for this GuestIngress (nothing else), and
// hands the guest Service back (releaseGuestService). When the guest is gone for good (its
// Cluster or kubeconfig Secret is gone, clusterscope.GuestGone) or an admin gave up on it
// (SkipGuestCleanupAnnotation), the finalizer goes without the guest, and a Warning event says
// what was left there. Otherwise an unreachable guest is waited for: the ClusterCache's
// connect event, a Cluster or Secret event, or the annotation brings the object back.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	gi := s.guestIngress
	if err := r.deleteHostObjects(ctx, s, corev1.EventTypeNormal, eventDeleted, "the GuestIngress is being deleted"); err != nil {
		return ctrl.Result{}, err
	}
	s.hostDeleted = true

	leftBecause := ""
	if gi.Annotations[guestnetv1.SkipGuestCleanupAnnotation] == "true" {
		leftBecause = fmt.Sprintf("The annotation %s=true gives up on the guest", guestnetv1.SkipGuestCleanupAnnotation)
	} else {
		gone, why, err := clusterscope.GuestGone(ctx, r.APIReader, gi.Namespace, gi.Spec.ClusterName, s.cluster)
		if err != nil {
			return ctrl.Result{}, err
		}
		if gone {
			leftBecause = why
		} else if held, err := r.heldGuestService(ctx, s); err != nil {
			return ctrl.Result{}, err
		} else if held != nil {
			released, err := r.releaseGuestService(ctx, s, *held)
			if err != nil || !released {
				s.waitingForGuest = err == nil
				return ctrl.Result{}, err
			}
		}
	}
	if leftBecause != "" {
		record.Written(ctx, r.recorder, gi, record.Write{Type: corev1.EventTypeWarning, Reason: guestnetv1.GuestGoneReason, Action: eventActionDelete,
			Note: fmt.Sprintf("%s: guestnet released the GuestIngress without giving back what it changed in the guest. %s", leftBecause, ingress.LeftInGuest(gi))})
	}
	controllerutil.RemoveFinalizer(gi, guestnetv1.GuestIngressFinalizer)
	return ctrl.Result{}, nil
}

// heldGuestService is the guest Service a deletion gives back: the one status.guestService
// names. A GuestIngress without it (reconciled last by a guestnet that did not record it)
// gives back its spec's Service if it is the one that may write to it (no other GuestIngress
// of the Cluster owns or holds it); otherwise guestnet wrote nothing there for it. nil: none.
func (r *Reconciler) heldGuestService(ctx context.Context, s *scope) (*client.ObjectKey, error) {
	gi := s.guestIngress
	ref := gi.Status.GuestService
	if ref == nil {
		all, err := r.ofCluster(ctx, gi)
		if err != nil {
			return nil, err
		}
		// (A legacy case: whether the older ones could hold anything is not asked again.)
		notDeleting := func(other *guestnetv1.GuestIngress) bool { return other.DeletionTimestamp.IsZero() }
		if rivals := ingress.GuestServiceRivalsOf(gi, all, notDeleting); rivals.Owner != "" || rivals.Holder != "" {
			return nil, nil
		}
		ref = &gi.Spec.GuestService
	}
	return &client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, nil
}

// releaseGuestService hands the guest Service key back: first the values guestnet recorded
// before it changed them are patched back (ingress.Restore), then an apply of an empty
// configuration drops guestnet's ownership of what is left (and the record). A value that
// cannot be put back (its nodePort is taken by another Service by now) is reported in a
// Warning event and left as it is. The Service is read from the guest apiserver, not a cache:
// the record may have been written a moment ago. released is false while the guest cannot be
// reached.
func (r *Reconciler) releaseGuestService(ctx context.Context, s *scope, key client.ObjectKey) (bool, error) {
	gi := s.guestIngress
	if !clusterscope.IsProvisioned(s.cluster) {
		return true, nil // never provisioned: guestnet changed nothing in the guest
	}
	clusterKey := client.ObjectKeyFromObject(s.cluster)
	guestClient, err := r.ClusterCache.GetClient(ctx, clusterKey)
	if err == nil {
		s.guestErr = nil
		var reader client.Client
		if reader, err = r.ClusterCache.GetUncachedClient(ctx, clusterKey); err == nil {
			return r.restoreGuestService(ctx, gi, key, guestClient, reader)
		}
	}
	s.guestErr = err
	if errors.Is(err, clustercache.ErrClusterNotConnected) {
		return false, nil
	}
	return false, err
}

func (r *Reconciler) restoreGuestService(ctx context.Context, gi *guestnetv1.GuestIngress, key client.ObjectKey, guestClient, reader client.Client) (bool, error) {
	live := &corev1.Service{}
	if err := reader.Get(ctx, key, live); err != nil {
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	patches, _ := ingress.Restore(live)
	if gone, err := r.giveBack(ctx, gi, guestClient, live, patches); err != nil || gone {
		return gone, err
	}
	if len(patches) > 0 {
		if err := reader.Get(ctx, key, live); err != nil {
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		}
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
	record.Written(ctx, r.recorder, gi, record.Write{Type: corev1.EventTypeNormal, Reason: eventReleased, Action: eventActionApply,
		Object: live, Note: fmt.Sprintf("Gave back the fields guestnet applied to Service %s in the guest", key)})
	return true, nil
}

// giveBack applies patches (ingress.Restore, ingress.RestoreDropped) to the guest Service
// live, each recorded as an event. One that no longer applies (its nodePort is another
// Service's by now, or the Service changed since it was read) is reported in a Warning event
// and left as it is. gone: the Service no longer exists.
func (r *Reconciler) giveBack(ctx context.Context, gi *guestnetv1.GuestIngress, guestClient client.Client, live *corev1.Service, patches []ingress.RestorePatch) (gone bool, err error) {
	key := client.ObjectKeyFromObject(live)
	for _, patch := range patches {
		err := guestClient.Patch(ctx, live.DeepCopy(), client.RawPatch(types.JSONPatchType, patch.Patch), client.FieldOwner(ingress.RestoreFieldManager))
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case apierrors.IsInvalid(err) || apierrors.IsConflict(err) || apierrors.IsBadRequest(err):
			record.Written(ctx, r.recorder, gi, record.Write{Type: corev1.EventTypeWarning, Reason: eventRestored, Action: eventActionRestore,
				Object: live, Note: fmt.Sprintf("Could not give %s back to Service %s in the guest, left as it is: %s", patch.What, key, ssa.APIErrorMessage(err))})
		case err != nil:
			return false, fmt.Errorf("restoring %s of Service %s in the guest: %w", patch.What, key, err)
		default:
			record.Written(ctx, r.recorder, gi, record.Write{Type: corev1.EventTypeNormal, Reason: eventRestored, Action: eventActionRestore,
				Object: live, Note: fmt.Sprintf("Gave %s back to Service %s in the guest (what it had before guestnet changed it)", patch.What, key)})
		}
	}
	return false, nil
}

// deleteHostObjects deletes the host Service, pool and L2 policy guestnet created for the
// GuestIngress, if they exist, recording each deletion as an event of that type and reason
// that says why. It looks past the cache (at deletion, so that nothing is left behind).
func (r *Reconciler) deleteHostObjects(ctx context.Context, s *scope, eventType, reason, why string) error {
	gi := s.guestIngress
	return kerrors.NewAggregate([]error{
		r.deleteOwned(ctx, s, &corev1.Service{}, hostnames.HostService(gi), gi.Namespace, eventType, reason, why),
		r.deleteOwned(ctx, s, ingress.NewPool(), hostnames.Pool(gi), "", eventType, reason, why),
		r.deleteOwned(ctx, s, ingress.NewL2Policy(), hostnames.L2Policy(gi), "", eventType, reason, why),
		r.deleteAnnouncers(ctx, s, eventType, reason, why),
	})
}

// deleteOwned deletes the object of that kind (obj) and name if guestnet created it for the
// GuestIngress; anything else of that name is left alone. What the cache does not hold is
// read from the apiserver: the cache may not have seen an object created a moment ago, and
// holds only the Services that carry guestnet's label, which a tenant can strip.
func (r *Reconciler) deleteOwned(ctx context.Context, s *scope, obj client.Object, name, namespace string, eventType, reason, why string) error {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	err := r.Client.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, obj)
	}
	if optional.IsMissing(err) {
		return nil // a kind the host does not serve (Cilium not installed): nothing to delete
	}
	if err != nil {
		return client.IgnoreNotFound(err)
	}
	if !ownership.IsOwnedBy(obj, s.guestIngress) {
		return nil
	}
	return r.deleteObject(ctx, s, obj, eventType, reason, why)
}

// deleteObject deletes obj, a host object of the GuestIngress as read (nothing when it is nil
// or already being deleted), with a precondition on its UID, and records why.
func (r *Reconciler) deleteObject(ctx context.Context, s *scope, obj client.Object, eventType, reason, why string) error {
	if isNil(obj) || !obj.GetDeletionTimestamp().IsZero() {
		return nil
	}
	uid := obj.GetUID()
	if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil {
		return client.IgnoreNotFound(err)
	}
	record.Written(ctx, r.recorder, s.guestIngress, record.Write{Type: eventType, Reason: reason, Action: eventActionDelete,
		Object: obj, Note: fmt.Sprintf("Deleted %s %s: %s", kindOf(obj), client.ObjectKeyFromObject(obj), why)})
	return nil
}

// isNil reports whether obj is nil, also as a typed nil pointer in the interface.
func isNil(obj client.Object) bool {
	switch o := obj.(type) {
	case nil:
		return true
	case *corev1.Service:
		return o == nil
	case *unstructured.Unstructured:
		return o == nil
	}
	return false
}

// repairKind is kind when a write now puts back what someone else changed or deleted: the
// spec is the one the status was computed for, and that reconcile had built the chain
// (status.hostService), so guestnet's objects were then as it wants them. (A change of what
// a policy admits also counts: rare, and also not the tenant's doing.) Empty otherwise.
func repairKind(gi *guestnetv1.GuestIngress, kind metrics.RepairKind) metrics.RepairKind {
	if gi.Generation == gi.Status.ObservedGeneration && gi.Status.HostService != "" {
		return kind
	}
	return ""
}
