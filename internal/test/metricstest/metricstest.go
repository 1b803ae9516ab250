// Package metricstest reads guestnet's metrics in tests.
package metricstest

import (
	"strings"

	"github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Series are the values of metric name in what gatherer gathers, by the values of labels
// joined with "/" (the other labels are summed over).
func Series(g gomega.Gomega, gatherer prometheus.Gatherer, name string, labels ...string) map[string]float64 {
	families, err := gatherer.Gather()
	g.Expect(err).NotTo(gomega.HaveOccurred())
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[labelKey(m, labels)] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

func labelKey(m *dto.Metric, labels []string) string {
	values := map[string]string{}
	for _, l := range m.GetLabel() {
		values[l.GetName()] = l.GetValue()
	}
	key := make([]string, len(labels))
	for i, l := range labels {
		key[i] = values[l]
	}
	return strings.Join(key, "/")
}
