package ports

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// decide: what guestnet does about one MachineDeployment, from what was read.
func TestDecide(t *testing.T) {
	required := Base(true)
	lacking := func(name string, mutate ...func(*Workers)) Workers {
		w := workers("md-0", PortsMissing, nil, mutate...)
		w.Template = template(name, masquerade(port(22, "")))
		a, err := Analyze(w.Template, required)
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
		w.Analysis = a
		return w
	}
	complete := func(mutate ...func(*Workers)) Workers {
		w := workers("md-0", PortsDeclared, nil, mutate...)
		w.Template = template("user", masquerade(port(22, ""), port(10250, "")))
		return w
	}
	rolling := func(w *Workers) { w.MachineDeployment.Generation = 2 }
	generatedByGuestnet := func(w *Workers) {
		w.Template.SetLabels(map[string]string{guestnetv1.GeneratedTemplateLabel: "c"})
	}
	pointingAt := func(name string) func(*Workers) {
		return func(w *Workers) { w.MachineDeployment.Spec.Template.Spec.InfrastructureRef.Name = name }
	}
	annotated := func(key, value string) func(*Workers) {
		return func(w *Workers) {
			if w.MachineDeployment.Annotations == nil {
				w.MachineDeployment.Annotations = map[string]string{}
			}
			w.MachineDeployment.Annotations[key] = value
		}
	}
	apply := func(w Workers, mutate ...func(*Workers)) Workers {
		for _, m := range mutate {
			m(&w)
		}
		return w
	}

	tests := []struct {
		name     string
		workers  Workers
		revision string
		want     Action
	}{
		{name: "ports missing: repoint", workers: lacking("user"), want: Repoint},
		{name: "complete: nothing", workers: complete(), want: NoAction},
		{name: "someone else's rollout to a template lacking ports: redirect it at once", workers: apply(lacking("user"), rolling), want: Repoint},
		{name: "guestnet's own rollout still running: wait", workers: apply(lacking("user-c-0123456789"), rolling, generatedByGuestnet), want: WaitForRollout},
		{name: "set back to the template guestnet replaced: stop", workers: apply(lacking("user"), pointingAt("user"), annotated(guestnetv1.RepointedFromAnnotation, "user")), want: Reverted},
		{name: "set back, even mid-rollout: stop", workers: apply(lacking("user"), rolling, pointingAt("user"), annotated(guestnetv1.RepointedFromAnnotation, "user")), want: Reverted},
		{name: "pointed at another template than guestnet replaced: follow", workers: apply(lacking("other"), pointingAt("other"), annotated(guestnetv1.RepointedFromAnnotation, "user")), want: Repoint},
		{name: "set back to a template that declares everything: nothing", workers: apply(complete(), pointingAt("user"), annotated(guestnetv1.RepointedFromAnnotation, "user")), want: NoAction},
		{name: "new template revision: repoint", workers: complete(), revision: "2", want: Repoint},
		{name: "revision already rolled out on this MachineDeployment: nothing", workers: apply(complete(), annotated(guestnetv1.TemplateRevisionAnnotation, "2")), revision: "2", want: NoAction},
		{name: "topology-owned: never", workers: apply(lacking("user"), func(w *Workers) {
			w.MachineDeployment.Labels = map[string]string{clusterv1.ClusterTopologyOwnedLabel: ""}
		}), want: NoAction},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			p, err := decide(&tt.workers, "c", tt.revision)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Action).To(Equal(tt.want))
			if tt.want == NoAction {
				g.Expect(p.Template).To(BeNil())
				return
			}
			g.Expect(p.Template.GetLabels()).To(HaveKeyWithValue(guestnetv1.GeneratedTemplateLabel, "c"))
			g.Expect(p.Revision).To(Equal(tt.revision))
		})
	}
}

func TestAppliedRevision(t *testing.T) {
	g := NewWithT(t)
	md := &clusterv1.MachineDeployment{}
	generated := template("t-1", masquerade())
	generated.SetAnnotations(map[string]string{guestnetv1.TemplateRevisionAnnotation: "1"})
	g.Expect(AppliedRevision(md, template("user", masquerade()))).To(BeEmpty(), "a user's template")
	g.Expect(AppliedRevision(md, generated)).To(Equal("1"), "a copy generated before guestnet recorded it on MachineDeployments")
	md.Annotations = map[string]string{guestnetv1.TemplateRevisionAnnotation: "2"}
	g.Expect(AppliedRevision(md, generated)).To(Equal("2"))
}

func TestPortsDeclaredConditionWhenGuestnetStops(t *testing.T) {
	own := NewSet(Requirement{Port: TCP(30080)})
	cluster := Base(true).Union(own)
	stopped := func(p Plan) Workers {
		w := workers("md-0", PortsMissing, []Port{TCP(22)})
		copyOf, err := Declare(w.Template, cluster, "c", "")
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
		p.Template = copyOf
		w.Plan = p
		return w
	}
	list := `set the ports of interface default (spec.template.spec.virtualMachineTemplate.spec.template.spec.domain.devices.interfaces) of KubevirtMachineTemplate md-0-tmpl to ` +
		`[{"port":22,"protocol":"TCP"},{"port":10250,"protocol":"TCP"},{"port":30080,"protocol":"TCP"}]`

	tests := []struct {
		name       string
		workers    Workers
		wantReason string
		wantInMsg  []string
	}{
		{name: "reverted", workers: stopped(Plan{Action: Reverted, RevertedBy: []string{"argocd-controller"}}), wantReason: guestnetv1.RepointRevertedReason,
			wantInMsg: []string{"MachineDeployment md-0 was set back to KubevirtMachineTemplate md-0-tmpl, which lacks 30080/TCP, by field manager argocd-controller", "declare the ports in the template's source: " + list}},
		{name: "reverted by someone unknown", workers: stopped(Plan{Action: Reverted}), wantReason: guestnetv1.RepointRevertedReason,
			wantInMsg: []string{"by another field manager"}},
		{name: "name taken", workers: stopped(Plan{Action: NameTaken, Conflict: "KubevirtMachineTemplate x already exists and guestnet did not generate it"}), wantReason: guestnetv1.TemplateNameTakenReason,
			wantInMsg: []string{"does not adopt the object that holds the name of its copy: KubevirtMachineTemplate x already exists", list}},
		{name: "waiting for guestnet's own rollout", workers: stopped(Plan{Action: WaitForRollout}), wantReason: guestnetv1.PortsMissingReason,
			wantInMsg: []string{"guestnet declares them in a new copy once CAPI has rolled the workers to this one (3 of 3 workers run it)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c := portsDeclaredCondition(own, []Workers{tt.workers})
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(tt.wantReason))
			for _, m := range tt.wantInMsg {
				g.Expect(c.Message).To(ContainSubstring(m))
			}
			again := portsDeclaredCondition(own, []Workers{tt.workers})
			g.Expect(again.Message).To(Equal(c.Message), "stable: an unchanged world writes nothing")
		})
	}
}

func TestInfrastructureRefOwners(t *testing.T) {
	g := NewWithT(t)
	entry := func(manager, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationApply, FieldsV1: metav1.NewFieldsV1(fields)}
	}
	ref := `{"f:spec":{"f:template":{"f:spec":{"f:infrastructureRef":{"f:apiGroup":{},"f:kind":{},"f:name":{}},"f:version":{}}},"f:replicas":{}}}`
	md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		entry("manager", `{"f:status":{"f:replicas":{}}}`),
		entry("kustomize-controller", ref),
		entry("guestnet", `{"f:metadata":{"f:annotations":{}},"f:spec":{"f:template":{"f:spec":{"f:infrastructureRef":{"f:name":{}}}}}}`),
		entry("argocd-controller", ref),
		entry("kubectl-edit", `{"f:spec":{"f:template":{"f:spec":{"f:infrastructureRef":{"f:kind":{}}}}}}`),
	}}}
	g.Expect(InfrastructureRefOwners(md)).To(Equal([]string{"argocd-controller", "kustomize-controller"}))

	// The cache keeps guestnet's entries whole, and of the others only who owns the name.
	out, err := KeepInfrastructureRefOwners(md.DeepCopy())
	g.Expect(err).NotTo(HaveOccurred())
	cached := out.(*clusterv1.MachineDeployment)
	var managers []string
	for _, e := range cached.ManagedFields {
		managers = append(managers, e.Manager)
		if e.Manager != "guestnet" {
			g.Expect(e.FieldsV1.GetRawString()).To(Equal(`{"f:spec":{"f:template":{"f:spec":{"f:infrastructureRef":{"f:name":{}}}}}}`))
		}
	}
	g.Expect(managers).To(Equal([]string{"kustomize-controller", "guestnet", "argocd-controller"}))
	g.Expect(cached.ManagedFields[1]).To(Equal(md.ManagedFields[2]))
	g.Expect(InfrastructureRefOwners(cached)).To(Equal(InfrastructureRefOwners(md)))
}
