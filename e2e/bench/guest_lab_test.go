package bench_test

// TestBenchLargeGuest is `make bench`'s measure of one large guest (docs/performance.md,
// "A large guest"): the manager's memory when one guest cluster holds BENCH_GUEST_SERVICES
// Services, one in BENCH_GUEST_LARGE_EVERY with a 64 KiB annotation (what a tenant can put in
// its own guest). It runs the manager binary (GUESTNET_MANAGER_BIN) with its default cap
// (--guest-max-objects, internal/guestbounds) and without a cap (the guest cache's transforms
// only, internal/manager.KeepWhatGuestnetReads), and BENCH_BASELINE_BIN (e.g. main's binary)
// when set; each with a fresh GuestWebhookBridge of that guest, whose first reconcile lists
// every guest Service through the guest cache. It asserts nothing. Skipped without
// BENCH_GUEST_SERVICES (set by `make bench`).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// guestRun is one manager run of TestBenchLargeGuest.
type guestRun struct {
	Name   string
	bin    string
	args   []string
	Reason string  // the bridge's ClusterAvailable reason
	Heap   float64 // live heap after a forced GC, MiB
	RSS    float64 // MiB
	Anon   float64 // MiB
}

func TestBenchLargeGuest(t *testing.T) {
	bin := os.Getenv("GUESTNET_MANAGER_BIN")
	services, _ := strconv.Atoi(os.Getenv("BENCH_GUEST_SERVICES"))
	if bin == "" || services <= 0 {
		t.Skip("BENCH_GUEST_SERVICES or GUESTNET_MANAGER_BIN is not set: run `make bench`")
	}
	largeEvery, _ := strconv.Atoi(os.Getenv("BENCH_GUEST_LARGE_EVERY"))
	if largeEvery <= 0 {
		largeEvery = 20
	}
	out := os.Getenv("BENCH_OUT")
	if out == "" {
		out = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	dir := t.TempDir()
	l, err := lab.Start(ctx, lab.Options{Dir: dir})
	if err != nil {
		t.Fatalf("starting the lab: %v", err)
	}
	defer l.Stop()
	gc, err := l.CreateGuestCluster(ctx, "large-guest", "tenant", lab.WorkerTemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	runs := []*guestRun{{Name: "empty guest (no Services), this binary", bin: bin}}
	measure := func(i int, r *guestRun) {
		webhookNS := fmt.Sprintf("webhook-%d", i)
		wh, err := lab.CreateServiceWebhook(ctx, l.Guest.Client, l.Guest.CA.CertPEM(), webhookNS, "target-"+webhookNS)
		if err != nil {
			t.Fatal(err)
		}
		cmd := startManagerWith(t, r.bin, l, filepath.Join(dir, fmt.Sprintf("manager-%d.log", i)), r.args...)
		defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
		gwb := &guestnetv1.GuestWebhookBridge{
			ObjectMeta: metav1.ObjectMeta{Namespace: gc.Namespace, Name: fmt.Sprintf("bridge-%d", i)},
			Spec: guestnetv1.GuestWebhookBridgeSpec{
				ClusterName:        gc.Name,
				ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{wh.Config.Name}},
				NodePortRange:      guestnetv1.NodePortRange{Start: int32(30140 + i), Size: 1},
				Mode:               guestnetv1.BridgeModeAlways,
			},
		}
		if err := l.Host.Client.Create(ctx, gwb); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for {
			got := &guestnetv1.GuestWebhookBridge{}
			_ = l.Host.Client.Get(ctx, client.ObjectKeyFromObject(gwb), got)
			r.Reason = conditions.GetReason(got, guestnetv1.ClusterAvailableCondition)
			if conditions.IsTrue(got, guestnetv1.TargetsBridgedCondition) || r.Reason == guestnetv1.GuestTooLargeReason {
				break
			}
			if time.Since(start) > 5*time.Minute {
				t.Fatalf("%s: bridge %s neither bridged nor GuestTooLarge after 5 minutes (ClusterAvailable %q)", r.Name, gwb.Name, r.Reason)
			}
			time.Sleep(time.Second)
		}
		time.Sleep(5 * time.Second)
		r.Heap = profileHeap(t, filepath.Join(out, fmt.Sprintf("heap-guest-%d.pprof", i))).LiveHeap
		u := processStats(t, cmd.Process.Pid)
		r.RSS, r.Anon = u.RSSMiB, u.AnonRSSMiB
		t.Logf("%s: ClusterAvailable %s, live heap %.1f MiB, RSS %.1f MiB (anon %.1f)", r.Name, r.Reason, r.Heap, r.RSS, r.Anon)
	}
	measure(0, runs[0])

	created := createGuestServices(ctx, t, l, services, largeEvery)
	t.Logf("created %d guest Services (%d with a 64 KiB annotation)", services, created)

	runs = append(runs,
		&guestRun{Name: fmt.Sprintf("%d Services, this binary, default cap", services), bin: bin},
		&guestRun{Name: fmt.Sprintf("%d Services, this binary, no cap (transforms only)", services), bin: bin, args: []string{"--guest-max-objects=-1"}},
	)
	if baseline := os.Getenv("BENCH_BASELINE_BIN"); baseline != "" {
		runs = append(runs, &guestRun{Name: fmt.Sprintf("%d Services, baseline %s", services, filepath.Base(baseline)), bin: baseline})
	}
	for i, r := range runs[1:] {
		measure(i+1, r)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "One guest with %d Services, one in %d with a 64 KiB annotation (%s):\n\n", services, largeEvery, machine())
	b.WriteString("| run | guest's ClusterAvailable | live heap (MiB) | RSS (MiB) | of it anon |\n|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.1f |\n", r.Name, r.Reason, r.Heap, r.RSS, r.Anon)
	}
	t.Log("\n" + b.String())
	if err := os.WriteFile(filepath.Join(out, "large-guest.md"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// createGuestServices creates n headless Services in the guest (no ClusterIP to allocate),
// every largeEvery-th with a 64 KiB annotation, with 16 writers; it returns how many are large.
func createGuestServices(ctx context.Context, t *testing.T, l *lab.Lab, n, largeEvery int) int {
	cfg := rest.CopyConfig(l.Guest.Config)
	cfg.QPS, cfg.Burst = 2000, 2000
	c, err := client.New(cfg, client.Options{Scheme: lab.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	const namespaces = 20
	for i := range namespaces {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tenant-apps-%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	large := strings.Repeat("x", 64<<10)
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range 16 {
		wg.Go(func() {
			for i := range work {
				svc := &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("tenant-apps-%d", i%namespaces), Name: fmt.Sprintf("svc-%d", i),
						Labels: map[string]string{"app": fmt.Sprintf("app-%d", i)}},
					Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app": fmt.Sprintf("app-%d", i)},
						Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
				}
				if i%largeEvery == 0 {
					svc.Annotations = map[string]string{"example.com/blob": large}
				}
				if err := c.Create(ctx, svc); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("creating guest Services: %v", firstErr)
	}
	return (n + largeEvery - 1) / largeEvery
}

// healthAddress is where the bench's manager serves its health probes (--health-addr).
const healthAddress = "127.0.0.1:9440"

// diagnosticsAddress is where it serves /metrics, over plain HTTP (--insecure-diagnostics).
const diagnosticsAddress = "127.0.0.1:8443"

// startManagerWith is startManager with extra flags.
func startManagerWith(t *testing.T, bin string, l *lab.Lab, logPath string, args ...string) *exec.Cmd {
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logFile.Close() })
	cmd := exec.Command(bin, append([]string{"--kubeconfig=" + l.Host.KubeconfigPath, "--sync-period=" + resync.String(),
		"--health-addr=" + healthAddress, "--diagnostics-address=" + diagnosticsAddress, "--insecure-diagnostics",
		"--profiler-address=" + profilerAddress}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if limit := os.Getenv("BENCH_GOMEMLIMIT"); limit != "" {
		// As config/manager sets it: the container's memory limit.
		cmd.Env = append(os.Environ(), "GOMEMLIMIT="+limit)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	return cmd
}
