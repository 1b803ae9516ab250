package topology

import (
	"testing"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func clusterWithVariables(vars ...clusterv1.ClusterVariable) *clusterv1.Cluster {
	return &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "tenant-a", UID: "cluster-uid"},
		Spec: clusterv1.ClusterSpec{Topology: clusterv1.Topology{
			ClassRef: clusterv1.ClusterClassRef{Name: "kubevirt-guestnet"}, Version: "v1.33.1", Variables: vars,
		}},
	}
}

func variable(name, raw string) clusterv1.ClusterVariable {
	return clusterv1.ClusterVariable{Name: name, Value: apiextensionsv1.JSON{Raw: []byte(raw)}}
}

func TestVariableOf(t *testing.T) {
	tests := []struct {
		name      string
		cluster   *clusterv1.Cluster
		want      Variable
		wantFound bool
		wantErr   string
	}{
		{name: "no topology", cluster: &clusterv1.Cluster{}},
		{name: "no guestnet variable", cluster: clusterWithVariables(variable("other", `{"ingress":{}}`))},
		{name: "null", cluster: clusterWithVariables(variable(VariableName, `null`))},
		{name: "workerPorts only", cluster: clusterWithVariables(variable(VariableName, `{"workerPorts":[{"port":22}]}`)), wantFound: true},
		{
			name:      "ingress and webhookBridge; numbers stay integers",
			cluster:   clusterWithVariables(variable("other", `1`), variable(VariableName, `{"ingress":{"ports":[{"name":"http","port":80,"nodePort":30080}]},"webhookBridge":{"apiServices":{"all":true}}}`)),
			wantFound: true,
			want: Variable{
				Ingress:       map[string]any{"ports": []any{map[string]any{"name": "http", "port": int64(80), "nodePort": int64(30080)}}},
				WebhookBridge: map[string]any{"apiServices": map[string]any{"all": true}},
			},
		},
		{
			name:      "nodeIdentity: an empty object opts in",
			cluster:   clusterWithVariables(variable(VariableName, `{"nodeIdentity":{}}`)),
			wantFound: true,
			want:      Variable{NodeIdentity: map[string]any{}},
		},
		{
			name:      "nodeIdentity with nodeAddresses",
			cluster:   clusterWithVariables(variable(VariableName, `{"workerPorts":[{"port":8472,"protocol":"UDP"}],"nodeIdentity":{"nodeAddresses":"External"}}`)),
			wantFound: true,
			want:      Variable{NodeIdentity: map[string]any{"nodeAddresses": "External"}},
		},
		{
			name:      "nodeIdentity with the control plane address: passed on as it is",
			cluster:   clusterWithVariables(variable(VariableName, `{"nodeIdentity":{"controlPlane":{"ip":"10.2.6.221","l2":{"interfaces":["^eth0$"]},"serviceName":"kmc-tenant-a-lb"}}}`)),
			wantFound: true,
			want: Variable{NodeIdentity: map[string]any{"controlPlane": map[string]any{
				"ip": "10.2.6.221", "l2": map[string]any{"interfaces": []any{"^eth0$"}}, "serviceName": "kmc-tenant-a-lb",
			}}},
		},
		{name: "null parts are absent", cluster: clusterWithVariables(variable(VariableName, `{"ingress":null,"webhookBridge":null,"nodeIdentity":null}`)), wantFound: true},
		{name: "not an object", cluster: clusterWithVariables(variable(VariableName, `"x"`)), wantFound: true, wantErr: "is not an object"},
		{name: "ingress not an object", cluster: clusterWithVariables(variable(VariableName, `{"ingress":[1]}`)), wantFound: true, wantErr: "guestnet.ingress in the Cluster's topology variables must be an object"},
		{name: "webhookBridge not an object", cluster: clusterWithVariables(variable(VariableName, `{"webhookBridge":true}`)), wantFound: true, wantErr: "guestnet.webhookBridge"},
		{name: "nodeIdentity not an object", cluster: clusterWithVariables(variable(VariableName, `{"nodeIdentity":"Managed"}`)), wantFound: true, wantErr: "guestnet.nodeIdentity in the Cluster's topology variables must be an object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, found, err := VariableOf(tc.cluster)
			g.Expect(found).To(Equal(tc.wantFound))
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

func TestDesired(t *testing.T) {
	g := NewWithT(t)
	cluster := clusterWithVariables()
	spec := map[string]any{"guestService": map[string]any{"namespace": "a", "name": "b"}, "clusterName": "someone-else"}

	u := Desired(GuestIngressKind, cluster, spec, "")
	g.Expect(u.GetAPIVersion()).To(Equal(guestnetv1.GroupVersion.String()))
	g.Expect(u.GetKind()).To(Equal("GuestIngress"))
	g.Expect(u.GetNamespace()).To(Equal("ns"))
	g.Expect(u.GetName()).To(Equal("tenant-a"))
	g.Expect(u.GetLabels()).To(Equal(map[string]string{ManagedLabel: ManagedValue, clusterv1.ClusterNameLabel: "tenant-a"}))
	g.Expect(u.GetOwnerReferences()).To(Equal([]metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: "tenant-a", UID: "cluster-uid", Controller: ptr.To(true),
	}}))
	g.Expect(u.Object["spec"]).To(Equal(map[string]any{"guestService": map[string]any{"namespace": "a", "name": "b"}, "clusterName": "tenant-a"}),
		"clusterName is always the Cluster's")
	g.Expect(spec).To(HaveKeyWithValue("clusterName", "someone-else"), "the variable's value is not changed")
	g.Expect(Owns(cluster, u)).To(BeTrue())

	filtered := Desired(GuestWebhookBridgeKind, cluster, map[string]any{}, "blue")
	g.Expect(filtered.GetKind()).To(Equal("GuestWebhookBridge"))
	g.Expect(filtered.GetLabels()).To(HaveKeyWithValue(clusterv1.WatchLabel, "blue"))

	// An empty nodeIdentity (the opt-in alone) still makes a GuestNodeIdentity of the Cluster.
	identity := Desired(GuestNodeIdentityKind, cluster, map[string]any{}, "")
	g.Expect(identity.GetKind()).To(Equal("GuestNodeIdentity"))
	g.Expect(identity.GetName()).To(Equal("tenant-a"))
	g.Expect(identity.Object["spec"]).To(Equal(map[string]any{"clusterName": "tenant-a"}))
	g.Expect(Owns(cluster, identity)).To(BeTrue())

	// The control plane address is part of the spec like any other field.
	controlPlane := map[string]any{"ip": "10.2.6.221", "l2": map[string]any{"interfaces": []any{"^eth0$"}}}
	withAddress := Desired(GuestNodeIdentityKind, cluster, map[string]any{"nodeAddresses": "Managed", "controlPlane": controlPlane}, "")
	g.Expect(withAddress.Object["spec"]).To(Equal(map[string]any{"clusterName": "tenant-a", "nodeAddresses": "Managed", "controlPlane": controlPlane}))
}

// Every kind the controller manages has its field of the variable, its part of a Variable and
// its (empty) object, and the controller is woken by each.
func TestManagedKinds(t *testing.T) {
	g := NewWithT(t)
	v := Variable{Ingress: map[string]any{"i": 1}, WebhookBridge: map[string]any{"w": 1}, NodeIdentity: map[string]any{"n": 1}}
	want := map[string]struct {
		field string
		spec  map[string]any
		obj   any
	}{
		GuestIngressKind:       {IngressField, v.Ingress, &guestnetv1.GuestIngress{}},
		GuestWebhookBridgeKind: {WebhookBridgeField, v.WebhookBridge, &guestnetv1.GuestWebhookBridge{}},
		GuestNodeIdentityKind:  {NodeIdentityField, v.NodeIdentity, &guestnetv1.GuestNodeIdentity{}},
	}
	g.Expect(managedKinds).To(HaveLen(len(want)))
	for _, k := range managedKinds {
		w, ok := want[k.kind]
		g.Expect(ok).To(BeTrue(), "unexpected kind %s", k.kind)
		g.Expect(k.field).To(Equal(w.field), k.kind)
		g.Expect(k.spec(v)).To(Equal(w.spec), k.kind)
		g.Expect(k.newObject()).To(Equal(w.obj), k.kind)
	}
}

func TestOwns(t *testing.T) {
	cluster := clusterWithVariables()
	ref := func(apiVersion, kind string, uid types.UID, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: "tenant-a", UID: uid, Controller: ptr.To(controller)}
	}
	ours := ref(clusterv1.GroupVersion.String(), "Cluster", "cluster-uid", true)
	label := map[string]string{ManagedLabel: ManagedValue}
	tests := []struct {
		name   string
		labels map[string]string
		refs   []metav1.OwnerReference
		want   bool
	}{
		{name: "label and controller reference", labels: label, refs: []metav1.OwnerReference{ours}, want: true},
		{name: "older API version of the Cluster", labels: label, refs: []metav1.OwnerReference{ref("cluster.x-k8s.io/v1beta1", "Cluster", "cluster-uid", true)}, want: true},
		{name: "no label (the user's, or taken over)", refs: []metav1.OwnerReference{ours}},
		{name: "label, no owner"},
		{name: "label, owner that is not the controller", labels: label, refs: []metav1.OwnerReference{ref(clusterv1.GroupVersion.String(), "Cluster", "cluster-uid", false)}},
		{name: "label, a deleted Cluster of the same name", labels: label, refs: []metav1.OwnerReference{ref(clusterv1.GroupVersion.String(), "Cluster", "old-uid", true)}},
		{name: "label, another kind", labels: label, refs: []metav1.OwnerReference{ref(clusterv1.GroupVersion.String(), "MachineDeployment", "cluster-uid", true)}},
		{name: "label, another group", labels: label, refs: []metav1.OwnerReference{ref("example.com/v1", "Cluster", "cluster-uid", true)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Labels: tc.labels, OwnerReferences: tc.refs}}
			NewWithT(t).Expect(Owns(cluster, gi)).To(Equal(tc.want))
		})
	}
}

func TestObjectChangedIgnoresStatusUpdates(t *testing.T) {
	g := NewWithT(t)
	p := objectChanged()
	old := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Generation: 1, Labels: map[string]string{"a": "b"}}}
	update := func(mutate func(*guestnetv1.GuestIngress)) bool {
		n := old.DeepCopy()
		mutate(n)
		return p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: n})
	}
	g.Expect(update(func(n *guestnetv1.GuestIngress) { n.Status.LoadBalancerIP = "10.0.0.1"; n.ResourceVersion = "2" })).To(BeFalse())
	g.Expect(update(func(n *guestnetv1.GuestIngress) { n.Finalizers = []string{"f"} })).To(BeFalse())
	g.Expect(update(func(n *guestnetv1.GuestIngress) { n.Generation = 2 })).To(BeTrue())
	g.Expect(update(func(n *guestnetv1.GuestIngress) { n.Labels = nil })).To(BeTrue())
	g.Expect(update(func(n *guestnetv1.GuestIngress) { n.OwnerReferences = []metav1.OwnerReference{{UID: "x"}} })).To(BeTrue())
	g.Expect(update(func(n *guestnetv1.GuestIngress) { now := metav1.Now(); n.DeletionTimestamp = &now })).To(BeTrue())
	g.Expect(p.Create(event.CreateEvent{Object: old})).To(BeTrue())
	g.Expect(p.Delete(event.DeleteEvent{Object: old})).To(BeTrue())
}
