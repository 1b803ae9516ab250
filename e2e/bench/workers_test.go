package bench_test

import (
	"testing"

	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/utils/ptr"
)

// The window between two scrapes: per controller, the reconciles and queue waits of the
// window only (series of one controller summed, e.g. by priority or result), the p99 as the
// bound of its bucket, the waits over 1 s and 10 s counted; a controller idle in the window is
// left out.
func TestControllerWindows(t *testing.T) {
	g := NewWithT(t)
	// Cumulative counts for the bounds 0.1, 1 (as multiplication computes it), 10 and 100.
	hist := func(metric, label, controller string, sum float64, counts ...uint64) *dto.MetricFamily {
		bounds := []float64{0.1, 0.9999999999999999, 10, 100}
		h := &dto.Histogram{SampleCount: ptr.To(counts[len(counts)-1]), SampleSum: ptr.To(sum)}
		for i, b := range bounds {
			h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: ptr.To(b), CumulativeCount: ptr.To(counts[i])})
		}
		return &dto.MetricFamily{Name: ptr.To(metric), Metric: []*dto.Metric{{
			Label:     []*dto.LabelPair{{Name: ptr.To(label), Value: ptr.To(controller)}},
			Histogram: h,
		}}}
	}
	before := []*dto.MetricFamily{
		hist(reconcileTimeMetric, "controller", "bridge", 10, 100, 100, 100, 100),
		hist(queueWaitMetric, "name", "bridge", 50, 90, 95, 100, 100),
		hist(reconcileTimeMetric, "controller", "idle", 1, 5, 5, 5, 5),
	}
	after := []*dto.MetricFamily{
		// 10 more reconciles: 8 under 0.1 s, 2 under 1 s.
		hist(reconcileTimeMetric, "controller", "bridge", 11.5, 108, 110, 110, 110),
		// 10 more waits: 1 under 0.1 s, 1 more under 1 s, 6 more under 10 s, 2 more under 100 s.
		hist(queueWaitMetric, "name", "bridge", 150, 91, 97, 108, 110),
		hist(reconcileTimeMetric, "controller", "idle", 1, 5, 5, 5, 5),
		hist(reconcileTimeMetric, "controller", "new", 0.5, 2, 2, 2, 2),
	}
	g.Expect(controllerWindows(before, after)).To(Equal([]ControllerWindow{
		{Controller: "bridge", Reconciles: 10, ReconcileMean: 0.15, ReconcileP99: 0.9999999999999999,
			QueueWaits: 10, QueueWaitMean: 10, QueueWaitP99: 100, QueueWaitOver1s: 8, QueueWaitOver10s: 2},
		{Controller: "new", Reconciles: 2, ReconcileMean: 0.25, ReconcileP99: 0.1},
	}))

	// Two series of one controller (results, priorities) are one histogram.
	twoSeries := hist(queueWaitMetric, "controller", "bridge", 4, 1, 2, 2, 2)
	twoSeries.Metric = append(twoSeries.Metric, hist(queueWaitMetric, "controller", "bridge", 4, 0, 0, 2, 2).Metric[0])
	g.Expect(controllerWindows(nil, []*dto.MetricFamily{twoSeries})).To(Equal([]ControllerWindow{
		{Controller: "bridge", QueueWaits: 4, QueueWaitMean: 2, QueueWaitP99: 10, QueueWaitOver1s: 2},
	}))
}
