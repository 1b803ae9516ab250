package bench_test

import (
	"testing"

	. "github.com/onsi/gomega"
)

// What a steady-state write changed: the fields by path, conditions by type, the
// lastTransitionTime left out; an object written without a status change says so; objects
// not written are not listed.
func TestStatusChanges(t *testing.T) {
	g := NewWithT(t)
	cond := func(typ, msg, at string) map[string]any {
		return map[string]any{"type": typ, "status": "False", "message": msg, "lastTransitionTime": at}
	}
	before := statusSnapshot{
		"GuestWebhookBridge a/b": {"1", map[string]any{"conditions": []any{cond("Ready", "dial: connection refused", "t1"), cond("Paused", "", "t1")}}},
		"GuestIngress a/c":       {"5", map[string]any{"readyEndpoints": 2.0}},
		"GuestIngress a/d":       {"7", map[string]any{"readyEndpoints": 2.0}},
	}
	after := statusSnapshot{
		"GuestWebhookBridge a/b": {"2", map[string]any{"conditions": []any{cond("Paused", "", "t1"), cond("Ready", "no answer within 5s", "t2")}}},
		"GuestIngress a/c":       {"6", map[string]any{"readyEndpoints": 2.0}},
		"GuestIngress a/d":       {"7", map[string]any{"readyEndpoints": 2.0}},
	}
	written, changes := statusChanges(before, after)
	g.Expect(written).To(Equal(2))
	g.Expect(changes).To(Equal([]string{
		"GuestIngress a/c: status unchanged",
		`GuestWebhookBridge a/b: status.conditions.Ready.message: "dial: connection refused" -> "no answer within 5s"`,
	}))
}
