package record

import (
	"context"
	"testing"

	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
)

// A write is logged at the default level with the object's kind and name and why, recorded
// as an event, and counted when it is a repair.
func TestWritten(t *testing.T) {
	g := NewWithT(t)
	var lines []string
	log := funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 0})
	ctx := ctrl.LoggerInto(context.Background(), log)
	recorder := events.NewFakeRecorder(10)
	gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "web"}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a-web"}}
	repairs := func() float64 {
		families, err := ctrlmetrics.Registry.Gather()
		g.Expect(err).NotTo(HaveOccurred())
		for _, f := range families {
			if f.GetName() != metrics.RepairsName {
				continue
			}
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == string(metrics.RepairHostService) {
					return m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}
	before := repairs()

	Written(ctx, recorder, gi, Write{Type: corev1.EventTypeNormal, Reason: "Applied", Action: "Apply", Object: svc,
		Note: "Applied host Service tenant-a-web", Repair: metrics.RepairHostService})
	Written(ctx, recorder, gi, Write{Type: corev1.EventTypeNormal, Reason: "Deleted", Action: "Delete", Note: "Deleted it"})

	g.Expect(lines).To(HaveLen(2))
	g.Expect(lines[0]).To(And(ContainSubstring(`"level"=0 "msg"="Applied host Service tenant-a-web"`), ContainSubstring(`"reason"="Applied"`),
		ContainSubstring(`"action"="Apply"`), ContainSubstring(`"Service"={"name"="tenant-a-web" "namespace"="k0smotron"}`),
		ContainSubstring(`"repair"="HostService"`)))
	g.Expect(lines[1]).To(And(ContainSubstring(`"msg"="Deleted it"`), Not(ContainSubstring("repair"))))
	g.Expect(<-recorder.Events + "\n" + <-recorder.Events).To(Equal(
		"Normal Applied Applied host Service tenant-a-web\nNormal Deleted Deleted it"))
	g.Expect(repairs()).To(Equal(before+1), "one repair, the other write is none")
	g.Expect(testutil.GatherAndCount(ctrlmetrics.Registry, metrics.RepairsName)).To(Equal(len(metrics.RepairKinds)))
}
