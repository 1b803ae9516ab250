package ports

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func workers(name string, state TemplateState, declared []Port, mutate ...func(*Workers)) Workers {
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
		Spec:       clusterv1.MachineDeploymentSpec{Replicas: ptr.To[int32](3)},
		Status:     clusterv1.MachineDeploymentStatus{ObservedGeneration: 1, UpToDateReplicas: ptr.To[int32](3)},
	}
	w := Workers{MachineDeployment: md, Template: template(name+"-tmpl", masquerade()), Analysis: Analysis{State: state, Declared: declared}}
	for _, m := range mutate {
		m(&w)
	}
	return w
}

func TestPortsDeclaredCondition(t *testing.T) {
	own := NewSet(Requirement{Port: TCP(30080)}, Requirement{Port: TCP(30443)})
	cluster := Base(false).Union(own)
	declared := []Port{TCP(22), TCP(10250), TCP(30080), TCP(30443)}
	rolling := func(w *Workers) { w.MachineDeployment.Status.UpToDateReplicas = ptr.To[int32](1) }
	topology := func(w *Workers) {
		w.MachineDeployment.Labels = map[string]string{clusterv1.ClusterTopologyOwnedLabel: ""}
		w.Required = cluster
	}

	tests := []struct {
		name       string
		own        Set
		workers    []Workers
		wantStatus metav1.ConditionStatus
		wantReason string
		wantInMsg  []string
	}{
		{name: "nothing to declare", own: nil, wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.PortsNotRequestedReason},
		{name: "no workers", own: own, wantStatus: metav1.ConditionUnknown, wantReason: guestnetv1.NoWorkersReason},
		{name: "declared everywhere", own: own, workers: []Workers{workers("md-0", PortsDeclared, declared), workers("md-1", PortsDeclared, declared)},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.PortsDeclaredReason, wantInMsg: []string{"30080/TCP, 30443/TCP"}},
		{name: "missing on one template", own: own, workers: []Workers{workers("md-0", PortsDeclared, declared), workers("md-1", PortsMissing, declared[:3])},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.PortsMissingReason,
			wantInMsg: []string{"KubevirtMachineTemplate md-1-tmpl (MachineDeployment md-1) lacks 30443/TCP"}},
		{name: "declared, rollout in progress", own: own, workers: []Workers{workers("md-0", PortsDeclared, declared, rolling)},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.RollingOutReason, wantInMsg: []string{"1 of 3 workers run it"}},
		// Just after a repoint CAPI has observed the new generation but still counts the old
		// MachineSet's Machines as up to date, and RollingOut is not True yet (seen with the real
		// CAPI v1.14.2 in the demo): the old MachineSet's Machines say it is not over.
		{name: "declared, CAPI not yet counting the old Machines", own: own, workers: []Workers{workers("md-0", PortsDeclared, declared, func(w *Workers) { w.OldMachines = 2 })},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.RollingOutReason, wantInMsg: []string{"1 of 3 workers run it"}},
		{name: "topology-owned: give the variable value", own: own, workers: []Workers{workers("md-0", PortsMissing, []Port{TCP(22), UDP(8473)}, topology)},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.TopologyVariableRequiredReason,
			wantInMsg: []string{`set the Cluster topology variable guestnet to {"workerPorts":[{"port":22,"protocol":"TCP"},{"port":8473,"protocol":"UDP"},{"port":10250,"protocol":"TCP"},{"port":30080,"protocol":"TCP"},{"port":30443,"protocol":"TCP"}]}`}},
		{name: "all forwarded", own: own, workers: []Workers{workers("md-0", AllPortsForwarded, nil)},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.AllPortsForwardedReason},
		{name: "not masquerade", own: own, workers: []Workers{workers("md-0", NotMasquerade, nil)},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.NotMasqueradeReason},
		// CAPK creates the VMs in virtualMachineTemplate.metadata.namespace when set (found
		// reading the real CAPK v0.11.2 the lab runs): their pods are out of the host
		// Services' reach, though the ports are declared.
		{name: "VMs in another namespace", own: own, workers: []Workers{workers("md-0", PortsDeclared, declared), workers("md-1", PortsDeclared, declared, func(w *Workers) {
			g := NewWithT(t)
			g.Expect(unstructured.SetNestedField(w.Template.Object, "vms", "spec", "template", "spec", "virtualMachineTemplate", "metadata", "namespace")).To(Succeed())
		})}, wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.WorkersElsewhereReason,
			wantInMsg: []string{"CAPK creates the VMs of MachineDeployment md-1 in namespace vms (virtualMachineTemplate.metadata.namespace of KubevirtMachineTemplate md-1-tmpl), not in the Cluster's namespace tenant"}},
		{name: "VMs in another cluster", own: own, workers: []Workers{workers("md-0", PortsDeclared, declared, func(w *Workers) {
			g := NewWithT(t)
			g.Expect(unstructured.SetNestedField(w.Template.Object, "infra-kubeconfig", "spec", "template", "spec", "infraClusterSecretRef", "name")).To(Succeed())
		})}, wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.WorkersElsewhereReason,
			wantInMsg: []string{"in the infrastructure cluster of Secret infra-kubeconfig (infraClusterSecretRef"}},
		{name: "VMs in the Cluster's namespace, spelled out", own: own, workers: []Workers{workers("md-0", PortsDeclared, declared, func(w *Workers) {
			g := NewWithT(t)
			g.Expect(unstructured.SetNestedField(w.Template.Object, "tenant", "spec", "template", "spec", "virtualMachineTemplate", "metadata", "namespace")).To(Succeed())
		})}, wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.PortsDeclaredReason},
		{name: "template error wins", own: own, workers: []Workers{workers("md-0", PortsMissing, nil), workers("md-1", "", nil, func(w *Workers) {
			w.TemplateErr = errors.New("KubevirtMachineTemplate gone (MachineDeployment md-1) does not exist")
		})}, wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.WorkerTemplateErrorReason, wantInMsg: []string{"gone", "fix the MachineDeployment's infrastructureRef"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c := portsDeclaredCondition(tt.own, tt.workers)
			g.Expect(c.Type).To(Equal(guestnetv1.PortsDeclaredCondition))
			g.Expect(c.Status).To(Equal(tt.wantStatus))
			g.Expect(c.Reason).To(Equal(tt.wantReason))
			g.Expect(c.Message).NotTo(BeEmpty())
			for _, m := range tt.wantInMsg {
				g.Expect(c.Message).To(ContainSubstring(m))
			}
		})
	}
}
