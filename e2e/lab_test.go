package e2e

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// The lab's masquerade stand-in behaves as KubeVirt's masquerade binding: with a ports list on
// the interface only declared ports reach the VM; without one every port does.
func TestLab_MasqueradeStandInForwardsOnlyDeclaredPorts(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)

	declaring, err := l.CreateGuestCluster(ctx, uniqueName("masq"), "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, 10250, 30080}})
	g.Expect(err).NotTo(HaveOccurred())
	w, err := l.AddWorker(ctx, declaring, "masq-a", "10.244.1.21")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.ServeMachineName(30080)).To(Succeed())
	g.Expect(w.ServeMachineName(30443)).To(Succeed())

	g.Expect(lab.Get(ctx, w.IP, 30080)).To(Equal(w.Machine), "a declared port reaches the VM")
	_, err = lab.Get(ctx, w.IP, 30443)
	g.Expect(err).To(HaveOccurred(), "an undeclared port never reaches the VM")

	forwardingAll, err := l.CreateGuestCluster(ctx, uniqueName("masq-all"), "guest-1", lab.WorkerTemplateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	w2, err := l.AddWorker(ctx, forwardingAll, "masq-b", "10.244.1.22")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w2.ServeMachineName(30443)).To(Succeed())
	g.Expect(lab.Get(ctx, w2.IP, 30443)).To(Equal(w2.Machine), "without a ports list every port reaches the VM")

	g.Expect(l.RemoveWorker(ctx, forwardingAll, w2)).To(Succeed())
	_, err = lab.Get(ctx, w2.IP, 30443)
	g.Expect(err).To(HaveOccurred(), "a removed worker answers nothing")
}
