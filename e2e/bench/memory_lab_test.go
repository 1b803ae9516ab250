package bench_test

import (
	"strconv"
	"strings"
)

// RuntimeMemory is what the manager's Go runtime holds, in MiB, as its runtime.MemStats say
// right after a forced GC: the parts of its anonymous RSS, to say what a guest cluster costs
// beside its live heap.
type RuntimeMemory struct {
	// LiveHeap is the live heap objects (HeapAlloc).
	LiveHeap float64 `json:"liveHeapMiB"`
	// HeapUnused is what the heap's spans in use hold beside live objects (HeapInuse -
	// HeapAlloc): free slots of partly used spans.
	HeapUnused float64 `json:"heapUnusedMiB"`
	// HeapKept is the free spans the runtime has not returned to the kernel yet (HeapIdle -
	// HeapReleased): the garbage of the last cycles, which the GC's pacing (GOGC) let grow
	// up to the size of the live heap, and what a peak left.
	HeapKept float64 `json:"heapKeptMiB"`
	// Stacks is the goroutines' stacks (StackInuse).
	Stacks float64 `json:"stacksMiB"`
	// Runtime is the runtime's own structures: span and cache metadata, the GC's bitmaps and
	// the profiler's buckets (MSpanInuse + MCacheInuse + GCSys + BuckHashSys + OtherSys).
	Runtime float64 `json:"runtimeMiB"`
	// Goroutines is their number.
	Goroutines float64 `json:"goroutines"`
}

// Resident is the sum of the parts: what the runtime keeps mapped and, but for what the
// kernel has not faulted in, resident.
func (m RuntimeMemory) Resident() float64 {
	return m.LiveHeap + m.HeapUnused + m.HeapKept + m.Stacks + m.Runtime
}

// PerCluster is (m - base) / n for every part: in KiB, and goroutines per cluster.
func (m RuntimeMemory) PerCluster(base RuntimeMemory, n int) RuntimeMemory {
	return RuntimeMemory{
		LiveHeap:   perClusterKiB(m.LiveHeap, base.LiveHeap, n),
		HeapUnused: perClusterKiB(m.HeapUnused, base.HeapUnused, n),
		HeapKept:   perClusterKiB(m.HeapKept, base.HeapKept, n),
		Stacks:     perClusterKiB(m.Stacks, base.Stacks, n),
		Runtime:    perClusterKiB(m.Runtime, base.Runtime, n),
		Goroutines: (m.Goroutines - base.Goroutines) / float64(n),
	}
}

// perClusterKiB is what each of n guest clusters adds to a figure in MiB, from base to end,
// in KiB.
func perClusterKiB(end, base float64, n int) float64 { return (end - base) * 1024 / float64(n) }

// parseMemStats reads the runtime.MemStats that the text form of a heap profile
// (/debug/pprof/heap?debug=1) ends with ("# HeapAlloc = 123", "# Stack = inuse / sys").
func parseMemStats(text string) RuntimeMemory {
	stats := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		name, value, ok := strings.Cut(strings.TrimPrefix(line, "# "), " = ")
		if !ok || !strings.HasPrefix(line, "# ") {
			continue
		}
		inuse, _, _ := strings.Cut(value, " / ") // "Stack = inuse / sys": the part in use
		if v, err := strconv.ParseFloat(strings.TrimSpace(inuse), 64); err == nil {
			stats[name] = v / (1 << 20)
		}
	}
	return RuntimeMemory{
		LiveHeap:   stats["HeapAlloc"],
		HeapUnused: stats["HeapInuse"] - stats["HeapAlloc"],
		HeapKept:   stats["HeapIdle"] - stats["HeapReleased"],
		Stacks:     stats["Stack"],
		Runtime:    stats["MSpan"] + stats["MCache"] + stats["GCSys"] + stats["BuckHashSys"] + stats["OtherSys"],
	}
}

// parseGoroutineTotal reads "goroutine profile: total N" of /debug/pprof/goroutine?debug=1.
func parseGoroutineTotal(text string) float64 {
	first, _, _ := strings.Cut(text, "\n")
	n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(first, "goroutine profile: total ")))
	return float64(n)
}
