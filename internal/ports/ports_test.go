package ports

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func TestNewSetMergesDuplicatesAndSorts(t *testing.T) {
	g := NewWithT(t)
	s := NewSet(
		Requirement{Port: TCP(30443), Reasons: []string{"a"}},
		Requirement{Port: TCP(22), Reasons: []string{"SSH"}},
		Requirement{Port: UDP(30443), Reasons: []string{"b"}},
		Requirement{Port: TCP(30443), Reasons: []string{"c", "a"}},
	)
	g.Expect(s.Ports()).To(Equal([]Port{TCP(22), TCP(30443), UDP(30443)}))
	g.Expect(s[1].Reasons).To(Equal([]string{"a", "c"}), "same port and protocol: one entry, every reason once")
	g.Expect(s.String()).To(Equal("22/TCP, 30443/TCP, 30443/UDP"))
}

func TestSetMissingAndUnion(t *testing.T) {
	g := NewWithT(t)
	required := Base(true).Union(NewSet(Requirement{Port: UDP(8473)}))
	g.Expect(required.Missing([]Port{TCP(22), TCP(10250), UDP(8473)})).To(BeEmpty())
	g.Expect(required.Missing([]Port{TCP(22), TCP(8473)}).Ports()).To(Equal([]Port{UDP(8473), TCP(10250)}),
		"a TCP declaration does not cover the UDP tunnel port")
}

func TestCiliumTunnel(t *testing.T) {
	tests := []struct {
		name    string
		data    map[string]string
		want    []Port
		wantErr string
	}{
		{name: "no cilium-config", data: nil, want: nil},
		{name: "defaults to VXLAN 8472", data: map[string]string{}, want: []Port{UDP(8472)}},
		{name: "field report: tunnel-port 8473", data: map[string]string{"tunnel-protocol": "vxlan", "tunnel-port": "8473"}, want: []Port{UDP(8473)}},
		{name: "geneve default 6081", data: map[string]string{"tunnel-protocol": "geneve"}, want: []Port{UDP(6081)}},
		{name: "older 'tunnel' key", data: map[string]string{"tunnel": "geneve"}, want: []Port{UDP(6081)}},
		{name: "native routing needs none", data: map[string]string{"routing-mode": "native", "tunnel-port": "8473"}, want: nil},
		{name: "tunnel disabled (older key)", data: map[string]string{"tunnel": "disabled"}, want: nil},
		{name: "tunnel-port 0 means default", data: map[string]string{"tunnel-port": "0"}, want: []Port{UDP(8472)}},
		{name: "bad port", data: map[string]string{"tunnel-port": "70000"}, wantErr: `invalid tunnel-port "70000"`},
		{name: "bad protocol", data: map[string]string{"tunnel-protocol": "gre"}, wantErr: `unknown tunnel protocol "gre"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			s, note, err := CiliumTunnel(tt.data)
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s.Ports()).To(Equal(tt.want))
			g.Expect(note).NotTo(BeEmpty())
		})
	}
}

func TestForGuestIngress(t *testing.T) {
	gi := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: guestnetv1.GuestIngressSpec{Ports: []guestnetv1.IngressPort{
			{Name: "http", Port: 80, NodePort: ptr.To[int32](30080)},
			{Name: "https", Port: 443}, // follows the guest's allocation
			{Name: "dns", Port: 53, NodePort: ptr.To[int32](30053), Protocol: corev1.ProtocolUDP},
			{Name: "pending", Port: 8080}, // not allocated yet
		}},
		Status: guestnetv1.GuestIngressStatus{Ports: []guestnetv1.IngressPortStatus{
			{Name: "http", Port: 80, NodePort: 31111}, // spec wins over a stale observation
			{Name: "https", Port: 443, NodePort: 30443},
		}},
	}
	g := NewWithT(t)
	s := ForGuestIngress(gi)
	g.Expect(s.Ports()).To(Equal([]Port{UDP(30053), TCP(30080), TCP(30443)}))
	g.Expect(s[1].Reasons).To(Equal([]string{"GuestIngress web port http"}))

	gi.Spec.DeclarePorts = ptr.To(false)
	g.Expect(ForGuestIngress(gi)).To(BeEmpty())
}

func TestForBridgeDeclaresTheWholeRange(t *testing.T) {
	g := NewWithT(t)
	gwb := &guestnetv1.GuestWebhookBridge{ObjectMeta: metav1.ObjectMeta{Name: "b"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{NodePortRange: guestnetv1.NodePortRange{Start: 32700, Size: 3}}}
	g.Expect(ForBridge(gwb).Ports()).To(Equal([]Port{TCP(32700), TCP(32701), TCP(32702)}))
}

func TestParseExtraPorts(t *testing.T) {
	tests := []struct {
		value   string
		want    []Port
		wantErr string
	}{
		{value: "", want: nil},
		{value: "9100", want: []Port{TCP(9100)}},
		{value: " 4240/tcp , 51871/UDP,9100", want: []Port{TCP(4240), TCP(9100), UDP(51871)}},
		{value: "9100,9100/TCP", want: []Port{TCP(9100)}},
		{value: "0", wantErr: `"0" is not a port`},
		{value: "65536", wantErr: `"65536" is not a port`},
		{value: "http", wantErr: `"http" is not a port`},
		{value: "53/SCTP", wantErr: `has protocol "SCTP"; use TCP or UDP`},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			g := NewWithT(t)
			s, err := ParseExtraPorts(tt.value)
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s.Ports()).To(Equal(tt.want))
		})
	}
}
