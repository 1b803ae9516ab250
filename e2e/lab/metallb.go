package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"golang.org/x/sys/unix"
)

// MetalLB runs for real in the lab's host cluster: its controller (IP allocation from
// IPAddressPools) and one speaker per played host node (announcement: ARP on the node's
// L2 segment, and its native BGP implementation), go.universe.tf/metallb at the release of
// the lab's MetalLB CRDs, built by the Makefile as metallb-controller and metallb-speaker
// (hack/tools/metallb). What is played around them:
//
//   - their Pods: each binary reads its own Pod object at start (internal/k8s/k8s.go, New:
//     owner of its ConfigurationState, and of the speaker's ServiceL2Status objects), so
//     StartMetalLB creates them in MetalLBNamespace (the speakers' bound to their node, on the
//     host network, with the node's segment address as pod IP), and no kubelet runs them;
//   - the nodes' host network: each speaker runs in a network namespace of its own, the
//     node's, whose eth0 (MAC MetalLBSpeaker.MAC, address MetalLBSpeaker.Address) is a port of
//     the segment bridge, with the host apiserver reachable as from a host node;
//   - the segment: a bridge in a namespace of its own, and a client (MetalLB.ARP) on it, on
//     MetalLBSegmentCIDR; load-balancer IPs are on-link for the client. The lab namespace is
//     on it too (MetalLBGatewayAddress), the nodes' default gateway: the speakers' BGP
//     sessions reach the lab's BGP router there, from their node's address.
//
// The controller runs in a pod network namespace of its own: it serves health and metrics
// on every address (":<port>", no flag for the address), harmless there.
//
// Flags: both run with --namespace=MetalLBNamespace, --lb-class=MetalLBClass (they handle
// only Services of that class), the admin kubeconfig (KUBECONFIG), METALLB_BGP_TYPE=native;
// the controller with --webhook-mode=disabled (no admission webhook, hence no certificate
// rotation: internal/k8s/k8s.go enables that only with the webhook), the speakers with
// --node-name and no memberlist (no --ml-bindaddr / --ml-labels: speakerlist.New disables
// it, and each speaker then counts every Node as having a speaker,
// speaker/layer2_controller.go speakersForAds; L2Advertisements must therefore select the
// speakers' nodes, see MetalLBSpeakerLabel).
//
// MetalLB reads its configuration (IPAddressPool, L2Advertisement, BGPAdvertisement,
// BGPPeer, Community) only from MetalLBNamespace. Without the webhook, nothing refuses a bad
// configuration at admission: the controller and speakers refuse it as a whole (overlapping
// pools, internal/config/config.go) and say so in their ConfigurationState. BGPPeers are
// written as v1beta2 (the CRD's conversion webhook is not served). One MetalLB per lab at
// a time.
type MetalLB struct {
	// Speakers are the speakers, one per node, in the order of MetalLBOptions.Nodes.
	Speakers []*MetalLBSpeaker

	l          *Lab
	netns      *podNetns
	controller *process
	pods       []string
	segment    *netNamespace
	client     *netNamespace
	uplink     bool // MetalLBUplink exists
	stopOnce   sync.Once
}

// MetalLBSpeaker is one node's speaker.
type MetalLBSpeaker struct {
	// Node is the host Node it runs for (--node-name).
	Node string
	// Address is the node's address on the segment (eth0), MAC eth0's MAC.
	Address, MAC string
	// Pod is its Pod's name in MetalLBNamespace.
	Pod string

	netns *podNetns
	proc  *process
}

// LogPath is the speaker's log file.
func (s *MetalLBSpeaker) LogPath() string { return s.proc.logPath }

// Dial connects to address over network from the speaker's node (its host network).
func (s *MetalLBSpeaker) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	return s.netns.dialNetwork(ctx, network, address)
}

const (
	// MetalLBNamespace is the namespace MetalLB runs in and reads its configuration from.
	MetalLBNamespace = "metallb-system"
	// MetalLBClass is the loadBalancerClass the lab's MetalLB handles (--lb-class): a host
	// Service is MetalLB's when its spec.loadBalancerClass is this.
	MetalLBClass = "metallb.io/metallb"
	// MetalLBSpeakerLabel is set ("true") on every Node a speaker runs for, for the
	// nodeSelectors of L2Advertisements and BGPAdvertisements.
	MetalLBSpeakerLabel = "lab.guestnet.dev/metallb-speaker"
	// MetalLBSegmentCIDR is the nodes' L2 segment: speaker i's node is .(i+1), the client
	// MetalLBClientAddress, the lab namespace MetalLBGatewayAddress. Load-balancer IPs (from
	// LoadBalancerCIDR) are on-link for the client. Outside the ranges local in the lab
	// namespace (hack/labns), so that the lab namespace routes to it.
	MetalLBSegmentCIDR = "10.99.160.0/24"
	// MetalLBClientAddress is the client's address on the segment (MetalLB.ARP asks from it).
	MetalLBClientAddress = "10.99.160.100"
	// MetalLBGatewayAddress is the lab namespace's address on the segment (interface
	// MetalLBUplink), the nodes' default gateway: through it they reach what listens in the
	// lab namespace, such as the lab's BGP router (StartBGPRouter). It answers ARP only for
	// this address (arp_ignore=1), not for the load-balancer IPs local in the lab namespace.
	MetalLBGatewayAddress = "10.99.160.254"
	// MetalLBUplink is the lab namespace's interface on the segment.
	MetalLBUplink = "mlb-uplink"
	// metallbHealthPort is where both serve /readyz inside their namespaces (waitHealthReady's).
	metallbHealthPort = 9440
	// metallbVersion is the release the Makefile builds (METALLB_VERSION), for the Pods' images.
	metallbVersion = "v0.16.1"
)

// MetalLB's API group, metallb.io: IPAddressPool, L2Advertisement, BGPAdvertisement and
// Community are served as v1beta1; BGPPeer as v1beta1 and v1beta2 (storage).
var (
	MetalLBIPAddressPoolGVK    = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "IPAddressPool"}
	MetalLBL2AdvertisementGVK  = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "L2Advertisement"}
	MetalLBBGPAdvertisementGVK = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "BGPAdvertisement"}
	MetalLBBGPPeerGVK          = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta2", Kind: "BGPPeer"}
	MetalLBServiceL2StatusGVK  = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "ServiceL2Status"}
	MetalLBConfigStateGVK      = schema.GroupVersionKind{Group: "metallb.io", Version: "v1beta1", Kind: "ConfigurationState"}
)

// MetalLBOptions tune StartMetalLB.
type MetalLBOptions struct {
	// Nodes are the host Nodes a speaker runs for: HostNodes when empty. A Node that does not
	// exist is created ready.
	Nodes []string
	// LogLevel of both binaries ("info" when empty; "debug" logs every announcement decision).
	LogLevel string
}

// StartMetalLB installs MetalLB's CRDs (if the lab started without them), creates
// MetalLBNamespace and the Pods of the controller and the speakers, builds the segment and
// starts the controller and one speaker per node; it waits until each answers /readyz. They
// log to <lab>/metallb-controller.log and <lab>/metallb-speaker-<node>.log. Stop stops them
// (the lab stops them too); the configuration tests wrote stays.
func (l *Lab) StartMetalLB(ctx context.Context, opts MetalLBOptions) (_ *MetalLB, err error) {
	controllerBin, err := findFile(l.Assets.binDirs, "metallb-controller")
	if err != nil {
		return nil, err
	}
	speakerBin, err := findFile(l.Assets.binDirs, "metallb-speaker")
	if err != nil {
		return nil, err
	}
	if slices.Contains(l.withoutCRDs, "metallb") {
		if err := l.InstallThirdPartyCRDs("metallb"); err != nil {
			return nil, err
		}
	}
	nodes := opts.Nodes
	if len(nodes) == 0 {
		nodes = HostNodes
	}
	if len(nodes) > 99 {
		return nil, fmt.Errorf("at most 99 MetalLB nodes, not %d", len(nodes))
	}
	logLevel := opts.LogLevel
	if logLevel == "" {
		logLevel = "info"
	}
	m := &MetalLB{l: l}
	defer func() {
		if err != nil {
			m.Stop()
		}
	}()
	c := l.Host.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: MetalLBNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", MetalLBNamespace, err)
	}
	dir := filepath.Join(l.Dir, "metallb")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := m.buildSegment(dir); err != nil {
		return nil, err
	}
	env := append(os.Environ(), "KUBECONFIG="+l.Host.KubeconfigPath, "METALLB_BGP_TYPE=native")
	common := []string{
		"--namespace=" + MetalLBNamespace,
		"--lb-class=" + MetalLBClass,
		"--log-level=" + logLevel,
		fmt.Sprintf("--health-probe-port=%d", metallbHealthPort),
	}

	// The controller.
	const controllerPod = "controller"
	if err := m.createPod(ctx, controllerPod, "controller", "", ""); err != nil {
		return nil, err
	}
	if m.netns, err = newPodNetnsTo(dir, "controller", HostAPIServerAddress); err != nil {
		return nil, err
	}
	if m.controller, err = m.start(l.Dir, "metallb-controller", m.netns, env, controllerBin, append(common,
		"--pod-name="+controllerPod, "--webhook-mode=disabled")...); err != nil {
		return nil, err
	}

	// The speakers.
	for i, node := range nodes {
		s := &MetalLBSpeaker{
			Node:    node,
			Address: fmt.Sprintf("10.99.160.%d", i+1),
			MAC:     fmt.Sprintf("02:6d:6c:62:00:%02x", i+1),
			Pod:     "speaker-" + node,
		}
		m.Speakers = append(m.Speakers, s)
		if err := markSpeakerNode(ctx, c, node); err != nil {
			return nil, err
		}
		if err := m.createPod(ctx, s.Pod, "speaker", node, s.Address); err != nil {
			return nil, err
		}
		if s.netns, err = newPodNetnsTo(dir, "node-"+node, HostAPIServerAddress); err != nil {
			return nil, err
		}
		if err := m.attach(s.netns.netNamespace, fmt.Sprintf("n%02d", i+1), s.MAC, s.Address); err != nil {
			return nil, err
		}
		if err := s.netns.ip("route add default via " + MetalLBGatewayAddress); err != nil {
			return nil, err
		}
		if s.proc, err = m.start(l.Dir, "metallb-speaker-"+node, s.netns, env, speakerBin, append(common,
			"--pod-name="+s.Pod, "--node-name="+node)...); err != nil {
			return nil, err
		}
	}
	if err := waitHealthReady(ctx, m.controller, m.netns); err != nil {
		return nil, err
	}
	for _, s := range m.Speakers {
		if err := waitHealthReady(ctx, s.proc, s.netns); err != nil {
			return nil, err
		}
	}
	l.onStop(m.Stop)
	return m, nil
}

// start runs bin with args in ns, logging to <dir>/<name>.log.
func (m *MetalLB) start(dir, name string, ns *podNetns, env []string, bin string, args ...string) (*process, error) {
	cmdName, argv := ns.command(bin, args...)
	cmd := exec.Command(cmdName, argv...)
	cmd.Env = env
	return startCommand(dir, name, cmd)
}

// buildSegment creates the segment's bridge (in a namespace of its own) and the client on it.
func (m *MetalLB) buildSegment(dir string) (err error) {
	if m.segment, err = newNetNamespace(dir, "segment"); err != nil {
		return err
	}
	if err := m.segment.ip("link add br0 type bridge", "link set br0 up"); err != nil {
		return err
	}
	if err := m.attachLab(); err != nil {
		return err
	}
	if m.client, err = newNetNamespace(dir, "client"); err != nil {
		return err
	}
	if err := m.attach(m.client, "client", "02:6d:6c:62:00:64", MetalLBClientAddress); err != nil {
		return err
	}
	return m.client.ip("route add " + LoadBalancerCIDR + " dev eth0 scope link")
}

// attachLab connects the lab namespace to the segment (MetalLBUplink, MetalLBGatewayAddress).
func (m *MetalLB) attachLab() error {
	m.l.podNet.track(MetalLBUplink, true)
	if err := runIP("link add " + MetalLBUplink + " type veth peer name uplink netns " + m.segment.path); err != nil {
		return err
	}
	m.uplink = true
	if err := m.segment.ip("link set uplink master br0", "link set uplink up"); err != nil {
		return err
	}
	if err := writeSysctls("1", "ipv4/conf/"+MetalLBUplink+"/arp_ignore"); err != nil {
		return err
	}
	if err := writeSysctls("2", "ipv4/conf/"+MetalLBUplink+"/arp_announce"); err != nil {
		return err
	}
	return runIP("addr add "+MetalLBGatewayAddress+"/24 dev "+MetalLBUplink, "link set "+MetalLBUplink+" up")
}

// attach connects ns to the segment: eth0 in ns with mac and addr (on MetalLBSegmentCIDR),
// its peer "<port>" a port of the bridge.
func (m *MetalLB) attach(ns *netNamespace, port, mac, addr string) error {
	if err := m.segment.ip(
		"link add "+port+" type veth peer name eth0 netns "+ns.path,
		"link set "+port+" master br0",
		"link set "+port+" up",
	); err != nil {
		return err
	}
	return ns.ip(
		"link set eth0 address "+mac,
		"addr add "+addr+"/24 dev eth0",
		"link set eth0 up",
	)
}

// createPod creates the played Pod of a MetalLB binary (component "controller" or
// "speaker"; a speaker's on node, host network, with the node's address).
func (m *MetalLB) createPod(ctx context.Context, name, component, node, addr string) error {
	c := m.l.Host.Client
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: MetalLBNamespace, Name: name,
			Labels: map[string]string{"app.kubernetes.io/name": "metallb", "app.kubernetes.io/component": component},
		},
		Spec: corev1.PodSpec{
			NodeName:    node,
			HostNetwork: node != "",
			Containers:  []corev1.Container{{Name: component, Image: "quay.io/metallb/" + component + ":" + metallbVersion}},
		},
	}
	if err := c.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating MetalLB pod %s: %w", name, err)
	}
	m.pods = append(m.pods, name)
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: component, Image: pod.Spec.Containers[0].Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	if addr != "" {
		pod.Status.HostIP, pod.Status.PodIP = addr, addr
		pod.Status.PodIPs = []corev1.PodIP{{IP: addr}}
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("setting status of MetalLB pod %s: %w", name, err)
	}
	return nil
}

// markSpeakerNode labels node with MetalLBSpeakerLabel, creating it ready if missing.
func markSpeakerNode(ctx context.Context, c client.Client, node string) error {
	n := &corev1.Node{}
	if err := c.Get(ctx, types.NamespacedName{Name: node}, n); apierrors.IsNotFound(err) {
		if err := createReadyNode(ctx, c, node, ""); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("reading node %s: %w", node, err)
	}
	patch := []byte(`{"metadata":{"labels":{"` + MetalLBSpeakerLabel + `":"true"}}}`)
	if err := c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("labelling node %s: %w", node, err)
	}
	return nil
}

// Speaker returns the speaker of node, nil if none runs for it.
func (m *MetalLB) Speaker(node string) *MetalLBSpeaker {
	for _, s := range m.Speakers {
		if s.Node == node {
			return s
		}
	}
	return nil
}

// ControllerLogPath is the controller's log file.
func (m *MetalLB) ControllerLogPath() string { return m.controller.logPath }

// AnnouncingNodes asks the segment, from the client, who has ip (one ARP request, the
// replies of one second) and returns the nodes whose eth0 MAC answered, in the order of
// the replies; a MAC of no speaker's node is returned as is.
func (m *MetalLB) AnnouncingNodes(ip string) ([]string, error) {
	macs, err := m.ARP(ip, time.Second)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, mac := range macs {
		name := mac
		for _, s := range m.Speakers {
			if s.MAC == mac {
				name = s.Node
			}
		}
		nodes = append(nodes, name)
	}
	return nodes, nil
}

// ARP sends one ARP request for ip from the client's eth0 and returns the sender MACs of
// the replies to it that arrive within wait (none: nobody announces ip on the segment).
func (m *MetalLB) ARP(ip string, wait time.Duration) ([]string, error) {
	target := net.ParseIP(ip).To4()
	if target == nil {
		return nil, fmt.Errorf("not an IPv4 address: %q", ip)
	}
	var macs []string
	err := m.client.do(func() (err error) {
		macs, err = arpRequest("eth0", net.ParseIP(MetalLBClientAddress).To4(), target, wait)
		return err
	})
	return macs, err
}

// arpRequest broadcasts an ARP request (RFC 826) for target from src on ifname and collects
// the senders' hardware addresses of the replies for target addressed to src.
func arpRequest(ifname string, src, target net.IP, wait time.Duration) ([]string, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	proto := htons(unix.ETH_P_ARP)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return nil, fmt.Errorf("ARP socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
		return nil, fmt.Errorf("binding the ARP socket to %s: %w", ifname, err)
	}
	const (
		arpRequestOp = 1
		arpReplyOp   = 2
	)
	req := make([]byte, 28)
	binary.BigEndian.PutUint16(req[0:], 1)      // hardware type: Ethernet
	binary.BigEndian.PutUint16(req[2:], 0x0800) // protocol type: IPv4
	req[4], req[5] = 6, 4
	binary.BigEndian.PutUint16(req[6:], arpRequestOp)
	copy(req[8:14], ifi.HardwareAddr)
	copy(req[14:18], src)
	copy(req[24:28], target)
	broadcast := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index, Halen: 6, Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
	if err := unix.Sendto(fd, req, 0, broadcast); err != nil {
		return nil, fmt.Errorf("sending the ARP request: %w", err)
	}
	var macs []string
	deadline := time.Now().Add(wait)
	buf := make([]byte, 1500)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return macs, nil
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return nil, err
		}
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading ARP replies: %w", err)
		}
		p := buf[:n]
		if n < 28 || binary.BigEndian.Uint16(p[6:]) != arpReplyOp ||
			!net.IP(p[14:18]).Equal(target) || !net.IP(p[24:28]).Equal(src) {
			continue
		}
		macs = append(macs, net.HardwareAddr(p[8:14]).String())
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Stop stops the speakers and the controller, deletes their Pods (MetalLB's status objects
// go with them: they are the Pods' dependents), removes MetalLBSpeakerLabel from the nodes
// and takes the segment down.
func (m *MetalLB) Stop() {
	m.stopOnce.Do(func() {
		for _, s := range m.Speakers {
			s.proc.stop()
			if s.netns != nil {
				s.netns.close()
			}
		}
		m.controller.stop()
		if m.netns != nil {
			m.netns.close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := m.l.Host.Client
		for _, name := range m.pods {
			// At once: no kubelet would confirm a graceful deletion of a Pod bound to a node.
			_ = c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: MetalLBNamespace, Name: name}}, client.GracePeriodSeconds(0))
		}
		unlabel := []byte(`{"metadata":{"labels":{"` + MetalLBSpeakerLabel + `":null}}}`)
		for _, s := range m.Speakers {
			_ = c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Node}}, client.RawPatch(types.MergePatchType, unlabel))
		}
		for _, ns := range []*netNamespace{m.client, m.segment} {
			if ns != nil {
				ns.close()
			}
		}
		if m.uplink {
			_ = runIP("link del " + MetalLBUplink)
		}
		m.l.podNet.track(MetalLBUplink, false)
	})
}
