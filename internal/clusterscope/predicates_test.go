package clusterscope

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

func TestClusterChanged(t *testing.T) {
	tests := []struct {
		name     string
		old, new *clusterv1.Cluster
		want     bool
	}{
		{name: "status churn", old: newCluster(), new: newCluster(func(c *clusterv1.Cluster) { c.Status.Phase = "Provisioned" }), want: false},
		{name: "spec.paused set", old: newCluster(), new: newCluster(func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) }), want: true},
		{name: "spec.paused cleared", old: newCluster(func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) }), new: newCluster(), want: true},
		{name: "paused annotation added", old: newCluster(), new: newCluster(func(c *clusterv1.Cluster) { pausedAnnotation(c) }), want: true},
		{
			name: "annotation removed while spec.paused stays",
			old: newCluster(func(c *clusterv1.Cluster) {
				c.Spec.Paused = ptr.To(true)
				pausedAnnotation(c)
			}),
			new:  newCluster(func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) }),
			want: true,
		},
		{name: "infrastructure provisioned", old: newCluster(), new: newCluster(provisioned), want: true},
		{name: "deletion started (the guest is gone for good)", old: newCluster(), new: newCluster(func(c *clusterv1.Cluster) {
			c.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}), want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(ClusterChanged().Update(event.UpdateEvent{ObjectOld: tt.old, ObjectNew: tt.new})).To(Equal(tt.want))
		})
	}

	g := NewWithT(t)
	g.Expect(ClusterChanged().Create(event.CreateEvent{Object: newCluster()})).To(BeTrue())
	g.Expect(ClusterChanged().Delete(event.DeleteEvent{Object: newCluster()})).To(BeTrue())
	g.Expect(ClusterChanged().Generic(event.GenericEvent{Object: newCluster()})).To(BeFalse())
}
