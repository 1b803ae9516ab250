package nodeidentity

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const guestnet = "guestnet"

func node(name string, opts ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, o := range opts {
		o(n)
	}
	return n
}

func internalIP(ips ...string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		for _, ip := range ips {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
		}
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
	}
}

func tainted(n *corev1.Node) {
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: UninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule})
}

func wroteAddresses(managers ...string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		for _, m := range managers {
			n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{
				Manager: m, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status",
				FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:addresses":{".":{}},"f:conditions":{}}}`),
			})
		}
	}
}

func pod(ip string, opts ...func(*corev1.Pod)) corev1.Pod {
	p := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func TestDecide(t *testing.T) {
	deleting := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }
	pending := func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }
	for name, tc := range map[string]struct {
		node    *corev1.Node
		pods    []corev1.Pod
		verdict Verdict
		writers []string
	}{
		"external kubelet waits: write":           {node: node("a", tainted, internalIP(), wroteAddresses("kubelet")), pods: []corev1.Pod{pod("10.244.1.5")}, verdict: Write},
		"in sync":                                 {node: node("a", internalIP("10.244.1.5"), wroteAddresses("kubelet", guestnet)), pods: []corev1.Pod{pod("10.244.1.5")}, verdict: InSync},
		"pod IP changed after guestnet wrote":     {node: node("a", internalIP("10.244.1.5"), wroteAddresses("kubelet", guestnet)), pods: []corev1.Pod{pod("10.244.1.9")}, verdict: Write},
		"right address, still tainted: write":     {node: node("a", tainted, internalIP("10.244.1.5")), pods: []corev1.Pod{pod("10.244.1.5")}, verdict: Write},
		"kubelet owns 10.0.2.2":                   {node: node("a", internalIP("10.0.2.2"), wroteAddresses("kubelet")), pods: []corev1.Pod{pod("10.244.1.5")}, verdict: KubeletOwned},
		"kubelet --node-ip right already":         {node: node("a", internalIP("10.244.1.5"), wroteAddresses("kubelet")), pods: []corev1.Pod{pod("10.244.1.5")}, verdict: InSync},
		"another initializer":                     {node: node("a", internalIP("10.244.1.7"), wroteAddresses("kubelet", "kubevirt-cloud-controller-manager")), pods: []corev1.Pod{pod("10.244.1.5")}, verdict: OtherInitializer, writers: []string{"kubevirt-cloud-controller-manager"}},
		"another initializer, guestnet wrote too": {node: node("a", internalIP("10.244.1.7"), wroteAddresses("ccm", guestnet)), pods: []corev1.Pod{pod("10.244.1.5")}, verdict: Write, writers: []string{"ccm"}},
		"no pod":                            {node: node("a", tainted), verdict: NoWorkerPod},
		"no pod, guestnet wrote (VM down)":  {node: node("a", internalIP("10.244.1.5"), wroteAddresses(guestnet)), verdict: NoWorkerPod},
		"no pod, not waiting: not a worker": {node: node("cp-0", internalIP("192.0.2.10"), wroteAddresses("kubelet")), verdict: NotAWorker},
		"pod going or pending only":         {node: node("a", tainted), pods: []corev1.Pod{pod("10.244.1.5", deleting), pod("10.244.1.6", pending)}, verdict: NoWorkerPod},
		"migrating: two running pods":       {node: node("a", internalIP("10.244.1.5"), wroteAddresses(guestnet)), pods: []corev1.Pod{pod("10.244.1.5"), pod("10.244.1.6")}, verdict: Migrating},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			d := Decide(tc.node, tc.pods, guestnet)
			g.Expect(d.Verdict).To(Equal(tc.verdict))
			g.Expect(d.Writers).To(Equal(tc.writers))
		})
	}
}

func TestAddresses(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Addresses(node("a", internalIP("10.0.2.2")), []string{"10.244.1.5", "fd00::5"})).To(Equal([]corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.244.1.5"},
		{Type: corev1.NodeInternalIP, Address: "fd00::5"},
		{Type: corev1.NodeHostName, Address: "a"},
	}), "InternalIPs replaced, the kubelet's Hostname kept")
	g.Expect(Addresses(node("b"), []string{"10.244.1.5"})).To(Equal([]corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.244.1.5"},
		{Type: corev1.NodeHostName, Address: "b"},
	}), "no Hostname address: the Node's name")
}

func TestMachineName(t *testing.T) {
	g := NewWithT(t)
	g.Expect(MachineName(node("guest-md-0-abc"))).To(Equal("guest-md-0-abc"))
	n := node("whatever")
	n.Spec.ProviderID = "kubevirt://guest-md-0-xyz"
	g.Expect(MachineName(n)).To(Equal("guest-md-0-xyz"))
	n.Spec.ProviderID = "aws:///eu-west-1a/i-0"
	g.Expect(MachineName(n)).To(Equal("whatever"), "another provider's ID: the name")
}

func TestTrimNode(t *testing.T) {
	g := NewWithT(t)
	n := node("a", tainted, internalIP("10.244.1.5"), wroteAddresses("kubelet", guestnet))
	n.Labels = map[string]string{"big": "label"}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry/some:image"}, SizeBytes: 1 << 30}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{Manager: "kubectl", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{}}}`)})
	trimmed := TrimNode(n)
	g.Expect(trimmed.Labels).To(BeNil())
	g.Expect(trimmed.Status.Images).To(BeNil())
	g.Expect(trimmed.Status.Conditions).To(BeNil())
	g.Expect(trimmed.Status.Addresses).To(Equal(n.Status.Addresses))
	g.Expect(trimmed.Spec.Taints).To(Equal(n.Spec.Taints))
	g.Expect(AddressWriters(trimmed)).To(Equal([]string{"kubelet", guestnet}), "who wrote the addresses survives the trim")
	g.Expect(Decide(trimmed, []corev1.Pod{pod("10.244.1.5")}, guestnet)).To(Equal(Decide(n, []corev1.Pod{pod("10.244.1.5")}, guestnet)))
}
