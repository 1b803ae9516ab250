package guestnodeidentity

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The Cilium follow-up looks only at Nodes written within ciliumWatchFor: nothing is read of
// Cilium at steady state.
func TestWrittenNodesWindow(t *testing.T) {
	g := NewWithT(t)
	var w writtenNodes
	c := client.ObjectKey{Namespace: "ns", Name: "guest"}
	now := time.Now()
	w.wrote(c, "b", now.Add(-ciliumWatchFor-time.Second))
	w.wrote(c, "a", now.Add(-time.Second))
	g.Expect(w.recent(c, now)).To(Equal([]string{"a"}))
	g.Expect(w.recent(c, now.Add(ciliumWatchFor))).To(BeEmpty())
	g.Expect(w.at).To(BeEmpty(), "forgotten once out of the window")
}

func TestCiliumInternalIPs(t *testing.T) {
	g := NewWithT(t)
	cn := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"addresses": []any{
		map[string]any{"type": "InternalIP", "ip": "10.0.2.2"},
		map[string]any{"type": "CiliumInternalIP", "ip": "10.245.1.7"},
		map[string]any{"type": "InternalIP", "ip": "fd10:0:2::2"},
	}}}}
	g.Expect(ciliumInternalIPs(cn)).To(Equal([]string{"10.0.2.2", "fd10:0:2::2"}))
	g.Expect(ciliumInternalIPs(&unstructured.Unstructured{Object: map[string]any{}})).To(BeEmpty())
}
