package nodeagent

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Results of one sync of the kernel with the Node, the label of guestnet_node_agent_syncs_total.
const (
	// SyncChanged: the kernel was brought to what the Node says (something was written).
	SyncChanged = "changed"
	// SyncUnchanged: the kernel already was.
	SyncUnchanged = "unchanged"
	// SyncWaiting: nothing to do yet (no Node, no InternalIP, the kubelet's own address).
	SyncWaiting = "waiting"
	// SyncError: the kernel could not be read or written, or the node IP does not answer.
	SyncError = "error"
	// SyncRemoved: --remove took (or kept) everything off.
	SyncRemoved = "removed"
)

// agentMetrics are the agent's own metrics, on a registry of its own (the manager's are not
// the agent's business), served at /metrics next to /readyz.
type agentMetrics struct {
	registry   *prometheus.Registry
	syncs      *prometheus.CounterVec
	ready      prometheus.Gauge
	lastChange prometheus.Gauge
}

func newAgentMetrics() *agentMetrics {
	m := &agentMetrics{
		registry: prometheus.NewRegistry(),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "guestnet_node_agent_syncs_total",
			Help: "Syncs of the VM's kernel with its Node, by result: changed (written), unchanged, waiting, error, removed.",
		}, []string{"result"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "guestnet_node_agent_ready",
			Help: "1 when the node IP is a local address of the VM and a request to it works from inside the VM (what /readyz says), else 0.",
		}),
		lastChange: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "guestnet_node_agent_last_change_timestamp_seconds",
			Help: "When the agent last wrote the kernel (Unix time); 0 when it has not since it started.",
		}),
	}
	for _, r := range []string{SyncChanged, SyncUnchanged, SyncWaiting, SyncError, SyncRemoved} {
		m.syncs.WithLabelValues(r) // every result reads 0 before it first happens
	}
	m.registry.MustRegister(m.syncs, m.ready, m.lastChange)
	return m
}

// synced records the result of one sync.
func (m *agentMetrics) synced(result string, ready bool, now time.Time) {
	m.syncs.WithLabelValues(result).Inc()
	if ready {
		m.ready.Set(1)
	} else {
		m.ready.Set(0)
	}
	if result == SyncChanged {
		m.lastChange.Set(float64(now.Unix()))
	}
}

func (m *agentMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
