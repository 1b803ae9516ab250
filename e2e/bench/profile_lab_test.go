package bench_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// profilerAddress is where the bench's manager serves net/http/pprof (--profiler-address),
// inside the bench's network namespace.
const profilerAddress = "127.0.0.1:6060"

// cpuProfileSeconds is how long the CPU profile taken from the first creation lasts:
// BENCH_CPU_SECONDS, or by default about as long as a fleet of n takes to converge here.
func cpuProfileSeconds(n int) int {
	if s, err := strconv.Atoi(os.Getenv("BENCH_CPU_SECONDS")); err == nil && s > 0 {
		return s
	}
	return min(max(10, n/2), 300)
}

// profileCPU writes a CPU profile of the next `seconds` to path; the channel closes when it
// is written (or failed: a missing profile is logged, not fatal).
func profileCPU(t *testing.T, path string, seconds int) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := fetch(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", profilerAddress, seconds), path); err != nil {
			t.Logf("CPU profile: %v", err)
		}
	}()
	return done
}

// profileHeap writes a heap profile (after a GC) to path and returns what the manager's Go
// runtime holds right after that GC (RuntimeMemory).
func profileHeap(t *testing.T, path string) RuntimeMemory {
	if err := fetch(fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", profilerAddress), path); err != nil {
		t.Logf("heap profile: %v", err)
		return RuntimeMemory{}
	}
	m := parseMemStats(text(t, fmt.Sprintf("http://%s/debug/pprof/heap?debug=1", profilerAddress)))
	m.Goroutines = parseGoroutineTotal(text(t, fmt.Sprintf("http://%s/debug/pprof/goroutine?debug=1", profilerAddress)))
	return m
}

// fetch writes the body of url to path.
func fetch(url, path string) error {
	body, err := get(url)
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// text returns the body of url ("" if that failed: a missing figure is logged, not fatal).
func text(t *testing.T, url string) string {
	body, err := get(url)
	if err != nil {
		t.Logf("%v", err)
	}
	return string(body)
}

// get returns the body of url, from the bench's own manager on loopback (a CPU profile
// takes up to BENCH_CPU_SECONDS to answer).
func get(url string) ([]byte, error) {
	c := &http.Client{Timeout: 10 * time.Minute}
	resp, err := c.Get(url) //nolint:gosec // the bench's own manager on loopback
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return body, nil
}

// heapShare is one part of the live heap, by the stacks that allocated it.
type heapShare struct {
	Name   string
	focus  string
	ignore string
}

// heapShares split the live heap into what grows with the fleet: the connection to each guest
// (REST mapper from discovery, clients, cache set-up), whether CAPI's ClusterCache holds it
// or guestnet's own guest cache (internal/guestcache), the objects
// the informers hold (host and guest, decoded from lists and watches), what reconciles hold
// while they run, and the rest (the binary's init, buffers).
var heapShares = []heapShare{
	{Name: "guest connections", focus: guestConnections},
	{Name: "cached objects", focus: `\(\*Reflector\)|\(\*StreamWatcher\)`, ignore: guestConnections},
	{Name: "reconciles in flight", focus: `reconcileHandler`, ignore: guestConnections + `|\(\*Reflector\)|\(\*StreamWatcher\)`},
}

// guestConnections matches the stacks that set up a guest connection: CAPI's ClusterCache
// (clustercache.(*clusterAccessor)) or guestnet's internal/guestcache.
const guestConnections = `clustercache\.\(\*clusterAccessor\)|guestcache\.`

// heapBreakdown totals the heap profile at path by heapShares (MiB, with "other" for the
// rest), with `go tool pprof` (the go command runs the bench, so it is there).
func heapBreakdown(t *testing.T, path string) map[string]float64 {
	out := map[string]float64{}
	rest := 0.0
	for i, s := range append([]heapShare{{Name: "total"}}, heapShares...) {
		args := []string{"tool", "pprof", "-sample_index=inuse_space", "-unit=B", "-top", "-nodecount=1000000"}
		if s.focus != "" {
			args = append(args, "-focus="+s.focus)
		}
		if s.ignore != "" {
			args = append(args, "-ignore="+s.ignore)
		}
		text, err := exec.Command("go", append(args, path)...).Output()
		if err != nil {
			t.Logf("go tool pprof %s: %v", path, err)
			return nil
		}
		// "Showing nodes accounting for 11809080B, 29.81% of 39617010B total"
		b := 0.0
		for _, line := range strings.Split(string(text), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Showing nodes accounting for "); ok {
				b, _ = strconv.ParseFloat(strings.TrimSuffix(strings.Fields(v)[0], "B,"), 64)
			}
		}
		if i == 0 {
			rest = b
			continue
		}
		out[s.Name] = b / (1 << 20)
		rest -= b
	}
	out["other"] = rest / (1 << 20)
	return out
}
