package guestcache

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"
)

func TestGuestMapperKnowsTheBuiltinKindsWithoutDiscovery(t *testing.T) {
	g := NewWithT(t)
	d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	m := newGuestMapper(d)

	svc, err := m.RESTMapping(schema.GroupKind{Kind: "Service"}, "v1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(svc.Resource).To(Equal(schema.GroupVersionResource{Version: "v1", Resource: "services"}))
	g.Expect(svc.Scope.Name()).To(Equal(meta.RESTScopeNameNamespace))

	api, err := m.RESTMapping(schema.GroupKind{Group: "apiregistration.k8s.io", Kind: "APIService"}, "v1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(api.Resource.Resource).To(Equal("apiservices"))
	g.Expect(api.Scope.Name()).To(Equal(meta.RESTScopeNameRoot))

	g.Expect(d.Actions()).To(BeEmpty(), "a built-in kind costs no discovery")
}

func TestGuestMapperLooksUpOtherKindsInTheirGroupVersionOnly(t *testing.T) {
	g := NewWithT(t)
	d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	d.Resources = []*metav1.APIResourceList{{
		GroupVersion: "cilium.io/v2",
		APIResources: []metav1.APIResource{
			{Name: "ciliumnodes", SingularName: "ciliumnode", Kind: "CiliumNode"},
			{Name: "ciliumnodes/status", Kind: "CiliumNode"},
			{Name: "ciliumendpoints", SingularName: "ciliumendpoint", Namespaced: true, Kind: "CiliumEndpoint"},
		},
	}}
	m := newGuestMapper(d)

	node, err := m.RESTMapping(schema.GroupKind{Group: "cilium.io", Kind: "CiliumNode"}, "v2")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(node.Resource.Resource).To(Equal("ciliumnodes"))
	g.Expect(node.Scope.Name()).To(Equal(meta.RESTScopeNameRoot))
	ep, err := m.RESTMapping(schema.GroupKind{Group: "cilium.io", Kind: "CiliumEndpoint"}, "v2")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ep.Scope.Name()).To(Equal(meta.RESTScopeNameNamespace))
	g.Expect(d.Actions()).To(HaveLen(1), "one lookup of cilium.io/v2, then the mapper knows it")

	_, err = m.RESTMapping(schema.GroupKind{Group: "cilium.io", Kind: "CiliumNode"}, "v9")
	g.Expect(meta.IsNoMatchError(err)).To(BeTrue(), "a group-version the guest does not serve is no match: %v", err)
}
