package nodeagent

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestAgentMetrics(t *testing.T) {
	g := NewWithT(t)
	m := newAgentMetrics()
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", http.NoBody))
		body, err := io.ReadAll(rec.Result().Body)
		g.Expect(err).NotTo(HaveOccurred())
		return string(body)
	}
	before := scrape()
	g.Expect(before).To(ContainSubstring(`guestnet_node_agent_syncs_total{result="error"} 0`), "every result is there from the start")
	g.Expect(before).To(ContainSubstring("guestnet_node_agent_ready 0"))
	g.Expect(before).To(ContainSubstring("guestnet_node_agent_last_change_timestamp_seconds 0"))

	m.synced(SyncWaiting, false, time.Unix(100, 0))
	m.synced(SyncChanged, true, time.Unix(200, 0))
	m.synced(SyncUnchanged, true, time.Unix(300, 0))
	after := scrape()
	for _, want := range []string{
		`guestnet_node_agent_syncs_total{result="waiting"} 1`,
		`guestnet_node_agent_syncs_total{result="changed"} 1`,
		`guestnet_node_agent_syncs_total{result="unchanged"} 1`,
		"guestnet_node_agent_ready 1",
		"guestnet_node_agent_last_change_timestamp_seconds 200", // an unchanged sync is no change
	} {
		g.Expect(after).To(ContainSubstring(want))
	}
	m.synced(SyncError, false, time.Unix(400, 0))
	g.Expect(scrape()).To(ContainSubstring("guestnet_node_agent_ready 0"))
}
