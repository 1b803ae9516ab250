package ports

import (
	"context"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

// No port exists only for SSH: 22 is required when CAPK SSHes into the VMs, not otherwise.
func TestBaseRequires22OnlyForCAPKsSSHCheck(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Base(false).Ports()).To(Equal([]Port{TCP(10250)}))
	g.Expect(Base(true).Ports()).To(Equal([]Port{TCP(22), TCP(10250)}))
	g.Expect(Base(true)[0].Reasons).To(Equal([]string{"SSH: CAPK's ssh bootstrap check (KubevirtCluster not externally managed)"}))
}

func testKubevirtCluster(annotations map[string]string) *unstructured.Unstructured {
	kc := &unstructured.Unstructured{}
	kc.SetGroupVersionKind(KubevirtClusterGVK)
	kc.SetNamespace("ns")
	kc.SetName("guest")
	kc.SetAnnotations(annotations)
	return kc
}

// CAPK has SSH keys for a cluster's VMs when its KubevirtCluster is not externally managed.
func TestCAPKHasSSHKeys(t *testing.T) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "guest"}, Spec: clusterv1.ClusterSpec{
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: KubevirtClusterGVK.Group, Kind: KubevirtClusterGVK.Kind, Name: "guest"},
	}}
	for name, tc := range map[string]struct {
		objects []client.Object
		cluster *clusterv1.Cluster
		want    bool
	}{
		"externally managed (k0smotron's templates)":      {objects: []client.Object{testKubevirtCluster(map[string]string{clusterv1.ManagedByAnnotation: "k0smotron"})}, cluster: cluster},
		"externally managed, empty value (CAPI: present)": {objects: []client.Object{testKubevirtCluster(map[string]string{clusterv1.ManagedByAnnotation: ""})}, cluster: cluster},
		"managed by CAPK: it generates keys":              {objects: []client.Object{testKubevirtCluster(nil)}, cluster: cluster, want: true},
		"not created yet: as before, keys assumed":        {cluster: cluster, want: true},
		"another infrastructure":                          {cluster: &clusterv1.Cluster{ObjectMeta: cluster.ObjectMeta}, want: true},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(tc.objects...).Build()
			got, err := CAPKHasSSHKeys(context.Background(), c, tc.cluster)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// CAPK v0.11.2 SSHes into a VM only with its keys and a checkStrategy of ssh or unset.
func TestCAPKWillSSH(t *testing.T) {
	withStrategy := func(strategy string) *unstructured.Unstructured {
		tmpl := template("md-0", masquerade(port(10250, "TCP")))
		if strategy != "" {
			g := NewWithT(t)
			g.Expect(unstructured.SetNestedField(tmpl.Object, strategy, "spec", "template", "spec", "virtualMachineBootstrapCheck", "checkStrategy")).To(Succeed())
		}
		return tmpl
	}
	for name, tc := range map[string]struct {
		keys     bool
		strategy string
		want     bool
	}{
		"keys, ssh":      {keys: true, strategy: "ssh", want: true},
		"keys, unset":    {keys: true, want: true},
		"keys, none":     {keys: true, strategy: "none"},
		"no keys, ssh":   {strategy: "ssh"},
		"no keys, unset": {},
		"no keys, none":  {strategy: "none"},
		"keys, a value the enum refuses (IsBootstrapped: no SSH)": {keys: true, strategy: "Ssh"},
	} {
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Expect(CAPKWillSSH(tc.keys, withStrategy(tc.strategy))).To(Equal(tc.want))
		})
	}
}

// Per worker MachineDeployment, 22 is required only where CAPK SSHes into the VMs; a
// template that declares 22 keeps it, and a cluster whose KubevirtCluster is externally
// managed requires no 22 whatever its templates' checkStrategy.
func TestListWorkersRequires22OnlyWhereCAPKSSHes(t *testing.T) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "guest"}, Spec: clusterv1.ClusterSpec{
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: KubevirtClusterGVK.Group, Kind: KubevirtClusterGVK.Kind, Name: "guest"},
	}}
	md := func(name string) *clusterv1.MachineDeployment {
		return &clusterv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: "guest"}},
			Spec: clusterv1.MachineDeploymentSpec{ClusterName: "guest", Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
				ClusterName: "guest",
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: KubevirtMachineTemplateGVK.Group, Kind: KubevirtMachineTemplateGVK.Kind, Name: name,
				},
			}}},
		}
	}
	tmpl := func(name, strategy string, declared ...any) *unstructured.Unstructured {
		u := template(name, masquerade(declared...))
		u.SetNamespace("ns")
		if strategy != "" {
			if err := unstructured.SetNestedField(u.Object, strategy, "spec", "template", "spec", "virtualMachineBootstrapCheck", "checkStrategy"); err != nil {
				t.Fatal(err)
			}
		}
		return u
	}
	objects := func(kc *unstructured.Unstructured) []client.Object {
		return []client.Object{kc,
			md("md-ssh"), tmpl("md-ssh", "ssh", port(10250, "TCP")),
			md("md-unset"), tmpl("md-unset", "", port(10250, "TCP")),
			md("md-none"), tmpl("md-none", "none", port(10250, "TCP")),
			md("md-none-22"), tmpl("md-none-22", "none", port(22, ""), port(10250, "TCP")),
		}
	}
	required := Base(false).Union(NewSet(Requirement{Port: UDP(8473), Reasons: []string{"Cilium VXLAN tunnel"}}))

	for name, tc := range map[string]struct {
		kc      *unstructured.Unstructured
		missing map[string][]Port
	}{
		"CAPK-managed KubevirtCluster": {kc: testKubevirtCluster(nil), missing: map[string][]Port{
			"md-ssh": {TCP(22), UDP(8473)}, "md-unset": {TCP(22), UDP(8473)}, "md-none": {UDP(8473)}, "md-none-22": {UDP(8473)},
		}},
		"externally managed KubevirtCluster": {kc: testKubevirtCluster(map[string]string{clusterv1.ManagedByAnnotation: "k0smotron"}), missing: map[string][]Port{
			"md-ssh": {UDP(8473)}, "md-unset": {UDP(8473)}, "md-none": {UDP(8473)}, "md-none-22": {UDP(8473)},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			host := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objects(tc.kc)...).Build()
			workers, err := ListWorkers(context.Background(), host, cluster, required)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(workers).To(HaveLen(len(tc.missing)))
			for _, w := range workers {
				name := w.MachineDeployment.Name
				g.Expect(w.TemplateErr).NotTo(HaveOccurred(), name)
				g.Expect(w.Analysis.Missing.Ports()).To(Equal(tc.missing[name]), name)
				g.Expect(w.Required.Missing(w.Analysis.Declared)).To(Equal(w.Analysis.Missing), "%s: analysed against its own requirement", name)
				if slices.Contains(tc.missing[name], TCP(22)) {
					g.Expect(w.Plan.Action).To(Equal(Repoint), name)
					declared, err := Analyze(w.Plan.Template, w.Required)
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(declared.Declared).To(ContainElement(TCP(22)), "%s: the copy declares 22", name)
				}
			}
		})
	}

	// Nothing known to be required (the guest unreadable): no 22 either.
	host := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objects(testKubevirtCluster(nil))...).Build()
	workers, err := ListWorkers(context.Background(), host, cluster, nil)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	for _, w := range workers {
		NewWithT(t).Expect(w.Required).To(BeEmpty(), w.MachineDeployment.Name)
	}
}
