package workerports

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

// guestCache is a ClusterCache that hands out one guest client.
type guestCache struct {
	clustercache.ClusterCache
	guest client.Client
}

func (c guestCache) GetClient(context.Context, client.ObjectKey) (client.Client, error) {
	return c.guest, nil
}

// Issue 19, property 5: guestnet adds 22/TCP to a worker template only when CAPK will SSH
// into its VMs (KubevirtCluster not externally managed, checkStrategy ssh or unset); 22 stays
// declarable through the extra-worker-ports annotation.
func TestReconcileDeclares22OnlyWhereCAPKSSHes(t *testing.T) {
	for name, tc := range map[string]struct {
		managedBy string // the KubevirtCluster's cluster.x-k8s.io/managed-by, "" for none
		extra     string
		want      map[string][]ports.Port
	}{
		"CAPK manages the KubevirtCluster: 22 where checkStrategy is ssh or unset": {extra: "9100", want: map[string][]ports.Port{
			"md-ssh":   {ports.TCP(22), ports.TCP(9100), ports.TCP(10250)},
			"md-unset": {ports.TCP(22), ports.TCP(9100), ports.TCP(10250)},
			"md-none":  {ports.TCP(9100), ports.TCP(10250)},
		}},
		"externally managed (k0smotron): no 22": {managedBy: "k0smotron", extra: "9100", want: map[string][]ports.Port{
			"md-ssh":   {ports.TCP(9100), ports.TCP(10250)},
			"md-unset": {ports.TCP(9100), ports.TCP(10250)},
			"md-none":  {ports.TCP(9100), ports.TCP(10250)},
		}},
		"externally managed, 22 in the extra ports: declared everywhere": {managedBy: "k0smotron", extra: "22,9100", want: map[string][]ports.Port{
			"md-ssh":   {ports.TCP(22), ports.TCP(9100), ports.TCP(10250)},
			"md-unset": {ports.TCP(22), ports.TCP(9100), ports.TCP(10250)},
			"md-none":  {ports.TCP(22), ports.TCP(9100), ports.TCP(10250)},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := ctrl.LoggerInto(context.Background(), ctrl.Log)
			cluster := &clusterv1.Cluster{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "guest", Annotations: map[string]string{guestnetv1.ExtraWorkerPortsAnnotation: tc.extra}},
				Spec: clusterv1.ClusterSpec{InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: ports.KubevirtClusterGVK.Group, Kind: ports.KubevirtClusterGVK.Kind, Name: "guest",
				}},
			}
			cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
			kc := &unstructured.Unstructured{}
			kc.SetGroupVersionKind(ports.KubevirtClusterGVK)
			kc.SetNamespace("ns")
			kc.SetName("guest")
			if tc.managedBy != "" {
				kc.SetAnnotations(map[string]string{clusterv1.ManagedByAnnotation: tc.managedBy})
			}
			objects := []client.Object{cluster, kc}
			for md, strategy := range map[string]string{"md-ssh": "ssh", "md-unset": "", "md-none": "none"} {
				objects = append(objects, machineDeployment(md), workerTemplate(md, strategy))
			}
			host := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objects...).Build()
			guest := fake.NewClientBuilder().WithScheme(scheme.New()).Build() // no cilium-config: no tunnel port
			r := &Reconciler{Client: host, APIReader: host, ClusterCache: guestCache{guest: guest},
				recorder: events.NewFakeRecorder(100)}

			_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cluster)})
			g.Expect(err).NotTo(HaveOccurred())

			for md, want := range tc.want {
				got := &clusterv1.MachineDeployment{}
				g.Expect(host.Get(ctx, client.ObjectKey{Namespace: "ns", Name: md}, got)).To(Succeed())
				name := got.Spec.Template.Spec.InfrastructureRef.Name
				g.Expect(name).NotTo(Equal(md), "%s is repointed at a copy", md)
				tmpl := &unstructured.Unstructured{}
				tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
				g.Expect(host.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, tmpl)).To(Succeed())
				a, err := ports.Analyze(tmpl, nil)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(a.Declared).To(ConsistOf(want), "%s's copy %s", md, name)
			}
		})
	}
}

func machineDeployment(name string) *clusterv1.MachineDeployment {
	return &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: "guest"}},
		Spec: clusterv1.MachineDeploymentSpec{ClusterName: "guest", Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
			ClusterName: "guest",
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: ports.KubevirtMachineTemplateGVK.Group, Kind: ports.KubevirtMachineTemplateGVK.Kind, Name: name,
			},
		}}},
	}
}

// workerTemplate is a KubevirtMachineTemplate whose masquerade interface declares only the
// kubelet's port, with the given checkStrategy ("" leaves it unset).
func workerTemplate(name, checkStrategy string) *unstructured.Unstructured {
	spec := map[string]any{
		"virtualMachineTemplate": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"domain": map[string]any{"devices": map[string]any{"interfaces": []any{map[string]any{
				"name": "default", "masquerade": map[string]any{}, "ports": []any{map[string]any{"port": int64(10250), "protocol": "TCP"}},
			}}}},
			"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}},
		}}}},
	}
	if checkStrategy != "" {
		spec["virtualMachineBootstrapCheck"] = map[string]any{"checkStrategy": checkStrategy}
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"template": map[string]any{"spec": spec}}}}
	u.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	u.SetNamespace("ns")
	u.SetName(name)
	return u
}

// A KubevirtCluster that gets (or loses) its managed-by annotation after the Cluster's first
// reconcile brings its Cluster back: whether 22/TCP is required changed.
func TestInfraClusterToClusters(t *testing.T) {
	g := NewWithT(t)
	ref := func(name string) clusterv1.ContractVersionedObjectReference {
		return clusterv1.ContractVersionedObjectReference{APIGroup: ports.KubevirtClusterGVK.Group, Kind: ports.KubevirtClusterGVK.Kind, Name: name}
	}
	a := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}, Spec: clusterv1.ClusterSpec{InfrastructureRef: ref("infra-a")}}
	b := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}, Spec: clusterv1.ClusterSpec{InfrastructureRef: ref("infra-b")}}
	other := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "a"}, Spec: clusterv1.ClusterSpec{InfrastructureRef: ref("infra-a")}}
	host := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(a, b, other).Build()
	r := &Reconciler{Client: host}
	kc := kubevirtClusterMetadata()
	kc.SetNamespace("ns")
	kc.SetName("infra-a")
	g.Expect(r.infraClusterToClusters(context.Background(), kc)).To(ConsistOf(ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "ns", Name: "a"}}))
}
