package hostnames

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestBridgeServiceNames(t *testing.T) {
	n := strings.Repeat
	tests := []struct {
		name       string
		got        string
		want       string // exact, when readable
		wantHashed bool
	}{
		{name: "host Service", got: BridgeHostService("tenant-a", "cert-manager", "cert-manager-webhook"), want: "tenant-a-cert-manager-cert-manager-webhook"},
		{name: "host Service, 63 characters", got: BridgeHostService(n("c", 21), n("n", 20), n("s", 20)), want: n("c", 21) + "-" + n("n", 20) + "-" + n("s", 20)},
		{name: "host Service, 64 characters", got: BridgeHostService(n("c", 22), n("n", 20), n("s", 20)), wantHashed: true},
		{name: "host Service, longest inputs", got: BridgeHostService(n("c", 63), n("n", 63), n("s", 63)), wantHashed: true},
		{name: "host Service, cluster name with dots", got: BridgeHostService("tenant.a", "cert-manager", "webhook"), wantHashed: true},
		{name: "host Service, cluster name starting with a digit", got: BridgeHostService("1tenant", "cert-manager", "webhook"), wantHashed: true},
		{name: "NodePort Service", got: BridgeNodePortService("cert-manager-webhook"), want: "cert-manager-webhook-guestnet-nodeport"},
		{name: "NodePort Service, 63 characters", got: BridgeNodePortService(n("s", 45)), want: n("s", 45) + "-guestnet-nodeport"},
		{name: "NodePort Service, 64 characters", got: BridgeNodePortService(n("s", 46)), wantHashed: true},
		{name: "NodePort Service, longest Service name", got: BridgeNodePortService(n("s", 63)), wantHashed: true},
		{name: "ExternalName Service", got: BridgeExternalNameService("metrics-server"), want: "metrics-server-guestnet"},
		{name: "ExternalName Service, 63 characters", got: BridgeExternalNameService(n("s", 54)), want: n("s", 54) + "-guestnet"},
		{name: "ExternalName Service, 64 characters", got: BridgeExternalNameService(n("s", 55)), wantHashed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(validation.IsDNS1035Label(tt.got)).To(BeEmpty(), "Service name %q", tt.got)
			g.Expect(len(tt.got)).To(BeNumerically("<=", MaxServiceName))
			if tt.want != "" {
				g.Expect(tt.got).To(Equal(tt.want))
			}
			g.Expect(tt.got).To(MatchRegexp(hashPattern(tt.wantHashed)))
		})
	}
}

func TestBridgeServiceNamesDiffer(t *testing.T) {
	g := NewWithT(t)
	long := strings.Repeat("s", 63)
	names := map[string]string{}
	for _, in := range [][3]string{
		{"tenant-a", "cert-manager", "cert-manager-webhook"},
		{"tenant-b", "cert-manager", "cert-manager-webhook"},
		{"tenant.a", "cert-manager", "cert-manager-webhook"},
		{"tenant-a", long, long},
		{"tenant-a", long, long[:62] + "t"},
		{"tenant-a", long[:62] + "t", long},
	} {
		name := BridgeHostService(in[0], in[1], in[2])
		g.Expect(names).NotTo(HaveKey(name), "%v and %s", in, names[name])
		names[name] = strings.Join(in[:], "/")
	}
	g.Expect(BridgeNodePortService(long)).NotTo(Equal(BridgeNodePortService(long[:62] + "t")))
	g.Expect(BridgeExternalNameService(long)).NotTo(Equal(BridgeExternalNameService(long[:62] + "t")))
	// The NodePort and ExternalName Services of one guest Service never share a name.
	for _, svc := range []string{"metrics-server", long} {
		g.Expect(BridgeNodePortService(svc)).NotTo(Equal(BridgeExternalNameService(svc)))
	}
}

func TestServiceDNSNameAndBridgeURL(t *testing.T) {
	g := NewWithT(t)
	g.Expect(ServiceDNSName("k0smotron", "tenant-a-cert-manager-cert-manager-webhook")).To(Equal("tenant-a-cert-manager-cert-manager-webhook.k0smotron.svc"))

	tests := []struct {
		port int32
		path string
		want string
	}{
		// Exactly what cert-manager's chart renders for webhook.url.host=<name>.
		{443, "/validate", "https://tenant-a-cm-webhook.k0smotron.svc/validate"},
		{443, "", "https://tenant-a-cm-webhook.k0smotron.svc"},
		{8443, "/mutate", "https://tenant-a-cm-webhook.k0smotron.svc:8443/mutate"},
		{10250, "/", "https://tenant-a-cm-webhook.k0smotron.svc:10250/"},
	}
	for _, tt := range tests {
		g.Expect(BridgeURL("k0smotron", "tenant-a-cm-webhook", tt.port, tt.path)).To(Equal(tt.want))
	}
}
