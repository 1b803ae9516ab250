package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/exp/topology"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/feature"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// The ClusterClass in templates/ against the real Cluster API: the core manager
// (lab.StartCAPI, ClusterTopology on, its admission webhooks serving the test's namespace)
// validates the ClusterClass and every Cluster's variables, its ClusterClass controller
// computes the ClusterClass's status.variables, and its topology controller evaluates the
// guestnet-worker-ports patch and creates each Cluster's objects: the KubevirtCluster, the
// control plane (k0smotron's, played by lab.StartK0smotronStandIn), the MachineDeployment and
// its KubevirtMachineTemplate, whose every change the MachineDeployment controller rolls out
// through a new MachineSet. Nothing provisions the Machines: a rollout starts and goes no
// further, which is all the patch has to cause. guestnet's topology controller (exp/topology)
// makes the GuestIngress and GuestWebhookBridge from the same variable.

const (
	clusterClassFile = "clusterclass-kubevirt-guestnet.yaml"
	clusterClassName = "kubevirt-guestnet"
	// classWorkerTemplate is the ClusterClass's KubevirtMachineTemplate of default-worker.
	classWorkerTemplate = "kubevirt-guestnet-worker"
)

// The ClusterClass file, applied as it is, is accepted by the host apiserver (CAPI, CAPK and
// the lab's k0smotron stand-in CRDs) and by CAPI's ClusterClass webhook (structural variable
// schema, CEL rules within CAPI's cost limits, a patch that selects a template of the class,
// enabledIf and valueFrom.template that parse), and CAPI's ClusterClass controller reconciles
// it: every template it refers to exists (the file carries them all), and the guestnet
// variable is published in status.variables with the schema of the file.
func TestClusterClassAcceptedAndReconciledByCAPI(t *testing.T) {
	e := newTopologyEnv(t, "clusterclass")
	cc := e.createClusterClass()
	e.g.Expect(cc.Status.Variables).To(HaveLen(1))
	v := cc.Status.Variables[0]
	e.g.Expect(v.Name).To(Equal(topology.VariableName))
	e.g.Expect(v.Definitions).To(HaveLen(1))
	e.g.Expect(v.Definitions[0].From).To(Equal(clusterv1.VariableDefinitionFromInline))
	e.g.Expect(v.Definitions[0].Schema).To(Equal(cc.Spec.Variables[0].Schema))
	for _, o := range readTemplateObjects(t, clusterClassFile) {
		if o.GetKind() == "ClusterClass" {
			continue
		}
		owned := &unstructured.Unstructured{}
		owned.SetGroupVersionKind(o.GroupVersionKind())
		e.g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: o.GetName()}, owned)).To(Succeed())
		e.g.Expect(owned.GetOwnerReferences()).To(ContainElement(HaveField("Name", clusterClassName)), "%s %s is the ClusterClass's", o.GetKind(), o.GetName())
	}
}

// The guestnet variable drives both sides through the real controllers. Without it CAPI
// creates the workers from the class's template as it is (no ports list), with the
// KubevirtCluster marked as k0smotron's (no load balancer of CAPK) and the control plane at
// the topology's version. Setting it makes guestnet create the GuestIngress and
// GuestWebhookBridge and CAPI's patch declare on the workers exactly what guestnet requires
// for them (10250/TCP, workerPorts, the ingress nodePorts, the bridge range): CAPI
// writes a new KubevirtMachineTemplate (<cluster>-md-0-<random>), repoints the
// MachineDeployment and starts a rollout (a new MachineSet on it), and guestnet's reading of
// the workers (ports.ListWorkers, as the PortsDeclared conditions read them) finds that
// template, topology-owned, with every port declared. Changing the value does all of it
// again; removing it deletes the guestnet objects and rolls the workers back to no ports list.
func TestClusterClassTopologyVariableRollsTheWorkersAndDrivesTheGuestnetObjects(t *testing.T) {
	e := newTopologyEnv(t, "clusterclass-topology")
	e.createClusterClass()
	e.l.StartManagerBinary(t, lab.ManagerFlags{Namespace: e.ns, WatchFilter: e.filter, FeatureGates: string(feature.ClusterTopologyVariables) + "=true"})
	cluster := e.createCluster("tenant-a", nil, 2)

	// No variable: the class's template as it is, two Machines of one MachineSet.
	w0 := e.eventuallyWorkers(cluster, func(g Gomega, w ports.Workers) {
		g.Expect(e.machineSetTemplates(g, cluster)).To(Equal(map[string]int32{w.Template.GetName(): 2}))
	})
	t0 := w0.Template.GetName()
	e.g.Expect(w0.TopologyOwned()).To(BeTrue())
	e.g.Expect(w0.MachineDeployment.Name).To(MatchRegexp(`^tenant-a-md-0-[a-z0-9]{5}$`))
	e.g.Expect(w0.MachineDeployment.Labels).To(HaveKeyWithValue(clusterv1.WatchLabel, e.filter))
	e.g.Expect(t0).To(MatchRegexp(`^tenant-a-md-0-[a-z0-9]{5}$`))
	e.g.Expect(w0.Template.GetAnnotations()).To(HaveKeyWithValue(clusterv1.TemplateClonedFromNameAnnotation, classWorkerTemplate))
	e.g.Expect(w0.Template.GetLabels()).To(HaveKeyWithValue(clusterv1.ClusterTopologyMachineDeploymentNameLabel, "md-0"))
	e.g.Expect(w0.Analysis.State).To(Equal(ports.AllPortsForwarded))
	e.g.Expect(w0.Template.Object["spec"]).To(Equal(e.classTemplateSpec()), "unset variable: patch disabled")
	e.expectClusterObjects(cluster)
	e.expectNoGuestnetObjects(cluster)

	// Set the variable.
	e.setVariable(cluster, yamlValue(t, `
workerPorts: [{port: 8472, protocol: UDP}]
ingress:
  guestService: {namespace: projectcontour, name: envoy}
  ports: [{name: http, port: 80, nodePort: 30080}, {name: https, port: 443, nodePort: 30443}]
  loadBalancer: {ip: 10.2.6.220}
webhookBridge:
  apiServices: {names: [v1beta1.metrics.k8s.io]}`))
	t1 := e.eventuallyDeclared(cluster, t0, []ports.Port{ports.UDP(8472)}, func(g Gomega, gi *guestnetv1.GuestIngress, gwb *guestnetv1.GuestWebhookBridge) {
		g.Expect(gi).NotTo(BeNil())
		g.Expect(gwb).NotTo(BeNil())
		g.Expect(gi.Spec.Ports).To(HaveLen(2))
		g.Expect(gwb.Spec.NodePortRange).To(Equal(guestnetv1.NodePortRange{Start: 30064, Size: 16}))
	})
	e.g.Eventually(func(g Gomega) map[string]int32 { return e.machineSetTemplates(g, cluster) }).
		Should(Equal(map[string]int32{t0: 2, t1: 1}), "the rollout starts: one Machine surged on the new template")

	// Change it: another nodePort, another bridge range.
	e.setVariable(cluster, yamlValue(t, `
workerPorts: [{port: 8472, protocol: UDP}]
ingress:
  guestService: {namespace: projectcontour, name: envoy}
  ports: [{name: http, port: 80, nodePort: 30080}, {name: https, port: 443, nodePort: 30444}]
  loadBalancer: {ip: 10.2.6.220}
webhookBridge:
  apiServices: {names: [v1beta1.metrics.k8s.io]}
  nodePortRange: {start: 31000, size: 4}`))
	t2 := e.eventuallyDeclared(cluster, t1, []ports.Port{ports.UDP(8472)}, func(g Gomega, gi *guestnetv1.GuestIngress, gwb *guestnetv1.GuestWebhookBridge) {
		g.Expect(gi).NotTo(BeNil())
		g.Expect(gwb).NotTo(BeNil())
		g.Expect(gi.Spec.Ports[1].NodePort).To(Equal(ptr.To[int32](30444)))
		g.Expect(gwb.Spec.NodePortRange).To(Equal(guestnetv1.NodePortRange{Start: 31000, Size: 4}))
	})
	e.g.Expect(t2).NotTo(Equal(t0))
	e.g.Eventually(func(g Gomega) map[string]int32 { return e.machineSetTemplates(g, cluster) }).
		Should(HaveKeyWithValue(t2, BeEquivalentTo(1)), "a new MachineSet for the new template")

	// Remove it: the guestnet objects go, the workers keep no ports list again.
	e.setVariable(cluster, nil)
	e.expectNoGuestnetObjects(cluster)
	w3 := e.eventuallyWorkers(cluster, func(g Gomega, w ports.Workers) {
		g.Expect(w.Template.GetName()).NotTo(BeElementOf(t0, t1, t2))
		g.Expect(w.Analysis.State).To(Equal(ports.AllPortsForwarded))
	})
	e.g.Expect(w3.Template.Object["spec"]).To(Equal(e.classTemplateSpec()))
	e.g.Eventually(func(g Gomega) map[string]int32 { return e.machineSetTemplates(g, cluster) }).
		Should(HaveKeyWithValue(w3.Template.GetName(), BeEquivalentTo(1)))
}

// For every value, CAPI's patch declares on the workers exactly what guestnet requires of the
// GuestIngress and GuestWebhookBridge its topology controller makes from the same value, as
// the apiserver stores them (CRD defaults included): 10250/TCP (no 22: the class's KubevirtCluster
// is managed by k0smotron, CAPK never SSHes), workerPorts, each
// ingress nodePort and the whole bridge range, each once, in port order, and CAPK's CRD
// accepts the patched template (CAPI creates it). That includes the value the PortsDeclared
// condition tells users to set (ports.TopologyValue). Without workerPorts the workers keep
// the class's template as it is, whatever else the value has.
func TestClusterClassPatchDeclaresThePortsOfTheGuestnetObjects(t *testing.T) {
	e := newTopologyEnv(t, "clusterclass-objects")
	e.createClusterClass()
	e.l.StartManagerBinary(t, lab.ManagerFlags{Namespace: e.ns, WatchFilter: e.filter, FeatureGates: string(feature.ClusterTopologyVariables) + "=true"})

	conditionValue := ports.TopologyValue(ports.Base(false).Union(ports.NewSet(
		ports.Requirement{Port: ports.UDP(8473)}, ports.Requirement{Port: ports.TCP(30080)}, ports.Requirement{Port: ports.TCP(30443)})).Ports())
	tests := []struct {
		name  string
		value string
		// extra are the workerPorts; nil means the value has none.
		extra []ports.Port
		// objects: whether the value makes a GuestIngress and a GuestWebhookBridge.
		objects bool
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
			extra:   []ports.Port{ports.UDP(8472), ports.TCP(22), ports.TCP(30064)},
			objects: true,
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
			extra:   []ports.Port{ports.TCP(9100)},
			objects: true,
		},
		{
			name:  "the value the PortsDeclared condition gives",
			value: conditionValue,
			extra: []ports.Port{ports.TCP(10250), ports.UDP(8473), ports.TCP(30080), ports.TCP(30443)},
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
	// All Clusters at once: CAPI works on them side by side.
	clusters := make([]*clusterv1.Cluster, len(tests))
	for i, tc := range tests {
		clusters[i] = e.createCluster(fmt.Sprintf("tenant-%d", i), yamlValue(t, tc.value), 1)
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := e.forSubtest(t)
			cluster := clusters[i]
			if tc.extra == nil {
				w := e.eventuallyWorkers(cluster, func(Gomega, ports.Workers) {})
				e.g.Expect(w.Analysis.State).To(Equal(ports.AllPortsForwarded))
				e.g.Expect(w.Template.Object["spec"]).To(Equal(e.classTemplateSpec()))
				return
			}
			e.eventuallyDeclared(cluster, "", tc.extra, func(g Gomega, gi *guestnetv1.GuestIngress, gwb *guestnetv1.GuestWebhookBridge) {
				g.Expect(gi != nil).To(Equal(tc.objects), "GuestIngress")
				g.Expect(gwb != nil).To(Equal(tc.objects), "GuestWebhookBridge")
			})
		})
	}
}

// guestnet.nodeIdentity, an empty object included, makes CAPI's topology controller run the
// workers' kubelets in external cloud-provider mode: the bootstrap config template of the
// MachineDeployment gets k0s's --enable-cloud-provider in its args; without it (no variable,
// or a value without nodeIdentity) the class's template stays as it is, and removing it takes
// the argument away again. No guestnet manager runs: only CAPI's patch is looked at.
func TestClusterClassNodeIdentityRunsTheKubeletsExternal(t *testing.T) {
	e := newTopologyEnv(t, "clusterclass-kubelet")
	e.createClusterClass()
	external := []string{"--enable-cloud-provider"}
	tests := []struct {
		name  string
		value any
		want  []string
	}{
		{name: "the opt-in alone", value: yamlValue(t, `nodeIdentity: {}`), want: external},
		{name: "nodeAddresses External", value: yamlValue(t, "workerPorts: [{port: 8472, protocol: UDP}]\nnodeIdentity: {nodeAddresses: External}"), want: external},
		{name: "no nodeIdentity", value: yamlValue(t, `workerPorts: [{port: 8472, protocol: UDP}]`)},
		{name: "no variable"},
	}
	clusters := make([]*clusterv1.Cluster, len(tests))
	for i, tc := range tests {
		clusters[i] = e.createCluster(fmt.Sprintf("tenant-%d", i), tc.value, 1)
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := e.forSubtest(t)
			e.eventuallyWorkerArgs(clusters[i], tc.want)
		})
	}
	e.setVariable(clusters[0], yamlValue(t, `workerPorts: [{port: 8472, protocol: UDP}]`))
	e.eventuallyWorkerArgs(clusters[0], nil)
}

// guestnet.nodeIdentity.controlPlane makes CAPI's topology controller give the Cluster's
// control plane (k0smotron's, from the class's K0smotronControlPlaneTemplate) a LoadBalancer
// Service of Cilium's L2 announcer, which guestnet gives the address and k0smotron makes the
// Cluster's endpoint; without it (no variable, nodeIdentity without controlPlane, no
// nodeIdentity) the class's ClusterIP stays, and removing it brings ClusterIP back. CAPI
// refuses another ip for a Cluster (immutable, as in the CRD). The rest of the control plane's
// service (its ports) is the class's in every case. No guestnet manager runs: only CAPI's
// patch is looked at (the control plane of a LoadBalancer Service gets no address here, and
// reports no status: CAPI creates no workers for it, which is not looked at).
func TestClusterClassControlPlaneAddressMakesTheServiceALoadBalancer(t *testing.T) {
	e := newTopologyEnv(t, "clusterclass-cplb")
	e.createClusterClass()
	loadBalancer := map[string]any{"type": "LoadBalancer", "loadBalancerClass": "io.cilium/l2-announcer", "apiPort": int64(6443), "konnectivityPort": int64(8132)}
	clusterIP := map[string]any{"type": "ClusterIP", "apiPort": int64(6443), "konnectivityPort": int64(8132)}
	tests := []struct {
		name  string
		value any
		want  map[string]any
	}{
		{name: "the control plane address", value: yamlValue(t, `nodeIdentity: {controlPlane: {ip: 10.2.6.221}}`), want: loadBalancer},
		{name: "with everything else", value: yamlValue(t, `
workerPorts: [{port: 8472, protocol: UDP}]
nodeIdentity: {nodeAddresses: External, controlPlane: {ip: 10.2.6.222, serviceName: kmc-x-lb, l2: {interfaces: ["^eth0$"]}}}`), want: loadBalancer},
		{name: "node identity without it", value: yamlValue(t, `nodeIdentity: {nodeAddresses: External}`), want: clusterIP},
		{name: "the empty opt-in", value: yamlValue(t, `nodeIdentity: {}`), want: clusterIP},
		{name: "no nodeIdentity", value: yamlValue(t, `workerPorts: [{port: 8472, protocol: UDP}]`), want: clusterIP},
		{name: "no variable", want: clusterIP},
	}
	clusters := make([]*clusterv1.Cluster, len(tests))
	for i, tc := range tests {
		clusters[i] = e.createCluster(fmt.Sprintf("tenant-%d", i), tc.value, 1)
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := e.forSubtest(t)
			e.eventuallyControlPlaneService(clusters[i], tc.want)
		})
	}

	// Another ip: refused by CAPI's Cluster webhook, nothing changes.
	busy := wait.Backoff{Steps: 30, Duration: 20 * time.Millisecond, Factor: 1.3, Jitter: 0.2, Cap: time.Second}
	err := retry.RetryOnConflict(busy, func() error {
		c := &clusterv1.Cluster{}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(clusters[0]), c); err != nil {
			return err
		}
		c.Spec.Topology.Variables[0].Value.Raw = []byte(`{"nodeIdentity":{"controlPlane":{"ip":"10.2.6.223"}}}`)
		return e.c.Update(e.ctx, c)
	})
	e.g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "CAPI refuses another ip: %v", err)
	e.g.Expect(err.Error()).To(ContainSubstring("controlPlane.ip is immutable"))

	// Removing it: ClusterIP again.
	e.setVariable(clusters[0], yamlValue(t, `nodeIdentity: {}`))
	e.eventuallyControlPlaneService(clusters[0], clusterIP)
}

// The schema of guestnet.ingress, guestnet.webhookBridge and guestnet.nodeIdentity is a
// faithful subset of the CRDs: every value CAPI's Cluster webhook accepts (validated against
// the status.variables its ClusterClass controller computed), the apiserver accepts as the
// GuestIngress, GuestWebhookBridge and GuestNodeIdentity guestnet's topology controller applies; and the CRDs' rules are all in
// the schema, so CAPI already refuses what the apiserver would (a Cluster is refused at once,
// instead of an event later). Only the fields the variable leaves out (clusterName,
// declarePorts) are refused by CAPI and not by the CRDs.
func TestClusterClassVariableSchemaIsASubsetOfTheCRDs(t *testing.T) {
	e := newTopologyEnv(t, "clusterclass-schema")
	e.createClusterClass()

	const lb = `loadBalancer: {ip: 10.2.6.220}`
	const svc = `guestService: {namespace: projectcontour, name: envoy}`
	tests := []struct {
		name     string
		ingress  string // the value of guestnet.ingress (YAML), empty for none
		bridge   string // the value of guestnet.webhookBridge (YAML), empty for none
		identity string // the value of guestnet.nodeIdentity (YAML), empty for none
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
  class: io.cilium/bgp-control-plane
  externalTrafficPolicy: Local
  ipFamilies: [IPv4]
  bgp:
    communities: {standard: ["65000:100"], wellKnown: [no-export], large: ["64512:1:100"]}
    advertisementLabels: {upstream: transit}
  annotations: {a: b}
  labels: {c: d}`, bridge: `
apiServices: {names: [v1beta1.metrics.k8s.io], selector: {matchLabels: {a: b}}}
validatingWebhooks: {all: true}
mutatingWebhooks: {selector: {matchExpressions: [{key: app, operator: Exists}]}}
nodePortRange: {start: 32752, size: 16}
mode: Always`},
		{name: "minimal", wantCAPI: true, wantCRD: true, ingress: svc + "\nloadBalancer: {poolRef: {name: shared}}", bridge: `apiServices: {names: [v1beta1.metrics.k8s.io]}`},
		{name: "IPv6 ip inside IPv6 cidrs", wantCAPI: true, wantCRD: true, ingress: svc + "\nloadBalancer: {ip: 'fd00::10', cidrs: ['fd00::/120']}"},
		{name: "dual-stack ips", wantCAPI: true, wantCRD: true, ingress: svc + "\nloadBalancer: {ips: ['10.2.6.220', 'fd00::10'], class: io.cilium/bgp-control-plane}"},
		{name: "Local with Cilium's L2 announcer", ingress: svc + "\nloadBalancer: {ip: 10.2.6.220, externalTrafficPolicy: Local}"},
		{name: "ip and ips", ingress: svc + "\nloadBalancer: {ip: 10.2.6.220, ips: ['fd00::10']}"},

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
		{name: "class not a qualified name", ingress: svc + "\nloadBalancer: {ip: 10.0.0.1, class: 'io.cilium/l2 announcer'}"},
		{name: "annotation key not a qualified name", ingress: svc + "\nloadBalancer: {ip: 10.0.0.1, annotations: {'a b': c}}"},
		{name: "label value too long", ingress: svc + "\nloadBalancer: {ip: 10.0.0.1, labels: {a: " + strings.Repeat("x", 64) + "}}"},
		{name: "l2 nodeSelector operator", ingress: svc + "\nloadBalancer: {ip: 10.0.0.1, l2: {nodeSelector: {matchExpressions: [{key: a, operator: Near}]}}}"},
		{name: "l2 nodeSelector In without values", ingress: svc + "\nloadBalancer: {ip: 10.0.0.1, l2: {nodeSelector: {matchExpressions: [{key: a, operator: In}]}}}"},
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

		{name: "node identity: the opt-in alone", wantCAPI: true, wantCRD: true, identity: `{}`},
		{name: "node identity: External", wantCAPI: true, wantCRD: true, identity: `nodeAddresses: External`},
		{name: "node identity: bad nodeAddresses", identity: `nodeAddresses: Sometimes`},
		{name: "node identity: unknown field", identity: `foo: bar`},
		{name: "node identity: clusterName (left out of the variable)", wantCRD: true, identity: `clusterName: other`},

		{name: "control plane address: the ip alone", wantCAPI: true, wantCRD: true, identity: `controlPlane: {ip: 10.2.6.221}`},
		{name: "control plane address: everything", wantCAPI: true, wantCRD: true, identity: `
nodeAddresses: External
controlPlane:
  ip: 'fd00::21'
  serviceName: kmc-tenant-a-lb
  l2:
    interfaces: ["^eth0$", "^bond[0-9]+$"]
    nodeSelector:
      matchLabels: {node-role.kubernetes.io/worker: ""}
      matchExpressions: [{key: zone, operator: In, values: [a, b]}, {key: spare, operator: DoesNotExist}]`},
		{name: "control plane address: no ip", identity: `controlPlane: {serviceName: kmc-tenant-a-lb}`},
		{name: "control plane address: bad ip", identity: `controlPlane: {ip: 10.2.6.300}`},
		{name: "control plane address: a CIDR for ip", identity: `controlPlane: {ip: 10.2.6.221/32}`},
		{name: "control plane address: not an object", identity: `controlPlane: 10.2.6.221`},
		{name: "control plane address: unknown field", identity: `controlPlane: {ip: 10.2.6.221, cidrs: [10.2.6.216/29]}`},
		{name: "control plane address: serviceName in upper case", identity: `controlPlane: {ip: 10.2.6.221, serviceName: KMC-lb}`},
		{name: "control plane address: serviceName starting with a digit", identity: `controlPlane: {ip: 10.2.6.221, serviceName: 1-lb}`},
		{name: "control plane address: empty serviceName", identity: `controlPlane: {ip: 10.2.6.221, serviceName: ''}`},
		{name: "control plane address: serviceName of 64", identity: "controlPlane: {ip: 10.2.6.221, serviceName: " + strings.Repeat("a", 64) + "}"},
		{name: "control plane address: seventeen interfaces", identity: `controlPlane: {ip: 10.2.6.221, l2: {interfaces: [a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q]}}`},
		{name: "control plane address: empty interface", identity: `controlPlane: {ip: 10.2.6.221, l2: {interfaces: ['']}}`},
		{name: "control plane address: bad operator", identity: `controlPlane: {ip: 10.2.6.221, l2: {nodeSelector: {matchExpressions: [{key: a, operator: Equals, values: [b]}]}}}`},
		{name: "control plane address: In without values", identity: `controlPlane: {ip: 10.2.6.221, l2: {nodeSelector: {matchExpressions: [{key: a, operator: In}]}}}`},
		{name: "control plane address: Exists with values", identity: `controlPlane: {ip: 10.2.6.221, l2: {nodeSelector: {matchExpressions: [{key: a, operator: Exists, values: [b]}]}}}`},
		{name: "control plane address: seventeen matchLabels", identity: "controlPlane: {ip: 10.2.6.221, l2: {nodeSelector: {matchLabels: {" + manyLabels(17) + "}}}}"},
		{name: "control plane address: seventeen values", identity: `controlPlane: {ip: 10.2.6.221, l2: {nodeSelector: {matchExpressions: [{key: a, operator: In, values: [a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q]}]}}}`},
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
			if tc.identity != "" {
				value[topology.NodeIdentityField] = yamlValue(t, tc.identity)
			}
			cluster := e.topologyCluster(fmt.Sprintf("tenant-%d", i), value, 1)
			// As a user creates it, through CAPI's webhooks; nothing is stored.
			capiErr := e.c.Create(e.ctx, cluster.DeepCopy(), client.DryRunAll)
			if capiErr != nil {
				g.Expect(apierrors.IsInvalid(capiErr)).To(BeTrue(), "CAPI refuses the value itself: %v", capiErr)
			}

			cluster.UID = types.UID(fmt.Sprintf("uid-%d", i)) // the owner of the objects applied below
			variable, _, err := topology.VariableOf(cluster)
			g.Expect(err).NotTo(HaveOccurred())
			var crdErrs []error
			if variable.Ingress != nil {
				crdErrs = append(crdErrs, dryRunApply(e.ctx, e.c, topology.Desired(topology.GuestIngressKind, cluster, variable.Ingress, ""), nil))
			}
			if variable.WebhookBridge != nil {
				crdErrs = append(crdErrs, dryRunApply(e.ctx, e.c, topology.Desired(topology.GuestWebhookBridgeKind, cluster, variable.WebhookBridge, ""), nil))
			}
			if variable.NodeIdentity != nil {
				crdErrs = append(crdErrs, dryRunApply(e.ctx, e.c, topology.Desired(topology.GuestNodeIdentityKind, cluster, variable.NodeIdentity, ""), nil))
			}
			crdOK := true
			for _, err := range crdErrs {
				crdOK = crdOK && err == nil
			}

			g.Expect(capiErr == nil).To(Equal(tc.wantCAPI), "CAPI: %v", capiErr)
			g.Expect(crdOK).To(Equal(tc.wantCRD), "apiserver: %v", crdErrs)
		})
	}
}

// manyLabels is n matchLabels in YAML flow style: "k0: v, k1: v, ...".
func manyLabels(n int) string {
	labels := make([]string, n)
	for i := range labels {
		labels[i] = fmt.Sprintf("k%d: v", i)
	}
	return strings.Join(labels, ", ")
}

// --- the lab's real CAPI with the ClusterClass ----------------------------------------------

// topologyTimeout bounds each wait for CAPI's controllers (a reconcile of theirs takes well
// under a second in the lab; a rollout step a few).
const topologyTimeout = 90 * time.Second

// topologyEnv is a namespace of the lab's host with a real CAPI manager of its own (watch
// filter = the namespace's name) and the k0smotron stand-in.
type topologyEnv struct {
	t      *testing.T
	g      *WithT
	ctx    context.Context
	l      *lab.Lab
	c      client.Client
	ns     string
	filter string
}

func newTopologyEnv(t *testing.T, prefix string) *topologyEnv {
	t.Helper()
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	ns := uniqueName(prefix)
	e := &topologyEnv{t: t, g: NewWithT(t), ctx: ctx, l: l, c: l.Host.Client, ns: ns, filter: ns}
	e.g.SetDefaultEventuallyTimeout(topologyTimeout)
	e.g.SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	e.g.Expect(e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	capi, err := l.StartCAPI(ctx, ns, e.filter)
	e.g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("CAPI's log: %s", capi.LogPath())
		}
		capi.Stop()
	})
	k0s, err := l.StartK0smotronStandIn(ctx, ns)
	e.g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(k0s.Stop)
	return e
}

// forSubtest is the env for subtest t (its failures are t's).
func (e *topologyEnv) forSubtest(t *testing.T) *topologyEnv {
	sub := *e
	sub.t, sub.g = t, NewWithT(t)
	sub.g.SetDefaultEventuallyTimeout(topologyTimeout)
	sub.g.SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	return &sub
}

// createClusterClass creates the objects of the ClusterClass file, as they are, but for the
// watch-filter label on the ClusterClass, and waits until CAPI's ClusterClass controller has
// reconciled it (until then CAPI's Cluster webhook validates no variable and its topology
// controller waits).
func (e *topologyEnv) createClusterClass() *clusterv1.ClusterClass {
	e.t.Helper()
	for _, o := range readTemplateObjects(e.t, clusterClassFile) {
		o.SetNamespace(e.ns)
		if o.GetKind() == "ClusterClass" {
			o.SetLabels(map[string]string{clusterv1.WatchLabel: e.filter})
		}
		e.g.Expect(e.c.Create(e.ctx, o)).To(Succeed(), "creating %s %s", o.GetKind(), o.GetName())
	}
	cc := &clusterv1.ClusterClass{}
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: clusterClassName}, cc)).To(Succeed())
		g.Expect(cc.Status.ObservedGeneration).To(Equal(cc.Generation), "reconciled: %+v", cc.Status.Conditions)
		g.Expect(conditions.IsTrue(cc, clusterv1.ClusterClassVariablesReadyCondition)).To(BeTrue(), "%+v", cc.Status.Conditions)
		g.Expect(conditions.IsTrue(cc, clusterv1.ClusterClassRefVersionsUpToDateCondition)).To(BeTrue(), "%+v", cc.Status.Conditions)
	}).Should(Succeed())
	return cc
}

// classTemplateSpec is the spec of the ClusterClass's worker template, as the apiserver
// stores it.
func (e *topologyEnv) classTemplateSpec() any {
	e.t.Helper()
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: classWorkerTemplate}, tmpl)).To(Succeed())
	return tmpl.Object["spec"]
}

// topologyCluster is a Cluster of the class with one MachineDeployment md-0 (class
// default-worker) of replicas workers, a control plane of one replica and, unless value is
// nil, the guestnet variable set to value; labelled for the namespace's CAPI.
func (e *topologyEnv) topologyCluster(name string, value any, replicas int32) *clusterv1.Cluster {
	e.t.Helper()
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: clusterv1.ClusterSpec{
			ClusterNetwork: clusterv1.ClusterNetwork{
				Pods:     clusterv1.NetworkRanges{CIDRBlocks: []string{"10.245.0.0/16"}},
				Services: clusterv1.NetworkRanges{CIDRBlocks: []string{"10.96.0.0/12"}},
			},
			Topology: clusterv1.Topology{
				ClassRef:     clusterv1.ClusterClassRef{Name: clusterClassName},
				Version:      "v1.33.1",
				ControlPlane: clusterv1.ControlPlaneTopology{Replicas: ptr.To[int32](1)},
				Workers: clusterv1.WorkersTopology{MachineDeployments: []clusterv1.MachineDeploymentTopology{
					{Class: "default-worker", Name: "md-0", Replicas: ptr.To(replicas)},
				}},
			},
		},
	}
	if value != nil {
		raw, err := json.Marshal(value)
		e.g.Expect(err).NotTo(HaveOccurred())
		cluster.Spec.Topology.Variables = []clusterv1.ClusterVariable{{Name: topology.VariableName, Value: apiextensionsv1.JSON{Raw: raw}}}
	}
	lab.ForRealCAPITopology(cluster, e.filter)
	return cluster
}

func (e *topologyEnv) createCluster(name string, value any, replicas int32) *clusterv1.Cluster {
	e.t.Helper()
	cluster := e.topologyCluster(name, value, replicas)
	e.g.Expect(e.c.Create(e.ctx, cluster)).To(Succeed())
	return cluster
}

// setVariable sets the Cluster's guestnet variable to value, or removes it when nil.
func (e *topologyEnv) setVariable(cluster *clusterv1.Cluster, value any) {
	e.t.Helper()
	var raw []byte
	if value != nil {
		var err error
		raw, err = json.Marshal(value)
		e.g.Expect(err).NotTo(HaveOccurred())
	}
	// CAPI's controllers write a new Cluster often (topology, conditions): retry for a while.
	busy := wait.Backoff{Steps: 30, Duration: 20 * time.Millisecond, Factor: 1.3, Jitter: 0.2, Cap: time.Second}
	e.g.Expect(retry.RetryOnConflict(busy, func() error {
		c := &clusterv1.Cluster{}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), c); err != nil {
			return err
		}
		c.Spec.Topology.Variables = nil
		if raw != nil {
			c.Spec.Topology.Variables = []clusterv1.ClusterVariable{{Name: topology.VariableName, Value: apiextensionsv1.JSON{Raw: raw}}}
		}
		return e.c.Update(e.ctx, c)
	})).To(Succeed())
}

// eventuallyWorkers waits until guestnet's reading of the Cluster's workers
// (ports.ListWorkers) finds one MachineDeployment with its template, and check passes.
func (e *topologyEnv) eventuallyWorkers(cluster *clusterv1.Cluster, check func(Gomega, ports.Workers)) ports.Workers {
	e.t.Helper()
	var w ports.Workers
	e.g.Eventually(func(g Gomega) {
		workers, err := ports.ListWorkers(e.ctx, e.c, cluster, nil)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(workers).To(HaveLen(1))
		w = workers[0]
		g.Expect(w.TemplateErr).NotTo(HaveOccurred())
		check(g, w)
	}).Should(Succeed())
	return w
}

// eventuallyDeclared waits until guestnet's GuestIngress and GuestWebhookBridge of the
// Cluster pass check (nil for an object that does not exist) and the workers' template
// (another than previous) declares exactly what guestnet requires for them, with extra (the
// workerPorts), and returns the template's name.
func (e *topologyEnv) eventuallyDeclared(cluster *clusterv1.Cluster, previous string, extra []ports.Port, check func(Gomega, *guestnetv1.GuestIngress, *guestnetv1.GuestWebhookBridge)) string {
	e.t.Helper()
	var name string
	e.g.Eventually(func(g Gomega) {
		required := ports.Base(false)
		gi, gwb := &guestnetv1.GuestIngress{}, &guestnetv1.GuestWebhookBridge{}
		key := client.ObjectKeyFromObject(cluster)
		if err := e.c.Get(e.ctx, key, gi); apierrors.IsNotFound(err) {
			gi = nil
		} else {
			g.Expect(err).NotTo(HaveOccurred())
			required = required.Union(ports.ForGuestIngress(gi))
		}
		if err := e.c.Get(e.ctx, key, gwb); apierrors.IsNotFound(err) {
			gwb = nil
		} else {
			g.Expect(err).NotTo(HaveOccurred())
			required = required.Union(ports.ForBridge(gwb))
		}
		check(g, gi, gwb)
		for _, p := range extra {
			required = required.Union(ports.NewSet(ports.Requirement{Port: p}))
		}
		// The Cluster as it is now: the topology controller sets its infrastructureRef, which
		// says whether CAPK SSHes into the VMs (22/TCP).
		live := &clusterv1.Cluster{}
		g.Expect(e.c.Get(e.ctx, key, live)).To(Succeed())
		workers, err := ports.ListWorkers(e.ctx, e.c, live, required)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(workers).To(HaveLen(1))
		w := workers[0]
		g.Expect(w.TemplateErr).NotTo(HaveOccurred())
		g.Expect(w.TopologyOwned()).To(BeTrue())
		name = w.Template.GetName()
		g.Expect(name).NotTo(Equal(previous))
		g.Expect(w.Analysis.State).To(Equal(ports.PortsDeclared), "missing: %s", w.Analysis.Missing)
		g.Expect(w.Analysis.Declared).To(Equal(required.Ports()), "exactly the required ports, each once, in port order")
	}).Should(Succeed())
	return name
}

// eventuallyWorkerArgs waits until the Cluster's MachineDeployment refers to a bootstrap
// config template (K0sWorkerConfigTemplate) whose k0s worker args are want.
func (e *topologyEnv) eventuallyWorkerArgs(cluster *clusterv1.Cluster, want []string) {
	e.t.Helper()
	match := Equal(want)
	if want == nil {
		match = BeEmpty()
	}
	e.g.Eventually(func(g Gomega) []string {
		mds := &clusterv1.MachineDeploymentList{}
		g.Expect(e.c.List(e.ctx, mds, client.InNamespace(e.ns), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name})).To(Succeed())
		g.Expect(mds.Items).To(HaveLen(1))
		tmpl := &unstructured.Unstructured{}
		tmpl.SetGroupVersionKind(lab.WorkerConfigTemplateGVK)
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: mds.Items[0].Spec.Template.Spec.Bootstrap.ConfigRef.Name}, tmpl)).To(Succeed())
		return workerArgs(g, tmpl)
	}).Should(match, "k0s worker args of Cluster %s", cluster.Name)
}

// eventuallyControlPlaneService waits until the Cluster's control plane (the
// K0smotronControlPlane CAPI's topology controller made from the class's template) has
// spec.service want.
func (e *topologyEnv) eventuallyControlPlaneService(cluster *clusterv1.Cluster, want map[string]any) {
	e.t.Helper()
	e.g.Eventually(func(g Gomega) map[string]any {
		live := &clusterv1.Cluster{}
		g.Expect(e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), live)).To(Succeed())
		g.Expect(live.Spec.ControlPlaneRef.Name).NotTo(BeEmpty())
		cp := &unstructured.Unstructured{}
		cp.SetGroupVersionKind(lab.ControlPlaneGVK)
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: live.Spec.ControlPlaneRef.Name}, cp)).To(Succeed())
		service, _, err := unstructured.NestedMap(cp.Object, "spec", "service")
		g.Expect(err).NotTo(HaveOccurred())
		return service
	}).Should(Equal(want), "spec.service of the control plane of Cluster %s", cluster.Name)
}

// machineSetTemplates maps the infrastructure template of each of the Cluster's MachineSets
// to its desired replicas.
func (e *topologyEnv) machineSetTemplates(g Gomega, cluster *clusterv1.Cluster) map[string]int32 {
	list := &clusterv1.MachineSetList{}
	g.Expect(e.c.List(e.ctx, list, client.InNamespace(e.ns), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name})).To(Succeed())
	out := map[string]int32{}
	for _, ms := range list.Items {
		out[ms.Spec.Template.Spec.InfrastructureRef.Name] = ptr.Deref(ms.Spec.Replicas, 0)
	}
	return out
}

// expectClusterObjects checks what CAPI's topology controller made of the Cluster besides
// the workers: a KubevirtCluster that CAPK leaves to k0smotron (as in the default flavor), and
// the control plane at the topology's version.
func (e *topologyEnv) expectClusterObjects(cluster *clusterv1.Cluster) {
	e.t.Helper()
	live := &clusterv1.Cluster{}
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), live)).To(Succeed())
	infra := &unstructured.Unstructured{}
	infra.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtCluster"))
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: live.Spec.InfrastructureRef.Name}, infra)).To(Succeed())
	e.g.Expect(infra.GetAnnotations()).To(HaveKey(clusterv1.ManagedByAnnotation), "k0smotron provides the control-plane endpoint; CAPK must create no load balancer")
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(lab.ControlPlaneGVK)
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: live.Spec.ControlPlaneRef.Name}, cp)).To(Succeed())
	version, _, _ := unstructured.NestedString(cp.Object, "spec", "version")
	e.g.Expect(version).To(Equal(live.Spec.Topology.Version))
}

// expectNoGuestnetObjects waits until the Cluster has no GuestIngress and no
// GuestWebhookBridge.
func (e *topologyEnv) expectNoGuestnetObjects(cluster *clusterv1.Cluster) {
	e.t.Helper()
	key := client.ObjectKeyFromObject(cluster)
	e.g.Eventually(func() bool { return apierrors.IsNotFound(e.c.Get(e.ctx, key, &guestnetv1.GuestIngress{})) }).Should(BeTrue())
	e.g.Eventually(func() bool { return apierrors.IsNotFound(e.c.Get(e.ctx, key, &guestnetv1.GuestWebhookBridge{})) }).Should(BeTrue())
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
