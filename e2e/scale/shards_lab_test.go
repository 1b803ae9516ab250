package scale_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// shardMember is outside the fleets of the other tests (0..19, 900).
const shardMember = 950

// Guest shards (lab.StartGuestShards) are separate guest clusters: each apiserver has its own
// address and CA and its own state in the guest's etcd (what one holds, the others and the
// guest do not), and writes its own audit log. A fleet member put on a shard lives there: its
// kubeconfig Secret and Cluster endpoint name the shard, its worker Nodes and guest Service
// are in the shard only. The test logs a shard apiserver's idle RSS and CPU (docs/lab.md).
// It runs in this package's lab (it needs the audit log; a lab of its own cannot run beside
// another package lab in one process: the host DNS stand-in has one address). Its shards stay
// until the lab stops, and its fleet member is deleted at the end: the other tests count every
// write of a manager that watches the whole host.
func TestLab_GuestShardsAreSeparateGuestClusters(t *testing.T) {
	l := shared.Get(t)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)

	started := time.Now()
	shards, err := l.StartGuestShards(ctx, 2)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("2 guest shards started in %v", time.Since(started).Round(100*time.Millisecond))
	g.Expect(shards).To(HaveLen(2))
	g.Expect(shards[0].Server()).NotTo(Or(Equal(shards[1].Server()), Equal(l.Guest.Server())))
	g.Expect(shards[0].EtcdURL()).To(Equal(l.Guest.EtcdURL()))

	t.Run("each shard holds its own cluster state", func(t *testing.T) {
		g := NewWithT(t)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shard0-only"}}
		g.Expect(shards[0].Client.Create(ctx, ns)).To(Succeed())
		g.Expect(shards[0].Client.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{})).To(Succeed())
		for _, other := range []*lab.Cluster{shards[1], l.Guest} {
			err := other.Client.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "namespace of shard 0 in %s: %v", other.Server(), err)
		}
	})

	t.Run("a fleet member lives on its shard", func(t *testing.T) {
		g := NewWithT(t)
		shard := shards[1]
		auditLog, err := shard.AuditLog()
		g.Expect(err).NotTo(HaveOccurred())
		m, err := l.CreateFleetMember(ctx, shardMember, lab.FleetOptions{Guest: shard, GuestIndex: 0, Bridge: true})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.Cluster.Namespace}}
			g.Expect(client.IgnoreNotFound(l.Host.Client.Delete(context.Background(), ns))).To(Succeed())
		})
		g.Expect(m.Guest).To(BeIdenticalTo(shard))
		g.Expect(m.Cluster.Guest).To(BeIdenticalTo(shard))

		secret := &corev1.Secret{}
		g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Namespace: m.Cluster.Namespace, Name: m.Cluster.Name + "-kubeconfig"}, secret)).To(Succeed())
		cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["value"])
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(cfg.Host).To(Equal(shard.Server()))
		g.Expect(cfg.CertData).NotTo(Equal(shard.Config.CertData), "credentials of the member's own, not the shard's admin's")
		cluster := &clusterv1.Cluster{}
		g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Namespace: m.Cluster.Namespace, Name: m.Cluster.Name}, cluster)).To(Succeed())
		g.Expect(cluster.Spec.ControlPlaneEndpoint).To(Equal(clusterv1.APIEndpoint{Host: shard.Options.Address, Port: lab.APIServerPort}))

		for _, key := range []struct {
			key client.ObjectKey
			obj client.Object
		}{
			{client.ObjectKey{Name: m.Cluster.Namespace + "-w0"}, &corev1.Node{}},
			{client.ObjectKey{Namespace: m.GuestNamespace, Name: "envoy"}, &corev1.Service{}},
		} {
			g.Expect(shard.Client.Get(ctx, key.key, key.obj)).To(Succeed())
			g.Expect(apierrors.IsNotFound(l.Guest.Client.Get(ctx, key.key, key.obj))).To(BeTrue(), "%s in the lab's guest", key.key)
		}
		// The member's guest nodePorts come from its index on the shard, its IPs from its
		// index in the fleet.
		g.Expect(m.GuestIngress.Spec.Ports[0].NodePort).To(HaveValue(BeEquivalentTo(30000)))
		g.Expect(m.GuestIngress.Spec.LoadBalancer.IP).To(Equal("10.98.203.201"))

		reqs, err := auditLog.Next("")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(lab.CountBy(reqs, func(r lab.AuditRequest) string {
			if r.Verb == "create" && r.Resource() == "services" {
				return "create services"
			}
			return ""
		})).To(HaveKeyWithValue("create services", BeNumerically(">=", 1)))
	})

	// A shard apiserver's cost at rest, for docs/lab.md.
	time.Sleep(20 * time.Second)
	before, err := lab.ReadProcessUsage(shards[0].PID())
	g.Expect(err).NotTo(HaveOccurred())
	time.Sleep(30 * time.Second)
	after, err := lab.ReadProcessUsage(shards[0].PID())
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("idle guest shard apiserver: RSS %.0f MiB (anon %.0f), CPU %.1f%% of a core over 30 s",
		after.RSSMiB, after.AnonRSSMiB, 100*(after.CPUSeconds-before.CPUSeconds)/30)
}
