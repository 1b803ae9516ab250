package ingress

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ssa"
)

func endpoint(uid string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{"10.244.1." + uid},
		TargetRef:  &corev1.ObjectReference{UID: types.UID(uid)},
		Conditions: discoveryv1.EndpointConditions{Ready: ready},
	}
}

func TestCountEndpoints(t *testing.T) {
	tests := []struct {
		name                 string
		slices               []discoveryv1.EndpointSlice
		wantReady, wantTotal int32
	}{
		{name: "no slice"},
		{name: "empty slice", slices: []discoveryv1.EndpointSlice{{}}},
		{
			name: "ready, not ready, unset (counts as ready)",
			slices: []discoveryv1.EndpointSlice{{Endpoints: []discoveryv1.Endpoint{
				endpoint("1", ptr.To(true)), endpoint("2", ptr.To(false)), endpoint("3", nil),
			}}},
			wantReady: 2, wantTotal: 3,
		},
		{
			name: "a pod in two slices counts once",
			slices: []discoveryv1.EndpointSlice{
				{Endpoints: []discoveryv1.Endpoint{endpoint("1", ptr.To(true))}},
				{Endpoints: []discoveryv1.Endpoint{endpoint("1", ptr.To(true)), endpoint("2", ptr.To(true))}},
			},
			wantReady: 2, wantTotal: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			ready, total := CountEndpoints(tt.slices)
			g.Expect(ready).To(Equal(tt.wantReady))
			g.Expect(total).To(Equal(tt.wantTotal))
		})
	}
}

func TestSetEndpoints(t *testing.T) {
	tests := []struct {
		name         string
		ready, total int32
		wantStatus   metav1.ConditionStatus
		wantMessage  []string
	}{
		{
			name: "nothing selected", wantStatus: metav1.ConditionFalse,
			wantMessage: []string{
				"The selector capk.cluster.x-k8s.io/kubevirt-machine-namespace=k0smotron,cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher of Service k0smotron/tenant-a-web matches no pod",
				"kubectl get pods -n k0smotron -l capk.cluster.x-k8s.io/kubevirt-machine-namespace=k0smotron,cluster.x-k8s.io/cluster-name=tenant-a,",
			},
		},
		{name: "selected, none ready", total: 2, wantStatus: metav1.ConditionFalse, wantMessage: []string{"2 worker virt-launcher pods match", "none is ready"}},
		{name: "ready", ready: 1, total: 2, wantStatus: metav1.ConditionTrue, wantMessage: []string{"1 of 2 worker virt-launcher pods"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			gi := newGI()
			SetEndpoints(gi, "k0smotron", "tenant-a-web", tt.ready, tt.total)
			c := conditions.Get(gi, guestnetv1.EndpointsReadyCondition)
			g.Expect(c.Status).To(Equal(tt.wantStatus))
			if tt.wantStatus == metav1.ConditionFalse {
				g.Expect(c.Reason).To(Equal(guestnetv1.NoEndpointsReason))
			}
			for _, m := range tt.wantMessage {
				g.Expect(c.Message).To(ContainSubstring(m))
			}
		})
	}
}

func TestGuestServiceConditions(t *testing.T) {
	g := NewWithT(t)
	gi := newGI()

	SetGuestServiceNotFound(gi)
	c := conditions.Get(gi, guestnetv1.GuestServiceReadyCondition)
	g.Expect(c.Reason).To(Equal(guestnetv1.GuestServiceNotFoundReason))
	g.Expect(c.Message).To(ContainSubstring("Waiting for Service projectcontour/envoy in the guest cluster"))

	SetGuestServicePortNotFound(gi, guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 30080), sp("admin", 9001, 31000)), gi.Spec.Ports[1:])
	c = conditions.Get(gi, guestnetv1.GuestServiceReadyCondition)
	g.Expect(c.Reason).To(Equal(guestnetv1.GuestServicePortNotFoundReason))
	g.Expect(c.Message).To(ContainSubstring("has no port for https (443/TCP); it has 80/TCP, 9001/TCP"))

	SetNodePortConflict(gi, []string{"nodePort 30080 (port http) is allocated to Service default/other"}, "spec.ports[0].nodePort: provided port is already allocated")
	c = conditions.Get(gi, guestnetv1.GuestServiceReadyCondition)
	g.Expect(c.Reason).To(Equal(guestnetv1.NodePortConflictReason))
	g.Expect(c.Message).To(ContainSubstring("nodePort 30080 (port http) is allocated to Service default/other"))

	SetGuestServiceReady(gi, []guestnetv1.IngressPortStatus{{Name: "http", Port: 80, NodePort: 30080}})
	c = conditions.Get(gi, guestnetv1.GuestServiceReadyCondition)
	g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
	g.Expect(c.Message).To(ContainSubstring("http 80 -> nodePort 30080"))
}

func TestLoadBalancerConditions(t *testing.T) {
	g := NewWithT(t)
	gi := newGI()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a-web"}}

	SetIPPending(gi, svc, &metav1.Condition{Type: IPAMRequestSatisfiedCondition, Status: metav1.ConditionFalse, Reason: "no_pool", Message: "no pool matches"}, "")
	c := conditions.Get(gi, guestnetv1.LoadBalancerReadyCondition)
	g.Expect(c.Reason).To(Equal(guestnetv1.IPPendingReason))
	g.Expect(c.Message).To(ContainSubstring("Cilium says cilium.io/IPAMRequestSatisfied=False (no_pool: no pool matches)"))

	SetCiliumPoolConflict(gi, "k0smotron.tenant-a-web", &metav1.Condition{Reason: "cidr_overlap", Message: "Pool conflicts since range '10.98.0.8/29' overlaps range '10.98.0.0/28' from IP Pool 'admins-pool'"})
	c = conditions.Get(gi, guestnetv1.LoadBalancerReadyCondition)
	g.Expect(c.Reason).To(Equal(guestnetv1.PoolConflictReason))
	g.Expect(c.Message).To(ContainSubstring("Cilium reports CiliumLoadBalancerIPPool k0smotron.tenant-a-web as conflicting (cidr_overlap)"))
	g.Expect(c.Message).NotTo(ContainSubstring("admins-pool"), "Cilium's message names the other pool: the platform's or another namespace's")

	SetLoadBalancerReady(gi, svc, "10.2.6.220", "k0smotron.tenant-a-web", "k0smotron.tenant-a-web")
	g.Expect(conditions.IsTrue(gi, guestnetv1.LoadBalancerReadyCondition)).To(BeTrue())
	g.Expect(LoadBalancerIP(&corev1.Service{Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{
		Ingress: []corev1.LoadBalancerIngress{{Hostname: "x"}, {IP: "10.2.6.220"}},
	}}})).To(Equal("10.2.6.220"))
}

func TestSelectorMatchesService(t *testing.T) {
	pool := func(selector map[string]any) *unstructured.Unstructured {
		u := NewPool()
		u.Object["spec"] = map[string]any{}
		if selector != nil {
			u.Object["spec"] = map[string]any{"serviceSelector": selector}
		}
		return u
	}
	tests := []struct {
		name     string
		selector map[string]any
		want     bool
	}{
		{name: "no selector selects everything", want: true},
		{name: "by Cilium's pseudo-labels", selector: ServiceSelector(newGI()), want: true},
		{name: "by the Service's labels", selector: map[string]any{"matchLabels": map[string]any{"cluster.x-k8s.io/cluster-name": "tenant-a"}}, want: true},
		{name: "another Service", selector: map[string]any{"matchLabels": map[string]any{ServiceNameKey: "other"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			ok, err := SelectorMatchesService(pool(tt.selector), map[string]string{"cluster.x-k8s.io/cluster-name": "tenant-a"}, "k0smotron", "tenant-a-web")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ok).To(Equal(tt.want))
		})
	}
}

// The Cilium pool as guestnet applies it, judged by internal/ssa.
func TestObjectUpToDate(t *testing.T) {
	desired := Pool(newGI())
	live := func(fields string, mutate func(*unstructured.Unstructured)) *unstructured.Unstructured {
		u := desired.DeepCopy()
		u.Object["spec"].(map[string]any)["disabled"] = false // a schema default
		u.SetResourceVersion("7")
		u.SetManagedFields([]metav1.ManagedFieldsEntry{{
			Manager: "guestnet", Operation: metav1.ManagedFieldsOperationApply, FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(fields),
		}})
		if mutate != nil {
			mutate(u)
		}
		return u
	}
	const owned = `{"f:metadata":{"f:annotations":{"f:guestnet.addons.cluster.x-k8s.io/guestingress":{}},"f:labels":{` +
		`"f:app.kubernetes.io/managed-by":{},"f:cluster.x-k8s.io/cluster-name":{},"f:guestnet.addons.cluster.x-k8s.io/guest-service-name":{},` +
		`"f:guestnet.addons.cluster.x-k8s.io/guest-service-namespace":{},"f:guestnet.addons.cluster.x-k8s.io/guestingress-name":{},` +
		`"f:guestnet.addons.cluster.x-k8s.io/guestingress-namespace":{}}},"f:spec":{"f:blocks":{},"f:serviceSelector":{}}}`
	const ownedMore = `{"f:metadata":{"f:labels":{"f:example.com/removed":{}}},"f:spec":{"f:blocks":{},"f:serviceSelector":{}}}`

	tests := []struct {
		name string
		live *unstructured.Unstructured
		want bool
	}{
		{name: "unchanged (defaults added by the schema do not count)", live: live(owned, nil), want: true},
		{name: "a value changed by someone", live: live(owned, func(u *unstructured.Unstructured) {
			u.Object["spec"].(map[string]any)["blocks"] = []any{map[string]any{"cidr": "10.0.0.0/8"}}
		})},
		{name: "a label of guestnet's removed by someone", live: live(owned, func(u *unstructured.Unstructured) {
			labels := u.GetLabels()
			delete(labels, "cluster.x-k8s.io/cluster-name")
			u.SetLabels(labels)
		})},
		{name: "guestnet owns a field it no longer wants", live: live(ownedMore, func(u *unstructured.Unstructured) {
			labels := u.GetLabels()
			labels["example.com/removed"] = "x"
			u.SetLabels(labels)
		})},
		{name: "no managed fields of guestnet's", live: func() *unstructured.Unstructured {
			u := live(owned, nil)
			u.SetManagedFields(nil)
			return u
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(ssa.ObjectUpToDate(desired, tt.live)).To(Equal(tt.want))
		})
	}
}
