package bench_test

import (
	"strconv"
	"testing"

	. "github.com/onsi/gomega"
)

// The runtime's MemStats at the end of a heap profile's text form split into the parts of
// the manager's memory; the goroutine profile's header gives their number.
func TestParseMemStats(t *testing.T) {
	g := NewWithT(t)
	const mib = 1 << 20
	text := "heap profile: 1: 2 [3: 4] @ heap/1048576\n" +
		"1: 2 [3: 4] @ 0x1\n\n" +
		"# runtime.MemStats\n" +
		"# Sys = 999\n" +
		"# HeapAlloc = " + itoa(100*mib) + "\n" +
		"# HeapSys = " + itoa(400*mib) + "\n" +
		"# HeapIdle = " + itoa(290*mib) + "\n" +
		"# HeapInuse = " + itoa(110*mib) + "\n" +
		"# HeapReleased = " + itoa(40*mib) + "\n" +
		"# Stack = " + itoa(20*mib) + " / " + itoa(21*mib) + "\n" +
		"# MSpan = " + itoa(3*mib) + " / " + itoa(4*mib) + "\n" +
		"# MCache = " + itoa(1*mib) + " / " + itoa(2*mib) + "\n" +
		"# BuckHashSys = " + itoa(2*mib) + "\n" +
		"# GCSys = " + itoa(10*mib) + "\n" +
		"# OtherSys = " + itoa(4*mib) + "\n" +
		"# NextGC = 12345\n"
	m := parseMemStats(text)
	g.Expect(m).To(Equal(RuntimeMemory{LiveHeap: 100, HeapUnused: 10, HeapKept: 250, Stacks: 20, Runtime: 20}))
	g.Expect(m.Resident()).To(Equal(400.0))

	g.Expect(parseGoroutineTotal("goroutine profile: total 1434\n202 @ 0x48c46e\n")).To(Equal(1434.0))
	g.Expect(parseMemStats("")).To(Equal(RuntimeMemory{}), "no profile: no figures")

	m.Goroutines = 1434
	base := RuntimeMemory{LiveHeap: 50, Stacks: 10, Goroutines: 434}
	g.Expect(m.PerCluster(base, 1000)).To(Equal(RuntimeMemory{
		LiveHeap: 51.2, HeapUnused: 10.24, HeapKept: 256, Stacks: 10.24, Runtime: 20.48, Goroutines: 1,
	}))
}

func itoa(n int) string { return strconv.Itoa(n) }
