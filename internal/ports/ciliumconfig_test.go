package ports

import (
	"testing"

	. "github.com/onsi/gomega"
)

// The guest caches keep of cilium-config what CiliumTunnel reads, and so the same answer.
func TestKeepTunnelKeys(t *testing.T) {
	g := NewWithT(t)
	data := map[string]string{"tunnel-protocol": "geneve", "tunnel-port": "6090", "cluster-name": "guest", "enable-bpf-masquerade": "true"}
	kept := KeepTunnelKeys(data)
	g.Expect(kept).To(Equal(map[string]string{"tunnel-protocol": "geneve", "tunnel-port": "6090"}))
	want, wantNote, _ := CiliumTunnel(data)
	got, gotNote, _ := CiliumTunnel(kept)
	g.Expect(got).To(Equal(want))
	g.Expect(gotNote).To(Equal(wantNote))
	g.Expect(KeepTunnelKeys(nil)).To(BeNil(), "no data stays no data")
	g.Expect(KeepTunnelKeys(map[string]string{"cluster-name": "guest"})).To(BeEmpty())
	g.Expect(KeepTunnelKeys(map[string]string{"cluster-name": "guest"})).NotTo(BeNil(), "a cilium-config of other keys is not a missing one")
}
