package optional

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// mapper is a RESTMapper whose kinds a test adds while a gate reads it.
type mapper struct {
	mu sync.Mutex
	meta.RESTMapper
	m *meta.DefaultRESTMapper
}

func newMapper() *mapper {
	m := meta.NewDefaultRESTMapper(nil)
	return &mapper{RESTMapper: m, m: m}
}

func (m *mapper) add(gvk schema.GroupVersionKind) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m.Add(gvk, meta.RESTScopeRoot)
}

func (m *mapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.m.RESTMapping(gk, versions...)
}

// An API is installed when every one of its kinds is served; what waits for it runs once,
// when the gate finds it, and what asks after that runs at once.
func TestGate(t *testing.T) {
	g := NewWithT(t)
	m := newMapper()
	m.add(CiliumLBIPAM.Kinds[0]) // the pool's CRD, not the L2 policy's

	gate := NewGate(CiliumLBIPAM, m, 10*time.Millisecond)
	g.Expect(gate.Installed()).To(BeFalse(), "one kind of two is not installed")
	g.Expect(gate.Message()).To(And(
		ContainSubstring("does not serve CiliumLoadBalancerIPPool (cilium.io/v2), CiliumL2AnnouncementPolicy (cilium.io/v2alpha1)"),
		ContainSubstring("install Cilium with LB-IPAM"),
		ContainSubstring("picks it up without a restart"),
	))

	var mu sync.Mutex
	ran := 0
	g.Expect(gate.WhenInstalled(context.Background(), func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		ran++
		return nil
	})).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- gate.Start(ctx) }()

	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	g.Expect(ran).To(BeZero(), "nothing runs while the API is missing")
	mu.Unlock()

	m.add(CiliumLBIPAM.Kinds[1])
	g.Eventually(done).Should(Receive(BeNil()), "the gate stops looking once the API is installed")
	g.Expect(gate.Installed()).To(BeTrue())
	mu.Lock()
	g.Expect(ran).To(Equal(1))
	mu.Unlock()

	now := false
	g.Expect(gate.WhenInstalled(ctx, func(context.Context) error { now = true; return nil })).To(Succeed())
	g.Expect(now).To(BeTrue(), "once installed, what asks runs at once")
	g.Expect(gate.NeedLeaderElection()).To(BeFalse())
}

// A nil gate is an API taken to be installed.
func TestNilGate(t *testing.T) {
	g := NewWithT(t)
	var gate *Gate
	g.Expect(gate.Installed()).To(BeTrue())
	ran := false
	g.Expect(gate.WhenInstalled(context.Background(), func(context.Context) error { ran = true; return nil })).To(Succeed())
	g.Expect(ran).To(BeTrue())
}

// IsMissing is the error of a read of a kind the apiserver does not serve.
func TestIsMissing(t *testing.T) {
	g := NewWithT(t)
	_, err := newMapper().RESTMapping(CAPK.Kinds[0].GroupKind(), CAPK.Kinds[0].Version)
	g.Expect(IsMissing(err)).To(BeTrue())
	g.Expect(IsMissing(nil)).To(BeFalse())
}

// A host of Cilium 1.16 or 1.17 serves CiliumBGPAdvertisement as v2alpha1 only: guestnet
// takes the first version the host serves.
func TestServedVersion(t *testing.T) {
	gk := schema.GroupKind{Group: "cilium.io", Kind: "CiliumBGPAdvertisement"}
	old := meta.NewDefaultRESTMapper(nil)
	old.Add(gk.WithVersion("v2alpha1"), meta.RESTScopeRoot)
	if v := ServedVersion(old, gk, "v2", "v2alpha1"); v != "v2alpha1" {
		t.Fatalf("Cilium 1.17: got %q, want v2alpha1", v)
	}
	both := meta.NewDefaultRESTMapper(nil)
	both.Add(gk.WithVersion("v2alpha1"), meta.RESTScopeRoot)
	both.Add(gk.WithVersion("v2"), meta.RESTScopeRoot)
	if v := ServedVersion(both, gk, "v2", "v2alpha1"); v != "v2" {
		t.Fatalf("Cilium 1.20: got %q, want v2", v)
	}
	if v := ServedVersion(meta.NewDefaultRESTMapper(nil), gk, "v2", "v2alpha1"); v != "" {
		t.Fatalf("no Cilium: got %q, want none", v)
	}
}
