package bridge

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// testBackend is a backend with two ports, one of them without a nodePort (range exhausted).
func testBackend() *Backend {
	svc := chartService(cmNS, cmSvc, 443)
	return &Backend{
		Service: &svc,
		Ports: []BackendPort{
			{Name: "https", Port: 443, TargetPort: intstr.FromString("https"), NodePort: 32701},
			{Port: 8443, TargetPort: intstr.FromInt32(10250), NodePort: 32702},
			{Name: "metrics", Port: 9402, TargetPort: intstr.FromInt32(9402)},
		},
		NodePortService:     hostnames.BridgeNodePortService(cmSvc),
		ExternalNameService: hostnames.BridgeExternalNameService(cmSvc),
		HostService:         cmHostService,
		APIService:          true,
	}
}

func expectBridgeGuestMarks(g Gomega, gwb *guestnetv1.GuestWebhookBridge, svc *corev1.Service) {
	g.Expect(ownership.IsBridgeObject(svc, gwb)).To(BeTrue(), "the bridge recognises its Service")
	g.Expect(ownership.IsBridgeObject(svc, newBridge(func(b *guestnetv1.GuestWebhookBridge) { b.Name = "other" }))).To(BeFalse())
	g.Expect(svc.Labels).To(Equal(ownership.BridgeGuestLabels(gwb)))
	for k, v := range ownership.SelectBridge(gwb) {
		g.Expect(svc.Labels).To(HaveKeyWithValue(k, v), "found by the bridge's selector")
	}
	g.Expect(svc.Annotations).To(Equal(map[string]string{ownership.BridgeAnnotation: me}))
	g.Expect(svc.OwnerReferences).To(BeEmpty(), "a guest object cannot be owned by a host object")
}

func TestGuestNodePortService(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge()
	b := testBackend()
	svc := toService(t, GuestNodePortService(gwb, b))

	g.Expect(svc.Namespace).To(Equal(cmNS))
	g.Expect(svc.Name).To(Equal("cert-manager-webhook-guestnet-nodeport"))
	g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeNodePort))
	g.Expect(svc.Spec.Selector).To(Equal(map[string]string{"app": cmSvc}), "the chart Service's selector")
	g.Expect(svc.Spec.Ports).To(Equal([]corev1.ServicePort{
		{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromString("https"), NodePort: 32701},
		{Name: "port-8443", Protocol: corev1.ProtocolTCP, Port: 8443, TargetPort: intstr.FromInt32(10250), NodePort: 32702},
	}), "ports without a nodePort are left out")
	expectBridgeGuestMarks(g, gwb, &svc)
	g.Expect(ownership.IsBridgeObject(b.Service, gwb)).To(BeFalse(), "the chart's Service is not the bridge's")
}

func TestGuestExternalNameService(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge()
	svc := toService(t, GuestExternalNameService(gwb, testBackend()))

	g.Expect(svc.Namespace).To(Equal(cmNS))
	g.Expect(svc.Name).To(Equal("cert-manager-webhook-guestnet"))
	g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeExternalName))
	g.Expect(svc.Spec.ExternalName).To(Equal(cmHostService + ".k0smotron.svc"))
	g.Expect(svc.Spec.Selector).To(BeNil())
	g.Expect(svc.Spec.Ports).To(Equal([]corev1.ServicePort{
		{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(443)},
		{Name: "port-8443", Protocol: corev1.ProtocolTCP, Port: 8443, TargetPort: intstr.FromInt32(8443)},
	}))
	expectBridgeGuestMarks(g, gwb, &svc)
}

func TestHostService(t *testing.T) {
	g := NewWithT(t)
	gwb := newBridge()
	svc := toService(t, HostService(gwb, testBackend()))

	g.Expect(svc.Namespace).To(Equal("k0smotron"), "the Cluster's namespace")
	g.Expect(svc.Name).To(Equal(cmHostService))
	g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP))
	g.Expect(svc.Spec.Selector).To(Equal(virtlauncher.WorkerSelector("k0smotron", "tenant-a")))
	g.Expect(svc.Spec.Ports).To(Equal([]corev1.ServicePort{
		{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(32701)},
		{Name: "port-8443", Protocol: corev1.ProtocolTCP, Port: 8443, TargetPort: intstr.FromInt32(32702)},
	}), "targetPort is the guest nodePort on the virt-launcher pods")
	g.Expect(svc.OwnerReferences).To(Equal([]metav1.OwnerReference{{
		APIVersion: guestnetv1.GroupVersion.String(), Kind: "GuestWebhookBridge", Name: "bridge", UID: "uid-bridge",
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}))
	g.Expect(svc.Labels).To(Equal(ownership.BridgeHostLabels(gwb, cmNS, cmSvc)))
	g.Expect(svc.Labels).To(HaveKeyWithValue(ownership.ClusterNameLabel, "tenant-a"))
	for k, v := range ownership.SelectBridge(gwb) {
		g.Expect(svc.Labels).To(HaveKeyWithValue(k, v), "found by the bridge's selector")
	}
	g.Expect(svc.Annotations).To(Equal(map[string]string{ownership.BridgeAnnotation: me}))
	g.Expect(ownership.IsBridgeObject(&svc, gwb)).To(BeTrue())
}

func TestBackendPorts(t *testing.T) {
	g := NewWithT(t)
	b := testBackend()
	g.Expect(b.Key()).To(Equal("cert-manager/cert-manager-webhook"))
	g.Expect(b.NodePort(443)).To(Equal(int32(32701)))
	g.Expect(b.NodePort(9402)).To(BeZero())
	g.Expect(b.NodePort(1)).To(BeZero())
	g.Expect(b.Usable()).To(BeTrue())
	g.Expect(b.allocated()).To(HaveLen(2))
	g.Expect(BackendPort{Port: 8443}.PortName()).To(Equal("port-8443"))
	g.Expect(BackendPort{Name: "https", Port: 8443}.PortName()).To(Equal("https"))
	g.Expect(ServiceKey(b, b.ExternalNameService).String()).To(Equal("cert-manager/cert-manager-webhook-guestnet"))
	g.Expect(HostNamespace(newBridge())).To(Equal("k0smotron"))

	for i := range b.Ports {
		b.Ports[i].NodePort = 0
	}
	g.Expect(b.Usable()).To(BeFalse())
	g.Expect(toService(t, HostService(newBridge(), b)).Spec.Ports).To(BeEmpty())
}
