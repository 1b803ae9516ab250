package bench_test

import (
	"sort"

	dto "github.com/prometheus/client_model/go"
)

// Where a repair's time goes: while one kind of drift is measured, the manager's own
// controller-runtime metrics (two scrapes of /metrics, before and after) say per controller
// how long its items waited in the queue for a worker and how long its reconciles ran. A
// repair much slower than the reconciles of its controller waited for a worker (or for an
// event); one as slow as them was slow work.

const (
	queueWaitMetric     = "workqueue_queue_duration_seconds"
	reconcileTimeMetric = "controller_runtime_reconcile_time_seconds"
)

// ControllerWindow is what one controller did in a window, from the difference of two scrapes.
// The p99 figures are the upper bound of the histogram bucket that holds the 99th percentile
// (controller-runtime's buckets: powers of ten for the queue, 5 ms to 60 s for reconciles).
type ControllerWindow struct {
	Controller string `json:"controller"`
	// Reconciles is how many reconciles ended in the window.
	Reconciles       int     `json:"reconciles"`
	ReconcileMean    float64 `json:"reconcileMeanSeconds"`
	ReconcileP99     float64 `json:"reconcileP99Seconds"`
	QueueWaits       int     `json:"queueWaits"`
	QueueWaitMean    float64 `json:"queueWaitMeanSeconds"`
	QueueWaitP99     float64 `json:"queueWaitP99Seconds"`
	QueueWaitOver1s  int     `json:"queueWaitsOver1s"`
	QueueWaitOver10s int     `json:"queueWaitsOver10s"`
}

// histogram is one controller's histogram: sample count and sum, and cumulative counts by
// upper bound.
type histogram struct {
	count   uint64
	sum     float64
	buckets map[float64]uint64
}

// controllerHistograms sums the series of metric by controller (the label "controller", or
// "name" for the workqueue metrics of releases that have only that one).
func controllerHistograms(families []*dto.MetricFamily, metric string) map[string]*histogram {
	out := map[string]*histogram{}
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			name := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" || (name == "" && l.GetName() == "name") {
					name = l.GetValue()
				}
			}
			if name == "" {
				continue
			}
			sum := out[name]
			if sum == nil {
				sum = &histogram{buckets: map[float64]uint64{}}
				out[name] = sum
			}
			sum.count += h.GetSampleCount()
			sum.sum += h.GetSampleSum()
			for _, b := range h.GetBucket() {
				sum.buckets[b.GetUpperBound()] += b.GetCumulativeCount()
			}
		}
	}
	return out
}

// minus is h after less what it held before (before may be nil: nothing before).
func (h *histogram) minus(before *histogram) *histogram {
	if before == nil {
		return h
	}
	d := &histogram{count: h.count - before.count, sum: h.sum - before.sum, buckets: map[float64]uint64{}}
	for bound, c := range h.buckets {
		d.buckets[bound] = c - before.buckets[bound]
	}
	return d
}

// quantileBound is the upper bound of the bucket that holds quantile q (the last finite bound
// when it lies beyond it), 0 for an empty histogram.
func (h *histogram) quantileBound(q float64) float64 {
	if h == nil || h.count == 0 {
		return 0
	}
	bounds := make([]float64, 0, len(h.buckets))
	for b := range h.buckets {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	want := q * float64(h.count)
	for _, b := range bounds {
		if float64(h.buckets[b]) >= want {
			return b
		}
	}
	return bounds[len(bounds)-1]
}

// over is how many samples were above the largest bucket bound not above bound (exponential
// buckets are computed by multiplication: 1 may be 0.9999999999999999).
func (h *histogram) over(bound float64) int {
	if h == nil {
		return 0
	}
	at, found := 0.0, false
	for b := range h.buckets {
		if b <= bound*(1+1e-9) && (!found || b > at) {
			at, found = b, true
		}
	}
	if !found {
		return int(h.count)
	}
	return int(h.count - h.buckets[at])
}

func (h *histogram) mean() float64 {
	if h == nil || h.count == 0 {
		return 0
	}
	return h.sum / float64(h.count)
}

// controllerWindows is, for each controller that reconciled or dequeued in the window between
// two scrapes, what it did; sorted by controller.
func controllerWindows(before, after []*dto.MetricFamily) []ControllerWindow {
	reconcileBefore, reconcileAfter := controllerHistograms(before, reconcileTimeMetric), controllerHistograms(after, reconcileTimeMetric)
	queueBefore, queueAfter := controllerHistograms(before, queueWaitMetric), controllerHistograms(after, queueWaitMetric)
	names := map[string]bool{}
	for name := range reconcileAfter {
		names[name] = true
	}
	for name := range queueAfter {
		names[name] = true
	}
	var out []ControllerWindow
	for name := range names {
		var reconciles, waits *histogram
		if h := reconcileAfter[name]; h != nil {
			reconciles = h.minus(reconcileBefore[name])
		}
		if h := queueAfter[name]; h != nil {
			waits = h.minus(queueBefore[name])
		}
		w := ControllerWindow{Controller: name}
		if reconciles != nil {
			w.Reconciles, w.ReconcileMean, w.ReconcileP99 = int(reconciles.count), reconciles.mean(), reconciles.quantileBound(0.99)
		}
		if waits != nil {
			w.QueueWaits, w.QueueWaitMean, w.QueueWaitP99 = int(waits.count), waits.mean(), waits.quantileBound(0.99)
			w.QueueWaitOver1s, w.QueueWaitOver10s = waits.over(1), waits.over(10)
		}
		if w.Reconciles == 0 && w.QueueWaits == 0 {
			continue
		}
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Controller < out[j].Controller })
	return out
}
