package diagnose

import (
	"context"
	"errors"
	"strconv"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func TestFetch_GuestNodesTrimmed(t *testing.T) {
	g := NewWithT(t)
	node := guestNode(machineName("a"), "10.244.1.11", "kubelet")
	node.Labels = map[string]string{"big": "label"}
	node.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.example/huge:1"}}}
	taint(&node)
	c := fake.NewClientBuilder().WithScheme(Scheme).WithObjects(&node).Build()
	nodes, truncated, err := listGuestNodes(context.Background(), c)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(truncated).To(BeFalse())
	g.Expect(nodes).To(HaveLen(1))
	got := nodes[0]
	g.Expect(got.Name).To(Equal(node.Name))
	g.Expect(got.Spec.ProviderID).To(Equal(node.Spec.ProviderID))
	g.Expect(got.Spec.Taints).To(Equal(node.Spec.Taints))
	g.Expect(got.Status.Addresses).To(Equal(node.Status.Addresses))
	// (who wrote the addresses is kept too: nodeidentity.TrimNode's tests; the fake client
	// does not keep managedFields)
	g.Expect(got.Labels).To(BeEmpty())
	g.Expect(got.Status.Images).To(BeEmpty())
}

// Nodes are read in pages and no more than maxGuestNodes of them.
func TestFetch_GuestNodesBounded(t *testing.T) {
	g := NewWithT(t)
	pages := 0
	c := fake.NewClientBuilder().WithScheme(Scheme).WithInterceptorFuncs(interceptor.Funcs{
		List: func(_ context.Context, _ client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			lo := (&client.ListOptions{}).ApplyOptions(opts)
			g.Expect(lo.Limit).To(BeNumerically(">", 0))
			g.Expect(lo.Limit).To(BeNumerically("<=", guestPageSize))
			nl := list.(*corev1.NodeList)
			for i := range int(lo.Limit) {
				nl.Items = append(nl.Items, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n" + strconv.Itoa(pages) + "-" + strconv.Itoa(i)}})
			}
			pages++
			nl.Continue = "more"
			return nil
		},
	}).Build()
	nodes, truncated, err := listGuestNodes(context.Background(), c)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(truncated).To(BeTrue())
	g.Expect(nodes).To(HaveLen(maxGuestNodes))
	g.Expect(pages).To(Equal(maxGuestNodes / guestPageSize))
}

func TestFetch_CiliumNodes(t *testing.T) {
	g := NewWithT(t)
	cn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
		"metadata": map[string]any{"name": machineName("a")},
		"spec": map[string]any{"addresses": []any{
			map[string]any{"type": "InternalIP", "ip": "10.0.2.2"},
			map[string]any{"type": "CiliumInternalIP", "ip": "10.245.0.1"},
		}},
	}}
	c := fake.NewClientBuilder().WithScheme(Scheme).WithObjects(cn).Build()
	got, err := listCiliumNodes(context.Background(), c)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal([]CiliumNode{{Name: machineName("a"), InternalIPs: []string{"10.0.2.2"}}}))
}

// A guest without Cilium's CRD has no CiliumNodes: not an error.
func TestFetch_CiliumNodesOptional(t *testing.T) {
	g := NewWithT(t)
	fail := func(err error) client.Reader {
		return fake.NewClientBuilder().WithScheme(Scheme).WithInterceptorFuncs(interceptor.Funcs{
			List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error { return err },
		}).Build()
	}
	noMatch := &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "cilium.io", Kind: "CiliumNode"}, SearchedVersions: []string{"v2"}}
	got, err := listCiliumNodes(context.Background(), fail(noMatch))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(BeNil())

	_, err = listCiliumNodes(context.Background(), fail(errors.New("boom")))
	g.Expect(err).To(MatchError(ContainSubstring("boom")))
}
