package nodeagent

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var params = Params{Image: "registry.example/guestnet:v1", APIServerHost: "10.2.6.220", APIServerPort: 6443}

// The agent's pod: host network, root with NET_ADMIN only, no privilege escalation, read-only
// root, every taint tolerated (the uninitialized one first of all), the control plane
// endpoint as its apiserver, its readiness on 127.0.0.1.
func TestAgentDaemonSet(t *testing.T) {
	g := NewWithT(t)
	_, _, role, _, ds := objects(params)
	g.Expect(role.Rules).To(HaveLen(1))
	g.Expect(role.Rules[0].Resources).To(Equal([]string{"nodes"}))
	g.Expect(role.Rules[0].Verbs).To(Equal([]string{"get", "list", "watch"}), "read-only, nothing else")

	spec := ds.Spec.Template.Spec
	g.Expect(*spec.HostNetwork).To(BeTrue())
	g.Expect(spec.Tolerations).To(HaveLen(1))
	g.Expect(*spec.Tolerations[0].Operator).To(Equal(corev1.TolerationOpExists))
	c := spec.Containers[0]
	g.Expect(*c.Image).To(Equal(params.Image))
	g.Expect(c.Args).To(Equal([]string{"node-agent", "--node-name=$(NODE_NAME)", "--health-port=9441"}))
	sc := c.SecurityContext
	g.Expect(*sc.AllowPrivilegeEscalation).To(BeFalse())
	g.Expect(*sc.ReadOnlyRootFilesystem).To(BeTrue())
	g.Expect(sc.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
	g.Expect(sc.Capabilities.Add).To(Equal([]corev1.Capability{"NET_ADMIN"}))
	g.Expect(sc.Privileged).To(BeNil())
	env := map[string]string{}
	for _, e := range c.Env {
		if e.Value != nil {
			env[*e.Name] = *e.Value
		}
	}
	g.Expect(env).To(HaveKeyWithValue("KUBERNETES_SERVICE_HOST", "10.2.6.220"))
	g.Expect(env).To(HaveKeyWithValue("KUBERNETES_SERVICE_PORT", "6443"))
	g.Expect(*c.ReadinessProbe.HTTPGet.Host).To(Equal("127.0.0.1"))

	removing := params
	removing.Remove = true
	g.Expect(Args(removing)).To(ContainElement("--remove"))
	g.Expect(TemplateHash(removing)).NotTo(Equal(TemplateHash(params)), "the opt-out is a rollout")
	g.Expect(TemplateHash(params)).To(Equal(TemplateHash(params)))
}

// No write at steady state: a live DaemonSet that carries the hash is not applied again (a
// nil client would panic if it were).
func TestApplyWritesOnlyWhenTheTemplateChanges(t *testing.T) {
	g := NewWithT(t)
	live := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: 3, Annotations: map[string]string{TemplateHashAnnotation: TemplateHash(params)}},
		Status: appsv1.DaemonSetStatus{ObservedGeneration: 3, DesiredNumberScheduled: 2, UpdatedNumberScheduled: 2, NumberReady: 2, NumberAvailable: 2}}
	st, applied, err := Apply(context.Background(), nil, live, params)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(applied).To(BeFalse())
	g.Expect(st).To(Equal(Status{Desired: 2, Updated: 2, Ready: 2, RolledOut: true}))
}

func TestDaemonSetStatus(t *testing.T) {
	g := NewWithT(t)
	ds := func(gen, observed int64, desired, updated, ready, unavailable int32) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: gen}, Status: appsv1.DaemonSetStatus{
			ObservedGeneration: observed, DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberReady: ready, NumberUnavailable: unavailable}}
	}
	g.Expect(DaemonSetStatus(ds(2, 2, 3, 3, 3, 0)).RolledOut).To(BeTrue())
	g.Expect(DaemonSetStatus(ds(2, 1, 3, 3, 3, 0)).RolledOut).To(BeFalse(), "the controller has not seen the new template")
	g.Expect(DaemonSetStatus(ds(2, 2, 3, 2, 3, 0)).RolledOut).To(BeFalse(), "an old pod left")
	g.Expect(DaemonSetStatus(ds(2, 2, 3, 3, 2, 1)).RolledOut).To(BeFalse(), "one not ready")
}
