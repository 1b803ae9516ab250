package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The Cilium stand-in does, in the lab's host cluster, what Cilium does there in production
// for Services: Cilium replaces kube-proxy on the host, so the stand-in is the lab's host
// kube-proxy too; no Cilium runs in the lab. It is written from Cilium's and kube-proxy's
// documented behaviour, independently of guestnet's code (sharing guestnet's selector
// matching would hide guestnet's mistakes):
//
//   - LB-IPAM stand-in: gives each LoadBalancer Service of Cilium's classes an IP from the
//     CiliumLoadBalancerIPPools whose serviceSelector selects it (labels plus the
//     io.kubernetes.service.{namespace,name} pseudo-labels), the one requested with the
//     lbipam.cilium.io/ips annotation if any, in status.loadBalancer.ingress, and sets the
//     Service condition cilium.io/IPAMRequestSatisfied. A pool that overlaps an older one is
//     marked cilium.io/PoolConflict=True and allocates nothing.
//   - L2 announcement + kube-proxy stand-in: for each Service whose IP a
//     CiliumL2AnnouncementPolicy announces (serviceSelector, loadBalancerIPs: true, a
//     nodeSelector that matches a host node), it listens on IP:port and forwards each
//     connection to a ready endpoint of the Service's EndpointSlices (kept by the real
//     kube-controller-manager) at <pod IP>:<targetPort>, round robin (kube-proxy picks at
//     random; round robin lets a test see every endpoint). With no ready endpoint it does not
//     listen, so connections are refused, as with kube-proxy. Only IPs in LoadBalancerCIDR are
//     bound (local in the lab namespace); interfaces regexes are not evaluated (the lab has lo).
//   - kube-proxy stand-in for ClusterIPs: for every host Service (any type) whose ClusterIP is
//     in HostServiceCIDR (local in the lab namespace) and that has a ready endpoint, it listens
//     on ClusterIP:port for each TCP port and forwards exactly as for load-balancer IPs (round
//     robin over the ready endpoints, looked up for each connection, the target port being
//     the EndpointSlice port of the Service port's name). A Service without ready endpoints
//     (no selector and no hand-written EndpointSlice, or a selector that selects nothing) is
//     not served: connections are refused, and a test may serve on its ClusterIP itself.
//     Headless and ExternalName Services have no ClusterIP. The L2 policies play no part.

// Cilium names the stand-in honours.
var (
	ciliumPoolGVK     = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumLoadBalancerIPPool"}
	ciliumL2PolicyGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2alpha1", Kind: "CiliumL2AnnouncementPolicy"}
)

const (
	ciliumIPsAnnotation        = "lbipam.cilium.io/ips"
	ciliumIPAMCondition        = "cilium.io/IPAMRequestSatisfied"
	ciliumPoolConflict         = "cilium.io/PoolConflict"
	ciliumServiceNamespaceKey  = "io.kubernetes.service.namespace"
	ciliumServiceNameKey       = "io.kubernetes.service.name"
	ciliumL2AnnouncerClass     = "io.cilium/l2-announcer"
	ciliumBGPControlPlaneClass = "io.cilium/bgp-control-plane"
	standInFieldOwner          = "cilium-stand-in"
)

// CiliumStandIn is a running Cilium stand-in (LB-IPAM, L2 announcement, kube-proxy for
// load-balancer IPs and ClusterIPs) for the lab's host cluster. Stop it with Stop.
type CiliumStandIn struct{ *standIn }

// StartCiliumStandIn starts the Cilium stand-in for every namespace of the host cluster; it
// logs to <lab>/cilium-stand-in.log.
func StartCiliumStandIn(ctx context.Context, l *Lab) (*CiliumStandIn, error) {
	s, err := startStandIn(ctx, l, standInFieldOwner, l.Host.Config, func(mgr ctrl.Manager, logger logr.Logger) (func(), error) {
		c := mgr.GetClient()
		allServices := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return loadBalancerServiceRequests(ctx, c)
		})

		if err := ctrl.NewControllerManagedBy(mgr).Named("pool-conflict-stand-in").
			Watches(newUnstructured(ciliumPoolGVK), handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "all-pools"}}}
			})).
			Complete(reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				return reconcile.Result{}, markPoolConflicts(ctx, c)
			})); err != nil {
			return nil, err
		}
		if err := ctrl.NewControllerManagedBy(mgr).Named("lbipam-stand-in").
			For(&corev1.Service{}).
			Watches(newUnstructured(ciliumPoolGVK), allServices).
			Complete(&ipamStandIn{c: c}); err != nil {
			return nil, err
		}
		proxy := &proxyStandIn{c: c, log: logger, listeners: map[string]*proxyListener{}, byService: map[types.NamespacedName][]string{}, next: map[types.NamespacedName]int{}}
		if err := ctrl.NewControllerManagedBy(mgr).Named("l2-kube-proxy-stand-in").
			For(&corev1.Service{}).
			Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				if name := o.GetLabels()[discoveryv1.LabelServiceName]; name != "" {
					return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
				}
				return nil
			})).
			Watches(newUnstructured(ciliumL2PolicyGVK), allServices).
			Watches(&corev1.Node{}, allServices).
			Complete(proxy); err != nil {
			return nil, err
		}
		return proxy.closeAll, nil
	})
	if err != nil {
		return nil, err
	}
	return &CiliumStandIn{s}, nil
}

func newUnstructured(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

func newUnstructuredList(gvk schema.GroupVersionKind) *unstructured.UnstructuredList {
	u := &unstructured.UnstructuredList{}
	u.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	return u
}

// isCiliumLoadBalancer reports whether Cilium handles the Service: type LoadBalancer with no
// class or one of Cilium's.
func isCiliumLoadBalancer(svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	class := ptr.Deref(svc.Spec.LoadBalancerClass, "")
	return class == "" || class == ciliumL2AnnouncerClass || class == ciliumBGPControlPlaneClass
}

func loadBalancerServiceRequests(ctx context.Context, c client.Reader) []reconcile.Request {
	list := &corev1.ServiceList{}
	if err := c.List(ctx, list); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if list.Items[i].Spec.Type == corev1.ServiceTypeLoadBalancer {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// serviceSelected evaluates a Cilium serviceSelector (as stored in a pool's or policy's spec)
// against a Service, with Cilium's pseudo-labels for the Service's namespace and name. No
// selector selects every Service.
func serviceSelected(obj *unstructured.Unstructured, svc *corev1.Service) bool {
	raw, found, _ := unstructured.NestedMap(obj.Object, "spec", "serviceSelector")
	if !found {
		return true
	}
	set := labels.Set{ciliumServiceNamespaceKey: svc.Namespace, ciliumServiceNameKey: svc.Name}
	for k, v := range svc.Labels {
		set[k] = v
	}
	return selectorMatches(raw, set)
}

func selectorMatches(raw map[string]any, set labels.Set) bool {
	ls := &metav1.LabelSelector{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, ls); err != nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	return err == nil && sel.Matches(set)
}

// --- pools --------------------------------------------------------------------------------

type labPool struct {
	obj      *unstructured.Unstructured
	prefixes []netip.Prefix
}

func (p labPool) conflicting() bool {
	conds, _, _ := unstructured.NestedSlice(p.obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == ciliumPoolConflict && m["status"] == string(metav1.ConditionTrue) {
			return true
		}
	}
	return false
}

func (p labPool) disabled() bool {
	d, _, _ := unstructured.NestedBool(p.obj.Object, "spec", "disabled")
	return d
}

// listPools returns every pool, oldest first, with its blocks parsed.
func listPools(ctx context.Context, c client.Reader) ([]labPool, error) {
	list := newUnstructuredList(ciliumPoolGVK)
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	pools := make([]labPool, 0, len(list.Items))
	for i := range list.Items {
		p := labPool{obj: &list.Items[i]}
		blocks, _, _ := unstructured.NestedSlice(p.obj.Object, "spec", "blocks")
		for _, b := range blocks {
			m, _ := b.(map[string]any)
			if cidr, _ := m["cidr"].(string); cidr != "" {
				if prefix, err := netip.ParsePrefix(cidr); err == nil {
					p.prefixes = append(p.prefixes, prefix.Masked())
				}
			}
		}
		pools = append(pools, p)
	}
	slices.SortFunc(pools, func(a, b labPool) int {
		if c := a.obj.GetCreationTimestamp().Compare(b.obj.GetCreationTimestamp().Time); c != 0 {
			return c
		}
		return strings.Compare(a.obj.GetName(), b.obj.GetName())
	})
	return pools, nil
}

// markPoolConflicts sets cilium.io/PoolConflict on every pool: True on a pool that overlaps
// an older pool without conflict, False otherwise.
func markPoolConflicts(ctx context.Context, c client.Client) error {
	pools, err := listPools(ctx, c)
	if err != nil {
		return err
	}
	var kept []labPool
	for _, p := range pools {
		var with string
		for _, k := range kept {
			if slices.ContainsFunc(p.prefixes, func(a netip.Prefix) bool { return slices.ContainsFunc(k.prefixes, a.Overlaps) }) {
				with = k.obj.GetName()
				break
			}
		}
		cond := metav1.Condition{Type: ciliumPoolConflict, Status: metav1.ConditionFalse, Reason: "resolved", Message: ""}
		if with != "" {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "cidr_overlap", fmt.Sprintf("Pool overlaps with CIDRs of pool %s", with)
		} else {
			kept = append(kept, p)
		}
		if err := setUnstructuredCondition(ctx, c, p.obj, cond); err != nil {
			return err
		}
	}
	return nil
}

func setUnstructuredCondition(ctx context.Context, c client.Client, obj *unstructured.Unstructured, cond metav1.Condition) error {
	var conds []metav1.Condition
	raw, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, r := range raw {
		var existing metav1.Condition
		if m, ok := r.(map[string]any); ok && runtime.DefaultUnstructuredConverter.FromUnstructured(m, &existing) == nil {
			conds = append(conds, existing)
		}
	}
	cond.ObservedGeneration = obj.GetGeneration()
	if !meta.SetStatusCondition(&conds, cond) {
		return nil
	}
	out := make([]any, len(conds))
	for i := range conds {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&conds[i])
		if err != nil {
			return err
		}
		out[i] = m
	}
	updated := obj.DeepCopy()
	if err := unstructured.SetNestedSlice(updated.Object, out, "status", "conditions"); err != nil {
		return err
	}
	return client.IgnoreNotFound(c.Status().Update(ctx, updated))
}

// --- LB-IPAM stand-in ---------------------------------------------------------------------

type ipamStandIn struct{ c client.Client }

func (r *ipamStandIn) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	svc := &corev1.Service{}
	if err := r.c.Get(ctx, req.NamespacedName, svc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !isCiliumLoadBalancer(svc) || !svc.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	pools, err := listPools(ctx, r.c)
	if err != nil {
		return reconcile.Result{}, err
	}
	var eligible []labPool
	for _, p := range pools {
		if !p.conflicting() && !p.disabled() && serviceSelected(p.obj, svc) {
			eligible = append(eligible, p)
		}
	}
	inEligible := func(ip netip.Addr) bool {
		return slices.ContainsFunc(eligible, func(p labPool) bool {
			return slices.ContainsFunc(p.prefixes, func(pr netip.Prefix) bool { return pr.Contains(ip) })
		})
	}
	used, err := usedIPs(ctx, r.c, svc)
	if err != nil {
		return reconcile.Result{}, err
	}

	var requested netip.Addr
	if v := strings.TrimSpace(strings.Split(svc.Annotations[ciliumIPsAnnotation], ",")[0]); v != "" {
		requested, _ = netip.ParseAddr(v)
	}
	current, _ := netip.ParseAddr(firstIngressIP(svc))

	var ip netip.Addr
	cond := metav1.Condition{Type: ciliumIPAMCondition, Status: metav1.ConditionFalse}
	switch {
	case current.IsValid() && inEligible(current) && (!requested.IsValid() || requested == current):
		ip = current
	case len(eligible) == 0:
		cond.Reason, cond.Message = "no_pool", "There are no enabled CiliumLoadBalancerIPPools that match this service"
	case requested.IsValid() && !inEligible(requested):
		cond.Reason, cond.Message = "no_pool", fmt.Sprintf("No pool that selects this service contains the requested IP %s", requested)
	case requested.IsValid() && used[requested]:
		cond.Reason, cond.Message = "already_allocated", fmt.Sprintf("The IP %s is already allocated to another service", requested)
	case requested.IsValid():
		ip = requested
	default:
		ip = firstFree(eligible, used)
		if !ip.IsValid() {
			cond.Reason, cond.Message = "out_of_ips", "All pools that select this service are exhausted"
		}
	}
	updated := svc.DeepCopy()
	updated.Status.LoadBalancer.Ingress = nil
	if ip.IsValid() {
		updated.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "satisfied", ""
	}
	cond.ObservedGeneration = svc.Generation
	meta.SetStatusCondition(&updated.Status.Conditions, cond)
	if equality.Semantic.DeepEqual(updated.Status, svc.Status) {
		return reconcile.Result{}, nil
	}
	err = r.c.Status().Update(ctx, updated)
	if apierrors.IsConflict(err) {
		return reconcile.Result{Requeue: true}, nil
	}
	return reconcile.Result{}, client.IgnoreNotFound(err)
}

// usedIPs are the load-balancer IPs of every Service but svc.
func usedIPs(ctx context.Context, c client.Reader, svc *corev1.Service) (map[netip.Addr]bool, error) {
	list := &corev1.ServiceList{}
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	used := map[netip.Addr]bool{}
	for i := range list.Items {
		o := &list.Items[i]
		if o.Namespace == svc.Namespace && o.Name == svc.Name {
			continue
		}
		if ip, err := netip.ParseAddr(firstIngressIP(o)); err == nil {
			used[ip] = true
		}
	}
	return used, nil
}

func firstIngressIP(svc *corev1.Service) string {
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			return in.IP
		}
	}
	return ""
}

// firstFree is the first IP of the pools (oldest pool first) that is not used.
func firstFree(pools []labPool, used map[netip.Addr]bool) netip.Addr {
	for _, p := range pools {
		for _, prefix := range p.prefixes {
			for ip, n := prefix.Addr(), 0; prefix.Contains(ip) && n < 1<<16; ip, n = ip.Next(), n+1 {
				if !used[ip] {
					return ip
				}
			}
		}
	}
	return netip.Addr{}
}

// --- L2 announcement + kube-proxy stand-in (load-balancer IPs and ClusterIPs) ---------------

type proxyStandIn struct {
	c   client.Client
	log interface{ Info(string, ...any) }

	mu        sync.Mutex
	listeners map[string]*proxyListener         // by ip:port
	byService map[types.NamespacedName][]string // addresses each Service is served on
	next      map[types.NamespacedName]int      // round robin
}

type proxyListener struct {
	l       net.Listener
	service types.NamespacedName
	port    int32
	wg      sync.WaitGroup
}

func (r *proxyStandIn) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var want []string
	svc := &corev1.Service{}
	err := r.c.Get(ctx, req.NamespacedName, svc)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return reconcile.Result{}, err
	default:
		var ips []netip.Addr
		if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil && netip.MustParsePrefix(HostServiceCIDR).Contains(ip) {
			ips = append(ips, ip) // kube-proxy stand-in
		}
		announced, err := r.announced(ctx, svc)
		if err != nil {
			return reconcile.Result{}, err
		}
		if ip, _ := netip.ParseAddr(firstIngressIP(svc)); announced && ip.IsValid() && netip.MustParsePrefix(LoadBalancerCIDR).Contains(ip) {
			ips = append(ips, ip) // L2 announcement stand-in
		}
		if len(ips) > 0 {
			eps, err := r.readyEndpoints(ctx, svc, 0)
			if err != nil {
				return reconcile.Result{}, err
			}
			if len(eps) > 0 {
				for _, ip := range ips {
					for _, p := range svc.Spec.Ports {
						if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
							want = append(want, net.JoinHostPort(ip.String(), strconv.Itoa(int(p.Port))))
						}
					}
				}
			}
		}
	}
	return reconcile.Result{}, r.serve(req.NamespacedName, want)
}

// announced reports whether an L2 announcement policy announces the Service's IP: it selects
// the Service, announces load-balancer IPs and selects at least one host node.
func (r *proxyStandIn) announced(ctx context.Context, svc *corev1.Service) (bool, error) {
	if !isCiliumLoadBalancer(svc) {
		return false, nil
	}
	policies := newUnstructuredList(ciliumL2PolicyGVK)
	if err := r.c.List(ctx, policies); err != nil {
		return false, err
	}
	nodes := &corev1.NodeList{}
	if err := r.c.List(ctx, nodes); err != nil {
		return false, err
	}
	for i := range policies.Items {
		p := &policies.Items[i]
		if lbIPs, _, _ := unstructured.NestedBool(p.Object, "spec", "loadBalancerIPs"); !lbIPs || !serviceSelected(p, svc) {
			continue
		}
		nodeSel, found, _ := unstructured.NestedMap(p.Object, "spec", "nodeSelector")
		if !found {
			return len(nodes.Items) > 0, nil
		}
		for _, n := range nodes.Items {
			if selectorMatches(nodeSel, n.Labels) {
				return true, nil
			}
		}
	}
	return false, nil
}

// readyEndpoints returns "<ip>:<port>" of the Service's ready endpoints for the Service port
// numbered port (any port's when 0), from its EndpointSlices.
func (r *proxyStandIn) readyEndpoints(ctx context.Context, svc *corev1.Service, port int32) ([]string, error) {
	portName := ""
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			portName = p.Name
		}
	}
	list := &discoveryv1.EndpointSliceList{}
	if err := r.c.List(ctx, list, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range list.Items {
		var target int32
		for _, p := range s.Ports {
			if port == 0 || ptr.Deref(p.Name, "") == portName {
				target = ptr.Deref(p.Port, 0)
				break
			}
		}
		if target == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if ptr.Deref(e.Conditions.Ready, true) && len(e.Addresses) > 0 {
				out = append(out, net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(target))))
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// serve makes the Service listen on exactly the addresses want.
func (r *proxyStandIn) serve(key types.NamespacedName, want []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, addr := range r.byService[key] {
		if pl, ok := r.listeners[addr]; ok && pl.service == key && !slices.Contains(want, addr) {
			r.closeLocked(addr) // not when the address has moved to another Service since
		}
	}
	var errs []error
	var serving []string
	for _, addr := range want {
		if pl, ok := r.listeners[addr]; ok {
			if pl.service == key {
				serving = append(serving, addr)
				continue
			}
			r.closeLocked(addr) // the IP moved to another Service
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		_, portStr, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(portStr)
		pl := &proxyListener{l: l, service: key, port: int32(port)}
		r.listeners[addr] = pl
		pl.wg.Go(func() { r.accept(pl) })
		serving = append(serving, addr)
		r.log.Info("Forwarding", "address", addr, "service", key)
	}
	r.byService[key] = serving
	if len(errs) > 0 {
		return fmt.Errorf("Cilium stand-in: %v", errs)
	}
	return nil
}

func (r *proxyStandIn) closeLocked(addr string) {
	if pl, ok := r.listeners[addr]; ok {
		_ = pl.l.Close()
		delete(r.listeners, addr)
		r.log.Info("Stopped forwarding", "address", addr, "service", pl.service)
	}
}

func (r *proxyStandIn) closeAll() {
	r.mu.Lock()
	var all []*proxyListener
	for addr, pl := range r.listeners {
		_ = pl.l.Close()
		all = append(all, pl)
		delete(r.listeners, addr)
	}
	r.mu.Unlock()
	for _, pl := range all {
		pl.wg.Wait()
	}
}

// accept forwards each connection to the next ready endpoint, looked up when it arrives.
func (r *proxyStandIn) accept(pl *proxyListener) {
	serveForwardWith(pl.l, func(ctx context.Context) (net.Conn, error) {
		target := r.pick(ctx, pl)
		if target == "" {
			return nil, errNoEndpoint
		}
		out, err := dialTCP(target)(ctx)
		if err != nil {
			r.log.Info("Endpoint refused", "service", pl.service, "endpoint", target, "error", err.Error())
		}
		return out, err
	})
}

func (r *proxyStandIn) pick(ctx context.Context, pl *proxyListener) string {
	svc := &corev1.Service{}
	if err := r.c.Get(ctx, pl.service, svc); err != nil {
		return ""
	}
	eps, err := r.readyEndpoints(ctx, svc, pl.port)
	if err != nil || len(eps) == 0 {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.next[pl.service] % len(eps)
	r.next[pl.service]++
	return eps[i]
}
