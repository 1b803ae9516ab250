package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/template"

	jsonpatch "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

const clusterClassFile = "clusterclass-kubevirt-guestnet.yaml"

// The ClusterClass in templates/ and its templates are accepted by the real host apiserver
// with the CAPI and CAPK CRDs installed (objects whose CRDs the lab lacks, k0smotron's, are
// not in the file).
func TestClusterClassAcceptedByTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("clusterclass")
	g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	for _, o := range readTemplateObjects(t, clusterClassFile) {
		o.SetNamespace(ns)
		g.Expect(l.Host.Client.Create(ctx, o)).To(Succeed(), "creating %s %s", o.GetKind(), o.GetName())
	}
}

// The ClusterClass's guestnet-worker-ports patch, applied the way CAPI's topology controller
// applies it (enabledIf template, JSON patch with valueFrom.variable) to the worker template,
// declares exactly the value the PortsDeclared condition tells users to set, and the patched
// template is valid for the apiserver. CAPI's patch engine is internal to CAPI and cannot run
// here, so this test evaluates the same definition itself.
func TestClusterClassWorkerPortsPatch(t *testing.T) {
	g := NewWithT(t)
	objs := readTemplateObjects(t, clusterClassFile)
	cc := &clusterv1.ClusterClass{}
	var workerTemplate *unstructured.Unstructured
	for _, o := range objs {
		switch {
		case o.GetKind() == "ClusterClass":
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cc)).To(Succeed())
		case o.GetKind() == ports.KubevirtMachineTemplateGVK.Kind:
			workerTemplate = o
		}
	}
	g.Expect(workerTemplate).NotTo(BeNil())

	required := ports.Base().Union(ports.NewSet(
		ports.Requirement{Port: ports.UDP(8473)}, ports.Requirement{Port: ports.TCP(30080)}, ports.Requirement{Port: ports.TCP(30443)}))
	var value any
	g.Expect(json.Unmarshal([]byte(ports.TopologyValue(required.Ports())), &value)).To(Succeed())

	before, err := ports.Analyze(workerTemplate, required)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(before.State).To(Equal(ports.AllPortsForwarded), "without the variable the template keeps no ports list")
	g.Expect(applyTopologyPatches(t, cc, workerTemplate, map[string]any{})).To(Equal(workerTemplate), "unset variable: patch disabled")

	patched := applyTopologyPatches(t, cc, workerTemplate, map[string]any{"guestnet": value})
	after, err := ports.Analyze(patched, required)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.State).To(Equal(ports.PortsDeclared))
	g.Expect(after.Declared).To(ConsistOf(required.Ports()))

	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("clusterclass-patch")
	g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	patched.SetNamespace(ns)
	g.Expect(l.Host.Client.Create(ctx, patched, client.DryRunAll)).To(Succeed(), "the patched template is valid for CAPK's CRD")
}

// applyTopologyPatches applies the ClusterClass's patches that select KubevirtMachineTemplates
// of machineDeploymentClass default-worker, for the given topology variables.
func applyTopologyPatches(t *testing.T, cc *clusterv1.ClusterClass, tmpl *unstructured.Unstructured, variables map[string]any) *unstructured.Unstructured {
	t.Helper()
	doc, err := json.Marshal(tmpl.Object)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range cc.Spec.Patches {
		if !enabled(t, p.EnabledIf, variables) {
			continue
		}
		for _, d := range p.Definitions {
			if d.Selector.Kind != tmpl.GetKind() || d.Selector.MatchResources.MachineDeploymentClass == nil {
				continue
			}
			var ops []map[string]any
			for _, jp := range d.JSONPatches {
				op := map[string]any{"op": jp.Op, "path": jp.Path}
				switch {
				case jp.ValueFrom != nil && jp.ValueFrom.Variable != "":
					op["value"] = lookupVariable(t, variables, jp.ValueFrom.Variable)
				case jp.Value != nil:
					var v any
					if err := json.Unmarshal(jp.Value.Raw, &v); err != nil {
						t.Fatal(err)
					}
					op["value"] = v
				default:
					t.Fatalf("patch %s: unsupported JSON patch %+v", p.Name, jp)
				}
				ops = append(ops, op)
			}
			raw, _ := json.Marshal(ops)
			patch, err := jsonpatch.DecodePatch(raw)
			if err != nil {
				t.Fatal(err)
			}
			if doc, err = patch.Apply(doc); err != nil {
				t.Fatalf("patch %s does not apply to %s: %v", p.Name, tmpl.GetName(), err)
			}
		}
	}
	out := &unstructured.Unstructured{}
	if err := json.Unmarshal(doc, &out.Object); err != nil {
		t.Fatal(err)
	}
	return out
}

func enabled(t *testing.T, enabledIf string, variables map[string]any) bool {
	if enabledIf == "" {
		return true
	}
	tpl, err := template.New("enabledIf").Option("missingkey=zero").Parse(enabledIf)
	if err != nil {
		t.Fatalf("enabledIf: %v", err)
	}
	var out bytes.Buffer
	if err := tpl.Execute(&out, variables); err != nil {
		t.Fatalf("enabledIf: %v", err)
	}
	return strings.TrimSpace(out.String()) == "true"
}

func lookupVariable(t *testing.T, variables map[string]any, path string) any {
	var v any = variables
	for _, part := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("variable %s: %s is not an object", path, part)
		}
		v = m[part]
	}
	return v
}

func readTemplateObjects(t *testing.T, name string) []*unstructured.Unstructured {
	t.Helper()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "templates", name))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := lab.DecodeObjects(data)
	if err != nil {
		t.Fatalf("decoding %s: %v", name, err)
	}
	return objs
}
