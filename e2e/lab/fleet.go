package lab

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// A fleet is what a hosting provider runs: many guest clusters, each with a GuestIngress and
// some with a GuestWebhookBridge. The scale guard (e2e/scale) and `make bench` build theirs
// here. Members live on the lab's guest apiserver or on guest shards (StartGuestShards,
// FleetOptions.Guest): real apiservers of their own, so that a member's guest connection
// caches its shard's objects, not the whole fleet's. Each member has namespaces of its own in
// host and guest, so its objects are distinct, and an address plan of its own: fleet-wide
// load-balancer IPs and worker pod IPs (MaxFleet members), and guest nodePorts that need only
// be distinct on one guest apiserver (MaxFleetPerGuest members each).

// MaxFleet is the largest member index + 1 the fleet-wide address plan allows: one
// load-balancer IP (10.98.200.1-10.98.211.250) and four worker pod IPs (10.244.64.1-
// 10.244.111.250) per member.
const MaxFleet = 3000

// MaxFleetPerGuest is the largest index + 1 of a member on one guest apiserver: the guest
// nodePorts 30000-31999 for GuestIngresses (two each) and 32000-32767 for bridges (two each:
// distinct for the members below 384, so a guest with more members gives bridges to a share
// of them).
const MaxFleetPerGuest = 1000

// FleetOptions shape each member.
type FleetOptions struct {
	// Workers is the number of worker virt-launcher pods per cluster (2 when 0).
	Workers int
	// Bridge gives the member a GuestWebhookBridge of one webhook and one APIService.
	Bridge bool
	// Guest is the guest apiserver the member lives on (a guest shard); nil is the lab's
	// guest.
	Guest *Cluster
	// GuestIndex is the member's index among the members on Guest, which its guest nodePorts
	// come from; on the lab's guest (Guest nil) it is the member's index.
	GuestIndex int
}

// FleetMember is one guest cluster of a fleet and guestnet's objects for it.
type FleetMember struct {
	Index int
	// Guest is the guest apiserver the member lives on (the lab's guest or a shard), and
	// GuestIndex its index there.
	Guest          *Cluster
	GuestIndex     int
	Cluster        *GuestCluster
	GuestNamespace string
	GuestIngress   *guestnetv1.GuestIngress
	// Bridge is nil for a member without one.
	Bridge *guestnetv1.GuestWebhookBridge
	// GuestIngressCreated and BridgeCreated are when their Create returned: the start of
	// what a benchmark times (creationTimestamp has only seconds).
	GuestIngressCreated, BridgeCreated time.Time
}

// fleet address plan: guest nodePorts by the index j on its guest, IPs by the member index i.
func fleetNodePorts(j int) (http, https int32) { return 30000 + 2*int32(j), 30001 + 2*int32(j) }
func fleetBridgeRange(j int) int32             { return 32000 + 2*int32(j%384) }
func fleetLoadBalancerIP(i int) string         { return fmt.Sprintf("10.98.%d.%d", 200+i/250, i%250+1) }
func fleetWorkerIP(i, w int) string {
	k := i*4 + w // up to 4 workers per member
	return fmt.Sprintf("10.244.%d.%d", 64+k/250, k%250+1)
}

// CreateFleetMember creates member i: in the host namespace fleet-<i>, Cluster "tenant"
// (kubeconfig Secret, MachineDeployment, worker template declaring the member's nodePorts)
// with its ready worker virt-launcher pods; in its guest (opts.Guest), the worker Nodes and
// the ingress controller's Service ingress-<i>/envoy (ClusterIP, as Contour's chart makes
// it); then the GuestIngress "web" with fixed nodePorts and IP and, with opts.Bridge, a
// webhook and an APIService in the guest and the GuestWebhookBridge "bridge" of both.
func (l *Lab) CreateFleetMember(ctx context.Context, i int, opts FleetOptions) (*FleetMember, error) {
	if i < 0 || i >= MaxFleet {
		return nil, fmt.Errorf("fleet member %d outside the address plan (0..%d)", i, MaxFleet-1)
	}
	workers := opts.Workers
	if workers == 0 {
		workers = 2
	}
	if workers > 4 {
		return nil, fmt.Errorf("at most 4 workers per fleet member")
	}
	m := &FleetMember{Index: i, Guest: l.Guest, GuestIndex: i, GuestNamespace: fmt.Sprintf("ingress-%04d", i)}
	var onGuest []GuestClusterOption
	if opts.Guest != nil {
		m.Guest, m.GuestIndex = opts.Guest, opts.GuestIndex
		// Credentials of its own, as Cluster API writes them: a connection of its own.
		kubeconfig, err := opts.Guest.KubeconfigAs(fmt.Sprintf("fleet-%04d", i), "system:masters")
		if err != nil {
			return nil, err
		}
		onGuest = append(onGuest, OnGuest(opts.Guest), WithKubeconfig(l.Host.Client, kubeconfig))
	}
	if m.GuestIndex < 0 || m.GuestIndex >= MaxFleetPerGuest {
		return nil, fmt.Errorf("fleet member %d: index %d on its guest outside the nodePort plan (0..%d)", i, m.GuestIndex, MaxFleetPerGuest-1)
	}
	ns := fmt.Sprintf("fleet-%04d", i)
	http, https := fleetNodePorts(m.GuestIndex)
	bridgeStart := fleetBridgeRange(m.GuestIndex)
	gc, err := l.CreateGuestCluster(ctx, ns, "tenant", WorkerTemplateOptions{
		Ports: []int32{22, 10250, http, https, bridgeStart, bridgeStart + 1},
	}, onGuest...)
	if err != nil {
		return nil, err
	}
	m.Cluster = gc
	for w := range workers {
		if _, err := l.AddWorker(ctx, gc, fmt.Sprintf("%s-w%d", ns, w), fleetWorkerIP(i, w)); err != nil {
			return nil, err
		}
	}
	if err := l.SetMachineDeploymentStatus(ctx, gc, int32(workers), int32(workers)); err != nil {
		return nil, err
	}

	if err := createNamespaces(ctx, m.Guest.Client, m.GuestNamespace); err != nil {
		return nil, err
	}
	envoy := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: m.GuestNamespace, Name: "envoy"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app.kubernetes.io/name": "contour", "app.kubernetes.io/component": "envoy"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromString("envoy-http")},
				{Name: "https", Port: 443, TargetPort: intstr.FromString("envoy-https")},
			},
		},
	}
	if err := m.Guest.Client.Create(ctx, envoy); err != nil {
		return nil, fmt.Errorf("creating guest Service: %w", err)
	}
	m.GuestIngress = &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  gc.Name,
			GuestService: guestnetv1.ObjectReference{Namespace: m.GuestNamespace, Name: "envoy"},
			Ports: []guestnetv1.IngressPort{
				{Name: "http", Port: 80, NodePort: ptr.To(http)},
				{Name: "https", Port: 443, NodePort: ptr.To(https)},
			},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: fleetLoadBalancerIP(i)},
		},
	}
	if err := l.Host.Client.Create(ctx, m.GuestIngress); err != nil {
		return nil, fmt.Errorf("creating GuestIngress: %w", err)
	}
	m.GuestIngressCreated = time.Now()
	if opts.Bridge {
		if err := l.AddFleetBridge(ctx, m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// AddFleetBridge gives member m, in its guest, a webhook (webhook-<i>) and an APIService
// (metrics-<i>), and in the host the GuestWebhookBridge "bridge" of both over the member's
// two bridge nodePorts (which its worker template declares).
func (l *Lab) AddFleetBridge(ctx context.Context, m *FleetMember) error {
	start := fleetBridgeRange(m.GuestIndex)
	webhookNS, metricsNS := fmt.Sprintf("webhook-%04d", m.Index), fmt.Sprintf("metrics-%04d", m.Index)
	wh, err := CreateServiceWebhook(ctx, m.Guest.Client, m.Guest.CA.CertPEM(), webhookNS, "target-"+webhookNS)
	if err != nil {
		return err
	}
	api, err := CreateMetricsAPI(ctx, m.Guest.Client, metricsNS, fmt.Sprintf("fleet-%04d.metrics.k8s.io", m.Index))
	if err != nil {
		return err
	}
	m.Bridge = &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: m.Cluster.Namespace, Name: "bridge"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        m.Cluster.Name,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{wh.Config.Name}},
			APIServices:        &guestnetv1.TargetSelector{Names: []string{api.APIService.Name}},
			NodePortRange:      guestnetv1.NodePortRange{Start: start, Size: 2},
			Mode:               guestnetv1.BridgeModeAlways,
		},
	}
	if err := l.Host.Client.Create(ctx, m.Bridge); err != nil {
		return fmt.Errorf("creating GuestWebhookBridge: %w", err)
	}
	m.BridgeCreated = time.Now()
	return nil
}
