// Package bench is `make bench` (docs/performance.md): for each fleet size N of BENCH_N, a fresh lab
// with audit logs, the real manager binary (GUESTNET_MANAGER_BIN) as its own process, and a
// fleet of N guest clusters (e2e/lab.CreateFleetMember; every BENCH_BRIDGE_EVERY-th with a
// GuestWebhookBridge), spread over guest shards of BENCH_SHARD_SIZE members each
// (lab.StartGuestShards) and created BENCH_CREATE_CONCURRENCY at a time. It measures the time
// from creation until each GuestIngress is Ready and each bridge has bridged its targets, the
// manager's requests per object from the apiservers' audit logs at creation and over a resync
// at steady state, and the manager's RSS and CPU seconds (also per guest cluster above its
// base before the fleet); it writes BENCH_OUT/results.md and results.json. It asserts nothing: the
// regression guard is e2e/scale, in `make test`. Without BENCH_N (set by `make bench`) it is skipped.
package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
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
	// SteadyStatusWritten counts the GuestIngresses and bridges written over that period;
	// SteadyStatusChanges says what changed in the status of the first few (statusChanges).
	SteadyStatusWritten int      `json:"steadyStatusWritten"`
	SteadyStatusChanges []string `json:"steadyStatusChanges,omitempty"`
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
	// Memory is what the manager's Go runtime holds at the end, right after the heap
	// profile's forced GC (MiB); BaseMemory the same at the base; MemoryPerCluster per guest
	// cluster above the base (KiB, goroutines per cluster).
	Memory           RuntimeMemory `json:"memory"`
	BaseMemory       RuntimeMemory `json:"baseMemory"`
	MemoryPerCluster RuntimeMemory `json:"memoryPerCluster"`
	CPUSeconds       float64       `json:"cpuSeconds"`
	// The manager's base, before the first member existed (process started, caches synced):
	// RSS, anonymous RSS and live heap, MiB; and per guest cluster above it, (at the end -
	// base) / N, KiB.
	BaseRSSMiB           float64 `json:"baseRssMiB"`
	BaseAnonRSSMiB       float64 `json:"baseAnonRssMiB"`
	BaseHeapMiB          float64 `json:"baseHeapMiB"`
	RSSPerClusterKiB     float64 `json:"rssPerClusterKiB"`
	AnonRSSPerClusterKiB float64 `json:"anonRssPerClusterKiB"`
	HeapPerClusterKiB    float64 `json:"heapPerClusterKiB"`

	// The lab under the manager: the guest shard apiservers the members live on (at most
	// ShardSize each), their resident memory in total at the end (MiB), and how many members
	// were created at a time.
	Shards            int     `json:"shards"`
	ShardSize         int     `json:"shardSize"`
	ShardsRSSMiB      float64 `json:"shardsRssMiB"`
	CreateConcurrency int     `json:"createConcurrency"`

	// Repairs are the drift repair latencies at steady state (repair_lab_test.go).
	Repairs []RepairStats `json:"repairs"`
	// Floor compares guestnet with a plain client writing the same objects (floor_lab_test.go).
	Floor *FloorResult `json:"floor,omitempty"`
	// RestartRequests are the restarted manager's requests until every member was exposed,
	// by verb and resource (its CPU profile is cpu-n<N>-restart.pprof); RestartLatency the apiservers' time to answer
	// them, by verb and resource; RestartTimeline the requests per minute since its start.
	RestartRequests map[string]int       `json:"restartRequests,omitempty"`
	RestartLatency  map[string]LatencyMs `json:"restartLatencyMs,omitempty"`
	RestartTimeline []TimelineMinute     `json:"restartTimeline,omitempty"`
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
	fleet := fleetShape{
		bridgeEvery: bridgeEvery,
		shardSize:   positiveEnv(t, "BENCH_SHARD_SIZE", 50),
		concurrency: positiveEnv(t, "BENCH_CREATE_CONCURRENCY", 8),
	}
	if fleet.shardSize > lab.MaxFleetPerGuest {
		t.Fatalf("BENCH_SHARD_SIZE: at most %d members per guest shard", lab.MaxFleetPerGuest)
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
		if shards := fleet.shards(n); shards > lab.MaxGuestShards {
			t.Fatalf("N=%d needs %d guest shards of %d members, more than the lab's %d: raise BENCH_SHARD_SIZE", n, shards, fleet.shardSize, lab.MaxGuestShards)
		}
		r := runFleet(t, bin, out, n, fleet)
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

// fleetShape is how a fleet is built: every bridgeEvery-th member with a bridge, shardSize
// members per guest shard, concurrency members created at a time.
type fleetShape struct {
	bridgeEvery, shardSize, concurrency int
}

// shards is how many guest shards a fleet of n needs.
func (f fleetShape) shards(n int) int { return (n + f.shardSize - 1) / f.shardSize }

// positiveEnv is the positive integer in the environment variable name, or def when unset.
func positiveEnv(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		t.Fatalf("%s: %q is not a positive integer", name, s)
	}
	return v
}

func runFleet(t *testing.T, bin, out string, n int, fleet fleetShape) Result {
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
	started := time.Now()
	shards, err := l.StartGuestShards(ctx, fleet.shards(n))
	if err != nil {
		t.Fatalf("starting the guest shards: %v", err)
	}
	t.Logf("N=%d: %d guest shards started in %.1f s", n, len(shards), time.Since(started).Seconds())
	// The manager's requests, from the host's and every shard's audit log.
	var auditLogs []*lab.AuditLog
	for _, c := range append([]*lab.Cluster{l.Host}, shards...) {
		a, err := c.AuditLog()
		if err != nil {
			t.Fatal(err)
		}
		auditLogs = append(auditLogs, a)
	}
	next := func() []lab.AuditRequest {
		var reqs []lab.AuditRequest
		for _, a := range auditLogs {
			r, err := a.Next(manager.Name)
			if err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, r...)
		}
		return reqs
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
	waitManagerReady(t)
	time.Sleep(3 * time.Second) // its caches; what it reads at start is not counted
	next()

	r := Result{N: n, Shards: len(shards), ShardSize: fleet.shardSize, CreateConcurrency: fleet.concurrency}
	base := processStats(t, cmd.Process.Pid)
	r.BaseRSSMiB, r.BaseAnonRSSMiB = base.RSSMiB, base.AnonRSSMiB
	r.BaseMemory = profileHeap(t, filepath.Join(out, fmt.Sprintf("heap-n%d-base.pprof", n)))
	r.BaseHeapMiB = r.BaseMemory.LiveHeap
	start := time.Now()
	cpuProfile := profileCPU(t, filepath.Join(out, fmt.Sprintf("cpu-n%d.pprof", n)), cpuProfileSeconds(n))
	members := createFleet(ctx, t, l, n, fleet, shards)
	created := map[client.ObjectKey]time.Time{}
	for _, m := range members {
		created[client.ObjectKeyFromObject(m.GuestIngress)] = m.GuestIngressCreated
		if m.Bridge != nil {
			// (Same namespace as the GuestIngress, another name.)
			created[client.ObjectKeyFromObject(m.Bridge)] = m.BridgeCreated
			r.Bridges++
		}
	}
	t.Logf("N=%d: fleet created in %.1f s, %d at a time", n, time.Since(start).Seconds(), fleet.concurrency)
	var creation []lab.AuditRequest
	ready := map[client.ObjectKey]float64{}
	last := time.Now()
	for len(ready) < len(created) {
		if time.Since(start) > readyTimeout(n) {
			t.Fatalf("only %d of %d objects ready after %v", len(ready), len(created), readyTimeout(n))
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
		time.Sleep(readyPoll(n))
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
	statusesBefore := snapshotStatuses(ctx, t, l.Host.Client)
	time.Sleep(resync + resync/5)
	steady := append(next(), settle(next)...)
	r.SteadyStatusWritten, r.SteadyStatusChanges = statusChanges(statusesBefore, snapshotStatuses(ctx, t, l.Host.Client))
	for _, q := range steady {
		if q.Write() {
			r.SteadyWrites++
		}
		if q.Read() {
			r.SteadyReads++
		}
	}
	r.SteadyRequests = byVerbAndResource(steady)
	u := processStats(t, cmd.Process.Pid)
	r.RSSMiB, r.AnonRSSMiB, r.PeakRSSMiB, r.CPUSeconds = u.RSSMiB, u.AnonRSSMiB, u.PeakRSSMiB, u.CPUSeconds
	heap := filepath.Join(out, fmt.Sprintf("heap-n%d.pprof", n))
	r.Memory = profileHeap(t, heap)
	r.HeapMiB = r.Memory.LiveHeap
	r.HeapShares = heapBreakdown(t, heap)
	r.MemoryPerCluster = r.Memory.PerCluster(r.BaseMemory, n)
	r.RSSPerClusterKiB = perClusterKiB(r.RSSMiB, r.BaseRSSMiB, n)
	r.AnonRSSPerClusterKiB = perClusterKiB(r.AnonRSSMiB, r.BaseAnonRSSMiB, n)
	r.HeapPerClusterKiB = perClusterKiB(r.HeapMiB, r.BaseHeapMiB, n)
	for _, s := range shards {
		r.ShardsRSSMiB += processStats(t, s.PID()).RSSMiB
	}
	<-cpuProfile
	if logged, err := os.ReadFile(filepath.Join(dir, "manager.log")); err == nil {
		r.ConnectFailures = strings.Count(string(logged), `"Connect failed"`)
	}

	if r.Repairs, err = measureRepairs(ctx, l, members, repairCount()); err != nil {
		t.Fatalf("repairs: %v", err)
	}
	stop()
	next() // what the manager did before its restart
	var restart []lab.AuditRequest
	if r.Floor, err = measureFloor(ctx, t, l, members, func() func() {
		cmd := startManager(t, bin, l, filepath.Join(dir, "manager-restart.log"))
		waitManagerReady(t)
		profiled := profileCPU(t, filepath.Join(out, fmt.Sprintf("cpu-n%d-restart.pprof", n)), cpuProfileSeconds(n))
		return func() {
			restart = next() // (before the profile's end: what came until every member was exposed)
			<-profiled
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	}); err != nil {
		t.Fatalf("floor: %v", err)
	}
	r.RestartRequests, r.RestartLatency, r.RestartTimeline = byVerbAndResource(restart), latencies(restart), timeline(restart)
	keepLogs(t, dir, out, n)
	return r
}

// keepLogs copies the manager's logs of fleet size n to out (what a bench run's figures are
// explained from).
func keepLogs(t *testing.T, dir, out string, n int) {
	for _, name := range []string{"manager.log", "manager-restart.log"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Logf("keeping %s: %v", name, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(out, fmt.Sprintf("n%d-%s", n, name)), b, 0o644); err != nil {
			t.Logf("keeping %s: %v", name, err)
		}
	}
}

// readyTimeout is how long a fleet of n may take from its first creation until every object
// is ready: 20 minutes, and 2 s more per member (the lab's own apiservers share the machine).
func readyTimeout(n int) time.Duration { return 20*time.Minute + time.Duration(n)*2*time.Second }

// readyPoll is how often the fleet's readiness is listed: every 200 ms, every second from 500
// members on (each list decodes every GuestIngress and bridge on the machine under test).
func readyPoll(n int) time.Duration {
	if n >= 500 {
		return time.Second
	}
	return 200 * time.Millisecond
}

// memoryLimit says which soft memory limit the manager ran with (BENCH_GOMEMLIMIT).
func memoryLimit() string {
	if limit := os.Getenv("BENCH_GOMEMLIMIT"); limit != "" {
		return "The manager ran with GOMEMLIMIT=" + limit + " (BENCH_GOMEMLIMIT; config/manager sets it to the container's memory limit)."
	}
	return "The manager ran without GOMEMLIMIT (BENCH_GOMEMLIMIT unset): its Go runtime's heap grew as GOGC=100 lets it."
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

// processStats reads a process's RSS, anonymous RSS, peak RSS (MiB) and CPU seconds.
func processStats(t *testing.T, pid int) lab.ProcessUsage {
	u, err := lab.ReadProcessUsage(pid)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// createFleet creates the n members, fleet.concurrency at a time, member i on shard i mod
// len(shards) (so that each shard gets members all along), and returns them in order.
func createFleet(ctx context.Context, t *testing.T, l *lab.Lab, n int, fleet fleetShape, shards []*lab.Cluster) []*lab.FleetMember {
	members := make([]*lab.FleetMember, n)
	errs := make([]error, n)
	indices := make(chan int)
	var wg sync.WaitGroup
	for range fleet.concurrency {
		wg.Go(func() {
			for i := range indices {
				if ctx.Err() != nil {
					errs[i] = ctx.Err()
					continue
				}
				members[i], errs[i] = l.CreateFleetMember(ctx, i, lab.FleetOptions{
					Bridge: i%fleet.bridgeEvery == 0,
					Guest:  shards[i%len(shards)], GuestIndex: i / len(shards),
				})
			}
		})
	}
	for i := range n {
		indices <- i
	}
	close(indices)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	return members
}

// waitManagerReady waits until the manager answers its readiness probe.
func waitManagerReady(t *testing.T) {
	deadline := time.Now().Add(time.Minute)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get("http://" + healthAddress + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager is not ready after a minute: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
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
	fmt.Fprintf(&b, "Machine: %s. Resync period %v; every %d-th cluster has a GuestWebhookBridge. %s\n\n", machine(), resync, bridgeEvery, memoryLimit())
	b.WriteString("| N | bridges | ready p50 (s) | p99 (s) | max (s) | all ready (s) | connect failures | writes / cluster | of them status | events | steady writes | steady live reads | RSS (MiB) | of it anon | peak RSS (MiB) | live heap (MiB) | CPU (s) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %d | %d | %.2f | %.2f | %.2f | %.1f | %d | %.1f | %.1f | %d | %d | %d | %.0f | %.0f | %.0f | %.0f | %.1f |\n",
			r.N, r.Bridges, r.ReadyP50, r.ReadyP99, r.ReadyMax, r.AllReady, r.ConnectFailures, r.WritesPerMember, r.StatusWritesPerMember,
			r.Events, r.SteadyWrites, r.SteadyReads, r.RSSMiB, r.AnonRSSMiB, r.PeakRSSMiB, r.HeapMiB, r.CPUSeconds)
	}
	b.WriteString("\nThe manager's memory per guest cluster above its base (measured before the first cluster existed, its caches synced), (at the end - base) / N:\n\n" +
		"| N | base RSS (MiB) | base anon (MiB) | base live heap (MiB) | RSS / cluster (KiB) | anon RSS / cluster (KiB) | live heap / cluster (KiB) |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.1f | %.0f | %.0f | %.0f |\n", r.N, r.BaseRSSMiB, r.BaseAnonRSSMiB, r.BaseHeapMiB,
			r.RSSPerClusterKiB, r.AnonRSSPerClusterKiB, r.HeapPerClusterKiB)
	}
	b.WriteString("\nWhat holds the manager's memory, per guest cluster above its base (KiB; from its Go runtime's MemStats right after the forced GC of each heap profile): " +
		"the live heap; the free slots of the heap's spans in use; the free spans not yet returned to the kernel (the garbage the GC's pacing let grow, what a peak left); " +
		"the goroutines' stacks; the runtime's own structures; their sum, against the anonymous RSS per cluster:\n\n" +
		"| N | live heap | spans' free slots | free spans kept | stacks | runtime | sum | anon RSS | goroutines / cluster | goroutines at the end |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		m := r.MemoryPerCluster
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %.0f |\n", r.N, m.LiveHeap, m.HeapUnused, m.HeapKept, m.Stacks, m.Runtime,
			m.Resident(), r.AnonRSSPerClusterKiB, m.Goroutines, r.Memory.Goroutines)
	}
	b.WriteString("\nThe lab under the manager: guest clusters live on guest shards (real kube-apiservers sharing one etcd, lab.StartGuestShards), created concurrently:\n\n" +
		"| N | guest shards | clusters per shard (at most) | shard apiservers' RSS in total (MiB) | created at a time |\n|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %d | %d | %d | %.0f | %d |\n", r.N, r.Shards, r.ShardSize, r.ShardsRSSMiB, r.CreateConcurrency)
	}
	b.WriteString("\nLive heap by what allocated it (MiB, from heap-n<N>.pprof):\n\n| N | guest connections | cached objects | reconciles in flight | other |\n|---|---|---|---|---|\n")
	for _, r := range results {
		h := r.HeapShares
		fmt.Fprintf(&b, "| %d | %.1f | %.1f | %.1f | %.1f |\n", r.N, h["guest connections"], h["cached objects"], h["reconciles in flight"], h["other"])
	}
	b.WriteString("\nDrift repair latency at steady state, from the apiservers' watch events (s):\n\n| N | drift | repairs | failures | p50 | p99 | max | measured over (s) |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		for _, s := range r.Repairs {
			fmt.Fprintf(&b, "| %d | %s | %d | %d | %.3f | %.3f | %.3f | %.0f |\n", r.N, s.Kind, s.Count, s.Failures, s.P50, s.P99, s.Max, s.WindowSeconds)
		}
	}
	b.WriteString("\nWhile each kind of drift was measured, per controller, from the manager's metrics (s; p99: the bound of the histogram bucket):\n\n" +
		"| N | drift | controller | reconciles | reconcile mean | reconcile p99 | queue waits | wait mean | wait p99 | waits > 1 s | waits > 10 s |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		for _, s := range r.Repairs {
			for _, w := range s.Workers {
				fmt.Fprintf(&b, "| %d | %s | %s | %d | %.3f | %.3g | %d | %.3f | %.3g | %d | %d |\n", r.N, s.Kind, w.Controller,
					w.Reconciles, w.ReconcileMean, w.ReconcileP99, w.QueueWaits, w.QueueWaitMean, w.QueueWaitP99, w.QueueWaitOver1s, w.QueueWaitOver10s)
			}
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
	for _, r := range results {
		if r.SteadyStatusWritten == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nN=%d: %d GuestIngresses and bridges were written at steady state; what changed in the status of the first %d:\n\n",
			r.N, r.SteadyStatusWritten, len(r.SteadyStatusChanges))
		for _, c := range r.SteadyStatusChanges {
			fmt.Fprintf(&b, "- %s\n", c)
		}
	}
	for _, r := range results {
		b.WriteString(restartMarkdown(r))
	}
	return b.String()
}

func fields(s, def string) []string {
	if strings.TrimSpace(s) == "" {
		s = def
	}
	return strings.Fields(s)
}
