package kubeconfig

import (
	"context"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
)

func secretReaderFixture(t *testing.T, kubeconfigs map[string]*clientcmdapi.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := clusterv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for name, kc := range kubeconfigs {
		objs = append(objs,
			&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: name}, Spec: clusterv1.ClusterSpec{ControlPlaneEndpoint: labEndpoint}},
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: name + "-kubeconfig"}, Data: map[string][]byte{"value": write(t, kc), "other": []byte("x")}},
		)
	}
	objs = append(objs, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "no-value"}, Spec: clusterv1.ClusterSpec{ControlPlaneEndpoint: labEndpoint}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "no-value-kubeconfig"}, Data: map[string][]byte{"kubeconfig": []byte("x")}})
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

// The ClusterCache's SecretClient: a Secret comes out holding only the checked kubeconfig;
// a refused one is an error naming the Secret and the fields, and reads nothing else.
func TestSecretReader(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newPKI(t)
	hostile := capiKubeconfig(p, "https://10.244.0.2:6443")
	hostile.AuthInfos["tenant-admin"].Exec = &clientcmdapi.ExecConfig{Command: "touch"}
	r := SecretReader{Reader: secretReaderFixture(t, map[string]*clientcmdapi.Config{
		"good":    capiKubeconfig(p, "https://10.244.0.2:6443"),
		"hostile": hostile,
	})}

	s := &corev1.Secret{}
	g.Expect(r.Get(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "good-kubeconfig"}, s)).To(Succeed())
	g.Expect(s.Data).To(HaveLen(1))
	want, err := Check(write(t, capiKubeconfig(p, "https://10.244.0.2:6443")), labEndpoint)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.Data["value"]).To(Equal(want))
	g.Expect(r.Refusal(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "good"})).To(BeNil())

	err = r.Get(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "hostile-kubeconfig"}, &corev1.Secret{})
	refused, ok := AsRefused(err)
	g.Expect(ok).To(BeTrue(), "%v", err)
	g.Expect(refused.Source).To(Equal("Secret tenant-a/hostile-kubeconfig"))
	g.Expect(fields(err)).To(Equal([]string{"users[tenant-admin].exec"}))
	g.Expect(r.Refusal(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "hostile"})).To(Equal(refused))

	err = r.Get(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "no-value-kubeconfig"}, &corev1.Secret{})
	g.Expect(fields(err)).To(Equal([]string{"data.value"}))

	// What the ClusterCache may ask that is not a kubeconfig Secret it can be given.
	err = r.Get(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "missing-kubeconfig"}, &corev1.Secret{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
	g.Expect(r.Refusal(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "missing"})).To(BeNil())
	g.Expect(r.Get(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "good"}, &corev1.Secret{})).To(MatchError(ContainSubstring("<cluster>-kubeconfig Secrets only")))
	g.Expect(r.Get(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "good-kubeconfig"}, &corev1.ConfigMap{})).To(MatchError(ContainSubstring("Secrets only")))
	g.Expect(r.List(ctx, &corev1.SecretList{})).NotTo(Succeed())
}

// The ClusterCache's "not connected" says why when the Secret is refused, and still is
// ErrClusterNotConnected; a connected guest is handed out as it is.
func TestClusterCacheExplainsARefusal(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newPKI(t)
	hostile := capiKubeconfig(p, "https://10.244.0.2:6443")
	hostile.Clusters["tenant"].ProxyURL = "http://10.244.77.1:3128"
	host := secretReaderFixture(t, map[string]*clientcmdapi.Config{"good": capiKubeconfig(p, "https://10.244.0.2:6443"), "hostile": hostile})
	connected := client.ObjectKey{Namespace: "tenant-a", Name: "good"}
	cc := ClusterCache(clustercache.NewFakeClusterCache(host, connected), SecretReader{Reader: host})

	c, err := cc.GetClient(ctx, connected)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c).NotTo(BeNil())

	key := client.ObjectKey{Namespace: "tenant-a", Name: "hostile"}
	calls := map[string]func() error{
		"GetClient":         func() error { _, err := cc.GetClient(ctx, key); return err },
		"GetReader":         func() error { _, err := cc.GetReader(ctx, key); return err },
		"GetUncachedClient": func() error { _, err := cc.GetUncachedClient(ctx, key); return err },
		"GetRESTConfig":     func() error { _, err := cc.GetRESTConfig(ctx, key); return err },
		"Watch":             func() error { return cc.Watch(ctx, key, namedWatcher{}) },
	}
	for name, call := range calls {
		err := call()
		g.Expect(errors.Is(err, clustercache.ErrClusterNotConnected)).To(BeTrue(), "%s: %v", name, err)
		g.Expect(fields(err)).To(Equal([]string{"clusters[tenant].proxy-url"}), "%s", name)
	}

	// Not connected for another reason: the ClusterCache's error as it is.
	_, err = cc.GetClient(ctx, client.ObjectKey{Namespace: "tenant-a", Name: "missing"})
	g.Expect(errors.Is(err, clustercache.ErrClusterNotConnected)).To(BeTrue())
	_, refused := AsRefused(err)
	g.Expect(refused).To(BeFalse())
}

// namedWatcher is a clustercache.Watcher that never gets to watch (the guest is not connected).
type namedWatcher struct{}

func (namedWatcher) Name() string                { return "test" }
func (namedWatcher) Object() client.Object       { return &corev1.Service{} }
func (namedWatcher) Watch(ctrlcache.Cache) error { return errors.New("not expected") }
