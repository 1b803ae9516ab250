package guestnodeidentity

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeagent"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
)

func TestSetNodeAddressesCondition(t *testing.T) {
	for name, tc := range map[string]struct {
		rep        nodeReport
		status     metav1.ConditionStatus
		reason     string
		messageHas []string
	}{
		"all set": {rep: nodeReport{nodes: 3, withPodIP: 3}, status: metav1.ConditionTrue, reason: guestnetv1.NodeAddressesSetReason,
			messageHas: []string{"3 of 3 guest Nodes"}},
		"no nodes": {rep: nodeReport{}, status: metav1.ConditionFalse, reason: guestnetv1.NoNodesReason},
		"kubelet not external": {rep: nodeReport{nodes: 2, withPodIP: 1, byVerdict: map[nodeidentity.Verdict][]string{nodeidentity.KubeletOwned: {"w-1"}}},
			status: metav1.ConditionFalse, reason: guestnetv1.KubeletNotExternalReason,
			messageHas: []string{"w-1", "--enable-cloud-provider", "K0sWorkerConfigTemplate", "--cloud-provider=external"}},
		"no worker pod": {rep: nodeReport{nodes: 1, byVerdict: map[nodeidentity.Verdict][]string{nodeidentity.NoWorkerPod: {"w-2"}}},
			status: metav1.ConditionFalse, reason: guestnetv1.WorkerPodNotFoundReason, messageHas: []string{"w-2", "kubectl get pods -n ns"}},
		"other initializer is informational": {rep: nodeReport{nodes: 1, writers: []string{"ccm"}, byVerdict: map[nodeidentity.Verdict][]string{nodeidentity.OtherInitializer: {"w-3"}}},
			status: metav1.ConditionTrue, reason: guestnetv1.InitializedElsewhereReason, messageHas: []string{"w-3", "ccm", "nodeAddresses: External"}},
		"external": {rep: nodeReport{nodes: 2, withPodIP: 2, external: true}, status: metav1.ConditionTrue, reason: guestnetv1.NodeAddressesExternalReason},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			gni := &guestnetv1.GuestNodeIdentity{}
			if tc.rep.byVerdict == nil {
				tc.rep.byVerdict = map[nodeidentity.Verdict][]string{}
			}
			setNodeAddressesCondition(gni, tc.rep, "ns")
			c := conditions.Get(gni, guestnetv1.NodeAddressesCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(tc.status))
			g.Expect(c.Reason).To(Equal(tc.reason))
			for _, s := range tc.messageHas {
				g.Expect(c.Message).To(ContainSubstring(s))
			}
		})
	}
}

func TestSetNodeAgentCondition(t *testing.T) {
	g := NewWithT(t)
	gni := &guestnetv1.GuestNodeIdentity{}
	setNodeAgentCondition(gni, nodeagent.Status{Desired: 2, Updated: 2, Ready: 2, RolledOut: true}, false, false)
	g.Expect(conditions.IsTrue(gni, guestnetv1.NodeAgentCondition)).To(BeTrue())
	setNodeAgentCondition(gni, nodeagent.Status{Desired: 2, Updated: 2, Ready: 1}, false, false)
	c := conditions.Get(gni, guestnetv1.NodeAgentCondition)
	g.Expect(c.Reason).To(Equal(guestnetv1.NodeAgentRollingOutReason))
	g.Expect(c.Message).To(ContainSubstring("1 of 2 agents ready"))
	g.Expect(c.Message).To(ContainSubstring("kubectl -n guestnet-system logs ds/guestnet-node-agent"))
	setNodeAgentCondition(gni, nodeagent.Status{}, true, true)
	g.Expect(conditions.GetReason(gni, guestnetv1.NodeAgentCondition)).To(Equal(guestnetv1.NodeAgentRemovingReason))
}
