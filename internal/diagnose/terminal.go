package diagnose

import (
	"fmt"
	"strings"
	"unicode"
)

// terminalSafe returns s with every rune a terminal would act on instead of print written as
// a \u escape: control characters (ESC starts the sequences that move the cursor, rewrite
// lines, set the window title or, in some terminals, write files) and the bidirectional
// overrides and isolates that make text read differently from what it holds. Much of what a
// report says comes from the guest cluster (condition messages of its APIServices, the names
// its certificates carry, errors its servers answer with) and from a tenant's objects, and
// the provider admin reads it on a terminal: none of it may drive that terminal (kubectl had
// the same hole, CVE-2021-25743).
func terminalSafe(s string) string {
	if strings.IndexFunc(s, unsafeForTerminal) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unsafeForTerminal(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func unsafeForTerminal(r rune) bool {
	switch {
	case unicode.IsControl(r): // C0, DEL and C1 (U+0080-U+009F, where CSI is U+009B)
		return true
	case r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069', r == '\u200e', r == '\u200f', r == '\u061c':
		return true // bidirectional embeddings, overrides, isolates and marks
	}
	return r == unicode.ReplacementChar // invalid UTF-8 as it was decoded
}
