package hostnames

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func gi(ns, name, cluster string) *guestnetv1.GuestIngress {
	return &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "uid-1"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  cluster,
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
		},
	}
}

func TestNames(t *testing.T) {
	long := strings.Repeat("a", 63)
	tests := []struct {
		name              string
		gi                *guestnetv1.GuestIngress
		wantService       string
		wantPool          string
		wantHashedService bool
		wantHashedPool    bool
	}{
		{
			name:        "readable from cluster and GuestIngress",
			gi:          gi("k0smotron", "web", "tenant-a"),
			wantService: "tenant-a-web", wantPool: "k0smotron.tenant-a-web",
		},
		{
			// A Service name cannot hold '.': replaced, and hashed so that "a.b" and "a-b" differ.
			name: "dots in names", gi: gi("k0smotron", "web.v2", "tenant.a"),
			wantHashedService: true, wantPool: "k0smotron.tenant.a-web.v2",
		},
		{
			// A Service name must start with a letter.
			name: "cluster name starting with a digit", gi: gi("k0smotron", "web", "1tenant"),
			wantHashedService: true, wantPool: "k0smotron.1tenant-web",
		},
		{
			name: "too long for a Service", gi: gi("k0smotron", long, "tenant-a"),
			wantHashedService: true, wantPool: "k0smotron.tenant-a-" + long,
		},
		{
			name: "too long for anything", gi: gi(long, strings.Repeat("b", 200), long),
			wantHashedService: true, wantHashedPool: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			svc, pool, policy := HostService(tt.gi), Pool(tt.gi), L2Policy(tt.gi)

			g.Expect(validation.IsDNS1035Label(svc)).To(BeEmpty(), "Service name %q", svc)
			g.Expect(validation.IsDNS1123Subdomain(pool)).To(BeEmpty(), "pool name %q", pool)
			g.Expect(policy).To(Equal(pool))
			if tt.wantService != "" {
				g.Expect(svc).To(Equal(tt.wantService))
			}
			if tt.wantPool != "" {
				g.Expect(pool).To(Equal(tt.wantPool))
			}
			g.Expect(svc).To(MatchRegexp(hashPattern(tt.wantHashedService)))
			g.Expect(pool).To(MatchRegexp(hashPattern(tt.wantHashedPool)))
			// Names are stable: the same input gives the same name.
			g.Expect(HostService(tt.gi)).To(Equal(svc))
		})
	}
}

func hashPattern(hashed bool) string {
	if hashed {
		return "-[0-9a-f]{10}$"
	}
	return ".*"
}

// Pools and policies are cluster-scoped: the same cluster and GuestIngress names in two
// namespaces must not share one, nor may names that only differ in where the '-' falls.
func TestClusterScopedNamesNeverCollide(t *testing.T) {
	g := NewWithT(t)
	names := map[string]string{}
	for _, in := range []*guestnetv1.GuestIngress{
		gi("team-a", "web", "tenant"),
		gi("team-b", "web", "tenant"),
		gi("team", "web", "a-tenant"),
		gi("team-a", "tenant-web", "x"),
		gi(strings.Repeat("n", 63), strings.Repeat("w", 253), strings.Repeat("c", 63)),
		gi(strings.Repeat("n", 63), strings.Repeat("w", 252)+"x", strings.Repeat("c", 63)),
	} {
		name := Pool(in)
		key := in.Namespace + "/" + in.Name + "/" + in.Spec.ClusterName
		g.Expect(names).NotTo(HaveKey(name), "%s and %s", key, names[name])
		names[name] = key
	}
}

func TestShortenedNamesDiffer(t *testing.T) {
	g := NewWithT(t)
	// Replacing '.' could make two names equal; the hash keeps them apart.
	g.Expect(ServiceName("a.b")).NotTo(Equal(ServiceName("a-b")))
	g.Expect(ServiceName("a-b")).To(Equal("a-b"))
	a, b := strings.Repeat("x", 70)+"1", strings.Repeat("x", 70)+"2"
	g.Expect(ServiceName(a)).NotTo(Equal(ServiceName(b)))
	g.Expect(len(ServiceName(a))).To(Equal(MaxServiceName))
	g.Expect(LabelValue(strings.Repeat("v", 64))).To(HaveLen(MaxLabelValue))
	g.Expect(validation.IsValidLabelValue(LabelValue(strings.Repeat("v.", 40)))).To(BeEmpty())
	g.Expect(LabelValue("web")).To(Equal("web"))
}
