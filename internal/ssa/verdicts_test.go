package ssa

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// An answer is the Service's at one resourceVersion: the same version is not looked at again
// (its content cannot differ), a new one is, and so is another desired configuration.
func TestServiceUpToDateIsRememberedPerResourceVersion(t *testing.T) {
	g := NewWithT(t)
	serviceVerdicts = newVerdicts(time.Now)
	svc := live(ownership.FieldManager)
	svc.UID = "7d0c3c4e-0d0a-4b0e-9a4c-1f6b7a0e2a11"
	g.Expect(ServiceUpToDate(desired(), svc)).To(BeTrue())
	g.Expect(serviceVerdicts.len()).To(Equal(1))

	// Only the remembered answer can say true here: the selector guestnet owns was changed,
	// which no Service at resourceVersion 42 can be.
	svc.Spec.Selector["app"] = "other"
	g.Expect(ServiceUpToDate(desired(), svc)).To(BeTrue())

	svc.ResourceVersion = "43"
	g.Expect(ServiceUpToDate(desired(), svc)).To(BeFalse())

	other := desired()
	other.Spec.Selector["app"] = "other"
	g.Expect(ServiceUpToDate(other, svc)).To(BeTrue())
	g.Expect(serviceVerdicts.len()).To(Equal(3))
}

// A Service without an identity (built in memory) is never remembered.
func TestServiceUpToDateWithoutUIDIsNotRemembered(t *testing.T) {
	g := NewWithT(t)
	serviceVerdicts = newVerdicts(time.Now)
	g.Expect(ServiceUpToDate(desired(), live(ownership.FieldManager))).To(BeTrue())
	g.Expect(serviceVerdicts.len()).To(BeZero())
}

// Answers asked for within a generation stay for the next; the others go after two.
func TestVerdictsLastTwoGenerations(t *testing.T) {
	g := NewWithT(t)
	now := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	v := newVerdicts(func() time.Time { return now })
	asked, forgotten := verdictKey{uid: "a", resourceVersion: "1"}, verdictKey{uid: "b", resourceVersion: "1"}
	v.put(asked, true)
	v.put(forgotten, false)

	now = now.Add(verdictsGeneration)
	_, ok := v.get(asked) // moved on into the new generation
	g.Expect(ok).To(BeTrue())
	g.Expect(v.len()).To(Equal(3))

	now = now.Add(verdictsGeneration)
	got, ok := v.get(asked)
	g.Expect(ok).To(BeTrue())
	g.Expect(got).To(BeTrue())
	_, ok = v.get(forgotten)
	g.Expect(ok).To(BeFalse())
}

// BenchmarkServiceUpToDate: the answer computed (extracting guestnet's fields) against
// remembered.
func BenchmarkServiceUpToDate(b *testing.B) {
	svc := live(ownership.FieldManager)
	d := desired()
	b.Run("computed", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			serviceVerdicts = newVerdicts(time.Now)
			svc.UID = "u"
			if ok, err := ServiceUpToDate(d, svc); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("remembered", func(b *testing.B) {
		b.ReportAllocs()
		serviceVerdicts = newVerdicts(time.Now)
		svc.UID = "u"
		for b.Loop() {
			if ok, err := ServiceUpToDate(d, svc); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
}
