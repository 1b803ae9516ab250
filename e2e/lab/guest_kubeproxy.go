package lab

import (
	"context"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The guest kube-proxy stand-in does, inside the lab's worker VMs, what the guest's
// EndpointSlice controller and kube-proxy do there in production for NodePort Services (the
// lab's guest runs no controller manager and no kubelet, and its "VMs" are addresses of the
// lab namespace, see vmAddress). Written from kube-proxy's documented behaviour, not from
// guestnet's code:
//
//   - for every guest Node with an InternalIP (a worker's pod IP; the Node's VM address is
//     vmAddress(InternalIP)), and every guest Service of type NodePort or LoadBalancer, for
//     each TCP port with a nodePort, it listens on <VM address>:<nodePort> while the Service
//     has at least one ready endpoint: a guest Pod in the Service's namespace matched by its
//     selector, with status.podIP set and condition Ready=True, not terminating, that has
//     the port's targetPort (a number, or the name of one of the Pod's TCP containerPorts);
//   - it forwards each connection to one of those endpoints at <podIP>:<targetPort>, round
//     robin (kube-proxy picks at random; round robin lets a test see every endpoint), looked
//     up when the connection arrives. externalTrafficPolicy Local counts only the Pods whose
//     spec.nodeName is that Node. Without a ready endpoint it does not listen, so connections
//     are refused (kube-proxy rejects them too);
//   - a Service without a selector is not served (kube-proxy would use hand-written
//     EndpointSlices; the stand-in computes endpoints from selectors only). UDP/SCTP ports,
//     healthCheckNodePort and ClusterIPs (unreachable from the host anyway) are not served.
//
// A workload a test runs inside the VM itself (Worker.ServeInVM) may already hold the
// address: the stand-in then logs that it cannot bind and retries every few seconds, and the
// test's server keeps the port. Deleting a Node closes its listeners (its VM is gone).
// Reaching a nodePort from outside the VM still takes the masquerade stand-in, which forwards
// the worker's pod IP to the VM address for declared ports only.

// GuestKubeProxyStandIn is a running guest kube-proxy stand-in (NodePorts in every worker VM)
// for the lab's guest cluster. Stop it with Stop.
type GuestKubeProxyStandIn struct{ *standIn }

const guestKubeProxyStandInName = "guest-kube-proxy-stand-in"

// StartGuestKubeProxyStandIn starts the guest kube-proxy stand-in, watching the guest's
// Services, Pods and Nodes; it logs to <lab>/guest-kube-proxy-stand-in.log.
func StartGuestKubeProxyStandIn(ctx context.Context, l *Lab) (*GuestKubeProxyStandIn, error) {
	s, err := startStandIn(ctx, l, guestKubeProxyStandInName, l.Guest.Config, func(mgr ctrl.Manager, logger logr.Logger) (func(), error) {
		proxy := &guestNodePortStandIn{c: mgr.GetClient(), log: logger, listeners: map[string]*nodePortListener{}, blocked: map[string]string{}, next: map[string]int{}}
		// One reconcile computes every listener: any change of a Service, Pod or Node triggers it.
		everything := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "node-ports"}}}
		})
		if err := ctrl.NewControllerManagedBy(mgr).Named(guestKubeProxyStandInName).
			Watches(&corev1.Service{}, everything).
			Watches(&corev1.Pod{}, everything).
			Watches(&corev1.Node{}, everything).
			Complete(proxy); err != nil {
			return nil, err
		}
		return proxy.closeAll, nil
	})
	if err != nil {
		return nil, err
	}
	return &GuestKubeProxyStandIn{s}, nil
}

// nodePortTarget is what one nodePort listener serves: a Service port, on one Node.
type nodePortTarget struct {
	service  types.NamespacedName
	port     string // the Service port's name ("" for a single unnamed port)
	nodePort int32
	node     string
}

type nodePortListener struct {
	l      net.Listener
	target nodePortTarget
	wg     sync.WaitGroup
}

type guestNodePortStandIn struct {
	c   client.Client
	log klog.Logger

	mu        sync.Mutex
	listeners map[string]*nodePortListener // by <VM address>:<nodePort>
	blocked   map[string]string            // addresses that could not be bound, with the error
	next      map[string]int               // round robin, by listener address
}

// Reconcile opens and closes listeners so that exactly the wanted nodePorts are served.
func (r *guestNodePortStandIn) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	nodes := &corev1.NodeList{}
	if err := r.c.List(ctx, nodes); err != nil {
		return reconcile.Result{}, err
	}
	services := &corev1.ServiceList{}
	if err := r.c.List(ctx, services); err != nil {
		return reconcile.Result{}, err
	}
	pods := &corev1.PodList{}
	if err := r.c.List(ctx, pods); err != nil {
		return reconcile.Result{}, err
	}
	want := map[string]nodePortTarget{}
	for i := range nodes.Items {
		node := &nodes.Items[i]
		vm, err := vmAddress(nodeInternalIP(node))
		if err != nil {
			continue // not a lab worker
		}
		for j := range services.Items {
			svc := &services.Items[j]
			if svc.Spec.Type != corev1.ServiceTypeNodePort && svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
				continue
			}
			for _, sp := range svc.Spec.Ports {
				if sp.NodePort == 0 || (sp.Protocol != "" && sp.Protocol != corev1.ProtocolTCP) {
					continue
				}
				if len(nodePortEndpoints(svc, sp, node.Name, pods.Items)) == 0 {
					continue
				}
				want[net.JoinHostPort(vm, strconv.Itoa(int(sp.NodePort)))] = nodePortTarget{
					service: client.ObjectKeyFromObject(svc), port: sp.Name, nodePort: sp.NodePort, node: node.Name,
				}
			}
		}
	}
	if blocked := r.serve(want); blocked > 0 {
		// A server of the test's own holds the address; take it when it is free again.
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	return reconcile.Result{}, nil
}

// serve makes the stand-in listen on exactly the addresses of want; it returns how many of
// them it could not bind.
func (r *guestNodePortStandIn) serve(want map[string]nodePortTarget) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, pl := range r.listeners {
		if target, ok := want[addr]; !ok || target != pl.target {
			r.closeLocked(addr)
		}
	}
	for addr := range r.blocked {
		if _, ok := want[addr]; !ok {
			delete(r.blocked, addr)
		}
	}
	blocked := 0
	for _, addr := range slices.Sorted(maps.Keys(want)) {
		if _, ok := r.listeners[addr]; ok {
			continue
		}
		target := want[addr]
		l, err := net.Listen("tcp", addr)
		if err != nil {
			blocked++
			if r.blocked[addr] != err.Error() {
				r.log.Info("Cannot listen on the nodePort, retrying; a server in the VM may hold it", "address", addr, "service", target.service, "node", target.node, "error", err.Error())
				r.blocked[addr] = err.Error()
			}
			continue
		}
		delete(r.blocked, addr)
		pl := &nodePortListener{l: l, target: target}
		r.listeners[addr] = pl
		pl.wg.Go(func() { r.accept(addr, pl) })
		r.log.Info("Forwarding nodePort", "address", addr, "service", target.service, "port", target.port, "node", target.node)
	}
	return blocked
}

func (r *guestNodePortStandIn) closeLocked(addr string) {
	if pl, ok := r.listeners[addr]; ok {
		_ = pl.l.Close()
		delete(r.listeners, addr)
		r.log.Info("Stopped forwarding nodePort", "address", addr, "service", pl.target.service, "node", pl.target.node)
	}
}

func (r *guestNodePortStandIn) closeAll() {
	r.mu.Lock()
	var all []*nodePortListener
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
func (r *guestNodePortStandIn) accept(addr string, pl *nodePortListener) {
	serveForwardWith(pl.l, func(ctx context.Context) (net.Conn, error) {
		target := r.pick(ctx, addr, pl.target)
		if target == "" {
			return nil, errNoEndpoint
		}
		out, err := dialTCP(target)(ctx)
		if err != nil {
			r.log.Info("Endpoint refused", "address", addr, "service", pl.target.service, "endpoint", target, "error", err.Error())
		}
		return out, err
	})
}

func (r *guestNodePortStandIn) pick(ctx context.Context, addr string, t nodePortTarget) string {
	svc := &corev1.Service{}
	if err := r.c.Get(ctx, t.service, svc); err != nil {
		return ""
	}
	pods := &corev1.PodList{}
	if err := r.c.List(ctx, pods, client.InNamespace(svc.Namespace)); err != nil {
		return ""
	}
	for _, sp := range svc.Spec.Ports {
		if sp.Name != t.port || sp.NodePort != t.nodePort {
			continue
		}
		eps := nodePortEndpoints(svc, sp, t.node, pods.Items)
		if len(eps) == 0 {
			return ""
		}
		r.mu.Lock()
		i := r.next[addr] % len(eps)
		r.next[addr]++
		r.mu.Unlock()
		return eps[i]
	}
	return ""
}

// nodePortEndpoints returns "<podIP>:<targetPort>" of the Service port's ready endpoints, as
// the EndpointSlice controller would list them and kube-proxy would use them on node.
func nodePortEndpoints(svc *corev1.Service, sp corev1.ServicePort, node string, pods []corev1.Pod) []string {
	if len(svc.Spec.Selector) == 0 {
		return nil
	}
	selector := labels.SelectorFromSet(svc.Spec.Selector)
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	var out []string
	for i := range pods {
		pod := &pods[i]
		if pod.Namespace != svc.Namespace || !selector.Matches(labels.Set(pod.Labels)) || !podServing(pod) {
			continue
		}
		if local && pod.Spec.NodeName != node {
			continue
		}
		if port := podTargetPort(pod, sp); port != 0 {
			out = append(out, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(port))))
		}
	}
	slices.Sort(out)
	return out
}

// podServing: the Pod has an IP, is Ready and is not terminating.
func podServing(pod *corev1.Pod) bool {
	if pod.Status.PodIP == "" || !pod.DeletionTimestamp.IsZero() ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podTargetPort resolves the Service port's targetPort for pod: a number as is (the Service
// port when unset), a name through the Pod's TCP containerPorts; 0 when the Pod has no such
// port.
func podTargetPort(pod *corev1.Pod, sp corev1.ServicePort) int32 {
	switch {
	case sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal == 0:
		return sp.Port
	case sp.TargetPort.Type == intstr.Int:
		return sp.TargetPort.IntVal
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == sp.TargetPort.StrVal && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
				return p.ContainerPort
			}
		}
	}
	return 0
}

func nodeInternalIP(node *corev1.Node) string {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}
