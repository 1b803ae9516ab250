package lab

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
// kube-proxy too. Of Cilium, only LB-IPAM runs for real; the datapath needs a kernel. The
// played parts are written from Cilium's and kube-proxy's documented behaviour,
// independently of guestnet's code (sharing guestnet's selector matching would hide
// guestnet's mistakes):
//
//   - LB-IPAM is real: the Cilium operator's lbipam cell (github.com/cilium/cilium, the
//     release of the lab's Cilium CRDs), built by the Makefile as cilium-lbipam
//     (hack/tools/lbipam) and run as a process against the host apiserver. It gives
//     LoadBalancer Services their IPs (status.loadBalancer.ingress), sets
//     cilium.io/IPAMRequestSatisfied on them and cilium.io/PoolConflict (and the IP counts) on
//     the pools; its log is <lab>/cilium-lbipam.log.
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
	ciliumL2PolicyGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2alpha1", Kind: "CiliumL2AnnouncementPolicy"}
)

const (
	ciliumServiceNamespaceKey  = "io.kubernetes.service.namespace"
	ciliumServiceNameKey       = "io.kubernetes.service.name"
	ciliumL2AnnouncerClass     = "io.cilium/l2-announcer"
	ciliumBGPControlPlaneClass = "io.cilium/bgp-control-plane"
	standInFieldOwner          = "cilium-stand-in"
)

// CiliumStandIn is the lab's Cilium for the host cluster: the real LB-IPAM and the stand-in
// of L2 announcement and kube-proxy (load-balancer IPs and ClusterIPs). Stop it with Stop.
type CiliumStandIn struct {
	*standIn
	lbipam *process
}

// StartCiliumStandIn starts the real LB-IPAM and the stand-in for every namespace of the host
// cluster; they log to <lab>/cilium-lbipam.log and <lab>/cilium-stand-in.log.
func StartCiliumStandIn(ctx context.Context, l *Lab) (*CiliumStandIn, error) {
	lbipam, err := startLBIPAM(ctx, l)
	if err != nil {
		return nil, err
	}
	s, err := startStandIn(ctx, l, standInFieldOwner, l.Host.Config, func(mgr ctrl.Manager, logger logr.Logger) (func(), error) {
		c := mgr.GetClient()
		allServices := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return loadBalancerServiceRequests(ctx, c)
		})

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
		lbipam.stop()
		return nil, err
	}
	return &CiliumStandIn{standIn: s, lbipam: lbipam}, nil
}

// Stop stops the stand-in (closing its listeners) and LB-IPAM. What LB-IPAM wrote stays, as
// when Cilium's operator restarts.
func (s *CiliumStandIn) Stop() {
	s.standIn.Stop()
	s.lbipam.stop()
}

// startLBIPAM runs the real LB-IPAM against the host apiserver and waits until it watches
// the pools (it stays dormant, allocating nothing, while there is none).
func startLBIPAM(ctx context.Context, l *Lab) (*process, error) {
	bin, err := findFile(l.Assets.binDirs, "cilium-lbipam")
	if err != nil {
		return nil, err
	}
	p, err := startProcess(l.Dir, "cilium-lbipam", bin,
		"--k8s-kubeconfig-path="+l.Host.KubeconfigPath)
	if err != nil {
		return nil, err
	}
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.waitReady(readyCtx, func(context.Context) error {
		if log, _ := os.ReadFile(p.logPath); !bytes.Contains(log, []byte("LB-IPAM initializing")) {
			return fmt.Errorf("LB-IPAM has not started")
		}
		return nil
	}); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
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
	return selectorMatches(raw, ciliumServiceLabels(svc))
}

// ciliumServiceLabels are the labels Cilium matches a Service selector against: the Service's
// own and the pseudo-labels of its namespace and name, set last so that no label of the
// Service hides them (serviceLabelSet in v1.20.2's pkg/bgp/manager/reconciler/service.go;
// LB-IPAM and the L2 announcer add them the same way).
func ciliumServiceLabels(svc *corev1.Service) labels.Set {
	set := labels.Set{}
	for k, v := range svc.Labels {
		set[k] = v
	}
	set[ciliumServiceNamespaceKey], set[ciliumServiceNameKey] = svc.Namespace, svc.Name
	return set
}

func selectorMatches(raw map[string]any, set labels.Set) bool {
	ls := &metav1.LabelSelector{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, ls); err != nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	return err == nil && sel.Matches(set)
}

func firstIngressIP(svc *corev1.Service) string {
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			return in.IP
		}
	}
	return ""
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
		port, _ := strconv.ParseInt(portStr, 10, 32)
		pl := &proxyListener{l: l, service: key, port: int32(port)}
		r.listeners[addr] = pl
		pl.wg.Go(func() { r.accept(pl) })
		serving = append(serving, addr)
		r.log.Info("Forwarding", "address", addr, "service", key)
	}
	r.byService[key] = serving
	if len(errs) > 0 {
		return fmt.Errorf("the Cilium stand-in: %v", errs)
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
