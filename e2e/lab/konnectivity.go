package lab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The guest flavour with konnectivity (Options.Konnectivity), set up as k0smotron, Kamaji and
// HyperShift ship it, with the real konnectivity server and agents
// (sigs.k8s.io/apiserver-network-proxy, built by the Makefile):
//
//   - the konnectivity server runs next to the guest apiserver (the hosted control plane's
//     pod): the apiserver reaches it over a unix socket, named in its egress selector
//     configuration (`cluster` egress through konnectivity over gRPC; `controlplane` and
//     `etcd` direct); the server accepts agents on GuestAPIServerAddress:KonnectivityAgentPort
//     (k0s's port), with a serving certificate of a CA of its own, and authenticates them by
//     their ServiceAccount token (kube-system/konnectivity-agent, audience
//     system:konnectivity-server; TokenReview against the guest apiserver), as k0s does;
//   - a konnectivity agent runs in each worker VM given one (StartKonnectivityAgent), in a
//     network namespace of its own that stands in for the VM's host network (the agent's
//     DaemonSet runs with hostNetwork): the server's address is reached through a forwarder
//     (the VM's NAT to the host network in production), and the guest's ClusterIPs through
//     the VM's kube-proxy, played by a ClusterIP stand-in in that namespace (below). Nothing
//     else is reachable from it: the agent reaches guest Services, not pod or node addresses;
//   - the agent's Pod in the guest (kube-system, k8s-app=konnectivity-agent, on the worker's
//     Node, hostNetwork), with the status its kubelet would report for a DaemonSet Pod with a
//     liveness probe and no readiness probe (k0s's and the Kubernetes docs' DaemonSet): Ready
//     while the agent process runs, connected to the server or not; once it exits, not Ready
//     with its container waiting in CrashLoopBackOff.
//
// Nothing binds a wildcard address: the server's agent port is bound on the apiserver's
// address, its health and admin ports on konnectivityServerLocalAddress; the agent's health
// and admin ports on 127.0.0.1 of its own namespace.

// Konnectivity names and ports, as k0s deploys it.
const (
	KonnectivityAgentPort           = 8132
	KonnectivityAudience            = "system:konnectivity-server"
	KonnectivityNamespace           = "kube-system"
	KonnectivityAgentServiceAccount = "konnectivity-agent"
	KonnectivityAgentLabel          = "k8s-app"
	KonnectivityAgentLabelValue     = "konnectivity-agent"
	// KonnectivityVersion is the release the Makefile builds (KONNECTIVITY_VERSION).
	KonnectivityVersion = "v0.36.0"

	// The server's health (/healthz, /readyz) and admin ports, on a loopback address of
	// their own; the agent's, inside its namespace.
	konnectivityServerLocalAddress = "127.0.20.1"
	konnectivityServerHealthPort   = 8092
	konnectivityServerAdminPort    = 8133
	konnectivityAgentHealthPort    = 8093
	konnectivityAgentAdminPort     = 8094
)

// KonnectivityAssets are konnectivity's server and agent, built by the Makefile
// (hack/tools/konnectivity).
type KonnectivityAssets struct {
	Server, Agent string
}

// LookupKonnectivity finds the konnectivity binaries in GUESTNET_LAB_BIN.
func (a *Assets) LookupKonnectivity() (*KonnectivityAssets, error) {
	k := &KonnectivityAssets{}
	var err error
	if k.Server, err = findFile(a.binDirs, "konnectivity-server"); err != nil {
		return nil, err
	}
	if k.Agent, err = findFile(a.binDirs, "konnectivity-agent"); err != nil {
		return nil, err
	}
	return k, nil
}

// KonnectivityServer is the konnectivity server of the lab's guest (Options.Konnectivity).
type KonnectivityServer struct {
	// Socket is the unix socket the guest apiserver's `cluster` egress dials.
	Socket string
	// Dir holds its certificates, the agents' tokens and the logs.
	Dir string

	assets *KonnectivityAssets
	ca     *CA
	proc   *process
}

func konnectivityDir(labDir string) string { return filepath.Join(labDir, "konnectivity") }

// writeEgressSelectorConfig writes the guest apiserver's egress selector configuration
// (apiserver.k8s.io/v1beta1, as k0s writes it): `cluster` egress through the konnectivity
// server's unix socket, `controlplane` and `etcd` direct. It returns the file's path.
func writeEgressSelectorConfig(labDir string) (string, error) {
	dir := konnectivityDir(labDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	config := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: GRPC
    transport:
      uds:
        udsName: %s
- name: controlplane
  connection:
    proxyProtocol: Direct
- name: etcd
  connection:
    proxyProtocol: Direct
`, konnectivitySocket(labDir))
	path := filepath.Join(dir, "egress-selector-configuration.yaml")
	return path, os.WriteFile(path, []byte(config), 0o600)
}

func konnectivitySocket(labDir string) string {
	return filepath.Join(konnectivityDir(labDir), "konnectivity-server.socket")
}

// startKonnectivityServer starts the server next to the running guest apiserver and waits
// until it serves; the lab stops it.
func (l *Lab) startKonnectivityServer(ctx context.Context) (err error) {
	assets, err := l.Assets.LookupKonnectivity()
	if err != nil {
		return err
	}
	s := &KonnectivityServer{Socket: konnectivitySocket(l.Dir), Dir: konnectivityDir(l.Dir), assets: assets}
	if s.ca, err = NewCA("konnectivity-ca"); err != nil {
		return err
	}
	if err := s.ca.WriteFiles(s.Dir, "ca"); err != nil {
		return err
	}
	if err := s.ca.IssueFiles(s.Dir, "server", CertRequest{
		CommonName: "konnectivity-server", IPs: []net.IP{net.ParseIP(GuestAPIServerAddress)}, Server: true,
	}); err != nil {
		return err
	}
	// The agents' identity, which the server checks by TokenReview.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: KonnectivityNamespace, Name: KonnectivityAgentServiceAccount}}
	if err := l.Guest.Client.Create(ctx, sa); client.IgnoreAlreadyExists(err) != nil {
		return fmt.Errorf("creating ServiceAccount %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	p := func(name string) string { return filepath.Join(s.Dir, name) }
	s.proc, err = startProcess(s.Dir, "konnectivity-server", assets.Server,
		"--mode=grpc",
		"--uds-name="+s.Socket,
		"--delete-existing-uds-file=true",
		"--server-port=0",
		"--agent-port="+strconv.Itoa(KonnectivityAgentPort),
		"--agent-bind-address="+GuestAPIServerAddress,
		"--admin-port="+strconv.Itoa(konnectivityServerAdminPort),
		"--admin-bind-address="+konnectivityServerLocalAddress,
		"--health-port="+strconv.Itoa(konnectivityServerHealthPort),
		"--health-bind-address="+konnectivityServerLocalAddress,
		"--cluster-cert="+p("server.crt"),
		"--cluster-key="+p("server.key"),
		"--agent-namespace="+KonnectivityNamespace,
		"--agent-service-account="+KonnectivityAgentServiceAccount,
		"--authentication-audience="+KonnectivityAudience,
		"--kubeconfig="+l.Guest.KubeconfigPath,
		"--server-id=konnectivity-server-0",
		"--server-count=1",
	)
	if err != nil {
		return err
	}
	l.Konnectivity = s
	l.onStop(s.proc.stop)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return s.proc.waitReady(ctx, func(ctx context.Context) error {
		if err := httpOK(ctx, http.DefaultClient, s.healthURL("/healthz")); err != nil {
			return err
		}
		_, err := os.Stat(s.Socket)
		return err
	})
}

func (s *KonnectivityServer) healthURL(path string) string {
	return "http://" + hostPort(konnectivityServerLocalAddress, konnectivityServerHealthPort) + path
}

// Ready reports the server's own readiness (/readyz): an error, with the server's reason
// ("no connection to any proxy agent"), until an agent is connected.
func (s *KonnectivityServer) Ready(ctx context.Context) error {
	return httpOK(ctx, http.DefaultClient, s.healthURL("/readyz"))
}

// LogPath is the server's log.
func (s *KonnectivityServer) LogPath() string { return s.proc.logPath }

// KonnectivityAgent is the konnectivity agent of one worker VM and its Pod in the guest.
type KonnectivityAgent struct {
	Worker *Worker
	// Pod is the agent's guest Pod (kube-system).
	Pod types.NamespacedName

	l         *Lab
	netns     *podNetns
	kubeProxy *standIn
	token     string

	mu       sync.Mutex
	proc     *process
	restarts int32
	exited   chan struct{} // closed once the Pod reports the current process's exit
	egress   net.Listener  // the VM's path to the server (CutOff, Reconnect)
}

// CutOff cuts the VM's path to the konnectivity server (its connections, and new ones are
// refused), as a broken Service or load balancer in front of the hosted control plane's
// agent port does: the agent keeps running, retrying, and its Pod stays Ready.
func (a *KonnectivityAgent) CutOff() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.egress != nil {
		_ = a.egress.Close()
		a.egress = nil
	}
}

// Reconnect restores the VM's path to the konnectivity server; the agent connects again
// within its retry interval (up to 10 s, --sync-interval-cap).
func (a *KonnectivityAgent) Reconnect() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.egress != nil {
		return nil
	}
	server := hostPort(GuestAPIServerAddress, KonnectivityAgentPort)
	var egress net.Listener
	if err := a.netns.do(func() (err error) { egress, err = net.Listen("tcp", server); return err }); err != nil {
		return fmt.Errorf("agent network namespace of %s: forwarder to the konnectivity server: %w", a.Worker.Machine, err)
	}
	a.egress = egress
	a.netns.track(egress)
	a.netns.wg.Go(func() { serveForwardWith(egress, dialTCP(server)) })
	return nil
}

// StartKonnectivityAgent runs a konnectivity agent in worker w's VM (Options.Konnectivity),
// creates its Pod in the guest and waits until the agent is connected to the server.
func (l *Lab) StartKonnectivityAgent(ctx context.Context, w *Worker) (_ *KonnectivityAgent, err error) {
	if l.Konnectivity == nil {
		return nil, errors.New("the lab runs without konnectivity (Options.Konnectivity)")
	}
	a := &KonnectivityAgent{Worker: w, l: l,
		Pod: types.NamespacedName{Namespace: KonnectivityNamespace, Name: "konnectivity-agent-" + w.Machine}}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	if a.netns, err = newPodNetnsTo(l.Konnectivity.Dir, w.Machine); err != nil {
		return nil, err
	}
	// The VM's view: the server's address (the hosted control plane, a host pod IP) is
	// reached through the VM's NAT, the guest's ClusterIPs through its kube-proxy.
	for _, args := range [][]string{
		{"ip", "addr", "add", GuestAPIServerAddress + "/32", "dev", "lo"},
		{"ip", "route", "add", "local", GuestServiceCIDR, "dev", "lo", "table", "local"},
		{"ip", "route", "add", "local", vmAddressCIDR, "dev", "lo", "table", "local"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + a.netns.path, "--"}, args...)...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("agent network namespace of %s: %s: %w: %s", w.Machine, args, err, out)
		}
	}
	if err := a.Reconnect(); err != nil {
		return nil, err
	}
	if a.kubeProxy, err = startVMClusterIPStandIn(ctx, l, w.Machine, a.netns); err != nil {
		return nil, err
	}
	if a.token, err = l.konnectivityAgentToken(ctx, w.Machine); err != nil {
		return nil, err
	}
	if err := l.createKonnectivityAgentPod(ctx, a); err != nil {
		return nil, err
	}
	l.onStop(a.close)
	if err := a.Start(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// konnectivityAgentToken requests the agent's ServiceAccount token (audience
// system:konnectivity-server, as its projected volume asks) and writes it to a file.
func (l *Lab) konnectivityAgentToken(ctx context.Context, machine string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: KonnectivityNamespace, Name: KonnectivityAgentServiceAccount}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{KonnectivityAudience}, ExpirationSeconds: ptr.To[int64](24 * 3600),
	}}
	if err := l.Guest.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	path := filepath.Join(l.Konnectivity.Dir, "agent-"+machine+".token")
	return path, os.WriteFile(path, []byte(tr.Status.Token), 0o600)
}

// createKonnectivityAgentPod creates the agent's Pod as its DaemonSet would (no kubelet
// writes its status yet: Start and the process's exit do).
func (l *Lab) createKonnectivityAgentPod(ctx context.Context, a *KonnectivityAgent) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: a.Pod.Namespace, Name: a.Pod.Name,
			Labels: map[string]string{KonnectivityAgentLabel: KonnectivityAgentLabelValue}},
		Spec: corev1.PodSpec{
			NodeName:           a.Worker.Machine,
			HostNetwork:        true,
			ServiceAccountName: KonnectivityAgentServiceAccount,
			Containers: []corev1.Container{{
				Name: "konnectivity-agent", Image: "registry.k8s.io/kas-network-proxy/proxy-agent:" + KonnectivityVersion,
				LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Host: "127.0.0.1", Path: "/healthz", Port: intstr.FromInt32(konnectivityAgentHealthPort),
				}}},
			}},
		},
	}
	if err := l.Guest.Client.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating guest Pod %s: %w", a.Pod, err)
	}
	return nil
}

// Start starts the agent process (again) and waits until it is connected to the server
// (its /readyz); its Pod turns Ready, as its kubelet reports a running container.
func (a *KonnectivityAgent) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil && a.proc.exited() == nil {
		return nil
	}
	k := a.l.Konnectivity
	bin, args := a.netns.command(k.assets.Agent,
		"--proxy-server-host="+GuestAPIServerAddress,
		"--proxy-server-port="+strconv.Itoa(KonnectivityAgentPort),
		"--ca-cert="+filepath.Join(k.Dir, "ca.crt"),
		"--service-account-token-path="+a.token,
		"--agent-id="+a.Worker.Machine,
		"--agent-identifiers=host="+a.Worker.IP,
		"--health-server-host=127.0.0.1",
		"--health-server-port="+strconv.Itoa(konnectivityAgentHealthPort),
		"--admin-bind-address=127.0.0.1",
		"--admin-server-port="+strconv.Itoa(konnectivityAgentAdminPort),
	)
	name := "konnectivity-agent-" + a.Worker.Machine
	if a.proc != nil {
		a.restarts++
		name += "-" + strconv.Itoa(int(a.restarts))
	}
	proc, err := startProcess(k.Dir, name, bin, args...)
	if err != nil {
		return err
	}
	a.proc, a.exited = proc, make(chan struct{})
	if err := a.setPodStatus(ctx, true); err != nil {
		return err
	}
	// The exit is reported whenever it comes, long after Start's ctx.
	go a.reportExit(context.WithoutCancel(ctx), proc, a.exited)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return proc.waitReady(ctx, a.connected)
}

// Stop stops the agent process; once it returns, the Pod reports the container's exit.
func (a *KonnectivityAgent) Stop() {
	a.mu.Lock()
	proc, exited := a.proc, a.exited
	a.mu.Unlock()
	if proc == nil {
		return
	}
	proc.stop()
	<-exited
}

// reportExit sets the Pod not Ready once proc exits, as the kubelet does when the container
// of a DaemonSet Pod exits (restartPolicy Always: it waits in CrashLoopBackOff).
func (a *KonnectivityAgent) reportExit(ctx context.Context, proc *process, exited chan struct{}) {
	defer close(exited)
	<-proc.done
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = a.setPodStatus(ctx, false) // the lab may be stopping: nobody reads it then
}

// connected asks the agent's /readyz (inside its namespace): ready once it holds a
// connection to a server.
func (a *KonnectivityAgent) connected(ctx context.Context) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		return a.netns.dial(ctx, addr)
	}}}
	defer hc.CloseIdleConnections()
	return httpOK(ctx, hc, "http://"+hostPort("127.0.0.1", konnectivityAgentHealthPort)+"/readyz")
}

// Connected reports whether the agent holds a connection to the server (its /readyz).
func (a *KonnectivityAgent) Connected(ctx context.Context) error { return a.connected(ctx) }

func (a *KonnectivityAgent) setPodStatus(ctx context.Context, running bool) error {
	c := a.l.Guest.Client
	pod := &corev1.Pod{}
	if err := c.Get(ctx, a.Pod, pod); err != nil {
		return fmt.Errorf("reading guest Pod %s: %w", a.Pod, err)
	}
	now := metav1.Now()
	ready := corev1.ConditionFalse
	cs := corev1.ContainerStatus{Name: "konnectivity-agent", Image: pod.Spec.Containers[0].Image, RestartCount: a.restarts}
	if running {
		ready = corev1.ConditionTrue
		cs.Ready, cs.Started = true, ptr.To(true)
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
	} else {
		cs.Started = ptr.To(false)
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: "back-off restarting failed container konnectivity-agent"}
		cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: now}
	}
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: a.Worker.IP, PodIP: a.Worker.IP, PodIPs: []corev1.PodIP{{IP: a.Worker.IP}}, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: ready, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{cs},
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("setting status of guest Pod %s: %w", a.Pod, err)
	}
	return nil
}

// close stops the agent, its VM's ClusterIP stand-in and its namespace.
func (a *KonnectivityAgent) close() {
	a.mu.Lock()
	proc := a.proc
	a.mu.Unlock()
	proc.stop()
	if a.kubeProxy != nil {
		a.kubeProxy.Stop()
	}
	if a.netns != nil {
		a.netns.close()
	}
}

// vmAddressCIDR holds the workers' VM addresses (vmAddress), where the guest's Pods serve.
const vmAddressCIDR = "10.244.128.0/17"

// The VM's kube-proxy for ClusterIPs, and its pod network, in an agent's namespace:
//   - for each guest Service with a selector and a ClusterIP, and each of its TCP ports, it
//     listens on <ClusterIP>:<port> inside the namespace while the Service has a ready
//     endpoint (a Ready guest Pod it selects, with the port's targetPort, as
//     guestKubeProxyStandIn counts them) and forwards each connection to one of them, round
//     robin, dialed from the lab namespace (where the guest's Pods serve). Services without a
//     selector and other protocols are not served;
//   - for each ready endpoint of a guest EndpointSlice at a VM address (a guest Pod), it
//     listens on that address and port inside the namespace and forwards to the same address
//     in the lab namespace, as the pod network routes a Pod IP (what the apiserver's service
//     proxy dials).
func startVMClusterIPStandIn(ctx context.Context, l *Lab, machine string, ns *podNetns) (*standIn, error) {
	name := "vm-kube-proxy-stand-in-" + machine
	return startStandIn(ctx, l, name, l.Guest.Config, func(mgr ctrl.Manager, logger logr.Logger) (func(), error) {
		r := &vmClusterIPStandIn{c: mgr.GetClient(), log: logger, ns: ns, listeners: map[string]*clusterIPListener{}}
		everything := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "cluster-ips"}}}
		})
		if err := ctrl.NewControllerManagedBy(mgr).Named(name).
			Watches(&corev1.Service{}, everything).
			Watches(&corev1.Pod{}, everything).
			Watches(&discoveryv1.EndpointSlice{}, everything).
			Complete(r); err != nil {
			return nil, err
		}
		return r.closeAll, nil
	})
}

type clusterIPTarget struct {
	service types.NamespacedName
	port    string
	// podAddress, for a Pod's address: forwarded as is.
	podAddress string
}

type clusterIPListener struct {
	l      net.Listener
	target clusterIPTarget
}

type vmClusterIPStandIn struct {
	c   client.Client
	log klog.Logger
	ns  *podNetns

	mu        sync.Mutex
	listeners map[string]*clusterIPListener // by <ClusterIP>:<port>
	next      int
	wg        sync.WaitGroup
}

func (r *vmClusterIPStandIn) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	services := &corev1.ServiceList{}
	if err := r.c.List(ctx, services); err != nil {
		return reconcile.Result{}, err
	}
	pods := &corev1.PodList{}
	if err := r.c.List(ctx, pods); err != nil {
		return reconcile.Result{}, err
	}
	want := map[string]clusterIPTarget{}
	for i := range services.Items {
		svc := &services.Items[i]
		if ip := net.ParseIP(svc.Spec.ClusterIP); ip == nil || !mustParseCIDR(GuestServiceCIDR).Contains(ip) {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			if (sp.Protocol != "" && sp.Protocol != corev1.ProtocolTCP) || len(clusterIPEndpoints(svc, sp, pods.Items)) == 0 {
				continue
			}
			want[hostPort(svc.Spec.ClusterIP, int(sp.Port))] = clusterIPTarget{service: client.ObjectKeyFromObject(svc), port: sp.Name}
		}
	}
	endpointSlices := &discoveryv1.EndpointSliceList{}
	if err := r.c.List(ctx, endpointSlices); err != nil {
		return reconcile.Result{}, err
	}
	for _, es := range endpointSlices.Items {
		for _, ep := range es.Endpoints {
			if !ptr.Deref(ep.Conditions.Ready, true) {
				continue
			}
			for _, addr := range ep.Addresses {
				if ip := net.ParseIP(addr); ip == nil || !mustParseCIDR(vmAddressCIDR).Contains(ip) {
					continue
				}
				for _, p := range es.Ports {
					if p.Port != nil && ptr.Deref(p.Protocol, corev1.ProtocolTCP) == corev1.ProtocolTCP {
						a := hostPort(addr, int(*p.Port))
						want[a] = clusterIPTarget{podAddress: a}
					}
				}
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, cl := range r.listeners {
		if target, ok := want[addr]; !ok || target != cl.target {
			_ = cl.l.Close()
			delete(r.listeners, addr)
		}
	}
	for _, addr := range slices.Sorted(maps.Keys(want)) {
		if _, ok := r.listeners[addr]; ok {
			continue
		}
		var ln net.Listener
		if err := r.ns.do(func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
			return reconcile.Result{}, fmt.Errorf("listening on ClusterIP %s: %w", addr, err)
		}
		cl := &clusterIPListener{l: ln, target: want[addr]}
		r.listeners[addr] = cl
		r.wg.Go(func() {
			serveForwardWith(ln, func(ctx context.Context) (net.Conn, error) {
				target := cl.target.podAddress
				if target == "" {
					target = r.pick(ctx, cl.target)
				}
				if target == "" {
					return nil, errNoEndpoint
				}
				return dialTCP(target)(ctx)
			})
		})
		r.log.Info("Serving", "address", addr, "service", cl.target.service, "port", cl.target.port)
	}
	return reconcile.Result{}, nil
}

func (r *vmClusterIPStandIn) pick(ctx context.Context, t clusterIPTarget) string {
	svc := &corev1.Service{}
	if err := r.c.Get(ctx, t.service, svc); err != nil {
		return ""
	}
	pods := &corev1.PodList{}
	if err := r.c.List(ctx, pods, client.InNamespace(svc.Namespace)); err != nil {
		return ""
	}
	for _, sp := range svc.Spec.Ports {
		if sp.Name != t.port {
			continue
		}
		eps := clusterIPEndpoints(svc, sp, pods.Items)
		if len(eps) == 0 {
			return ""
		}
		r.mu.Lock()
		r.next++
		i := r.next % len(eps)
		r.mu.Unlock()
		return eps[i]
	}
	return ""
}

// clusterIPEndpoints are the ready endpoints of a Service port for its ClusterIP: every
// selected Pod, wherever it runs.
func clusterIPEndpoints(svc *corev1.Service, sp corev1.ServicePort, pods []corev1.Pod) []string {
	cluster := svc.DeepCopy()
	cluster.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	return nodePortEndpoints(cluster, sp, "", pods)
}

func (r *vmClusterIPStandIn) closeAll() {
	r.mu.Lock()
	for addr, cl := range r.listeners {
		_ = cl.l.Close()
		delete(r.listeners, addr)
	}
	r.mu.Unlock()
	r.wg.Wait()
}
