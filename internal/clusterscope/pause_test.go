package clusterscope

import (
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/kubeconfig"
)

func newGuestIngress() *guestnetv1.GuestIngress {
	return &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "ingress", Generation: 3},
		Spec:       guestnetv1.GuestIngressSpec{ClusterName: "guest"},
	}
}

func newCluster(mutate ...func(*clusterv1.Cluster)) *clusterv1.Cluster {
	c := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "guest"}}
	for _, m := range mutate {
		m(c)
	}
	return c
}

func pausedAnnotation(o metav1.Object) {
	o.SetAnnotations(map[string]string{clusterv1.PausedAnnotation: ""})
}

func provisioned(c *clusterv1.Cluster) {
	c.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
}

func TestSetPausedCondition(t *testing.T) {
	tests := []struct {
		name        string
		objPaused   bool
		cluster     *clusterv1.Cluster
		wantPaused  bool
		wantMessage []string // substrings
	}{
		{name: "nothing paused", cluster: newCluster()},
		{name: "Cluster does not exist", cluster: nil},
		{
			name: "object annotation", objPaused: true, cluster: newCluster(), wantPaused: true,
			wantMessage: []string{"This object has the cluster.x-k8s.io/paused annotation"},
		},
		{
			name: "object annotation without Cluster", objPaused: true, cluster: nil, wantPaused: true,
			wantMessage: []string{"This object has the cluster.x-k8s.io/paused annotation"},
		},
		{
			name:        "Cluster spec.paused",
			cluster:     newCluster(func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) }),
			wantPaused:  true,
			wantMessage: []string{"Cluster guest has spec.paused set to true"},
		},
		{
			name:        "Cluster annotation",
			cluster:     newCluster(func(c *clusterv1.Cluster) { pausedAnnotation(c) }),
			wantPaused:  true,
			wantMessage: []string{"Cluster guest has the cluster.x-k8s.io/paused annotation"},
		},
		{
			name:      "everything at once",
			objPaused: true,
			cluster: newCluster(func(c *clusterv1.Cluster) {
				c.Spec.Paused = ptr.To(true)
				pausedAnnotation(c)
			}),
			wantPaused: true,
			wantMessage: []string{
				"This object has", "spec.paused set to true", "Cluster guest has the cluster.x-k8s.io/paused annotation",
				"guestnet makes no new changes until the pause is lifted",
			},
		},
		{
			name:       "spec.paused false",
			cluster:    newCluster(func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(false) }),
			wantPaused: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := newGuestIngress()
			if tt.objPaused {
				pausedAnnotation(obj)
			}

			g.Expect(SetPausedCondition(obj, tt.cluster)).To(Equal(tt.wantPaused))
			g.Expect(IsPaused(obj, tt.cluster)).To(Equal(tt.wantPaused))

			c := conditions.Get(obj, guestnetv1.PausedCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.ObservedGeneration).To(Equal(int64(3)))
			if tt.wantPaused {
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
				g.Expect(c.Reason).To(Equal(guestnetv1.PausedReason))
			} else {
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
				g.Expect(c.Reason).To(Equal(guestnetv1.NotPausedReason))
			}
			for _, m := range tt.wantMessage {
				g.Expect(c.Message).To(ContainSubstring(m))
			}
		})
	}
}

func TestSetPausedConditionTouchesNothingElse(t *testing.T) {
	g := NewWithT(t)
	obj := newGuestIngress()
	pausedAnnotation(obj)
	before := obj.DeepCopy()

	SetPausedCondition(obj, newCluster())

	g.Expect(obj.Status.Conditions).To(HaveLen(1))
	obj.Status.Conditions = nil
	g.Expect(obj).To(Equal(before))
}

func TestSetClusterAvailableCondition(t *testing.T) {
	tests := []struct {
		name        string
		cluster     *clusterv1.Cluster
		guestErr    error
		wantStatus  metav1.ConditionStatus
		wantReason  string
		wantMessage []string
	}{
		{
			name: "Cluster not found", cluster: nil,
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.ClusterNotFoundReason,
			wantMessage: []string{`No Cluster "guest" exists in namespace "k0smotron"`, "create it"},
		},
		{
			name: "infrastructure not provisioned", cluster: newCluster(),
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.ClusterNotProvisionedReason,
			wantMessage: []string{"Waiting for Cluster guest", "infrastructureProvisioned"},
		},
		{
			name:    "infrastructureProvisioned false",
			cluster: newCluster(func(c *clusterv1.Cluster) { c.Status.Initialization.InfrastructureProvisioned = ptr.To(false) }),
			// A guest error cannot matter before provisioning.
			guestErr:   errors.New("ignored"),
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.ClusterNotProvisionedReason,
		},
		{
			name: "Cluster being deleted", cluster: newCluster(provisioned, func(c *clusterv1.Cluster) {
				c.DeletionTimestamp = &metav1.Time{Time: time.Now()}
				c.Finalizers = []string{"cluster.x-k8s.io"}
			}),
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.GuestGoneReason,
			wantMessage: []string{"Cluster guest is being deleted"},
		},
		{
			name: "guest apiserver unreachable", cluster: newCluster(provisioned), guestErr: errors.New("connection refused"),
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.GuestUnreachableReason,
			wantMessage: []string{"Secret guest-kubeconfig", "connection refused"},
		},
		{
			name: "kubeconfig refused", cluster: newCluster(provisioned),
			guestErr: fmt.Errorf("%w: %w", clustercache.ErrClusterNotConnected, &kubeconfig.RefusedError{
				Source: "Secret k0smotron/guest-kubeconfig",
				Problems: []kubeconfig.Problem{
					{Field: "users[tenant].exec", Why: "runs a command", Fix: "write the credential itself"},
					{Field: "clusters[tenant].proxy-url", Why: "sends through a proxy", Fix: "remove it"},
				},
			}),
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.KubeconfigRefusedReason,
			wantMessage: []string{"Secret k0smotron/guest-kubeconfig", "users[tenant].exec runs a command: write the credential itself",
				"clusters[tenant].proxy-url sends through a proxy: remove it", "within 30 s"},
		},
		{
			name: "guest too large to cache", cluster: newCluster(provisioned),
			guestErr:   fmt.Errorf("wrapped: %w", &guestbounds.TooLargeError{Kind: "Service", Count: 20000, Max: 5000}),
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.GuestTooLargeReason,
			wantMessage: []string{"The guest of Cluster guest is not cached", "more than 5000 Services (at least 20000)", "--guest-max-objects"},
		},
		{
			name: "available", cluster: newCluster(provisioned),
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.ClusterAvailableReason,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := newGuestIngress()

			SetClusterAvailableCondition(obj, tt.cluster, tt.guestErr)

			c := conditions.Get(obj, guestnetv1.ClusterAvailableCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(tt.wantStatus))
			g.Expect(c.Reason).To(Equal(tt.wantReason))
			for _, m := range tt.wantMessage {
				g.Expect(c.Message).To(ContainSubstring(m))
			}
		})
	}
}
