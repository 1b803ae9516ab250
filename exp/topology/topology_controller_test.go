package topology_test

// Lab tests of the topology controller against the lab's real host apiserver, with the CAPI
// and guestnet CRDs: Clusters with spec.topology (class kubevirt-guestnet) are created and
// changed as users do; no CAPI controller runs (nothing else writes the Cluster), and no
// guest cluster is needed. Each test has a namespace and a manager of its own.
//
// Run with: make test TEST_PKGS=./exp/... TEST_ARGS='-run Topology -v'

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	ctrl "sigs.k8s.io/controller-runtime"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/exp/topology"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/feature"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

// One host-only lab for the package's tests.
var shared = lab.Shared{DirPrefix: "guestnet-topology", Options: lab.Options{SkipGuest: true}}

func TestMain(m *testing.M) { shared.Main(m) }

const (
	timeout  = 30 * time.Second
	interval = 100 * time.Millisecond
	// quiet is how long a test watches for a write that must not happen.
	quiet = 3 * time.Second
)

const (
	ingressValue = `
guestService: {namespace: projectcontour, name: envoy}
ports:
- {name: http, port: 80, nodePort: 30080}
- {name: https, port: 443, nodePort: 30443}
loadBalancer:
  ip: 10.2.6.220
  l2: {interfaces: ["^eth0$"]}`
	bridgeValue = `
apiServices: {names: [v1beta1.metrics.k8s.io]}
validatingWebhooks: {names: [cert-manager-webhook]}`
)

// Setting the variable creates the GuestIngress and GuestWebhookBridge named after the Cluster,
// with the variable's specs (and the CRD defaults), owned by the Cluster and applied by the
// guestnet-topology field manager; changing it updates them, removing fields removes them
// from the objects, an edit of the objects is undone; removing ingress deletes the
// GuestIngress only, removing the variable deletes the GuestWebhookBridge.
func TestTopologyVariableCreatesUpdatesAndDeletesTheObjects(t *testing.T) {
	e := newEnv(t, setupTopologyVariables)
	cluster := e.createCluster("tenant-a", value(map[string]string{"workerPorts": `[{port: 8472, protocol: UDP}]`, "ingress": ingressValue, "webhookBridge": bridgeValue}))

	gi := e.eventuallyGuestIngress(cluster, func(g Gomega, gi *guestnetv1.GuestIngress) {
		g.Expect(gi.Spec.LoadBalancer.IP).To(Equal("10.2.6.220"))
	})
	e.g.Expect(gi.Spec).To(Equal(guestnetv1.GuestIngressSpec{
		ClusterName:  "tenant-a",
		GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
		Ports: []guestnetv1.IngressPort{
			{Name: "http", Port: 80, NodePort: ptr.To[int32](30080), Protocol: corev1.ProtocolTCP},
			{Name: "https", Port: 443, NodePort: ptr.To[int32](30443), Protocol: corev1.ProtocolTCP},
		},
		LoadBalancer: guestnetv1.LoadBalancerSpec{
			IP: "10.2.6.220", L2: &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^eth0$"}},
			Class: guestnetv1.DefaultLoadBalancerClass, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
		},
		DeclarePorts: ptr.To(true),
	}))
	e.expectMadeFromTheVariable(cluster, gi)
	gwb := e.eventuallyBridge(cluster, func(Gomega, *guestnetv1.GuestWebhookBridge) {})
	e.g.Expect(gwb.Spec).To(Equal(guestnetv1.GuestWebhookBridgeSpec{
		ClusterName:        "tenant-a",
		APIServices:        &guestnetv1.TargetSelector{Names: []string{"v1beta1.metrics.k8s.io"}},
		ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{"cert-manager-webhook"}},
		NodePortRange:      guestnetv1.NodePortRange{Start: 30064, Size: 16},
		Mode:               guestnetv1.BridgeModeAuto,
	}))
	e.expectMadeFromTheVariable(cluster, gwb)
	e.eventuallyEvent(cluster, corev1.EventTypeNormal, topology.ReasonCreated, "Created GuestIngress tenant-a from the topology variable guestnet.ingress")
	e.eventuallyEvent(cluster, corev1.EventTypeNormal, topology.ReasonCreated, "Created GuestWebhookBridge tenant-a from the topology variable guestnet.webhookBridge")

	// Change both parts; l2 goes away, a port and a target kind come.
	e.setVariable(cluster, value(map[string]string{"ingress": `
guestService: {namespace: projectcontour, name: envoy}
ports:
- {name: http, port: 80, nodePort: 30080}
- {name: https, port: 443, nodePort: 30443}
- {name: dns, port: 53, nodePort: 30053, protocol: UDP}
loadBalancer: {ip: 10.2.6.221}`, "webhookBridge": bridgeValue + `
mutatingWebhooks: {all: true}
nodePortRange: {start: 31000, size: 8}
mode: Always`}))
	updated := e.eventuallyGuestIngress(cluster, func(g Gomega, gi *guestnetv1.GuestIngress) {
		g.Expect(gi.Spec.LoadBalancer.IP).To(Equal("10.2.6.221"))
	})
	e.g.Expect(updated.UID).To(Equal(gi.UID), "updated in place")
	e.g.Expect(updated.Spec.LoadBalancer.L2).To(BeNil(), "a field removed from the variable is removed from the object")
	e.g.Expect(updated.Spec.Ports).To(ContainElement(guestnetv1.IngressPort{Name: "dns", Port: 53, NodePort: ptr.To[int32](30053), Protocol: corev1.ProtocolUDP}))
	e.eventuallyBridge(cluster, func(g Gomega, gwb *guestnetv1.GuestWebhookBridge) {
		g.Expect(gwb.Spec.MutatingWebhooks).To(Equal(&guestnetv1.TargetSelector{All: true}))
		g.Expect(gwb.Spec.NodePortRange).To(Equal(guestnetv1.NodePortRange{Start: 31000, Size: 8}))
		g.Expect(gwb.Spec.Mode).To(Equal(guestnetv1.BridgeModeAlways))
	})
	e.eventuallyEvent(cluster, corev1.EventTypeNormal, topology.ReasonUpdated, "Updated GuestIngress tenant-a from the topology variable guestnet.ingress")

	// The variable is the source: an edit of the object is undone.
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		gi := &guestnetv1.GuestIngress{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "tenant-a"}, gi); err != nil {
			return err
		}
		gi.Spec.LoadBalancer.IP = "10.9.9.9"
		return e.c.Update(e.ctx, gi)
	})).To(Succeed())
	e.eventuallyGuestIngress(cluster, func(g Gomega, gi *guestnetv1.GuestIngress) {
		g.Expect(gi.Spec.LoadBalancer.IP).To(Equal("10.2.6.221"))
	})

	// Remove the ingress part: only the GuestIngress goes.
	e.setVariable(cluster, value(map[string]string{"webhookBridge": bridgeValue}))
	e.eventuallyGone(&guestnetv1.GuestIngress{}, "tenant-a")
	e.eventuallyEvent(cluster, corev1.EventTypeNormal, topology.ReasonDeleted, "Deleted GuestIngress tenant-a: the topology variable guestnet has no ingress any more")
	remaining := e.eventuallyBridge(cluster, func(g Gomega, gwb *guestnetv1.GuestWebhookBridge) {
		g.Expect(gwb.Spec.MutatingWebhooks).To(BeNil())
	})
	e.g.Expect(remaining.UID).To(Equal(gwb.UID))

	// Remove the variable: the GuestWebhookBridge goes too.
	e.setVariable(cluster, nil)
	e.eventuallyGone(&guestnetv1.GuestWebhookBridge{}, "tenant-a")
	e.eventuallyEvent(cluster, corev1.EventTypeNormal, topology.ReasonDeleted, "Deleted GuestWebhookBridge tenant-a: the topology variable guestnet has no webhookBridge any more")
}

// guestnet.nodeIdentity makes the Cluster's GuestNodeIdentity as ingress makes its
// GuestIngress: an empty object is the opt-in (the CRD defaults nodeAddresses to Managed), a
// change updates it in place (controlPlane, the control plane address, included), a value the
// CRD refuses changes nothing (another controlPlane.ip: it is immutable), removing the field
// deletes it; one the variable did not make is never touched.
func TestTopologyVariableNodeIdentity(t *testing.T) {
	e := newEnv(t, setupTopologyVariables)
	cluster := e.createCluster("tenant-a", value(map[string]string{"nodeIdentity": `{}`}))
	gni := e.eventuallyNodeIdentity(cluster, func(Gomega, *guestnetv1.GuestNodeIdentity) {})
	e.g.Expect(gni.Spec).To(Equal(guestnetv1.GuestNodeIdentitySpec{ClusterName: "tenant-a", NodeAddresses: guestnetv1.NodeAddressesManaged}))
	e.expectMadeFromTheVariable(cluster, gni)
	e.eventuallyEvent(cluster, corev1.EventTypeNormal, topology.ReasonCreated, "Created GuestNodeIdentity tenant-a from the topology variable guestnet.nodeIdentity")
	e.expectAbsent(&guestnetv1.GuestIngress{}, "tenant-a")

	e.setVariable(cluster, value(map[string]string{"nodeIdentity": `{nodeAddresses: External}`}))
	updated := e.eventuallyNodeIdentity(cluster, func(g Gomega, gni *guestnetv1.GuestNodeIdentity) {
		g.Expect(gni.Spec.NodeAddresses).To(Equal(guestnetv1.NodeAddressesExternal))
	})
	e.g.Expect(updated.UID).To(Equal(gni.UID), "updated in place")
	e.eventuallyEvent(cluster, corev1.EventTypeNormal, topology.ReasonUpdated, "Updated GuestNodeIdentity tenant-a from the topology variable guestnet.nodeIdentity")

	// The control plane address goes through as the rest of the spec; its ip cannot change,
	// the field as a whole can go.
	e.setVariable(cluster, value(map[string]string{"nodeIdentity": `{nodeAddresses: External, controlPlane: {ip: 10.2.6.221, l2: {interfaces: ["^eth0$"]}}}`}))
	withAddress := e.eventuallyNodeIdentity(cluster, func(g Gomega, gni *guestnetv1.GuestNodeIdentity) {
		g.Expect(gni.Spec.ControlPlane).NotTo(BeNil())
	})
	e.g.Expect(withAddress.UID).To(Equal(gni.UID), "updated in place")
	e.g.Expect(withAddress.Spec).To(Equal(guestnetv1.GuestNodeIdentitySpec{
		ClusterName: "tenant-a", NodeAddresses: guestnetv1.NodeAddressesExternal,
		ControlPlane: &guestnetv1.ControlPlaneAddressSpec{IP: "10.2.6.221", L2: &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^eth0$"}}},
	}))
	e.setVariable(cluster, value(map[string]string{"nodeIdentity": `{nodeAddresses: External, controlPlane: {ip: 10.2.6.222}}`}))
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonVariableInvalid,
		"guestnet.nodeIdentity is not a valid GuestNodeIdentity spec: ", "controlPlane.ip is immutable", "GuestNodeIdentity tenant-a keeps its current spec")
	e.expectUnchanged(withAddress, &guestnetv1.GuestNodeIdentity{})
	e.setVariable(cluster, value(map[string]string{"nodeIdentity": `{nodeAddresses: External}`}))
	updated = e.eventuallyNodeIdentity(cluster, func(g Gomega, gni *guestnetv1.GuestNodeIdentity) {
		g.Expect(gni.Spec.ControlPlane).To(BeNil())
	})

	e.setVariable(cluster, value(map[string]string{"nodeIdentity": `{nodeAddresses: Sometimes}`}))
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonVariableInvalid,
		"guestnet.nodeIdentity is not a valid GuestNodeIdentity spec: ", "spec.nodeAddresses", "GuestNodeIdentity tenant-a keeps its current spec")
	e.expectUnchanged(updated, &guestnetv1.GuestNodeIdentity{})

	e.setVariable(cluster, value(map[string]string{"workerPorts": `[{port: 8472, protocol: UDP}]`}))
	e.eventuallyGone(&guestnetv1.GuestNodeIdentity{}, "tenant-a")
	e.eventuallyEvent(cluster, corev1.EventTypeNormal, topology.ReasonDeleted, "Deleted GuestNodeIdentity tenant-a: the topology variable guestnet has no nodeIdentity any more")

	// Someone else's GuestNodeIdentity of the Cluster: left alone, with or without the field.
	users := &guestnetv1.GuestNodeIdentity{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "tenant-a"},
		Spec:       guestnetv1.GuestNodeIdentitySpec{ClusterName: "tenant-a"},
	}
	e.g.Expect(e.c.Create(e.ctx, users)).To(Succeed())
	e.setVariable(cluster, value(map[string]string{"nodeIdentity": `{nodeAddresses: External}`}))
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonConflict,
		"GuestNodeIdentity "+e.ns+"/tenant-a exists and was not made from the topology variable")
	e.expectUnchanged(users, &guestnetv1.GuestNodeIdentity{})
	e.setVariable(cluster, nil)
	e.expectUnchanged(users, &guestnetv1.GuestNodeIdentity{})
}

// A GuestIngress or GuestWebhookBridge named like the Cluster that the variable did not make
// (no label, or not owned by the Cluster) is never changed nor deleted; the Cluster gets a
// Warning event. Once the user deletes theirs, the variable's is created.
func TestTopologyObjectsNotMadeFromTheVariableAreNeverTouched(t *testing.T) {
	e := newEnv(t, setupTopologyVariables)
	users := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "tenant-a"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  "tenant-a",
			GuestService: guestnetv1.ObjectReference{Namespace: "ingress-nginx", Name: "controller"},
			LoadBalancer: guestnetv1.LoadBalancerSpec{PoolRef: &guestnetv1.PoolReference{Name: "shared"}},
		},
	}
	e.g.Expect(e.c.Create(e.ctx, users)).To(Succeed())
	// A bridge that carries the label, copied from one of guestnet's, but no owner reference.
	copied := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "tenant-a", Labels: map[string]string{topology.ManagedLabel: topology.ManagedValue}},
		Spec:       guestnetv1.GuestWebhookBridgeSpec{ClusterName: "tenant-a", APIServices: &guestnetv1.TargetSelector{All: true}},
	}
	e.g.Expect(e.c.Create(e.ctx, copied)).To(Succeed())

	cluster := e.createCluster("tenant-a", value(map[string]string{"ingress": ingressValue, "webhookBridge": bridgeValue}))
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonConflict,
		"GuestIngress "+e.ns+"/tenant-a exists and was not made from the topology variable")
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonConflict,
		"GuestWebhookBridge "+e.ns+"/tenant-a exists and was not made from the topology variable")
	e.expectUnchanged(users, &guestnetv1.GuestIngress{})
	e.expectUnchanged(copied, &guestnetv1.GuestWebhookBridge{})

	// Without the variable they are not deleted either.
	e.setVariable(cluster, nil)
	e.expectUnchanged(users, &guestnetv1.GuestIngress{})
	e.expectUnchanged(copied, &guestnetv1.GuestWebhookBridge{})

	// The user deletes theirs: the variable's takes the name.
	e.setVariable(cluster, value(map[string]string{"ingress": ingressValue}))
	e.g.Expect(e.c.Delete(e.ctx, users)).To(Succeed())
	gi := e.eventuallyGuestIngress(cluster, func(g Gomega, gi *guestnetv1.GuestIngress) {
		g.Expect(gi.UID).NotTo(Equal(users.UID))
	})
	e.expectMadeFromTheVariable(cluster, gi)
}

// A value the apiserver refuses (a CRD rule, a field the CRD does not have) changes nothing: no
// object is created from it, an existing object keeps its spec, and the Cluster gets a
// Warning event with the apiserver's message; the valid part of the value is applied. A
// value that is not even an object deletes nothing. (With CAPI's webhooks running, CAPI
// refuses such values already: the ClusterClass schema has the CRDs' rules.)
func TestTopologyInvalidValueChangesNothing(t *testing.T) {
	e := newEnv(t, setupTopologyVariables)
	cluster := e.createCluster("tenant-a", value(map[string]string{
		"ingress":       "guestService: {namespace: projectcontour, name: envoy}\nloadBalancer: {class: x}",
		"webhookBridge": bridgeValue,
	}))
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonVariableInvalid,
		"guestnet.ingress is not a valid GuestIngress spec: ", "loadBalancer needs ip, ips, cidrs or poolRef", "no GuestIngress is created until it is fixed")
	e.eventuallyBridge(cluster, func(Gomega, *guestnetv1.GuestWebhookBridge) {})
	e.expectAbsent(&guestnetv1.GuestIngress{}, "tenant-a")

	e.setVariable(cluster, value(map[string]string{"ingress": ingressValue, "webhookBridge": bridgeValue}))
	gi := e.eventuallyGuestIngress(cluster, func(Gomega, *guestnetv1.GuestIngress) {})

	// A bad IP, then a field the CRD does not have: the GuestIngress keeps its spec.
	e.setVariable(cluster, value(map[string]string{
		"ingress":       "guestService: {namespace: projectcontour, name: envoy}\nloadBalancer: {ip: 10.2.6.300}",
		"webhookBridge": bridgeValue,
	}))
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonVariableInvalid,
		"guestnet.ingress is not a valid GuestIngress spec: ", "spec.loadBalancer.ip", "ip must be an IPv4 or IPv6 address", "GuestIngress tenant-a keeps its current spec")
	e.expectUnchanged(gi, &guestnetv1.GuestIngress{})
	e.setVariable(cluster, value(map[string]string{"ingress": ingressValue + "\nfoo: bar", "webhookBridge": bridgeValue}))
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonVariableInvalid,
		"guestnet.ingress is not a valid GuestIngress spec: ", ".spec.foo: field not declared in schema", "GuestIngress tenant-a keeps its current spec")
	e.expectUnchanged(gi, &guestnetv1.GuestIngress{})

	// Not an object at all: nothing is deleted.
	e.setRawVariable(cluster, `"guestnet"`)
	e.eventuallyEvent(cluster, corev1.EventTypeWarning, topology.ReasonVariableInvalid,
		"the value of topology variable guestnet is not an object")
	e.expectUnchanged(gi, &guestnetv1.GuestIngress{})
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "tenant-a"}, &guestnetv1.GuestWebhookBridge{})).To(Succeed())
}

// While the Cluster is paused (CAPI pause) the variable is not acted on; unpausing applies it.
func TestTopologyPausedClusterIsLeftAlone(t *testing.T) {
	e := newEnv(t, setupTopologyVariables)
	cluster := e.createCluster("tenant-a", value(map[string]string{"ingress": ingressValue}), func(c *clusterv1.Cluster) {
		c.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	})
	e.g.Consistently(func() bool {
		return apierrors.IsNotFound(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "tenant-a"}, &guestnetv1.GuestIngress{}))
	}).WithTimeout(quiet).WithPolling(interval).Should(BeTrue())

	e.updateCluster(cluster, func(c *clusterv1.Cluster) { delete(c.Annotations, clusterv1.PausedAnnotation) })
	e.eventuallyGuestIngress(cluster, func(Gomega, *guestnetv1.GuestIngress) {})
}

// The controller runs only with the ClusterTopologyVariables feature gate: the manager binary
// does not register it when the gate is off, and does with --feature-gates
// ClusterTopologyVariables=true.
func TestTopologyFeatureGate(t *testing.T) {
	g := NewWithT(t)
	g.Expect(feature.Gates.Enabled(feature.ClusterTopologyVariables)).To(BeFalse(), "alpha: off by default")
	for _, enabled := range []bool{false, true} {
		e := newEnv(t, nil)
		flags := lab.ManagerFlags{Namespace: e.ns}
		if enabled {
			flags.FeatureGates = string(feature.ClusterTopologyVariables) + "=true"
		}
		shared.Get(t).StartManagerBinary(t, flags)
		cluster := e.createCluster("tenant-a", value(map[string]string{"ingress": ingressValue, "webhookBridge": bridgeValue}))
		if !enabled {
			e.g.Consistently(func() bool {
				return apierrors.IsNotFound(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "tenant-a"}, &guestnetv1.GuestIngress{})) &&
					apierrors.IsNotFound(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "tenant-a"}, &guestnetv1.GuestWebhookBridge{}))
			}).WithTimeout(quiet).WithPolling(interval).Should(BeTrue(), "gate off: nothing is made from the variable")
			continue
		}
		e.expectMadeFromTheVariable(cluster, e.eventuallyGuestIngress(cluster, func(Gomega, *guestnetv1.GuestIngress) {}))
		e.expectMadeFromTheVariable(cluster, e.eventuallyBridge(cluster, func(Gomega, *guestnetv1.GuestWebhookBridge) {}))
	}
}

// --- the environment of one test ---------------------------------------------------------------

type env struct {
	t   *testing.T
	g   *WithT
	ctx context.Context
	c   client.Client // the host, uncached
	ns  string
}

// newEnv creates a namespace of the test's own and starts a manager for it with setup (none
// when setup is nil).
func newEnv(t *testing.T, setup lab.SetupFunc) *env {
	l := shared.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	e := &env{t: t, g: NewWithT(t), ctx: ctx, c: l.Host.Client, ns: "topology-" + utilrand.String(6)}
	e.g.Expect(e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}})).To(Succeed())
	if setup != nil {
		lab.StartManager(t, l, manager.Options{WatchNamespace: e.ns}, setup)
	}
	return e
}

// value builds the guestnet variable's value from YAML fields.
func value(fields map[string]string) map[string]any {
	v := map[string]any{}
	for name, s := range fields {
		var f any
		if err := yaml.Unmarshal([]byte(strings.TrimSpace(s)), &f); err != nil {
			panic(err)
		}
		v[name] = f
	}
	return v
}

func rawValue(t *testing.T, v map[string]any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// createCluster creates a Cluster of class kubevirt-guestnet with the guestnet variable set to
// v (none when nil), as a user (or GitOps) writes it.
func (e *env) createCluster(name string, v map[string]any, mutate ...func(*clusterv1.Cluster)) *clusterv1.Cluster {
	e.t.Helper()
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: clusterv1.ClusterSpec{Topology: clusterv1.Topology{
			ClassRef: clusterv1.ClusterClassRef{Name: "kubevirt-guestnet"},
			Version:  "v1.33.1",
			Workers: clusterv1.WorkersTopology{MachineDeployments: []clusterv1.MachineDeploymentTopology{
				{Class: "default-worker", Name: "md-0", Replicas: ptr.To[int32](2)},
			}},
		}},
	}
	if v != nil {
		cluster.Spec.Topology.Variables = []clusterv1.ClusterVariable{{Name: topology.VariableName, Value: apiextensionsv1.JSON{Raw: rawValue(e.t, v)}}}
	}
	for _, m := range mutate {
		m(cluster)
	}
	e.g.Expect(e.c.Create(e.ctx, cluster)).To(Succeed())
	return cluster
}

func (e *env) updateCluster(cluster *clusterv1.Cluster, mutate func(*clusterv1.Cluster)) {
	e.t.Helper()
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := &clusterv1.Cluster{}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), c); err != nil {
			return err
		}
		mutate(c)
		return e.c.Update(e.ctx, c)
	})).To(Succeed())
}

// setVariable sets the guestnet variable to v, or removes it when v is nil.
func (e *env) setVariable(cluster *clusterv1.Cluster, v map[string]any) {
	e.t.Helper()
	if v == nil {
		e.updateCluster(cluster, func(c *clusterv1.Cluster) { c.Spec.Topology.Variables = nil })
		return
	}
	e.setRawVariable(cluster, string(rawValue(e.t, v)))
}

func (e *env) setRawVariable(cluster *clusterv1.Cluster, raw string) {
	e.t.Helper()
	e.updateCluster(cluster, func(c *clusterv1.Cluster) {
		c.Spec.Topology.Variables = []clusterv1.ClusterVariable{{Name: topology.VariableName, Value: apiextensionsv1.JSON{Raw: []byte(raw)}}}
	})
}

func (e *env) eventuallyGuestIngress(cluster *clusterv1.Cluster, check func(Gomega, *guestnetv1.GuestIngress)) *guestnetv1.GuestIngress {
	e.t.Helper()
	gi := &guestnetv1.GuestIngress{}
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: cluster.Name}, gi)).To(Succeed())
		check(g, gi)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	return gi
}

func (e *env) eventuallyBridge(cluster *clusterv1.Cluster, check func(Gomega, *guestnetv1.GuestWebhookBridge)) *guestnetv1.GuestWebhookBridge {
	e.t.Helper()
	gwb := &guestnetv1.GuestWebhookBridge{}
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: cluster.Name}, gwb)).To(Succeed())
		check(g, gwb)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	return gwb
}

func (e *env) eventuallyNodeIdentity(cluster *clusterv1.Cluster, check func(Gomega, *guestnetv1.GuestNodeIdentity)) *guestnetv1.GuestNodeIdentity {
	e.t.Helper()
	gni := &guestnetv1.GuestNodeIdentity{}
	e.g.Eventually(func(g Gomega) {
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: cluster.Name}, gni)).To(Succeed())
		check(g, gni)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	return gni
}

// expectMadeFromTheVariable checks the marks of the controller's objects: the label, CAPI's
// cluster-name label, the Cluster as controller owner, and the guestnet-topology field
// manager's server-side apply entry.
func (e *env) expectMadeFromTheVariable(cluster *clusterv1.Cluster, obj client.Object) {
	e.t.Helper()
	live := &clusterv1.Cluster{}
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), live)).To(Succeed())
	e.g.Expect(obj.GetLabels()).To(HaveKeyWithValue(topology.ManagedLabel, topology.ManagedValue))
	e.g.Expect(obj.GetLabels()).To(HaveKeyWithValue(clusterv1.ClusterNameLabel, cluster.Name))
	e.g.Expect(obj.GetOwnerReferences()).To(ConsistOf(metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: live.UID, Controller: ptr.To(true),
	}))
	var managers []string
	for _, m := range obj.GetManagedFields() {
		if m.Operation == metav1.ManagedFieldsOperationApply {
			managers = append(managers, m.Manager)
		}
	}
	e.g.Expect(managers).To(ContainElement(topology.FieldManager))
}

// expectUnchanged checks, for a while, that obj is not written (same resourceVersion).
func (e *env) expectUnchanged(obj, empty client.Object) {
	e.t.Helper()
	e.g.Consistently(func(g Gomega) {
		g.Expect(e.c.Get(e.ctx, client.ObjectKeyFromObject(obj), empty)).To(Succeed())
		g.Expect(empty.GetUID()).To(Equal(obj.GetUID()))
		g.Expect(empty.GetResourceVersion()).To(Equal(obj.GetResourceVersion()))
	}).WithTimeout(quiet).WithPolling(interval).Should(Succeed())
}

func (e *env) expectAbsent(empty client.Object, name string) {
	e.t.Helper()
	err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, empty)
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%T %s exists (%v)", empty, name, err)
}

func (e *env) eventuallyGone(empty client.Object, name string) {
	e.t.Helper()
	e.g.Eventually(func() bool {
		return apierrors.IsNotFound(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, empty))
	}).WithTimeout(timeout).WithPolling(interval).Should(BeTrue(), "%T %s still exists", empty, name)
}

// eventuallyEvent waits for an events.k8s.io/v1 Event about the Cluster of that type and
// reason whose note starts with notePrefix and contains each of contains.
func (e *env) eventuallyEvent(cluster *clusterv1.Cluster, eventType, reason, notePrefix string, contains ...string) {
	e.t.Helper()
	live := &clusterv1.Cluster{}
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), live)).To(Succeed())
	matches := func(ev eventsv1.Event) bool {
		if ev.Type != eventType || ev.Reason != reason || !strings.HasPrefix(ev.Note, notePrefix) {
			return false
		}
		for _, c := range contains {
			if !strings.Contains(ev.Note, c) {
				return false
			}
		}
		return true
	}
	e.g.Eventually(func(g Gomega) {
		list := &eventsv1.EventList{}
		g.Expect(e.c.List(e.ctx, list, client.InNamespace(e.ns))).To(Succeed())
		var seen []string
		for _, ev := range list.Items {
			if ev.Regarding.UID != live.UID || ev.Regarding.Kind != "Cluster" {
				continue
			}
			if matches(ev) {
				e.t.Logf("event on Cluster %s: %s %s: %s", cluster.Name, ev.Type, ev.Reason, ev.Note)
				return
			}
			seen = append(seen, ev.Type+" "+ev.Reason+": "+ev.Note)
		}
		g.Expect(false).To(BeTrue(), "no event %s %s %q containing %q on the Cluster; its events:\n%s",
			eventType, reason, notePrefix, contains, strings.Join(seen, "\n"))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// setupTopologyVariables registers the topology variables controller on mgr, as main.go does.
func setupTopologyVariables(ctx context.Context, mgr ctrl.Manager, _ clustercache.ClusterCache, o manager.Options) error {
	return (&topology.Reconciler{
		Client:           mgr.GetClient(),
		WatchFilterValue: o.WatchFilterValue,
	}).SetupWithManager(ctx, mgr, manager.Concurrency(o.TopologyVariablesConcurrency))
}
