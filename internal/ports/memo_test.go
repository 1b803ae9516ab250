package ports

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func TestCiliumConfigMemo(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	gets := 0
	guest := fake.NewClientBuilder().WithObjects(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "cilium-config"}, Data: map[string]string{"tunnel-port": "8473"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "other"}},
	).WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		gets++
		return c.Get(ctx, key, obj, opts...)
	}}).Build()
	memo := &CiliumConfigMemo{TTL: time.Hour}
	a, b := client.ObjectKey{Namespace: "ns", Name: "a"}, client.ObjectKey{Namespace: "ns", Name: "b"}

	for range 3 {
		cm := &corev1.ConfigMap{}
		g.Expect(memo.Reader(a, guest).Get(ctx, ciliumConfigKey, cm)).To(Succeed())
		g.Expect(cm.Data).To(HaveKeyWithValue("tunnel-port", "8473"))
	}
	g.Expect(gets).To(Equal(1), "read once per cluster")
	g.Expect(memo.Reader(b, guest).Get(ctx, ciliumConfigKey, &corev1.ConfigMap{})).To(Succeed())
	g.Expect(gets).To(Equal(2))
	g.Expect(memo.Reader(a, guest).Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "other"}, &corev1.ConfigMap{})).To(Succeed())
	g.Expect(gets).To(Equal(3), "other objects are not remembered")

	// No cilium-config is an answer too; an expired one is read again.
	empty := fake.NewClientBuilder().Build()
	c := client.ObjectKey{Namespace: "ns", Name: "c"}
	g.Expect(apierrors.IsNotFound(memo.Reader(c, empty).Get(ctx, ciliumConfigKey, &corev1.ConfigMap{}))).To(BeTrue())
	memo.TTL = time.Nanosecond
	g.Expect(memo.Reader(a, guest).Get(ctx, ciliumConfigKey, &corev1.ConfigMap{})).To(Succeed())
	g.Expect(gets).To(Equal(4))
	_, memoized := (*CiliumConfigMemo)(nil).Reader(a, guest).(memoReader)
	g.Expect(memoized).To(BeFalse(), "a nil memo reads through")
}
