package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The guest's service datapath on the kernel workers: the real kube-proxy per VM, and guest
// pods as network namespaces inside the VM.
//
//	VM namespace (the guest node's host network)             guest pod namespace
//	eth0 10.0.2.2 (fd10:0:2::2)                               eth0 10.245.X.Y/32 (fd00:10:245:X::Y/128)
//	lxcingress 10.245.X.254/32 (fd00:10:245:X::fe/128) <- veth ->  default via 10.245.X.254
//	route 10.245.X.Y dev lxcingress; forwarding on
//	kube-proxy v1.37.2, nftables mode: tables ip/ip6 kube-proxy
//
// The pod is wired as Cilium wires one (a veth per pod, a /32 route to it, the node's router
// address on the node's side), one guest pod per VM: 10.245.X.Y is the pod of the VM whose pod
// IP is 10.244.X.Y, in the guest pod CIDR 10.245.0.0/16.

// GuestKubeProxy is the real kube-proxy (k8s.io/kubernetes v1.37.2, cmd/kube-proxy) running
// in one worker VM. Stop it with Stop; its tables stay, as when kube-proxy exits.
type GuestKubeProxy struct {
	p *process
	w *Worker
}

// GuestKubeProxyOptions tune StartGuestKubeProxy.
type GuestKubeProxyOptions struct {
	// NodePortAddresses is --nodeport-addresses; "all" when empty (see StartGuestKubeProxy).
	NodePortAddresses string
}

// StartGuestKubeProxy runs the real kube-proxy in the kernel worker w's VM, in nftables
// mode, as the guest Node named after w's machine (--hostname-override), against the guest
// apiserver with the lab's admin kubeconfig (reached through KubeVirt's masquerade, as a
// node's kube-proxy reaches its control plane). Its health and metrics servers listen on the
// VM's 127.0.0.1. It leaves conntrack's limits and timeouts alone (they are the machine's).
// --nodeport-addresses defaults to "all": nftables mode's own default, "primary", accepts
// nodePorts only at the Node's InternalIP, and behind KubeVirt's masquerade they arrive at
// 10.0.2.2 (docs/client-source-ip.md). Its log is <lab>/guest-kube-proxy-<machine>.log.
func (l *Lab) StartGuestKubeProxy(ctx context.Context, w *Worker, opts GuestKubeProxyOptions) (*GuestKubeProxy, error) {
	if w.kernel == nil {
		return nil, errNotKernel
	}
	bin, err := findFile(l.Assets.binDirs, "kube-proxy")
	if err != nil {
		return nil, err
	}
	npa := opts.NodePortAddresses
	if npa == "" {
		npa = "all"
	}
	clusterCIDR := GuestPodCIDR
	if w.IPv6() != "" {
		clusterCIDR += "," + GuestPodCIDR6
	}
	nsenter, argv := w.kernel.vm.command(bin,
		"--proxy-mode=nftables",
		"--hostname-override="+w.Machine,
		"--kubeconfig="+l.Guest.KubeconfigPath,
		"--nodeport-addresses="+npa,
		"--cluster-cidr="+clusterCIDR,
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--healthz-bind-address=127.0.0.1:10256",
		"--metrics-bind-address=127.0.0.1:10249",
		"--oom-score-adj=0",
	)
	p, err := startCommand(l.Dir, "guest-kube-proxy-"+w.Machine, exec.Command(nsenter, argv...))
	if err != nil {
		return nil, err
	}
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.waitReady(readyCtx, func(ctx context.Context) error {
		conn, err := w.DialFromVM(ctx, "tcp", "127.0.0.1:10256")
		if err != nil {
			return err
		}
		_ = conn.Close()
		if _, err := w.kernel.vm.run("nft", "list", "table", "ip", "kube-proxy"); err != nil {
			return err
		}
		return nil
	}); err != nil {
		p.stop()
		return nil, fmt.Errorf("kube-proxy in %s: %w\n%s", w.Machine, err, p.logTail())
	}
	gkp := &GuestKubeProxy{p: p, w: w}
	l.onStop(gkp.Stop)
	return gkp, nil
}

// Stop stops kube-proxy.
func (k *GuestKubeProxy) Stop() { k.p.stop() }

// Guest pod addresses of the lab.
const (
	// GuestPodCIDR and GuestPodCIDR6 are the guest's pod CIDRs (the guest tunnel stand-in's
	// overlay addresses are in the first too).
	GuestPodCIDR  = "10.245.0.0/16"
	GuestPodCIDR6 = "fd00:10:245::/48"
	// ingressVeth is the VM's end of the ingress stand-in's veth.
	ingressVeth = "lxcingress"
)

// IngressStandInOptions say what guest objects an ingress stand-in has.
type IngressStandInOptions struct {
	// Namespace and Name of its guest Pod; Labels its labels (the guest Service's selector).
	Namespace, Name string
	Labels          map[string]string
	// Service is the guest Service (in Namespace, existing) whose EndpointSlices the lab
	// writes for the pod, as the guest's EndpointSlice controller would.
	Service string
	// Port is the container port it serves HTTP on, named "http".
	Port int32
}

// IngressStandIn is a guest ingress controller's pod on a kernel worker's VM: a network
// namespace in the VM with a guest pod IP, serving HTTP that answers each request with the
// client address it saw (the remote address of its TCP connection), as an access log would
// record it. Its guest Pod (on the worker's Node, Running, Ready) and the Service's
// EndpointSlices naming it are written by the lab (no kubelet or controller manager runs in
// the guest).
type IngressStandIn struct {
	// PodIP and PodIPv6 are its guest pod addresses (PodIPv6 on dual-stack workers).
	PodIP, PodIPv6 string

	l       *Lab
	w       *Worker
	opts    IngressStandInOptions
	ns      *netNamespace
	servers []*http.Server
	once    sync.Once
}

// StartIngressStandIn starts an ingress stand-in in w's VM (a kernel worker) with its guest
// Pod and EndpointSlices.
func (l *Lab) StartIngressStandIn(ctx context.Context, w *Worker, opts IngressStandInOptions) (_ *IngressStandIn, err error) {
	if w.kernel == nil {
		return nil, errNotKernel
	}
	svc := &corev1.Service{}
	if err := l.Guest.Client.Get(ctx, client.ObjectKey{Namespace: opts.Namespace, Name: opts.Service}, svc); err != nil {
		return nil, fmt.Errorf("the ingress stand-in's guest Service: %w", err)
	}
	ip4 := net.ParseIP(w.IP).To4()
	s := &IngressStandIn{l: l, w: w, opts: opts, PodIP: fmt.Sprintf("10.245.%d.%d", ip4[2], ip4[3])}
	router := fmt.Sprintf("10.245.%d.254", ip4[2])
	var router6 string
	if w.IPv6() != "" {
		s.PodIPv6, router6 = fmt.Sprintf("fd00:10:245:%d::%d", ip4[2], ip4[3]), fmt.Sprintf("fd00:10:245:%d::fe", ip4[2])
	}
	if s.ns, err = newNetNamespace(filepath.Join(l.Dir, "kernel"), strings.ReplaceAll(w.IP, ".", "-")+"-ingress"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	vmCmds := []string{
		"link add " + ingressVeth + " type veth peer name eth0 netns " + s.ns.path,
		"addr add " + router + "/32 dev " + ingressVeth,
		"link set " + ingressVeth + " up",
		"route add " + s.PodIP + "/32 dev " + ingressVeth,
	}
	podCmds := []string{
		"addr add " + s.PodIP + "/32 dev eth0",
		"link set eth0 up",
		"route add " + router + " dev eth0",
		"route add default via " + router,
	}
	sysctls := []string{"ipv4/ip_forward"}
	if router6 != "" {
		vmCmds = append(vmCmds, "addr add "+router6+"/128 dev "+ingressVeth+" nodad", "route add "+s.PodIPv6+"/128 dev "+ingressVeth)
		podCmds = append(podCmds, "addr add "+s.PodIPv6+"/128 dev eth0 nodad", "route add "+router6+" dev eth0", "route add ::/0 via "+router6)
		sysctls = append(sysctls, "ipv6/conf/all/forwarding")
	}
	if err := w.kernel.vm.ip(vmCmds...); err != nil {
		return nil, err
	}
	if err := w.kernel.vm.sysctl("1", sysctls...); err != nil {
		return nil, err
	}
	if err := s.ns.ip(podCmds...); err != nil {
		return nil, err
	}
	for _, ip := range []string{s.PodIP, s.PodIPv6} {
		if ip == "" {
			continue
		}
		var ln net.Listener
		if err := s.ns.do(func() (err error) {
			ln, err = net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(int(opts.Port))))
			return err
		}); err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: http.HandlerFunc(answerSourceSeen), ReadHeaderTimeout: 5 * time.Second}
		s.servers = append(s.servers, srv)
		go func() { _ = srv.Serve(ln) }()
	}
	if err := s.writeGuestObjects(ctx, svc); err != nil {
		return nil, err
	}
	l.onStop(s.stop)
	return s, nil
}

// answerSourceSeen answers with the client address of the request's connection.
func answerSourceSeen(rw http.ResponseWriter, r *http.Request) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(rw, host) //nolint:gosec // plain text: an IP address the kernel reported, not input
}

// writeGuestObjects writes the guest Pod (Running, Ready, on the worker's Node) and, per IP
// family, an EndpointSlice of the Service naming it.
func (s *IngressStandIn) writeGuestObjects(ctx context.Context, svc *corev1.Service) error {
	c := s.l.Guest.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.opts.Namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.opts.Name, Labels: s.opts.Labels},
		Spec: corev1.PodSpec{
			NodeName: s.w.Machine,
			Containers: []corev1.Container{{
				Name: "ingress", Image: "lab.guestnet.dev/ingress-stand-in",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: s.opts.Port, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	if err := c.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating the ingress stand-in's guest Pod: %w", err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: s.PodIP, PodIPs: []corev1.PodIP{{IP: s.PodIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
	}
	if s.PodIPv6 != "" {
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: s.PodIPv6})
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("setting the ingress stand-in's Pod status: %w", err)
	}
	var ports []discoveryv1.EndpointPort
	for _, sp := range svc.Spec.Ports {
		if port := podTargetPort(pod, sp); port != 0 {
			ports = append(ports, discoveryv1.EndpointPort{Name: ptr.To(sp.Name), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)})
		}
	}
	for _, e := range []struct {
		family discoveryv1.AddressType
		ip     string
	}{{discoveryv1.AddressTypeIPv4, s.PodIP}, {discoveryv1.AddressTypeIPv6, s.PodIPv6}} {
		if e.ip == "" {
			continue
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: s.opts.Namespace, Name: s.opts.Name + "-" + strings.ToLower(string(e.family)),
				Labels: map[string]string{
					discoveryv1.LabelServiceName: svc.Name,
					discoveryv1.LabelManagedBy:   "ingress-stand-in.lab.guestnet.dev",
				},
			},
			AddressType: e.family,
			Ports:       ports,
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{e.ip},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				NodeName:   ptr.To(s.w.Machine),
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
			}},
		}
		if err := c.Create(ctx, slice); err != nil {
			return fmt.Errorf("creating the EndpointSlice %s: %w", slice.Name, err)
		}
	}
	return nil
}

// Stop stops the ingress stand-in and deletes its Pod and EndpointSlices.
func (s *IngressStandIn) Stop(ctx context.Context) error {
	s.stop()
	c := s.l.Guest.Client
	var errs []error
	for _, o := range []client.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.opts.Name}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.opts.Name + "-ipv4"}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.opts.Name + "-ipv6"}},
	} {
		if err := c.Delete(ctx, o, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stop ends its servers and takes the pod off the VM.
func (s *IngressStandIn) stop() {
	s.once.Do(func() {
		for _, srv := range s.servers {
			_ = srv.Close()
		}
		if s.ns != nil {
			s.ns.close()
		}
		if s.w.kernel != nil && s.w.kernel.vm != nil {
			_ = s.w.kernel.vm.ip("link del " + ingressVeth)
		}
	})
}

// SourceSeen makes one HTTP request to addr ("host:port") over a connection from dial (an
// ExternalClient's Dial, a HostPod's, a VM's) and returns what an ingress stand-in answers:
// the client address it saw.
func SourceSeen(ctx context.Context, dial func(ctx context.Context, network, address string) (net.Conn, error), addr string) (string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", http.NoBody)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, body)
	}
	return string(body), nil
}
