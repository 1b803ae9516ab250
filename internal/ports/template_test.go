package ports

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// template builds a KubevirtMachineTemplate whose pod network interface is iface.
func template(name string, iface map[string]any, networks ...any) *unstructured.Unstructured {
	if networks == nil {
		networks = []any{map[string]any{"name": "default", "pod": map[string]any{}}}
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"virtualMachineTemplate": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"domain":   map[string]any{"devices": map[string]any{"interfaces": []any{iface}}, "memory": map[string]any{"guest": "4Gi"}},
			"networks": networks,
		}}}},
	}}}}}
	u.SetGroupVersionKind(KubevirtMachineTemplateGVK)
	u.SetNamespace("tenant")
	u.SetName(name)
	return u
}

func masquerade(ports ...any) map[string]any {
	i := map[string]any{"name": "default", "masquerade": map[string]any{}}
	if ports != nil {
		i["ports"] = ports
	}
	return i
}

func port(n int64, protocol string) map[string]any {
	p := map[string]any{"port": n}
	if protocol != "" {
		p["protocol"] = protocol
	}
	return p
}

func TestAnalyze(t *testing.T) {
	required := Base(true).Union(NewSet(Requirement{Port: UDP(8473)}))
	tests := []struct {
		name        string
		tmpl        *unstructured.Unstructured
		wantState   TemplateState
		wantMissing []Port
	}{
		{name: "all declared (protocol defaults to TCP)", tmpl: template("t", masquerade(port(22, ""), port(10250, "TCP"), port(8473, "UDP"))), wantState: PortsDeclared},
		{name: "tunnel declared as TCP only", tmpl: template("t", masquerade(port(22, ""), port(10250, ""), port(8473, "TCP"))), wantState: PortsMissing, wantMissing: []Port{UDP(8473)}},
		{name: "no ports list: all forwarded", tmpl: template("t", masquerade()), wantState: AllPortsForwarded},
		{name: "bridge binding", tmpl: template("t", map[string]any{"name": "default", "bridge": map[string]any{}, "ports": []any{port(22, "")}}), wantState: NotMasquerade},
		{name: "pod network under another name", tmpl: template("t",
			map[string]any{"name": "podnet", "masquerade": map[string]any{}, "ports": []any{port(22, "")}},
			map[string]any{"name": "podnet", "pod": map[string]any{}}), wantState: PortsMissing, wantMissing: []Port{UDP(8473), TCP(10250)}},
		{name: "no interface for the pod network", tmpl: template("t", map[string]any{"name": "other", "masquerade": map[string]any{}}), wantState: AllPortsForwarded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			a, err := Analyze(tt.tmpl, required)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(a.State).To(Equal(tt.wantState))
			g.Expect(a.Missing.Ports()).To(Equal(tt.wantMissing))
		})
	}
}

func TestAnalyzeRejectsMalformedTemplates(t *testing.T) {
	g := NewWithT(t)
	tmpl := template("t", masquerade(map[string]any{"port": "twenty-two"}))
	_, err := Analyze(tmpl, Base(true))
	g.Expect(err).To(MatchError(ContainSubstring("KubevirtMachineTemplate t")))
}

func TestDeclare(t *testing.T) {
	g := NewWithT(t)
	orig := template("md-0", masquerade(map[string]any{"name": "ssh", "port": int64(22)}))
	orig.SetLabels(map[string]string{"team": "a"})
	orig.SetAnnotations(map[string]string{"note": "x", "kubectl.kubernetes.io/last-applied-configuration": "{}"})
	orig.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Cluster", Name: "c", UID: "u"}})
	missing := NewSet(Requirement{Port: TCP(10250)}, Requirement{Port: UDP(8473)})

	out, err := Declare(orig, missing, "c", "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out.GetName()).To(MatchRegexp(`^md-0-c-[0-9a-f]{10}$`))
	g.Expect(out.GetNamespace()).To(Equal("tenant"))
	g.Expect(out.GetLabels()).To(Equal(map[string]string{"team": "a", guestnetv1.GeneratedTemplateLabel: "c"}))
	g.Expect(out.GetAnnotations()).To(Equal(map[string]string{"note": "x", guestnetv1.BaseTemplateAnnotation: "md-0", guestnetv1.TemplateRevisionAnnotation: ""}))
	g.Expect(out.GetOwnerReferences()).To(Equal(orig.GetOwnerReferences()))

	a, err := Analyze(out, Base(true).Union(missing))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(a.State).To(Equal(PortsDeclared))
	ifaces, _, _ := unstructured.NestedSlice(out.Object, interfacesPath...)
	g.Expect(ifaces[0].(map[string]any)["ports"]).To(HaveExactElements(
		map[string]any{"name": "ssh", "port": int64(22)},       // existing entries are kept as they are
		map[string]any{"port": int64(8473), "protocol": "UDP"}, // then the missing ones, in port order
		map[string]any{"port": int64(10250), "protocol": "TCP"},
	))
	memory, _, _ := unstructured.NestedString(out.Object, append(vmiSpecPath, "domain", "memory", "guest")...)
	g.Expect(memory).To(Equal("4Gi"), "everything else is copied")
	origIfaces, _, _ := unstructured.NestedSlice(orig.Object, interfacesPath...)
	g.Expect(origIfaces[0].(map[string]any)["ports"]).To(HaveLen(1), "the original is never changed")

	again, err := Declare(orig, missing, "c", "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.GetName()).To(Equal(out.GetName()), "identical content, identical name")

	revised, err := Declare(orig, missing, "c", "2")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(revised.GetName()).NotTo(Equal(out.GetName()), "a new revision forces a new hash")

	// The next generation derives from the base name, not from the generated one.
	next, err := Declare(out, NewSet(Requirement{Port: TCP(30080)}), "c", "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(next.GetName()).To(MatchRegexp(`^md-0-c-[0-9a-f]{10}$`))
	g.Expect(next.GetName()).NotTo(Equal(out.GetName()))
}

func TestDeclareRefusesTemplatesWithoutMasquerade(t *testing.T) {
	g := NewWithT(t)
	_, err := Declare(template("t", map[string]any{"name": "default", "bridge": map[string]any{}}), Base(true), "c", "")
	g.Expect(err).To(MatchError(ContainSubstring("no masquerade pod interface")))
}

func TestGeneratedNameNamesTheClusterWithinTheNameLimits(t *testing.T) {
	g := NewWithT(t)
	g.Expect(GeneratedName("tenant-a-md-0", "tenant-a", "0123456789")).To(Equal("tenant-a-md-0-0123456789"), "the base names the Cluster already")
	g.Expect(GeneratedName("workers", "tenant-a", "0123456789")).To(Equal("workers-tenant-a-0123456789"))
	g.Expect(GeneratedName("tenant-ab-md-0", "tenant-a", "0123456789")).To(Equal("tenant-ab-md-0-tenant-a-0123456789"), "a prefix of another name is not the Cluster's")

	long := GeneratedName(strings.Repeat("a", 300), "tenant-a", "0123456789")
	g.Expect(long).To(HaveLen(253))
	g.Expect(long).To(HaveSuffix("-tenant-a-0123456789"))
	// Cut where the base has a dot or dash: the name must stay a DNS subdomain.
	cut := GeneratedName(strings.Repeat("a", 231)+".-b"+strings.Repeat("c", 40), "tenant-a", "0123456789")
	g.Expect(cut).To(Equal(strings.Repeat("a", 231) + "-tenant-a-0123456789"))
	g.Expect(validation.IsDNS1123Subdomain(cut)).To(BeEmpty())
}

// Two clusters never get the same name for their copies, even when the same content and
// their names and bases combine into the same string.
func TestDeclareNamesCopiesPerCluster(t *testing.T) {
	g := NewWithT(t)
	missing := NewSet(Requirement{Port: TCP(10250)})
	byCluster := map[string]string{}
	for _, tc := range []struct{ base, cluster string }{{"x-b", "a"}, {"x", "b-a"}, {"tenant-a-md-0", "tenant-a"}, {"tenant-a-md-0", "tenant"}} {
		out, err := Declare(template(tc.base, masquerade(port(22, ""))), missing, tc.cluster, "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(out.GetName()).To(ContainSubstring(tc.cluster))
		g.Expect(out.GetLabels()).To(HaveKeyWithValue(guestnetv1.GeneratedTemplateLabel, tc.cluster))
		byCluster[out.GetName()] = tc.cluster
	}
	g.Expect(byCluster).To(HaveLen(4), "every cluster's copy has a name of its own")
}

func TestAdoptable(t *testing.T) {
	desired, err := Declare(template("md-0", masquerade(port(22, ""))), Base(true), "c", "")
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	tests := []struct {
		name    string
		mutate  func(*unstructured.Unstructured)
		wantErr string
	}{
		{name: "the copy guestnet wrote", mutate: func(*unstructured.Unstructured) {}},
		{name: "with fields the API server defaulted", mutate: func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "ssh", "spec", "template", "spec", "virtualMachineBootstrapCheck", "checkStrategy")
		}},
		{name: "numbers as JSON decodes them", mutate: func(u *unstructured.Unstructured) {
			ifaces, _, _ := unstructured.NestedSlice(u.Object, interfacesPath...)
			ifaces[0].(map[string]any)["ports"].([]any)[0].(map[string]any)["port"] = float64(22)
			_ = unstructured.SetNestedSlice(u.Object, ifaces, interfacesPath...)
		}},
		{name: "not labelled", mutate: func(u *unstructured.Unstructured) { u.SetLabels(nil) }, wantErr: "guestnet did not generate it"},
		{name: "labelled for another cluster", mutate: func(u *unstructured.Unstructured) {
			u.SetLabels(map[string]string{guestnetv1.GeneratedTemplateLabel: "other"})
		}, wantErr: "labelled guestnet.addons.cluster.x-k8s.io/generated-for=other, not c"},
		{name: "another value", mutate: func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "8Gi", append(vmiSpecPath, "domain", "memory", "guest")...)
		}, wantErr: "another spec"},
		{name: "a port less", mutate: func(u *unstructured.Unstructured) {
			ifaces, _, _ := unstructured.NestedSlice(u.Object, interfacesPath...)
			list := ifaces[0].(map[string]any)["ports"].([]any)
			ifaces[0].(map[string]any)["ports"] = list[:len(list)-1]
			_ = unstructured.SetNestedSlice(u.Object, ifaces, interfacesPath...)
		}, wantErr: "another spec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			existing := desired.DeepCopy()
			tt.mutate(existing)
			err := Adoptable(existing, desired, "c")
			if tt.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
			g.Expect(err.Error()).To(HavePrefix("KubevirtMachineTemplate " + desired.GetName() + " already exists"))
		})
	}
}

func TestPodInterfacePorts(t *testing.T) {
	g := NewWithT(t)
	out, err := Declare(template("md-0", masquerade(map[string]any{"name": "ssh", "port": int64(22)})), NewSet(Requirement{Port: UDP(8473)}, Requirement{Port: TCP(10250)}), "c", "")
	g.Expect(err).NotTo(HaveOccurred())
	iface, list, err := PodInterfacePorts(out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(iface).To(Equal("default"))
	g.Expect(list).To(Equal(`[{"name":"ssh","port":22},{"port":8473,"protocol":"UDP"},{"port":10250,"protocol":"TCP"}]`))
}
