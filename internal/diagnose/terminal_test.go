package diagnose

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// A guest admin writes what the report quotes (an APIService's condition message, a
// certificate's names, a server's error): none of it reaches the admin's terminal as a
// control sequence.
func TestWriteText_GuestTextCannotDriveTheTerminal(t *testing.T) {
	hostile := "FailedDiscoveryCheck \x1b]0;owned\x07\x1b[2J\x1b[1A\r[OK] all good\u202eevil\u009b31m\xff"
	r := &Report{Namespace: "tenant-a", Cluster: "c1\x1b[8m", Results: []Result{{
		Verdict: Fail, Check: CheckAPIService, Object: "v1beta1.metrics.k8s.io\x1b[0m",
		Detail: hostile, Fix: hostile, Runbook: "docs/runbook.md#apiservice-unavailable",
	}}}
	var out bytes.Buffer
	if err := r.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if !utf8.ValidString(text) {
		t.Errorf("the text output is not valid UTF-8: %q", text)
	}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if j := strings.IndexFunc(line, unsafeForTerminal); j >= 0 {
			r, _ := utf8.DecodeRuneInString(line[j:])
			t.Errorf("line %d holds %U a terminal acts on: %q", i, r, line)
		}
	}
	for _, want := range []string{`\u001b]0;owned\u0007`, `\u000d[OK] all good`, `\u202eevil`, `\u009b31m`, `c1\u001b[8m`} {
		if !strings.Contains(text, want) {
			t.Errorf("the output should show %s as text; got %q", want, text)
		}
	}
}

func TestTerminalSafe_LeavesPrintableTextAlone(t *testing.T) {
	for _, s := range []string{"", "plain ASCII: 10.98.80.10:443", "Grüße, 日本語, emoji 🚀", "tab\tis shown"} {
		got := terminalSafe(s)
		if strings.Contains(s, "\t") {
			if got != `tab\u0009is shown` {
				t.Errorf("terminalSafe(%q) = %q", s, got)
			}
			continue
		}
		if got != s {
			t.Errorf("terminalSafe(%q) = %q, want it unchanged", s, got)
		}
	}
}

func FuzzTerminalSafe(f *testing.F) {
	f.Add("\x1b[2J")
	f.Add("ok")
	f.Add("\u202e\xff\x9b")
	f.Fuzz(func(t *testing.T, s string) {
		got := terminalSafe(s)
		if strings.IndexFunc(got, unsafeForTerminal) >= 0 || !utf8.ValidString(got) {
			t.Fatalf("terminalSafe(%q) = %q still holds what a terminal acts on", s, got)
		}
	})
}
