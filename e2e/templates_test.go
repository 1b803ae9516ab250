package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	"sigs.k8s.io/cluster-api/core/reconcilers/topology/cluster/patches/inline"
	patchvariables "sigs.k8s.io/cluster-api/core/reconcilers/topology/cluster/patches/variables"
	capiadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	capifeature "sigs.k8s.io/cluster-api/feature"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/exp/topology"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// The ClusterClass tests use CAPI's own code wherever CAPI would run it: its ClusterClass
// validation webhook, its variable defaulting and validation (the Cluster webhook), its
// builtin variables and its inline JSON patch generator (enabledIf and valueFrom.template
// rendered with text/template and sprig's hermetic functions, as in CAPI v1.14). Only CAPI's
// controllers do not run; the lab's host apiserver, with the CAPI, CAPK and guestnet CRDs,
// judges the objects.

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

// CAPI's ClusterClass webhook accepts the ClusterClass: the variable schema is structural,
// its CEL rules compile within CAPI's cost limits, the patch selects a template of the class
// and its enabledIf and valueFrom.template parse with CAPI's function set.
func TestClusterClassAcceptedByCAPIValidation(t *testing.T) {
	g := NewWithT(t)
	cc, _ := loadClusterClass(t)
	enableCAPIClusterTopology(t)
	_, err := (&capiadmission.ClusterClass{}).ValidateCreate(testContext(t), cc)
	g.Expect(err).NotTo(HaveOccurred())
}

// The ClusterClass's guestnet-worker-ports patch, applied the way CAPI's topology controller
// applies it, declares exactly the value the PortsDeclared condition tells users to set, and
// the patched template is valid for the apiserver.
func TestClusterClassWorkerPortsPatch(t *testing.T) {
	g := NewWithT(t)
	cc, workerTemplate := loadClusterClass(t)

	required := ports.Base().Union(ports.NewSet(
		ports.Requirement{Port: ports.UDP(8473)}, ports.Requirement{Port: ports.TCP(30080)}, ports.Requirement{Port: ports.TCP(30443)}))
	var value any
	g.Expect(json.Unmarshal([]byte(ports.TopologyValue(required.Ports())), &value)).To(Succeed())

	before, err := ports.Analyze(workerTemplate, required)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(before.State).To(Equal(ports.AllPortsForwarded), "without the variable the template keeps no ports list")
	g.Expect(applyClusterPatches(t, cc, topologyCluster(t, cc, "tenant-a", nil), workerTemplate)).To(Equal(workerTemplate), "unset variable: patch disabled")

	cluster := topologyCluster(t, cc, "tenant-a", value)
	g.Expect(capiDefaultAndValidate(t, cc, cluster)).To(BeEmpty(), "CAPI accepts the value PortsDeclared gives")
	patched := applyClusterPatches(t, cc, cluster, workerTemplate)
	after, err := ports.Analyze(patched, required)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.State).To(Equal(ports.PortsDeclared))
	g.Expect(after.Declared).To(Equal(required.Ports()), "every port once, in port order")

	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("clusterclass-patch")
	g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	patched.SetNamespace(ns)
	g.Expect(l.Host.Client.Create(ctx, patched, client.DryRunAll)).To(Succeed(), "the patched template is valid for CAPK's CRD")
}

// One variable drives both sides. For a value with workerPorts, ingress and webhookBridge,
// the patch declares on the workers exactly what guestnet requires of the GuestIngress and
// GuestWebhookBridge the topology controller makes from the same value (as the apiserver
// stores them, CRD defaults included): 22/TCP, 10250/TCP, workerPorts, each ingress nodePort
// and the whole bridge range, each once, in port order; the patched template is valid for
// CAPK's CRD. Without workerPorts the workers keep no ports list, whatever else the value has.
func TestClusterClassPatchDeclaresThePortsOfTheGuestnetObjects(t *testing.T) {
	cc, workerTemplate := loadClusterClass(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("clusterclass-objects")
	NewWithT(t).Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())

	tests := []struct {
		name  string
		value string
		// extra are the workerPorts; nil means the value has none.
		extra []ports.Port
	}{
		{
			name: "ingress with TCP and UDP nodePorts, bridge with its default range, ports given twice",
			value: `
workerPorts: [{port: 8472, protocol: UDP}, {port: 22}, {port: 30064, protocol: TCP}]
ingress:
  guestService: {namespace: projectcontour, name: envoy}
  ports:
  - {name: http, port: 80, nodePort: 30080}
  - {name: https, port: 443, nodePort: 30443}
  - {name: quic, port: 443, nodePort: 30443, protocol: UDP}
  - {name: metrics, port: 8002}
  loadBalancer: {ip: 10.2.6.220}
webhookBridge:
  apiServices: {names: [v1beta1.metrics.k8s.io]}
  validatingWebhooks: {all: true}`,
			extra: []ports.Port{ports.UDP(8472), ports.TCP(22), ports.TCP(30064)},
		},
		{
			name: "bridge with its own range up to 32767, ingress with the default ports (no nodePorts)",
			value: `
workerPorts: [{port: 9100}]
ingress:
  guestService: {namespace: ingress-nginx, name: ingress-nginx-controller}
  loadBalancer: {cidrs: [10.2.6.216/29]}
webhookBridge:
  mutatingWebhooks: {selector: {matchLabels: {app: kyverno}}}
  nodePortRange: {start: 32760, size: 8}
  mode: Always`,
			extra: []ports.Port{ports.TCP(9100)},
		},
		{
			name: "no workerPorts: no ports list",
			value: `
ingress:
  guestService: {namespace: projectcontour, name: envoy}
  ports: [{name: http, port: 80, nodePort: 30080}]
  loadBalancer: {poolRef: {name: shared}}
webhookBridge: {apiServices: {all: true}}`,
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cluster := topologyCluster(t, cc, fmt.Sprintf("tenant-%d", i), yamlValue(t, tc.value))
			cluster.Namespace, cluster.UID = ns, types.UID(fmt.Sprintf("uid-%d", i))
			g.Expect(capiDefaultAndValidate(t, cc, cluster)).To(BeEmpty(), "CAPI accepts the value")

			// The objects the topology controller makes from the value, as the apiserver
			// defaults and stores them, and what guestnet requires for them.
			variable, found, err := topology.VariableOf(cluster)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(found).To(BeTrue())
			gi, gwb := &guestnetv1.GuestIngress{}, &guestnetv1.GuestWebhookBridge{}
			g.Expect(dryRunApply(ctx, l.Host.Client, topology.Desired(topology.GuestIngressKind, cluster, variable.Ingress, ""), gi)).To(Succeed())
			g.Expect(dryRunApply(ctx, l.Host.Client, topology.Desired(topology.GuestWebhookBridgeKind, cluster, variable.WebhookBridge, ""), gwb)).To(Succeed())
			required := ports.Base().Union(ports.ForGuestIngress(gi)).Union(ports.ForBridge(gwb))
			for _, p := range tc.extra {
				required = required.Union(ports.NewSet(ports.Requirement{Port: p}))
			}

			patched := applyClusterPatches(t, cc, cluster, workerTemplate)
			analysis, err := ports.Analyze(patched, required)
			g.Expect(err).NotTo(HaveOccurred())
			if tc.extra == nil {
				g.Expect(analysis.State).To(Equal(ports.AllPortsForwarded))
				g.Expect(patched).To(Equal(workerTemplate))
				return
			}
			g.Expect(analysis.State).To(Equal(ports.PortsDeclared), "missing: %s", analysis.Missing)
			g.Expect(analysis.Declared).To(Equal(required.Ports()), "exactly the required ports, each once, in port order")

			patched.SetNamespace(ns)
			patched.SetName(cluster.Name + "-md-0")
			g.Expect(l.Host.Client.Create(ctx, patched, client.DryRunAll)).To(Succeed(), "the patched template is valid for CAPK's CRD")
		})
	}
}

// The schema of guestnet.ingress and guestnet.webhookBridge is a faithful subset of the CRDs:
// every value CAPI's variable validation accepts, the apiserver accepts as the GuestIngress
// and GuestWebhookBridge the topology controller applies; and the CRDs' rules are all in the
// schema, so CAPI already refuses what the apiserver would (a Cluster is refused at once,
// instead of an event later). Only the fields the variable leaves out (clusterName,
// declarePorts) are refused by CAPI and not by the CRDs.
func TestClusterClassVariableSchemaIsASubsetOfTheCRDs(t *testing.T) {
	cc, _ := loadClusterClass(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("clusterclass-schema")
	NewWithT(t).Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())

	const lb = `loadBalancer: {ip: 10.2.6.220}`
	const svc = `guestService: {namespace: projectcontour, name: envoy}`
	tests := []struct {
		name    string
		ingress string // the value of guestnet.ingress (YAML), empty for none
		bridge  string // the value of guestnet.webhookBridge (YAML), empty for none
		// wantCAPI and wantCRD: whether CAPI's validation and the apiserver accept it.
		wantCAPI, wantCRD bool
	}{
		{name: "everything", wantCAPI: true, wantCRD: true, ingress: `
guestService: {namespace: projectcontour, name: envoy}
ports:
- {name: http, port: 80, nodePort: 30080, protocol: TCP}
- {name: https, port: 443, nodePort: 30443}
- {name: quic, port: 443, nodePort: 30443, protocol: UDP}
loadBalancer:
  ip: 10.2.6.220
  cidrs: [10.2.6.216/29, "fd00::/120"]
  l2:
    interfaces: ["^eth0$"]
    nodeSelector:
      matchLabels: {node-role.kubernetes.io/worker: ""}
      matchExpressions: [{key: zone, operator: In, values: [a, b]}]
  class: io.cilium/l2-announcer
  externalTrafficPolicy: Local
  annotations: {a: b}
  labels: {c: d}`, bridge: `
apiServices: {names: [v1beta1.metrics.k8s.io], selector: {matchLabels: {a: b}}}
validatingWebhooks: {all: true}
mutatingWebhooks: {selector: {matchExpressions: [{key: app, operator: Exists}]}}
nodePortRange: {start: 32752, size: 16}
mode: Always`},
		{name: "minimal", wantCAPI: true, wantCRD: true, ingress: svc + "\nloadBalancer: {poolRef: {name: shared}}", bridge: `apiServices: {names: [v1beta1.metrics.k8s.io]}`},
		{name: "IPv6 ip inside IPv6 cidrs", wantCAPI: true, wantCRD: true, ingress: svc + "\nloadBalancer: {ip: 'fd00::10', cidrs: ['fd00::/120']}"},

		{name: "loadBalancer without ip, cidrs or poolRef", ingress: svc + "\nloadBalancer: {class: x}"},
		{name: "cidrs and poolRef", ingress: svc + "\nloadBalancer: {cidrs: [10.0.0.0/29], poolRef: {name: p}}"},
		{name: "ip outside cidrs", ingress: svc + "\nloadBalancer: {ip: 10.0.1.1, cidrs: [10.0.0.0/29]}"},
		{name: "bad ip", ingress: svc + "\nloadBalancer: {ip: 10.2.6.300}"},
		{name: "bad cidr", ingress: svc + "\nloadBalancer: {cidrs: [10.0.0.0/33]}"},
		{name: "duplicate cidr", ingress: svc + "\nloadBalancer: {cidrs: [10.0.0.0/29, 10.0.0.0/29]}"},
		{name: "empty cidrs", ingress: svc + "\nloadBalancer: {cidrs: []}"},
		{name: "nine cidrs", ingress: svc + "\nloadBalancer: {cidrs: [10.0.0.0/32, 10.0.0.1/32, 10.0.0.2/32, 10.0.0.3/32, 10.0.0.4/32, 10.0.0.5/32, 10.0.0.6/32, 10.0.0.7/32, 10.0.0.8/32]}"},
		{name: "bad externalTrafficPolicy", ingress: svc + "\nloadBalancer: {ip: 10.0.0.1, externalTrafficPolicy: Node}"},
		{name: "empty class", ingress: svc + "\nloadBalancer: {ip: 10.0.0.1, class: ''}"},
		{name: "seventeen interfaces", ingress: svc + "\nloadBalancer: {ip: 10.0.0.1, l2: {interfaces: [a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q]}}"},
		{name: "no guestService", ingress: lb},
		{name: "guestService name in upper case", ingress: "guestService: {namespace: projectcontour, name: Envoy}\n" + lb},
		{name: "no loadBalancer", ingress: svc},
		{name: "empty ports", ingress: svc + "\nports: []\n" + lb},
		{name: "duplicate port name", ingress: svc + "\nports: [{name: http, port: 80}, {name: http, port: 8080}]\n" + lb},
		{name: "duplicate port and protocol", ingress: svc + "\nports: [{name: http, port: 80}, {name: web, port: 80, protocol: TCP}]\n" + lb},
		{name: "same port, other protocol", wantCAPI: true, wantCRD: true, ingress: svc + "\nports: [{name: http, port: 80}, {name: dns, port: 80, protocol: UDP}]\n" + lb},
		{name: "duplicate nodePort", ingress: svc + "\nports: [{name: http, port: 80, nodePort: 30080}, {name: web, port: 8080, nodePort: 30080}]\n" + lb},
		{name: "nodePort below the range", ingress: svc + "\nports: [{name: http, port: 80, nodePort: 29999}]\n" + lb},
		{name: "port 0", ingress: svc + "\nports: [{name: http, port: 0}]\n" + lb},
		{name: "port name without a letter", ingress: svc + "\nports: [{name: '80', port: 80}]\n" + lb},
		{name: "port name with --", ingress: svc + "\nports: [{name: a--b, port: 80}]\n" + lb},
		{name: "port name too long", ingress: svc + "\nports: [{name: abcdefghijklmnop, port: 80}]\n" + lb},
		{name: "bad protocol", ingress: svc + "\nports: [{name: http, port: 80, protocol: SCTP}]\n" + lb},
		{name: "unknown field", ingress: svc + "\n" + lb + "\nfoo: bar"},
		{name: "declarePorts (left out of the variable)", wantCRD: true, ingress: svc + "\n" + lb + "\ndeclarePorts: false"},
		{name: "clusterName (left out of the variable)", wantCRD: true, ingress: svc + "\n" + lb + "\nclusterName: other"},

		{name: "bridge without targets", bridge: `mode: Auto`},
		{name: "target selector without names, selector or all", bridge: `apiServices: {}`},
		{name: "empty names", bridge: `apiServices: {names: []}`},
		{name: "all: false alone", bridge: `validatingWebhooks: {all: false}`},
		{name: "group/version instead of an APIService name", bridge: `apiServices: {names: [metrics.k8s.io/v1beta1]}`},
		{name: "duplicate name", bridge: `mutatingWebhooks: {names: [a, a]}`},
		{name: "range above 32767", bridge: "apiServices: {all: true}\nnodePortRange: {start: 32760, size: 16}"},
		{name: "range of 65", bridge: "apiServices: {all: true}\nnodePortRange: {start: 30000, size: 65}"},
		{name: "range without size", bridge: "apiServices: {all: true}\nnodePortRange: {start: 30000}"},
		{name: "bad mode", bridge: "apiServices: {all: true}\nmode: Sometimes"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			value := map[string]any{}
			if tc.ingress != "" {
				value[topology.IngressField] = yamlValue(t, tc.ingress)
			}
			if tc.bridge != "" {
				value[topology.WebhookBridgeField] = yamlValue(t, tc.bridge)
			}
			cluster := topologyCluster(t, cc, fmt.Sprintf("tenant-%d", i), value)
			cluster.Namespace, cluster.UID = ns, types.UID(fmt.Sprintf("uid-%d", i))
			capiErrs := capiDefaultAndValidate(t, cc, cluster.DeepCopy())

			variable, _, err := topology.VariableOf(cluster)
			g.Expect(err).NotTo(HaveOccurred())
			var crdErrs []error
			if variable.Ingress != nil {
				crdErrs = append(crdErrs, dryRunApply(ctx, l.Host.Client, topology.Desired(topology.GuestIngressKind, cluster, variable.Ingress, ""), nil))
			}
			if variable.WebhookBridge != nil {
				crdErrs = append(crdErrs, dryRunApply(ctx, l.Host.Client, topology.Desired(topology.GuestWebhookBridgeKind, cluster, variable.WebhookBridge, ""), nil))
			}
			crdOK := true
			for _, err := range crdErrs {
				crdOK = crdOK && err == nil
			}

			g.Expect(capiErrs.ToAggregate() == nil).To(Equal(tc.wantCAPI), "CAPI: %v", capiErrs.ToAggregate())
			g.Expect(crdOK).To(Equal(tc.wantCRD), "apiserver: %v", crdErrs)
		})
	}
}

// --- CAPI's side, run here ------------------------------------------------------------------

// loadClusterClass reads the ClusterClass and its worker template from templates/, and
// completes the ClusterClass's status.variables as CAPI's ClusterClass controller does for
// inline variables (the Cluster webhook validates values against the status).
func loadClusterClass(t *testing.T) (*clusterv1.ClusterClass, *unstructured.Unstructured) {
	t.Helper()
	cc := &clusterv1.ClusterClass{}
	var workerTemplate *unstructured.Unstructured
	for _, o := range readTemplateObjects(t, clusterClassFile) {
		switch {
		case o.GetKind() == "ClusterClass":
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cc); err != nil {
				t.Fatal(err)
			}
		case o.GetKind() == ports.KubevirtMachineTemplateGVK.Kind:
			workerTemplate = o
		}
	}
	if cc.Name == "" || workerTemplate == nil {
		t.Fatalf("%s lacks the ClusterClass or the worker KubevirtMachineTemplate", clusterClassFile)
	}
	cc.Status.Variables = nil
	for _, v := range cc.Spec.Variables {
		cc.Status.Variables = append(cc.Status.Variables, clusterv1.ClusterClassStatusVariable{
			Name: v.Name,
			Definitions: []clusterv1.ClusterClassStatusVariableDefinition{{
				From:     clusterv1.VariableDefinitionFromInline,
				Required: v.Required,
				Schema:   v.Schema,
			}},
		})
	}
	return cc, workerTemplate
}

// enableCAPIClusterTopology turns on CAPI's ClusterTopology feature gate, without which its
// ClusterClass webhook refuses every ClusterClass.
func enableCAPIClusterTopology(t *testing.T) {
	t.Helper()
	if !capifeature.Gates.Enabled(capifeature.ClusterTopology) {
		if err := capifeature.MutableGates.Set(string(capifeature.ClusterTopology) + "=true"); err != nil {
			t.Fatal(err)
		}
	}
}

// topologyCluster is a Cluster of the class with one MachineDeployment (class default-worker)
// and, unless value is nil, the guestnet variable set to value.
func topologyCluster(t *testing.T, cc *clusterv1.ClusterClass, name string, value any) *clusterv1.Cluster {
	t.Helper()
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")},
		Spec: clusterv1.ClusterSpec{Topology: clusterv1.Topology{
			ClassRef: clusterv1.ClusterClassRef{Name: cc.Name},
			Version:  "v1.33.1",
			Workers: clusterv1.WorkersTopology{MachineDeployments: []clusterv1.MachineDeploymentTopology{
				{Class: "default-worker", Name: "md-0", Replicas: ptr.To[int32](2)},
			}},
		}},
	}
	if value != nil {
		raw, err := json.Marshal(value)
		if err != nil {
			t.Fatal(err)
		}
		cluster.Spec.Topology.Variables = []clusterv1.ClusterVariable{{Name: topology.VariableName, Value: apiextensionsv1.JSON{Raw: raw}}}
	}
	return cluster
}

// capiDefaultAndValidate defaults and validates the Cluster's variables with CAPI's Cluster
// webhook code, against the ClusterClass's status.variables; the defaults are written into
// cluster, as the webhook does.
func capiDefaultAndValidate(t *testing.T, cc *clusterv1.ClusterClass, cluster *clusterv1.Cluster) field.ErrorList {
	t.Helper()
	return (&capiadmission.Cluster{}).DefaultAndValidateVariables(testContext(t), cluster, nil, cc)
}

// applyClusterPatches applies the ClusterClass's patches to tmpl, the infrastructure template
// of the Cluster's first MachineDeployment, as CAPI's topology controller does: variables
// and builtins computed by CAPI's patches/variables package (for the variables the
// ClusterClass defines inline), JSON patches generated by its inline generator, applied in
// the ClusterClass's order.
func applyClusterPatches(t *testing.T, cc *clusterv1.ClusterClass, cluster *clusterv1.Cluster, tmpl *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	definitions := map[string]bool{}
	for _, v := range cc.Spec.Variables {
		definitions[v.Name] = true
	}
	global, err := patchvariables.Global(cluster.Spec.Topology, cluster, definitions)
	if err != nil {
		t.Fatal(err)
	}
	mdTopology := cluster.Spec.Topology.Workers.MachineDeployments[0]
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: cluster.Name + "-" + mdTopology.Name},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: cluster.Name, Replicas: mdTopology.Replicas,
			Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{Version: cluster.Spec.Topology.Version}},
		},
	}
	mdVariables, err := patchvariables.MachineDeployment(&mdTopology, md, nil, tmpl, definitions)
	if err != nil {
		t.Fatal(err)
	}

	current := tmpl.DeepCopy()
	for i := range cc.Spec.Patches {
		p := &cc.Spec.Patches[i]
		if p.External != nil {
			t.Fatalf("patch %s: external patches are not evaluated here", p.Name)
		}
		resp, err := inline.NewGenerator(p).Generate(context.Background(), cluster, &runtimehooksv1.GeneratePatchesRequest{
			Variables: global,
			Items: []runtimehooksv1.GeneratePatchesRequestItem{{
				UID: "worker",
				HolderReference: runtimehooksv1.HolderReference{
					APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineDeployment",
					Namespace: md.Namespace, Name: md.Name, FieldPath: "spec.template.spec.infrastructureRef",
				},
				Object:    runtime.RawExtension{Object: current.DeepCopy()},
				Variables: mdVariables,
			}},
		})
		if err != nil {
			t.Fatalf("patch %s: %v", p.Name, err)
		}
		for _, item := range resp.Items {
			if item.PatchType != runtimehooksv1.JSONPatchType {
				t.Fatalf("patch %s: patch type %s", p.Name, item.PatchType)
			}
			patch, err := jsonpatch.DecodePatch(item.Patch)
			if err != nil {
				t.Fatalf("patch %s: %v", p.Name, err)
			}
			doc, err := json.Marshal(current.Object)
			if err != nil {
				t.Fatal(err)
			}
			if doc, err = patch.Apply(doc); err != nil {
				t.Fatalf("patch %s does not apply to %s: %v", p.Name, tmpl.GetName(), err)
			}
			current = &unstructured.Unstructured{}
			if err := json.Unmarshal(doc, &current.Object); err != nil {
				t.Fatal(err)
			}
		}
	}
	return current
}

// --- helpers ------------------------------------------------------------------------------------

// dryRunApply server-side applies u as the topology controller does, without persisting it,
// and decodes the apiserver's answer (CRD defaults included) into into, unless nil.
func dryRunApply(ctx context.Context, c client.Client, u *unstructured.Unstructured, into any) error {
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(topology.FieldManager), client.ForceOwnership, client.DryRunAll); err != nil {
		return err
	}
	if into == nil {
		return nil
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
}

// yamlValue decodes a YAML (or JSON) value as JSON would.
func yamlValue(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal([]byte(strings.TrimSpace(s)), &v); err != nil {
		t.Fatalf("%v in %s", err, s)
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
