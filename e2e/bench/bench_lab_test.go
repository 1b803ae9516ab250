// Package bench is `make bench` (docs/performance.md): for each fleet size N of BENCH_N, a fresh lab
// with audit logs, the real manager binary (GUESTNET_MANAGER_BIN) as its own process, and a
// fleet of N guest clusters (e2e/lab.CreateFleetMember; every BENCH_BRIDGE_EVERY-th with a
// GuestWebhookBridge). It measures the time from creation until each GuestIngress is Ready
// and each bridge has bridged its targets, the manager's requests per object from the
// apiservers' audit logs at creation and over a resync at steady state, and the manager's RSS
// and CPU seconds; it writes BENCH_OUT/results.md and results.json. It asserts nothing: the
// regression guard is e2e/scale, in `make test`. Without BENCH_N (set by `make bench`) it is skipped.
package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

// Result is one fleet size's measurement.
type Result struct {
	N       int `json:"n"`
	Bridges int `json:"bridges"`
	// Seconds from its creation until each GuestIngress was seen Ready / each bridge was
	// seen with TargetsBridged True (polled every 200 ms).
	ReadyP50 float64 `json:"readyP50Seconds"`
	ReadyP99 float64 `json:"readyP99Seconds"`
	ReadyMax float64 `json:"readyMaxSeconds"`
	// AllReady is the time from the first creation until the last object was ready.
	AllReady float64 `json:"allReadySeconds"`
	// The manager's writes (host and guest, events apart) while the fleet converged, per
	// member, and of them the status writes; its events.
	WritesPerMember       float64        `json:"writesPerMember"`
	StatusWritesPerMember float64        `json:"statusWritesPerMember"`
	Events                int            `json:"events"`
	CreationRequests      map[string]int `json:"creationRequests"`
	// Over one resync period at steady state: the manager's writes and live reads.
	SteadyWrites   int            `json:"steadyWrites"`
	SteadyReads    int            `json:"steadyReads"`
	SteadyRequests map[string]int `json:"steadyRequests"`
	// The manager process at the end: resident memory (and its peak) in MiB, CPU seconds.
	// ConnectFailures counts the ClusterCache's "Connect failed" log lines: each is a guest
	// cluster tried before it could be reached (its kubeconfig Secret not there yet), which
	// the ClusterCache retries 30 s later.
	ConnectFailures int `json:"connectFailures"`

	RSSMiB float64 `json:"rssMiB"`
	// AnonRSSMiB is the part of RSS that is not the binary's mapped pages (heap, stacks).
	AnonRSSMiB float64 `json:"anonRssMiB"`
	PeakRSSMiB float64 `json:"peakRssMiB"`
	// HeapMiB is the manager's live Go heap after a forced GC, at the end; HeapShares splits
	// its profile by what allocated it (heapShares).
	HeapMiB    float64            `json:"heapMiB"`
	HeapShares map[string]float64 `json:"heapSharesMiB"`
	CPUSeconds float64            `json:"cpuSeconds"`

	// Repairs are the drift repair latencies at steady state (repair_lab_test.go).
	Repairs []RepairStats `json:"repairs"`
	// Floor compares guestnet with a plain client writing the same objects (floor_lab_test.go).
	Floor *FloorResult `json:"floor,omitempty"`
}

const (
	resync = 30 * time.Second
	// quiet: as in e2e/scale, longer than client-go's 10 s retry of a failed event write.
	quiet = 12 * time.Second
)

func TestBench(t *testing.T) {
	// Only `make bench` runs it (it sets BENCH_N): `make test` hands the manager binary to
	// every package, and a benchmark is no test.
	bin := os.Getenv("GUESTNET_MANAGER_BIN")
	if bin == "" || os.Getenv("BENCH_N") == "" {
		t.Skip("BENCH_N or GUESTNET_MANAGER_BIN is not set: run `make bench`")
	}
	sizes := fields(os.Getenv("BENCH_N"), "10 100")
	bridgeEvery, _ := strconv.Atoi(os.Getenv("BENCH_BRIDGE_EVERY"))
	if bridgeEvery == 0 {
		bridgeEvery = 5
	}
	out := os.Getenv("BENCH_OUT")
	if out == "" {
		out = "out/bench"
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	var results []Result
	for _, s := range sizes {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > lab.MaxFleet {
			t.Fatalf("BENCH_N: %q is not a fleet size between 1 and %d", s, lab.MaxFleet)
		}
		r := runFleet(t, bin, out, n, bridgeEvery)
		t.Logf("N=%d: %+v", n, r)
		results = append(results, r)
	}
	js, _ := json.MarshalIndent(map[string]any{"machine": machine(), "resync": resync.String(), "bridgeEvery": bridgeEvery, "results": results}, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "results.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "results.md"), []byte(markdown(results, bridgeEvery)), 0o644); err != nil {
		t.Fatal(err)
	}
	plot := plotSVG(results, fmt.Sprintf("guestnet manager against fleet size (%s)", machine()))
	if err := os.WriteFile(filepath.Join(out, "results.svg"), []byte(plot), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("results in %s:\n%s", out, markdown(results, bridgeEvery))
}

func runFleet(t *testing.T, bin, out string, n, bridgeEvery int) Result {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Minute)
	defer cancel()
	dir := t.TempDir()
	l, err := lab.Start(ctx, lab.Options{Dir: dir, Audit: true})
	if err != nil {
		t.Fatalf("starting the lab: %v", err)
	}
	defer l.Stop()
	if _, err := lab.StartCiliumStandIn(ctx, l); err != nil {
		t.Fatalf("starting the Cilium stand-in: %v", err)
	}
	hostLog, err := l.Host.AuditLog()
	if err != nil {
		t.Fatal(err)
	}
	guestLog, err := l.Guest.AuditLog()
	if err != nil {
		t.Fatal(err)
	}
	next := func() []lab.AuditRequest {
		h, err := hostLog.Next(manager.Name)
		if err != nil {
			t.Fatal(err)
		}
		g, err := guestLog.Next(manager.Name)
		if err != nil {
			t.Fatal(err)
		}
		return append(h, g...)
	}

	cmd := startManager(t, bin, l, filepath.Join(dir, "manager.log"))
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	}
	defer stop()
	time.Sleep(2 * time.Second) // its caches; what it reads at start is not counted
	next()

	r := Result{N: n}
	created := map[client.ObjectKey]time.Time{}
	start := time.Now()
	cpuProfile := profileCPU(t, filepath.Join(out, fmt.Sprintf("cpu-n%d.pprof", n)), cpuProfileSeconds(n))
	var members []*lab.FleetMember
	for i := range n {
		m, err := l.CreateFleetMember(ctx, i, lab.FleetOptions{Bridge: i%bridgeEvery == 0})
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		members = append(members, m)
		created[client.ObjectKeyFromObject(m.GuestIngress)] = time.Now()
		if m.Bridge != nil {
			// (Same namespace as the GuestIngress, another name.)
			created[client.ObjectKeyFromObject(m.Bridge)] = time.Now()
			r.Bridges++
		}
	}
	var creation []lab.AuditRequest
	ready := map[client.ObjectKey]float64{}
	last := time.Now()
	for len(ready) < len(created) {
		if time.Since(start) > 20*time.Minute {
			t.Fatalf("only %d of %d objects ready after 20 minutes", len(ready), len(created))
		}
		creation = append(creation, next()...)
		gis := &guestnetv1.GuestIngressList{}
		gwbs := &guestnetv1.GuestWebhookBridgeList{}
		if err := l.Host.Client.List(ctx, gis); err != nil {
			t.Fatal(err)
		}
		if err := l.Host.Client.List(ctx, gwbs); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for i := range gis.Items {
			gi := &gis.Items[i]
			key := client.ObjectKeyFromObject(gi)
			if _, done := ready[key]; !done && conditions.IsTrue(gi, guestnetv1.ReadyCondition) && gi.Status.ReadyEndpoints > 0 {
				ready[key], last = now.Sub(created[key]).Seconds(), now
			}
		}
		for i := range gwbs.Items {
			gwb := &gwbs.Items[i]
			key := client.ObjectKeyFromObject(gwb)
			if _, done := ready[key]; !done && conditions.IsTrue(gwb, guestnetv1.TargetsBridgedCondition) {
				ready[key], last = now.Sub(created[key]).Seconds(), now
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.AllReady = last.Sub(start).Seconds()
	var times []float64
	for _, s := range ready {
		times = append(times, s)
	}
	sort.Float64s(times)
	r.ReadyP50, r.ReadyP99, r.ReadyMax = quantile(times, 0.5), quantile(times, 0.99), times[len(times)-1]

	creation = append(creation, settle(next)...)
	writes, status := 0, 0
	for _, q := range creation {
		switch {
		case q.Write() && q.Resource() == "events":
			r.Events++
		case q.Write():
			writes++
			if strings.HasSuffix(q.Resource(), "/status") {
				status++
			}
		}
	}
	r.WritesPerMember, r.StatusWritesPerMember = float64(writes)/float64(n), float64(status)/float64(n)
	r.CreationRequests = byVerbAndResource(creation)

	// Steady state: one resync period and a bit (its jitter), then until quiet.
	time.Sleep(resync + resync/5)
	steady := append(next(), settle(next)...)
	for _, q := range steady {
		if q.Write() {
			r.SteadyWrites++
		}
		if q.Read() {
			r.SteadyReads++
		}
	}
	r.SteadyRequests = byVerbAndResource(steady)
	r.RSSMiB, r.AnonRSSMiB, r.PeakRSSMiB, r.CPUSeconds = processStats(t, cmd.Process.Pid)
	heap := filepath.Join(out, fmt.Sprintf("heap-n%d.pprof", n))
	r.HeapMiB = profileHeap(t, heap)
	r.HeapShares = heapBreakdown(t, heap)
	<-cpuProfile
	if logged, err := os.ReadFile(filepath.Join(dir, "manager.log")); err == nil {
		r.ConnectFailures = strings.Count(string(logged), `"Connect failed"`)
	}

	if r.Repairs, err = measureRepairs(ctx, l, members, repairCount()); err != nil {
		t.Fatalf("repairs: %v", err)
	}
	stop()
	if r.Floor, err = measureFloor(ctx, t, l, members, func() func() {
		cmd := startManager(t, bin, l, filepath.Join(dir, "manager-restart.log"))
		return func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }
	}); err != nil {
		t.Fatalf("floor: %v", err)
	}
	return r
}

// startManager starts the real binary, as deployed but bound to loopback, with a short
// resync and its pprof endpoint, logging to logPath.
func startManager(t *testing.T, bin string, l *lab.Lab, logPath string) *exec.Cmd {
	return startManagerWith(t, bin, l, logPath)
}

// settle returns the requests until the manager has not written for `quiet`.
func settle(next func() []lab.AuditRequest) []lab.AuditRequest {
	var out []lab.AuditRequest
	lastWrite := time.Now()
	for time.Since(lastWrite) < quiet {
		time.Sleep(250 * time.Millisecond)
		for _, q := range next() {
			if q.Write() {
				lastWrite = time.Now()
			}
			out = append(out, q)
		}
	}
	return out
}

func byVerbAndResource(reqs []lab.AuditRequest) map[string]int {
	return lab.CountBy(reqs, func(r lab.AuditRequest) string {
		if r.Write() || r.Read() {
			return r.Verb + " " + r.Resource()
		}
		return ""
	})
}

func quantile(sorted []float64, q float64) float64 {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// processStats reads the manager's RSS, anonymous RSS, peak RSS (MiB) and CPU seconds from
// /proc.
func processStats(t *testing.T, pid int) (rss, anon, peak, cpu float64) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "RssAnon:":
			anon = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces): utime and stime are the 12th and
	// 13th, in clock ticks (USER_HZ, 100 on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return rss, anon, peak, (utime + stime) / 100
}

func machine() string {
	cpus, _ := os.ReadFile("/proc/cpuinfo")
	model := ""
	n := 0
	for _, line := range strings.Split(string(cpus), "\n") {
		if strings.HasPrefix(line, "model name") {
			n++
			model = strings.TrimSpace(line[strings.Index(line, ":")+1:])
		}
	}
	mem, _ := os.ReadFile("/proc/meminfo")
	total := strings.Fields(strings.SplitN(string(mem), "\n", 2)[0])
	memGiB := 0.0
	if len(total) >= 2 {
		kb, _ := strconv.ParseFloat(total[1], 64)
		memGiB = kb / 1024 / 1024
	}
	return fmt.Sprintf("%d CPUs (%s), %.1f GiB memory", n, model, memGiB)
}

func markdown(results []Result, bridgeEvery int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Machine: %s. Resync period %v; every %d-th cluster has a GuestWebhookBridge.\n\n", machine(), resync, bridgeEvery)
	b.WriteString("| N | bridges | ready p50 (s) | p99 (s) | max (s) | all ready (s) | connect failures | writes / cluster | of them status | events | steady writes | steady live reads | RSS (MiB) | of it anon | peak RSS (MiB) | live heap (MiB) | CPU (s) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %d | %d | %.2f | %.2f | %.2f | %.1f | %d | %.1f | %.1f | %d | %d | %d | %.0f | %.0f | %.0f | %.0f | %.1f |\n",
			r.N, r.Bridges, r.ReadyP50, r.ReadyP99, r.ReadyMax, r.AllReady, r.ConnectFailures, r.WritesPerMember, r.StatusWritesPerMember,
			r.Events, r.SteadyWrites, r.SteadyReads, r.RSSMiB, r.AnonRSSMiB, r.PeakRSSMiB, r.HeapMiB, r.CPUSeconds)
	}
	b.WriteString("\nLive heap by what allocated it (MiB, from heap-n<N>.pprof):\n\n| N | guest connections | cached objects | reconciles in flight | other |\n|---|---|---|---|---|\n")
	for _, r := range results {
		h := r.HeapShares
		fmt.Fprintf(&b, "| %d | %.1f | %.1f | %.1f | %.1f |\n", r.N, h["guest connections"], h["cached objects"], h["reconciles in flight"], h["other"])
	}
	b.WriteString("\nDrift repair latency at steady state, from the apiservers' watch events (s):\n\n| N | drift | repairs | failures | p50 | p99 | max |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		for _, s := range r.Repairs {
			fmt.Fprintf(&b, "| %d | %s | %d | %d | %.3f | %.3f | %.3f |\n", r.N, s.Kind, s.Count, s.Failures, s.P50, s.P99, s.Max)
		}
	}
	b.WriteString("\nThe floor: a plain client writing what guestnet writes per GuestIngress, against guestnet restarted on the fleet with those objects gone; until every member is exposed (s):\n\n| N | floor writes | floor all | floor p50 | floor p99 | guestnet all | guestnet p50 | guestnet p99 | ratio (all) |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		if f := r.Floor; f != nil {
			fmt.Fprintf(&b, "| %d | %d | %.1f | %.2f | %.2f | %.1f | %.2f | %.2f | %.2f |\n", r.N, f.FloorWrites, f.FloorAll, f.FloorP50, f.FloorP99, f.GuestnetAll, f.GuestnetP50, f.GuestnetP99, f.Ratio)
		}
	}
	b.WriteString("\nRequests of the manager (host and guest apiservers' audit logs), by verb and resource:\n")
	for _, r := range results {
		fmt.Fprintf(&b, "\nN=%d, creation:\n\n```\n%s```\n\nN=%d, steady state over a resync:\n\n```\n%s```\n",
			r.N, lab.FormatCounts(r.CreationRequests), r.N, lab.FormatCounts(r.SteadyRequests))
	}
	return b.String()
}

func fields(s, def string) []string {
	if strings.TrimSpace(s) == "" {
		s = def
	}
	return strings.Fields(s)
}
