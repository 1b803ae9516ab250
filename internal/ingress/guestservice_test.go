package ingress

import (
	"slices"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// ownedBy gives the Service a managedFields entry of guestnet's owning the type, the record
// and the nodePorts of the given ports.
func ownedBy(svc *corev1.Service, record string, ports ...int32) *corev1.Service {
	fields := `"f:type":{}`
	if len(ports) > 0 {
		fields += `,"f:ports":{`
		for i, p := range ports {
			if i > 0 {
				fields += ","
			}
			fields += `"k:{\"port\":` + strconv.Itoa(int(p)) + `,\"protocol\":\"TCP\"}":{".":{},"f:nodePort":{},"f:port":{},"f:protocol":{}}`
		}
		fields += "}"
	}
	svc.Annotations = map[string]string{guestnetv1.OriginalGuestServiceAnnotation: record}
	svc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "guestnet", Operation: metav1.ManagedFieldsOperationApply, FieldsType: "FieldsV1",
		FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{"f:guestnet.addons.cluster.x-k8s.io/original":{}}},"f:spec":{` + fields + `}}`)}}
	return svc
}

func TestRestoreDropped(t *testing.T) {
	// The user's NodePort Service (nodePorts 31000, 31001) as guestnet left it with 30080 and
	// 30443 fixed.
	live := func() *corev1.Service {
		return ownedBy(guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 30080), sp("https", 443, 30443)),
			`{"nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000},{"port":443,"protocol":"TCP","nodePort":31001}]}`, 80, 443)
	}
	tests := []struct {
		name        string
		gi          *guestnetv1.GuestIngress
		live        *corev1.Service
		wantPatches []string
		wantWhat    []string
	}{
		{name: "every port still fixed: nothing", gi: newGI(), live: live()},
		{
			name:     "https dropped from spec.ports: its nodePort back",
			gi:       newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.Ports = gi.Spec.Ports[:1] }),
			live:     live(),
			wantWhat: []string{"nodePort 31001 of port 443/TCP"},
			wantPatches: []string{`[{"op":"test","path":"/spec/ports/1/port","value":443},{"op":"test","path":"/spec/ports/1/nodePort","value":30443},` +
				`{"op":"replace","path":"/spec/ports/1/nodePort","value":31001}]`},
		},
		{
			name:     "http's nodePort no longer fixed (followed): its nodePort back",
			gi:       newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.Ports[0].NodePort = nil }),
			live:     live(),
			wantWhat: []string{"nodePort 31000 of port 80/TCP"},
		},
		{
			name: "guestnet made the Service NodePort: a dropped port had no nodePort to give back",
			gi:   newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.Ports = gi.Spec.Ports[:1] }),
			live: ownedBy(guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 30080), sp("https", 443, 30443)),
				`{"type":"ClusterIP","nodePorts":[{"port":80,"protocol":"TCP"},{"port":443,"protocol":"TCP"}]}`, 80, 443),
		},
		{
			name: "a nodePort guestnet does not own is not touched",
			gi:   newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.Ports = gi.Spec.Ports[:1] }),
			live: ownedBy(guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 30080), sp("https", 443, 30443)),
				`{"nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000}]}`, 80),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			var what, raw []string
			for _, p := range RestoreDropped(tt.gi, tt.live) {
				what, raw = append(what, p.What), append(raw, string(p.Patch))
			}
			g.Expect(what).To(Equal(tt.wantWhat))
			if tt.wantPatches != nil {
				g.Expect(raw).To(Equal(tt.wantPatches))
			}
		})
	}

	// Once the nodePort is back (the restore's own field manager owns it now), the record of
	// the next apply keeps the rest only.
	g := NewWithT(t)
	gi := newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.Ports = gi.Spec.Ports[:1] })
	restored := ownedBy(guestSvc(corev1.ServiceTypeNodePort, sp("http", 80, 30080), sp("https", 443, 31001)),
		`{"nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000},{"port":443,"protocol":"TCP","nodePort":31001}]}`, 80)
	g.Expect(RestoreDropped(gi, restored)).To(BeEmpty())
	ac, _ := GuestService(gi, restored)
	g.Expect(toService(t, ac).Annotations[guestnetv1.OriginalGuestServiceAnnotation]).To(Equal(`{"nodePorts":[{"port":80,"protocol":"TCP","nodePort":31000}]}`))
}

func TestGuestServiceRivalsOf(t *testing.T) {
	at := func(s int) metav1.Time { return metav1.NewTime(t0.Add(time.Duration(s) * time.Second)) }
	gi := func(name string, age int, mutate ...func(*guestnetv1.GuestIngress)) guestnetv1.GuestIngress {
		g := newGI(func(g *guestnetv1.GuestIngress) { g.Name, g.CreationTimestamp = name, at(age) })
		for _, m := range mutate {
			m(g)
		}
		return *g
	}
	envoy := guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"}
	holds := func(g *guestnetv1.GuestIngress) { g.Status.GuestService = envoy.DeepCopy() }
	elsewhere := func(g *guestnetv1.GuestIngress) { g.Spec.GuestService.Name = "other" }
	deleting := func(g *guestnetv1.GuestIngress) { g.DeletionTimestamp = ptr.To(at(99)) }
	tests := []struct {
		name   string
		self   guestnetv1.GuestIngress
		others []guestnetv1.GuestIngress
		// ineligible names the GuestIngresses that may hold nothing (not admitted, paused, ...).
		ineligible []string
		want       GuestServiceRivals
	}{
		{name: "alone", self: gi("web", 5)},
		{name: "the oldest owns it", self: gi("web", 5), others: []guestnetv1.GuestIngress{gi("old", 1), gi("new", 9)}, want: GuestServiceRivals{Owner: "old"}},
		{name: "this one is the oldest", self: gi("web", 1), others: []guestnetv1.GuestIngress{gi("new", 9)}},
		{name: "same second: the name decides", self: gi("b", 1), others: []guestnetv1.GuestIngress{gi("a", 1)}, want: GuestServiceRivals{Owner: "a"}},
		{name: "one naming another Service", self: gi("web", 5), others: []guestnetv1.GuestIngress{gi("old", 1, elsewhere)}},
		{
			name:   "one naming another Service that still holds this one: it gives it back first",
			self:   gi("web", 5),
			others: []guestnetv1.GuestIngress{gi("old", 1, elsewhere, holds)},
			want:   GuestServiceRivals{Holder: "old"},
		},
		{
			name:   "an older one being deleted owns nothing, but holds until it gave it back",
			self:   gi("web", 5),
			others: []guestnetv1.GuestIngress{gi("old", 1, deleting, holds)},
			want:   GuestServiceRivals{Holder: "old"},
		},
		{
			name: "an older one that may hold nothing (not admitted, say) owns nothing: the next one does",
			self: gi("web", 5), others: []guestnetv1.GuestIngress{gi("oldest", 1), gi("old", 2)}, ineligible: []string{"oldest"},
			want: GuestServiceRivals{Owner: "old"},
		},
		{
			name: "... but until it has given the Service back, it holds it",
			self: gi("web", 5), others: []guestnetv1.GuestIngress{gi("oldest", 1, holds)}, ineligible: []string{"oldest"},
			want: GuestServiceRivals{Holder: "oldest"},
		},
		{
			name: "this one may hold nothing and a newer one may: the newer owns it (this one gives it back)",
			self: gi("web", 1), others: []guestnetv1.GuestIngress{gi("new", 9)}, ineligible: []string{"web"},
			want: GuestServiceRivals{Owner: "new"},
		},
		{name: "none may hold anything: nobody else owns it", self: gi("web", 5), others: []guestnetv1.GuestIngress{gi("old", 1)}, ineligible: []string{"web", "old"}},
		{name: "itself in the list", self: gi("web", 5, holds), others: []guestnetv1.GuestIngress{gi("web", 5, holds)}},
		{
			name: "another Cluster's, another namespace's: another guest",
			self: gi("web", 5),
			others: []guestnetv1.GuestIngress{
				gi("old", 1, holds, func(g *guestnetv1.GuestIngress) { g.Spec.ClusterName = "tenant-b" }),
				gi("old", 1, holds, func(g *guestnetv1.GuestIngress) { g.Namespace = "other" }),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			self := tt.self
			eligible := func(g *guestnetv1.GuestIngress) bool { return !slices.Contains(tt.ineligible, g.Name) }
			NewWithT(t).Expect(GuestServiceRivalsOf(&self, tt.others, eligible)).To(Equal(tt.want))
		})
	}
}
