package ingress

import (
	"net/netip"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
		{
			// Defense in depth: admission refuses these keys, and the builder drops them anyway.
			name: "keys no policy can allow are dropped, whatever the spec says",
			gi: newGI(func(gi *guestnetv1.GuestIngress) {
				lb := &gi.Spec.LoadBalancer
				lb.IP = ""
				lb.CIDRs = []string{"10.2.6.216/29"}
				lb.Annotations = map[string]string{
					"example.com/a":                                 "1",
					"lbipam.cilium.io/ips":                          "10.0.0.1",
					"lbipam.cilium.io/sharing-key":                  "victim",
					"lbipam.cilium.io/sharing-cross-namespace":      "*",
					"io.cilium/lb-ipam-ips":                         "10.0.0.1",
					"metallb.io/loadBalancerIPs":                    "10.0.0.1",
					"metallb.universe.tf/address-pool":              "infra",
					"guestnet.addons.cluster.x-k8s.io/guestingress": "other/web",
				}
				lb.Labels = map[string]string{
					"example.com/tier":                                        "edge",
					"service.kubernetes.io/service-proxy-name":                "none",
					"io.kubernetes.service.namespace":                         "kube-system",
					"io.kubernetes.service.name":                              "kube-dns",
					"app.kubernetes.io/managed-by":                            "someone",
					"guestnet.addons.cluster.x-k8s.io/guestingress-namespace": "other",
				}
			}),
			wantAnnotations: map[string]string{"example.com/a": "1"},
			wantClass:       "io.cilium/l2-announcer", wantETP: corev1.ServiceExternalTrafficPolicyCluster,
			wantLabels: map[string]string{"example.com/tier": "edge"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			svc := toService(t, HostService(tt.gi, nodePorts, Admission{}))

			g.Expect(svc.Namespace).To(Equal("k0smotron"))
			g.Expect(svc.Name).To(Equal("tenant-a-web"))
			g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeLoadBalancer))
			// Exactly the labels CAPI/CAPK guarantee on worker virt-launcher pods, the
			// KubevirtMachines' namespace among them; none with Local (guestnet writes the
			// endpoints: TestLocalEndpointsFollowTheIngressPods).
			if tt.wantETP == corev1.ServiceExternalTrafficPolicyLocal {
				g.Expect(svc.Spec.Selector).To(BeEmpty())
			} else {
				g.Expect(svc.Spec.Selector).To(Equal(map[string]string{
					"cluster.x-k8s.io/cluster-name": "tenant-a", "cluster.x-k8s.io/role": "worker", "kubevirt.io": "virt-launcher",
					"capk.cluster.x-k8s.io/kubevirt-machine-namespace": "k0smotron",
				}))
			}
			g.Expect(svc.Spec.Ports).To(Equal([]corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(30080)},
				{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(30443)},
			}))
			g.Expect(svc.Spec.LoadBalancerClass).To(Equal(ptr.To(tt.wantClass)))
			// No nodePort on any host node: Cilium's load balancer does not need them.
			g.Expect(svc.Spec.AllocateLoadBalancerNodePorts).To(Equal(ptr.To(false)))
			for _, p := range svc.Spec.Ports {
				g.Expect(p.NodePort).To(BeZero())
			}
			g.Expect(svc.Spec.HealthCheckNodePort).To(BeZero())
			g.Expect(svc.Spec.ExternalIPs).To(BeEmpty())
			g.Expect(svc.Spec.LoadBalancerIP).To(BeEmpty(), "the IP is requested with Cilium's annotation")
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
			g.Expect(pool.GetAnnotations()).To(Equal(map[string]string{"guestnet.addons.cluster.x-k8s.io/guestingress": "k0smotron/web",
				"guestnet.addons.cluster.x-k8s.io/guestingress-uid": "uid-1"}), "the GuestIngress exactly, and its UID")
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
		wantErr  string
	}{
		{
			name:    "no interface admitted: no policy that would announce on every interface",
			lb:      guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"},
			wantErr: "no host interface",
		},
		{
			name: "interfaces, every node",
			lb:   guestnetv1.LoadBalancerSpec{IP: "10.2.6.220", L2: &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^eth0$", "^bond[0-9]+$"}}},
			wantSpec: map[string]any{
				"serviceSelector": selector, "loadBalancerIPs": true, "interfaces": []any{"^eth0$", "^bond[0-9]+$"},
			},
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
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
				g.Expect(policy).To(BeNil())
				return
			}
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
		name        string
		gi          *guestnetv1.GuestIngress
		live        *corev1.Service
		wantType    corev1.ServiceType
		wantPorts   []corev1.ServicePort
		wantRecord  string // the OriginalGuestServiceAnnotation, "" for none
		wantEmpty   bool
		wantRefusal string
	}{
		{
			name:     "ClusterIP becomes NodePort with the fixed nodePorts, in the Service's order; the record keeps ClusterIP",
			gi:       newGI(),
			live:     guestSvc(corev1.ServiceTypeClusterIP, sp("https", 443, 0), sp("http", 80, 0)),
			wantType: corev1.ServiceTypeNodePort,
			wantPorts: []corev1.ServicePort{
				{Port: 443, Protocol: corev1.ProtocolTCP, NodePort: 30443},
				{Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080},
			},
			wantRecord: `{"type":"ClusterIP","nodePorts":[{"port":443,"protocol":"TCP"},{"port":80,"protocol":"TCP"}]}`,
		},
		{
			// Under server-side apply, leaving the type out would give it up: NodePort stays
			// in the configuration.
			name:     "NodePort, nodePorts followed: only the type, nothing to record",
			gi:       newGI(follow),
			live:     guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 31000), sp("https", 443, 31001)),
			wantType: corev1.ServiceTypeNodePort,
		},
		{
			name:       "NodePort with the user's nodePorts: those guestnet changes are recorded",
			gi:         newGI(),
			live:       guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 31000), sp("https", 443, 30443)),
			wantType:   corev1.ServiceTypeNodePort,
			wantPorts:  []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}, {Port: 443, Protocol: corev1.ProtocolTCP, NodePort: 30443}},
			wantRecord: `{"nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000}]}`,
		},
		{
			name:      "LoadBalancer allocates nodePorts: left alone",
			gi:        newGI(follow),
			live:      guestSvc(corev1.ServiceTypeLoadBalancer, sp("http", 80, 31000), sp("https", 443, 31001)),
			wantEmpty: true,
		},
		{
			name:       "LoadBalancer with fixed nodePorts: the type stays, the nodePorts are recorded",
			gi:         newGI(),
			live:       guestSvc(corev1.ServiceTypeLoadBalancer, sp("http", 80, 31000), sp("https", 443, 31001)),
			wantPorts:  []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}, {Port: 443, Protocol: corev1.ProtocolTCP, NodePort: 30443}},
			wantRecord: `{"nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000},{"port":443,"protocol":"TCP","nodePort":31001}]}`,
		},
		{
			name: "LoadBalancer without nodePorts is refused, not made NodePort",
			gi:   newGI(follow),
			live: func() *corev1.Service {
				s := guestSvc(corev1.ServiceTypeLoadBalancer, sp("http", 80, 0), sp("https", 443, 0))
				s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
				return s
			}(),
			wantRefusal: "Set allocateLoadBalancerNodePorts to true",
		},
		{
			name:        "ExternalName is refused",
			gi:          newGI(),
			live:        guestSvc(corev1.ServiceTypeExternalName),
			wantRefusal: "ExternalName",
		},
		{
			name: "headless is refused",
			gi:   newGI(),
			live: func() *corev1.Service {
				s := guestSvc(corev1.ServiceTypeClusterIP, sp("http", 80, 0))
				s.Spec.ClusterIP = corev1.ClusterIPNone
				return s
			}(),
			wantRefusal: "headless",
		},
		{
			name:       "a port the Service lacks is never added",
			gi:         newGI(),
			live:       guestSvc(corev1.ServiceTypeClusterIP, sp("http", 80, 0), sp("metrics", 8002, 0)),
			wantType:   corev1.ServiceTypeNodePort,
			wantPorts:  []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}},
			wantRecord: `{"type":"ClusterIP","nodePorts":[{"port":80,"protocol":"TCP"}]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			ac, refusal := GuestService(tt.gi, tt.live)
			if tt.wantRefusal != "" {
				g.Expect(ac).To(BeNil())
				g.Expect(refusal).To(ContainSubstring(tt.wantRefusal))
				g.Expect(refusal).To(ContainSubstring("projectcontour/envoy"))
				return
			}
			g.Expect(refusal).To(BeEmpty())
			g.Expect(*ac.Name).To(Equal("envoy"))
			g.Expect(*ac.Namespace).To(Equal("projectcontour"))
			if tt.wantEmpty {
				g.Expect(ac.Spec).To(BeNil())
				g.Expect(ac.Annotations).To(BeNil())
				return
			}
			svc := toService(t, ac)
			g.Expect(svc.Spec.Type).To(Equal(tt.wantType))
			g.Expect(svc.Spec.Ports).To(Equal(tt.wantPorts))
			g.Expect(svc.Annotations[guestnetv1.OriginalGuestServiceAnnotation]).To(Equal(tt.wantRecord))
			// Nothing else of the user's Service is in the configuration.
			svc.Spec.Type, svc.Spec.Ports = "", nil
			g.Expect(svc.Spec).To(Equal(corev1.ServiceSpec{}))
			g.Expect(svc.Labels).To(BeNil())
			g.Expect(len(svc.Annotations)).To(BeNumerically("<=", 1))
		})
	}
	g := NewWithT(t)
	release := toService(t, Release(guestSvc(corev1.ServiceTypeNodePort)))
	g.Expect(release.Spec).To(Equal(corev1.ServiceSpec{}), "the release gives back every field")
	g.Expect(release.Annotations).To(BeNil(), "and the record")
}

// Once guestnet owns a field, what it recorded stays the record: its own value never becomes
// "what the user had". A field the user took back is recorded anew.
func TestGuestServiceRecordKeepsTheUsersValues(t *testing.T) {
	g := NewWithT(t)
	gi := newGI()
	live := guestSvc(corev1.ServiceTypeClusterIP, sp("http", 80, 0), sp("https", 443, 0))
	first, _ := GuestService(gi, live)

	// The Service as the apiserver keeps it after guestnet's apply.
	applied := toService(t, first)
	live.Spec.Type = corev1.ServiceTypeNodePort
	live.Spec.Ports[0].NodePort, live.Spec.Ports[1].NodePort = 30080, 30443
	live.Annotations = applied.Annotations
	live.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "guestnet", Operation: metav1.ManagedFieldsOperationApply, FieldsType: "FieldsV1",
		FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{"f:guestnet.addons.cluster.x-k8s.io/original":{}}},"f:spec":{"f:type":{},` +
			`"f:ports":{"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:nodePort":{},"f:port":{},"f:protocol":{}},` +
			`"k:{\"port\":443,\"protocol\":\"TCP\"}":{".":{},"f:nodePort":{},"f:port":{},"f:protocol":{}}}}}`)}}
	second, _ := GuestService(gi, live)
	g.Expect(toService(t, second).Annotations).To(Equal(applied.Annotations))

	// The user's Helm sets nodePort 31000 on port 80: guestnet no longer owns it.
	live.Spec.Ports[0].NodePort = 31000
	live.ManagedFields[0].FieldsV1.SetRawString(`{"f:metadata":{"f:annotations":{"f:guestnet.addons.cluster.x-k8s.io/original":{}}},"f:spec":{"f:type":{},` +
		`"f:ports":{"k:{\"port\":443,\"protocol\":\"TCP\"}":{".":{},"f:nodePort":{},"f:port":{},"f:protocol":{}}}}}`)
	third, _ := GuestService(gi, live)
	g.Expect(toService(t, third).Annotations[guestnetv1.OriginalGuestServiceAnnotation]).To(
		Equal(`{"type":"ClusterIP","nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000},{"port":443,"protocol":"TCP"}]}`))
}

func TestRestore(t *testing.T) {
	withRecord := func(svc *corev1.Service, record string) *corev1.Service {
		svc.Annotations = map[string]string{guestnetv1.OriginalGuestServiceAnnotation: record}
		return svc
	}
	tests := []struct {
		name         string
		live         *corev1.Service
		wantWhat     []string
		wantPatches  []string
		wantRecorded bool
	}{
		{
			name:         "NodePort back to ClusterIP: the apiserver drops the nodePorts with the type",
			live:         withRecord(guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 30080)), `{"type":"ClusterIP","nodePorts":[{"port":80,"protocol":"TCP"}]}`),
			wantWhat:     []string{"type ClusterIP"},
			wantPatches:  []string{`[{"op":"test","path":"/spec/type","value":"NodePort"},{"op":"replace","path":"/spec/type","value":"ClusterIP"}]`},
			wantRecorded: true,
		},
		{
			name: "the user's nodePorts back, each on its own",
			live: withRecord(guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 30080), sp("https", 443, 30443)),
				`{"type":"NodePort","nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000},{"port":443,"protocol":"TCP","nodePort":30443}]}`),
			wantWhat: []string{"nodePort 31000 of port 80/TCP"},
			wantPatches: []string{`[{"op":"test","path":"/spec/ports/0/port","value":80},{"op":"test","path":"/spec/ports/0/nodePort","value":30080},` +
				`{"op":"replace","path":"/spec/ports/0/nodePort","value":31000}]`},
			wantRecorded: true,
		},
		{
			name:         "nothing changed",
			live:         withRecord(guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 31000)), `{"type":"NodePort","nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000}]}`),
			wantRecorded: true,
		},
		{name: "no record", live: guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 31000))},
		{name: "an unreadable record is no record", live: withRecord(guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 31000)), `{"type":`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			patches, recorded := Restore(tt.live)
			g.Expect(recorded).To(Equal(tt.wantRecorded))
			var what, raw []string
			for _, p := range patches {
				what, raw = append(what, p.What), append(raw, string(p.Patch))
			}
			g.Expect(what).To(Equal(tt.wantWhat))
			g.Expect(raw).To(Equal(tt.wantPatches))
		})
	}
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

func TestForbiddenHostServiceKey(t *testing.T) {
	g := NewWithT(t)
	for _, key := range []string{
		"lbipam.cilium.io/ips", "lbipam.cilium.io/sharing-key", "lbipam.cilium.io/sharing-cross-namespace",
		"io.cilium/lb-ipam-ips", "io.cilium/lb-ipam-sharing-key", "metallb.io/loadBalancerIPs", "metallb.universe.tf/allow-shared-ip",
		"guestnet.addons.cluster.x-k8s.io/guestingress", "app.kubernetes.io/managed-by", "cluster.x-k8s.io/cluster-name",
		"service.kubernetes.io/service-proxy-name", "io.kubernetes.service.namespace", "io.kubernetes.service.name",
	} {
		g.Expect(ForbiddenHostServiceKey(key)).To(BeTrue(), key)
	}
	for _, key := range []string{
		"example.com/team", "app.kubernetes.io/name", "cluster.x-k8s.io/role", "service.kubernetes.io/headless-x",
		"external-dns.alpha.kubernetes.io/hostname", "io.cilium/global-service", "lbipam.cilium.io", "team",
	} {
		g.Expect(ForbiddenHostServiceKey(key)).To(BeFalse(), key)
	}
}

func pool(spec map[string]any) *unstructured.Unstructured {
	p := NewPool()
	p.SetName("shared")
	p.Object["spec"] = spec
	return p
}

func TestPoolNamespaces(t *testing.T) {
	tests := []struct {
		name       string
		selector   any // nil: no serviceSelector
		want       []string
		wantPinned bool
	}{
		{name: "no selector selects every Service"},
		{name: "a label a tenant can set", selector: map[string]any{"matchLabels": map[string]any{"cluster.x-k8s.io/cluster-name": "tenant-a"}}},
		{name: "guestnet's namespace label (a tenant can put it on a Service of theirs)", selector: map[string]any{"matchLabels": map[string]any{"guestnet.addons.cluster.x-k8s.io/guestingress-namespace": "k0smotron"}}},
		{name: "by name only: any namespace may have a Service of that name", selector: map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.name": "tenant-a-web"}}},
		{
			name: "namespace by matchLabels", selector: map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": "k0smotron", "tier": "edge"}},
			want: []string{"k0smotron"}, wantPinned: true,
		},
		{
			name: "namespaces by In",
			selector: map[string]any{"matchExpressions": []any{
				map[string]any{"key": "io.kubernetes.service.namespace", "operator": "In", "values": []any{"b", "a"}},
			}},
			want: []string{"a", "b"}, wantPinned: true,
		},
		{
			name: "NotIn pins nothing",
			selector: map[string]any{"matchExpressions": []any{
				map[string]any{"key": "io.kubernetes.service.namespace", "operator": "NotIn", "values": []any{"kube-system"}},
			}},
		},
		{
			name: "Exists pins nothing",
			selector: map[string]any{"matchExpressions": []any{
				map[string]any{"key": "io.kubernetes.service.namespace", "operator": "Exists"},
			}},
		},
		{
			name: "two requirements intersect",
			selector: map[string]any{
				"matchLabels": map[string]any{"io.kubernetes.service.namespace": "a"},
				"matchExpressions": []any{
					map[string]any{"key": "io.kubernetes.service.namespace", "operator": "In", "values": []any{"a", "b"}},
				},
			},
			want: []string{"a"}, wantPinned: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			spec := map[string]any{"blocks": []any{map[string]any{"cidr": "10.2.6.0/24"}}}
			if tt.selector != nil {
				spec["serviceSelector"] = tt.selector
			}
			got, pinned, err := PoolNamespaces(pool(spec))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(pinned).To(Equal(tt.wantPinned))
			g.Expect(got).To(Equal(tt.want))
		})
	}
}

func TestPoolRanges(t *testing.T) {
	g := NewWithT(t)
	p := pool(map[string]any{"blocks": []any{
		map[string]any{"cidr": "10.2.6.0/28"},
		map[string]any{"start": "10.3.0.10", "stop": "10.3.0.20"},
		map[string]any{"start": "10.4.0.7"}, // a lone address
		map[string]any{"cidr": "not-a-cidr"},
	}})
	ranges := PoolRanges(p)
	g.Expect(ranges).To(HaveLen(3))
	in := func(s string) bool { return RangesContain(ranges, netip.MustParseAddr(s)) }
	g.Expect(in("10.2.6.15")).To(BeTrue())
	g.Expect(in("10.2.6.16")).To(BeFalse())
	g.Expect(in("10.3.0.10")).To(BeTrue())
	g.Expect(in("10.3.0.20")).To(BeTrue())
	g.Expect(in("10.3.0.21")).To(BeFalse())
	g.Expect(in("10.4.0.7")).To(BeTrue())
	g.Expect(in("10.4.0.8")).To(BeFalse())
	overlaps := func(s string) bool { return RangesOverlap(ranges, netip.MustParsePrefix(s)) }
	g.Expect(overlaps("10.2.6.8/29")).To(BeTrue())
	g.Expect(overlaps("10.2.0.0/16")).To(BeTrue())
	g.Expect(overlaps("10.3.0.0/29")).To(BeFalse())
	g.Expect(overlaps("10.3.0.16/28")).To(BeTrue())
	g.Expect(overlaps("10.4.0.7/32")).To(BeTrue())
	g.Expect(overlaps("10.5.0.0/16")).To(BeFalse())
}

// The hint guestnet gives when a poolRef pool does not select the host Service never
// suggests selecting by a label whose value a tenant chooses.
func TestPoolSelectorHint(t *testing.T) {
	g := NewWithT(t)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a-web", Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "tenant-a"}}}
	other := pool(map[string]any{"serviceSelector": map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": "elsewhere"}}})
	hint := PoolSelectorHint(other, svc)
	g.Expect(hint).To(ContainSubstring("does not select Service k0smotron/tenant-a-web"))
	g.Expect(hint).To(ContainSubstring("io.kubernetes.service.namespace: k0smotron"))
	g.Expect(hint).To(ContainSubstring("io.kubernetes.service.name: tenant-a-web"))
	g.Expect(hint).To(ContainSubstring("never by a label of the Service such as cluster.x-k8s.io/cluster-name"))
	g.Expect(hint).NotTo(ContainSubstring("cluster.x-k8s.io/cluster-name=tenant-a"))
	g.Expect(hint).NotTo(ContainSubstring("spec.loadBalancer.labels"))

	selecting := pool(map[string]any{"serviceSelector": map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": "k0smotron"}}})
	g.Expect(PoolSelectorHint(selecting, svc)).To(BeEmpty())
	g.Expect(PoolSelectorHint(nil, svc)).To(BeEmpty())
}
