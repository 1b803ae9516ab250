package bench_test

import (
	"encoding/json"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// auditLines reads audit events as the apiserver writes them, one JSON object per line.
func auditLines(t *testing.T, lines ...string) []lab.AuditRequest {
	t.Helper()
	out := make([]lab.AuditRequest, 0, len(lines))
	for _, l := range lines {
		var q lab.AuditRequest
		if err := json.Unmarshal([]byte(l), &q); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		out = append(out, q)
	}
	return out
}

// The restart's tables: answer times by verb and resource and minute by minute, counted from
// the first request; watches are neither counted nor timed (they stay open), a request whose
// answer the log does not hold yet is counted but not timed.
func TestRestartTables(t *testing.T) {
	g := NewWithT(t)
	reqs := auditLines(t,
		`{"verb":"patch","objectRef":{"resource":"services"},"requestReceivedTimestamp":"2026-12-05T10:00:00.000Z","stageTimestamp":"2026-12-05T10:00:00.100Z"}`,
		`{"verb":"patch","objectRef":{"resource":"services"},"requestReceivedTimestamp":"2026-12-05T10:00:30.000Z","stageTimestamp":"2026-12-05T10:00:30.300Z"}`,
		`{"verb":"watch","objectRef":{"resource":"services"},"requestReceivedTimestamp":"2026-12-05T09:59:00.000Z","stageTimestamp":"2026-12-05T09:59:00.001Z"}`,
		`{"verb":"create","objectRef":{"resource":"events"},"requestReceivedTimestamp":"2026-12-05T10:01:10.000Z","stageTimestamp":"2026-12-05T10:01:10.020Z"}`,
		`{"verb":"get","objectRef":{"resource":"services"},"requestReceivedTimestamp":"2026-12-05T10:01:20.000Z","stageTimestamp":"2026-12-05T10:01:20.040Z"}`,
		`{"verb":"patch","objectRef":{"resource":"guestingresses","subresource":"status"},"requestReceivedTimestamp":"2026-12-05T10:02:50.000Z"}`,
	)

	lat := latencies(reqs)
	g.Expect(lat).To(HaveLen(3))
	g.Expect(lat["patch services"].Count).To(Equal(2))
	g.Expect(lat["patch services"].Mean).To(BeNumerically("~", 200, 0.01))
	g.Expect(lat["patch services"].P99).To(BeNumerically("~", 300, 0.01))
	g.Expect(lat["create events"]).To(Equal(LatencyMs{Count: 1, Mean: 20, P99: 20}))

	tl := timeline(reqs)
	g.Expect(tl).To(HaveLen(3))
	g.Expect(tl[0]).To(Equal(TimelineMinute{Minute: 0, Requests: 2, Writes: 2, MeanMs: 200}))
	g.Expect(tl[1].Requests).To(Equal(2))
	g.Expect(tl[1].Events).To(Equal(1))
	g.Expect(tl[1].Writes).To(Equal(0))
	g.Expect(tl[1].MeanMs).To(BeNumerically("~", 30, 0.01))
	g.Expect(tl[2]).To(Equal(TimelineMinute{Minute: 2, Requests: 1, Writes: 1}))

	r := Result{N: 2, RestartRequests: byVerbAndResource(reqs), RestartLatency: lat, RestartTimeline: tl,
		Floor: &FloorResult{FloorAll: 10, GuestnetAll: 30,
			FloorCPU:    map[string]float64{"etcd": 1, "kube-apiserver": 4},
			GuestnetCPU: map[string]float64{"kube-apiserver": 6, "manager": 2}}}
	md := restartMarkdown(r)
	for _, row := range []string{
		"| patch services | 2 | 1.0 | 200.0 | 300.0 |",
		"| create events | 1 | 0.5 | 20.0 | 20.0 |",
		"| etcd | 1.0 | 0.0 |",
		"| manager | 0.0 | 2.0 |",
		"| all | 5.0 | 8.0 |",
		"| 2 | 1 | 1 | 0 | 0.0 |",
	} {
		g.Expect(md).To(ContainSubstring(row))
	}
	g.Expect(strings.Index(md, "| create events")).To(BeNumerically("<", strings.Index(md, "| patch services")))
	g.Expect(restartMarkdown(Result{N: 2})).To(BeEmpty())
}
