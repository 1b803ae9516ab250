package ingress

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func newGI(mutate ...func(*guestnetv1.GuestIngress)) *guestnetv1.GuestIngress {
	gi := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "web", UID: "uid-1"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  "tenant-a",
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
			Ports: []guestnetv1.IngressPort{
				{Name: "http", Port: 80, NodePort: ptr.To[int32](30080), Protocol: corev1.ProtocolTCP},
				{Name: "https", Port: 443, NodePort: ptr.To[int32](30443), Protocol: corev1.ProtocolTCP},
			},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"},
		},
	}
	for _, m := range mutate {
		m(gi)
	}
	return gi
}

// toService renders an apply configuration as the Service it asks for.
func toService(t *testing.T, ac *corev1ac.ServiceApplyConfiguration) *corev1.Service {
	t.Helper()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ac)
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, svc); err != nil {
		t.Fatal(err)
	}
	return svc
}

var nodePorts = map[string]int32{"http": 30080, "https": 30443}

func TestHostService(t *testing.T) {
	tests := []struct {
		name            string
		gi              *guestnetv1.GuestIngress
		wantAnnotations map[string]string
		wantClass       string
		wantETP         corev1.ServiceExternalTrafficPolicy
		wantLabels      map[string]string // besides guestnet's
	}{
		{
			name:            "fixed IP, defaults",
			gi:              newGI(),
			wantAnnotations: map[string]string{"lbipam.cilium.io/ips": "10.2.6.220"},
			wantClass:       "io.cilium/l2-announcer", wantETP: corev1.ServiceExternalTrafficPolicyCluster,
		},
		{
			name: "IP from a pool: no lbipam annotation and none of the user's",
			gi: newGI(func(gi *guestnetv1.GuestIngress) {
				gi.Spec.LoadBalancer.IP = ""
				gi.Spec.LoadBalancer.CIDRs = []string{"10.2.6.216/29"}
			}),
			wantClass: "io.cilium/l2-announcer", wantETP: corev1.ServiceExternalTrafficPolicyCluster,
		},
		{
			name: "user class, policy, annotations and labels; guestnet's labels win",
			gi: newGI(func(gi *guestnetv1.GuestIngress) {
				lb := &gi.Spec.LoadBalancer
				lb.Class, lb.ExternalTrafficPolicy = "io.cilium/bgp-control-plane", corev1.ServiceExternalTrafficPolicyLocal
				lb.Annotations = map[string]string{"example.com/a": "1", "lbipam.cilium.io/ips": "10.9.9.9"}
				lb.Labels = map[string]string{"example.com/tier": "edge", "cluster.x-k8s.io/cluster-name": "spoofed"}
			}),
			wantAnnotations: map[string]string{"example.com/a": "1", "lbipam.cilium.io/ips": "10.2.6.220"},
			wantClass:       "io.cilium/bgp-control-plane", wantETP: corev1.ServiceExternalTrafficPolicyLocal,
			wantLabels: map[string]string{"example.com/tier": "edge"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			svc := toService(t, HostService(tt.gi, nodePorts))

			g.Expect(svc.Namespace).To(Equal("k0smotron"))
			g.Expect(svc.Name).To(Equal("tenant-a-web"))
			g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeLoadBalancer))
			// Exactly the labels CAPI/CAPK guarantee on worker virt-launcher pods.
			g.Expect(svc.Spec.Selector).To(Equal(map[string]string{
				"cluster.x-k8s.io/cluster-name": "tenant-a", "cluster.x-k8s.io/role": "worker", "kubevirt.io": "virt-launcher",
			}))
			g.Expect(svc.Spec.Ports).To(Equal([]corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(30080)},
				{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(30443)},
			}))
			g.Expect(svc.Spec.LoadBalancerClass).To(Equal(ptr.To(tt.wantClass)))
			g.Expect(svc.Spec.ExternalTrafficPolicy).To(Equal(tt.wantETP))
			g.Expect(svc.Annotations).To(Equal(tt.wantAnnotations))
			wantLabels := map[string]string{
				"app.kubernetes.io/managed-by":                             "guestnet",
				"cluster.x-k8s.io/cluster-name":                            "tenant-a",
				"guestnet.addons.cluster.x-k8s.io/guestingress-namespace":  "k0smotron",
				"guestnet.addons.cluster.x-k8s.io/guestingress-name":       "web",
				"guestnet.addons.cluster.x-k8s.io/guest-service-namespace": "projectcontour",
				"guestnet.addons.cluster.x-k8s.io/guest-service-name":      "envoy",
			}
			for k, v := range tt.wantLabels {
				wantLabels[k] = v
			}
			g.Expect(svc.Labels).To(Equal(wantLabels))
			g.Expect(svc.OwnerReferences).To(Equal([]metav1.OwnerReference{{
				APIVersion: "guestnet.addons.cluster.x-k8s.io/v1alpha1", Kind: "GuestIngress", Name: "web", UID: "uid-1",
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}}))
		})
	}
}

func TestPool(t *testing.T) {
	selector := map[string]any{"matchLabels": map[string]any{
		"io.kubernetes.service.namespace": "k0smotron", "io.kubernetes.service.name": "tenant-a-web",
	}}
	tests := []struct {
		name       string
		lb         guestnetv1.LoadBalancerSpec
		wantBlocks []any // nil: no pool
	}{
		{name: "a lone IPv4 is a /32", lb: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"}, wantBlocks: []any{map[string]any{"cidr": "10.2.6.220/32"}}},
		{name: "a lone IPv6 is a /128", lb: guestnetv1.LoadBalancerSpec{IP: "fd00::dc"}, wantBlocks: []any{map[string]any{"cidr": "fd00::dc/128"}}},
		{
			name:       "cidrs, with an IP inside",
			lb:         guestnetv1.LoadBalancerSpec{IP: "10.2.6.220", CIDRs: []string{"10.2.6.220/29", "10.3.0.0/24"}},
			wantBlocks: []any{map[string]any{"cidr": "10.2.6.216/29"}, map[string]any{"cidr": "10.3.0.0/24"}},
		},
		{name: "poolRef: no pool of guestnet's", lb: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220", PoolRef: &guestnetv1.PoolReference{Name: "shared"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			pool := Pool(newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer = tt.lb }))
			if tt.wantBlocks == nil {
				g.Expect(pool).To(BeNil())
				return
			}
			g.Expect(pool.GroupVersionKind()).To(Equal(PoolGVK))
			g.Expect(pool.GetName()).To(Equal("k0smotron.tenant-a-web"))
			g.Expect(pool.GetNamespace()).To(BeEmpty())
			g.Expect(pool.Object["spec"]).To(Equal(map[string]any{"blocks": tt.wantBlocks, "serviceSelector": selector}))
			g.Expect(pool.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "guestnet"))
			g.Expect(pool.GetAnnotations()).To(Equal(map[string]string{"guestnet.addons.cluster.x-k8s.io/guestingress": "k0smotron/web"}))
		})
	}
}

func TestL2Policy(t *testing.T) {
	selector := map[string]any{"matchLabels": map[string]any{
		"io.kubernetes.service.namespace": "k0smotron", "io.kubernetes.service.name": "tenant-a-web",
	}}
	tests := []struct {
		name     string
		lb       guestnetv1.LoadBalancerSpec
		wantSpec map[string]any // nil: no policy
	}{
		{
			name:     "every node and interface",
			lb:       guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"},
			wantSpec: map[string]any{"serviceSelector": selector, "loadBalancerIPs": true},
		},
		{
			name: "interfaces and node selector of the announcement",
			lb: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220", L2: &guestnetv1.L2AnnouncementSpec{
				Interfaces: []string{"^eth0$"},
				NodeSelector: &metav1.LabelSelector{
					MatchLabels:      map[string]string{"node-role.kubernetes.io/worker": ""},
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a"}}},
				},
			}},
			wantSpec: map[string]any{
				"serviceSelector": selector, "loadBalancerIPs": true,
				"interfaces": []any{"^eth0$"},
				"nodeSelector": map[string]any{
					"matchLabels":      map[string]any{"node-role.kubernetes.io/worker": ""},
					"matchExpressions": []any{map[string]any{"key": "zone", "operator": "In", "values": []any{"a"}}},
				},
			},
		},
		{name: "not Cilium's L2 announcer: no policy", lb: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220", Class: "io.cilium/bgp-control-plane"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			var a Announcement
			if l2 := tt.lb.L2; l2 != nil {
				a = Announcement{Interfaces: l2.Interfaces, NodeSelector: l2.NodeSelector}
			}
			policy, err := L2Policy(newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer = tt.lb }), a)
			g.Expect(err).NotTo(HaveOccurred())
			if tt.wantSpec == nil {
				g.Expect(policy).To(BeNil())
				return
			}
			g.Expect(policy.GroupVersionKind()).To(Equal(L2PolicyGVK))
			g.Expect(policy.GetName()).To(Equal("k0smotron.tenant-a-web"))
			g.Expect(policy.Object["spec"]).To(Equal(tt.wantSpec))
		})
	}
}

func guestSvc(svcType corev1.ServiceType, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "projectcontour", Name: "envoy"},
		Spec:       corev1.ServiceSpec{Type: svcType, Ports: ports},
	}
}

func sp(name string, port, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, NodePort: nodePort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("envoy-" + name)}
}

func TestGuestService(t *testing.T) {
	follow := func(gi *guestnetv1.GuestIngress) {
		for i := range gi.Spec.Ports {
			gi.Spec.Ports[i].NodePort = nil
		}
	}
	tests := []struct {
		name      string
		gi        *guestnetv1.GuestIngress
		live      *corev1.Service
		wantType  corev1.ServiceType
		wantPorts []corev1.ServicePort
		wantEmpty bool
	}{
		{
			name:     "ClusterIP becomes NodePort with the fixed nodePorts, in the Service's order",
			gi:       newGI(),
			live:     guestSvc(corev1.ServiceTypeClusterIP, sp("https", 443, 0), sp("http", 80, 0)),
			wantType: corev1.ServiceTypeNodePort,
			wantPorts: []corev1.ServicePort{
				{Port: 443, Protocol: corev1.ProtocolTCP, NodePort: 30443},
				{Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080},
			},
		},
		{
			// Under server-side apply, leaving the type out would give it up: NodePort stays
			// in the configuration.
			name:     "NodePort, nodePorts followed: only the type",
			gi:       newGI(follow),
			live:     guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 31000), sp("https", 443, 31001)),
			wantType: corev1.ServiceTypeNodePort,
		},
		{
			name:      "LoadBalancer allocates nodePorts: left alone",
			gi:        newGI(follow),
			live:      guestSvc(corev1.ServiceTypeLoadBalancer, sp("http", 80, 31000), sp("https", 443, 31001)),
			wantEmpty: true,
		},
		{
			name: "LoadBalancer without nodePorts becomes NodePort",
			gi:   newGI(follow),
			live: func() *corev1.Service {
				s := guestSvc(corev1.ServiceTypeLoadBalancer, sp("http", 80, 0), sp("https", 443, 0))
				s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
				return s
			}(),
			wantType: corev1.ServiceTypeNodePort,
		},
		{
			name:      "a port the Service lacks is never added",
			gi:        newGI(),
			live:      guestSvc(corev1.ServiceTypeClusterIP, sp("http", 80, 0), sp("metrics", 8002, 0)),
			wantType:  corev1.ServiceTypeNodePort,
			wantPorts: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			ac := GuestService(tt.gi, tt.live)
			g.Expect(*ac.Name).To(Equal("envoy"))
			g.Expect(*ac.Namespace).To(Equal("projectcontour"))
			if tt.wantEmpty {
				g.Expect(ac.Spec).To(BeNil())
				return
			}
			svc := toService(t, ac)
			g.Expect(svc.Spec.Type).To(Equal(tt.wantType))
			g.Expect(svc.Spec.Ports).To(Equal(tt.wantPorts))
			// Nothing else of the user's Service is in the configuration.
			svc.Spec.Type, svc.Spec.Ports = "", nil
			g.Expect(svc.Spec).To(Equal(corev1.ServiceSpec{}))
			g.Expect(svc.Labels).To(BeNil())
			g.Expect(svc.Annotations).To(BeNil())
		})
	}
	g := NewWithT(t)
	release := toService(t, Release(guestSvc(corev1.ServiceTypeNodePort)))
	g.Expect(release.Spec).To(Equal(corev1.ServiceSpec{}), "the release gives back every field")
}

func TestNodePorts(t *testing.T) {
	observed := func(gi *guestnetv1.GuestIngress) {
		gi.Status.Ports = []guestnetv1.IngressPortStatus{{Name: "http", Port: 80, NodePort: 31000}, {Name: "https", Port: 443, NodePort: 31001}}
	}
	follow := func(gi *guestnetv1.GuestIngress) {
		for i := range gi.Spec.Ports {
			gi.Spec.Ports[i].NodePort = nil
		}
	}
	tests := []struct {
		name         string
		gi           *guestnetv1.GuestIngress
		svc          *corev1.Service
		want         []int32
		wantMissing  []string
		wantComplete bool
	}{
		{name: "no Service yet, fixed nodePorts", gi: newGI(), want: []int32{30080, 30443}, wantComplete: true},
		{name: "no Service yet, nothing fixed or observed", gi: newGI(follow), want: []int32{0, 0}},
		{name: "no Service any more: the last observed", gi: newGI(follow, observed), want: []int32{31000, 31001}, wantComplete: true},
		{
			name: "from the Service", gi: newGI(follow, observed),
			svc:  guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 32000), sp("https", 443, 32001)),
			want: []int32{32000, 32001}, wantComplete: true,
		},
		{
			name: "the Service lacks a port", gi: newGI(follow),
			svc:  guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 32000)),
			want: []int32{32000, 0}, wantMissing: []string{"https"},
		},
		{
			name: "a ClusterIP Service has no nodePorts", gi: newGI(follow),
			svc:  guestSvc(corev1.ServiceTypeClusterIP, sp("http", 80, 0), sp("https", 443, 0)),
			want: []int32{0, 0}, wantMissing: []string{"http", "https"},
		},
		{
			name: "protocol matters", gi: newGI(follow),
			svc:  guestSvc(corev1.ServiceTypeNodePort, corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolUDP, NodePort: 32000}, sp("https", 443, 32001)),
			want: []int32{0, 32001}, wantMissing: []string{"http"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			resolved, missing, complete := NodePorts(tt.gi, tt.svc)
			var got []int32
			for _, p := range resolved {
				got = append(got, p.NodePort)
			}
			var gotMissing []string
			for _, p := range missing {
				gotMissing = append(gotMissing, p.Name)
			}
			g.Expect(got).To(Equal(tt.want))
			g.Expect(gotMissing).To(Equal(tt.wantMissing))
			g.Expect(complete).To(Equal(tt.wantComplete))
		})
	}
}

func TestNodePortHolders(t *testing.T) {
	g := NewWithT(t)
	other := guestSvc(corev1.ServiceTypeNodePort, sp("x", 8080, 30080))
	other.Namespace, other.Name = "default", "other"
	self := guestSvc(corev1.ServiceTypeNodePort, sp("https", 443, 30443))
	g.Expect(NodePortHolders(newGI(), []corev1.Service{*self, *other})).To(Equal([]string{
		"nodePort 30080 (port http) is allocated to Service default/other",
	}))
	g.Expect(NodePortHolders(newGI(), []corev1.Service{*self})).To(BeEmpty())
}
