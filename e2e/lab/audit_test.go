package lab

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

// A reader opened while the apiserver is writing a line starts after that line: the request
// was made before the phase the reader counts, and half a line is no JSON (a CI run failed
// on "invalid character ':' looking for beginning of value").
func TestAuditLogOpenedMidLineStartsAtTheNextLine(t *testing.T) {
	g := NewWithT(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	before := `{"verb":"get","userAgent":"guestnet/v0"}` + "\n"
	inFlight := `{"verb":"list","userAgent":"guestnet/v0"}` + "\n"
	after := `{"verb":"patch","userAgent":"guestnet/v0"}` + "\n"
	half := len(inFlight) / 2
	g.Expect(os.WriteFile(path, []byte(before+inFlight[:half]), 0o600)).To(Succeed())

	a, err := openAuditLog(path)
	g.Expect(err).NotTo(HaveOccurred())
	got, err := a.Next("guestnet")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(BeEmpty(), "the line in flight is not complete yet")

	appendTo(g, path, inFlight[half:])
	got, err = a.Next("guestnet")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(BeEmpty(), "the line in flight was made before the reader")

	appendTo(g, path, after)
	got, err = a.Next("guestnet")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(HaveLen(1))
	g.Expect(got[0].Verb).To(Equal("patch"))
}

// A reader opened at a line's end reads every line after it.
func TestAuditLogOpenedAtALineEndReadsWhatFollows(t *testing.T) {
	g := NewWithT(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	g.Expect(os.WriteFile(path, []byte(`{"verb":"get","userAgent":"guestnet/v0"}`+"\n"), 0o600)).To(Succeed())
	a, err := openAuditLog(path)
	g.Expect(err).NotTo(HaveOccurred())
	appendTo(g, path, `{"verb":"list","userAgent":"guestnet/v0"}`+"\n"+`{"verb":"get","userAgent":"kubectl"}`+"\n")
	got, err := a.Next("guestnet")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(HaveLen(1))
	g.Expect(got[0].Verb).To(Equal("list"))
}

func appendTo(g Gomega, path, s string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = f.WriteString(s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.Close()).To(Succeed())
}
