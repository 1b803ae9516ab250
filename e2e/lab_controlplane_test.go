package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// The k0smotron stand-in plays k0smotron's LoadBalancer control-plane Service
// (lab.WithControlPlaneLoadBalancer): kmc-<name>-lb, applied by field manager k0smotron, gets
// no IP while no pool selects it, and then the control plane has no endpoint and no Secret;
// with a pool and an L2 policy selecting exactly it (what guestnet will create), the real
// LB-IPAM gives it the requested IP, the stand-in makes IP:6443 the control plane's endpoint
// and the kubeconfig's server, the real CAPI copies it into the Cluster, and the guest
// apiserver answers through the IP, with its certificate verified for the IP, from the lab
// namespace and from inside a worker VM on the kernel datapath. Another field manager's
// lbipam.cilium.io/ips survives k0smotron's applies.
func TestLab_K0smotronStandInExposesTheControlPlaneOnALoadBalancerIP(t *testing.T) {
	g := NewWithT(t)
	g.SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	host := l.Host.Client
	ns := uniqueName("cplb")
	ip := lab.GuestControlPlaneLoadBalancerIP
	wantEndpoint := clusterv1.APIEndpoint{Host: ip, Port: lab.APIServerPort}

	startCiliumStandIn(t, l)
	capi, err := l.StartCAPI(ctx, ns, ns)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capi.Stop)
	k0s, err := l.StartK0smotronStandIn(ctx, ns)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(k0s.Stop)
	gc, err := l.CreateGuestCluster(ctx, ns, "tenant", lab.WorkerTemplateOptions{Ports: []int32{22, 10250}},
		lab.ForRealCAPI(ns), lab.ForRealCAPK(), lab.WithControlPlaneLoadBalancer())
	g.Expect(err).NotTo(HaveOccurred())
	svcKey := client.ObjectKey{Namespace: ns, Name: lab.ControlPlaneServiceName(gc.Name)}
	g.Expect(svcKey.Name).To(Equal("kmc-tenant-lb"))

	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(lab.ControlPlaneGVK)
	controlPlaneEndpoint := func() (map[string]any, error) {
		if err := host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.Name}, cp); err != nil {
			return nil, err
		}
		e, _, err := unstructured.NestedMap(cp.Object, "spec", "controlPlaneEndpoint")
		return e, err
	}
	kubeconfigSecret := func() (*corev1.Secret, error) {
		s := &corev1.Secret{}
		return s, host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.Name + "-kubeconfig"}, s)
	}
	cluster := &clusterv1.Cluster{}

	svc := &corev1.Service{}
	g.Eventually(func(g Gomega) {
		g.Expect(host.Get(ctx, svcKey, svc)).To(Succeed())
	}).WithTimeout(30 * time.Second).Should(Succeed())
	t.Run("k0smotron's Service", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeLoadBalancer))
		g.Expect(svc.Spec.Selector).To(BeEmpty())
		g.Expect(ptr.Deref(svc.Spec.LoadBalancerClass, "")).To(Equal("io.cilium/l2-announcer"))
		var ports []string
		for _, p := range svc.Spec.Ports {
			ports = append(ports, p.Name+" "+p.TargetPort.String())
			g.Expect(p.Port).To(Equal(p.TargetPort.IntVal))
		}
		g.Expect(ports).To(Equal([]string{"api 6443", "konnectivity 8132"}))
		g.Expect(svc.OwnerReferences).To(ConsistOf(HaveField("Kind", "K0smotronControlPlane")))
		var managers []string
		for _, m := range svc.ManagedFields {
			if m.Operation == metav1.ManagedFieldsOperationApply {
				managers = append(managers, m.Manager)
			}
		}
		g.Expect(managers).To(ConsistOf("k0smotron"))
	})

	t.Run("without a pool: no IP, no endpoint, no Secret", func(t *testing.T) {
		g := NewWithT(t)
		g.Consistently(func(g Gomega) {
			g.Expect(host.Get(ctx, svcKey, svc)).To(Succeed())
			g.Expect(svc.Status.LoadBalancer.Ingress).To(BeEmpty())
			g.Expect(controlPlaneEndpoint()).To(BeNil())
			_, err := kubeconfigSecret()
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "Secret: %v", err)
			g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.Name}, cluster)).To(Succeed())
			g.Expect(cluster.Spec.ControlPlaneEndpoint.IsValid()).To(BeFalse())
		}).WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	})

	// guestnet's part, by hand: the IP requested with a field manager of its own, a pool and
	// an L2 policy selecting exactly this Service.
	request := corev1ac.Service(svcKey.Name, ns).WithAnnotations(map[string]string{"lbipam.cilium.io/ips": ip})
	g.Expect(host.Apply(ctx, request, client.FieldOwner("guestnet-test"), client.ForceOwnership)).To(Succeed())
	selector := map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": ns, "io.kubernetes.service.name": svcKey.Name}}
	pool := &unstructured.Unstructured{}
	pool.SetGroupVersionKind(schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumLoadBalancerIPPool"})
	pool.SetName(ns)
	pool.Object["spec"] = map[string]any{"blocks": []any{map[string]any{"cidr": ip + "/32"}}, "serviceSelector": selector}
	policy := &unstructured.Unstructured{}
	policy.SetGroupVersionKind(schema.GroupVersionKind{Group: "cilium.io", Version: "v2alpha1", Kind: "CiliumL2AnnouncementPolicy"})
	policy.SetName(ns)
	policy.Object["spec"] = map[string]any{"serviceSelector": selector, "loadBalancerIPs": true, "interfaces": []any{"^lo$"}}
	for _, o := range []*unstructured.Unstructured{pool, policy} {
		g.Expect(host.Create(ctx, o)).To(Succeed())
		t.Cleanup(func() { _ = host.Delete(context.Background(), o) })
	}

	g.Eventually(func(g Gomega) {
		g.Expect(host.Get(ctx, svcKey, svc)).To(Succeed())
		g.Expect(svc.Status.LoadBalancer.Ingress).To(ConsistOf(HaveField("IP", ip)))
	}).WithTimeout(30*time.Second).Should(Succeed(), "LB-IPAM gives the Service the requested IP")
	g.Eventually(controlPlaneEndpoint).WithTimeout(30*time.Second).Should(Equal(map[string]any{"host": ip, "port": int64(lab.APIServerPort)}),
		"the control plane's endpoint is the IP")
	g.Eventually(func(g Gomega) {
		g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.Name}, cluster)).To(Succeed())
		g.Expect(cluster.Spec.ControlPlaneEndpoint).To(Equal(wantEndpoint))
		g.Expect(ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false)).To(BeTrue())
	}).WithTimeout(time.Minute).Should(Succeed(), "CAPI copies the control plane's endpoint into the Cluster")
	var secret *corev1.Secret
	g.Eventually(func() error { secret, err = kubeconfigSecret(); return err }).WithTimeout(30 * time.Second).Should(Succeed())
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["value"])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.Host).To(Equal("https://" + net.JoinHostPort(ip, "6443")))

	g.Expect(host.Get(ctx, svcKey, svc)).To(Succeed())
	g.Expect(svc.Annotations).To(HaveKeyWithValue("lbipam.cilium.io/ips", ip), "k0smotron's applies leave another manager's annotation alone")

	t.Run("the guest apiserver answers through the IP from the lab namespace", func(t *testing.T) {
		NewWithT(t).Eventually(func(g Gomega) { readyz(ctx, g, cfg, nil) }).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
	})
	t.Run("and from inside a worker VM on the kernel datapath", func(t *testing.T) {
		g := NewWithT(t)
		w, err := l.AddWorker(ctx, gc, ns+"-w", "10.244.115.5", lab.OnKernelDatapath())
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func(g Gomega) {
			readyz(ctx, g, cfg, func(ctx context.Context, network, address string) (net.Conn, error) {
				return w.DialFromVM(ctx, network, address)
			})
		}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
	})
}

// readyz GETs /readyz through cfg (a kubeconfig's CA and client certificate; TLS verifies the
// server's address against the serving certificate), dialing with dial when set (from inside
// a VM, say), and expects "ok".
func readyz(ctx context.Context, g Gomega, cfg *rest.Config, dial func(ctx context.Context, network, address string) (net.Conn, error)) {
	c := rest.CopyConfig(cfg)
	c.Dial = dial
	hc, err := rest.HTTPClientFor(c)
	g.Expect(err).NotTo(HaveOccurred())
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/readyz", http.NoBody)
	g.Expect(err).NotTo(HaveOccurred())
	resp, err := hc.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "%s", body)
	g.Expect(string(body)).To(Equal("ok"))
}
