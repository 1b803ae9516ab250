package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"sigs.k8s.io/cluster-api/controllers/clustercache"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
)

// SetupFunc registers the controllers under test on a manager, with the ClusterCache that
// connects them to guest clusters, as main.go registers them. (Tests of everything main.go
// registers run the manager binary: Lab.StartManagerBinary.)
type SetupFunc func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, opts manager.Options) error

// ManagerSyncPeriod is the manager's resync period in the lab: the manager's default
// (--sync-period). A test that sees a reaction within seconds therefore proves a watch, not
// a resync.
const ManagerSyncPeriod = 10 * time.Minute

// ManagerConnectionRetryInterval replaces the ClusterCache's 30 s wait before it retries a
// failed connection. CreateGuestCluster marks the Cluster provisioned before it creates the
// <cluster>-kubeconfig Secret (as CAPI providers do), so the ClusterCache's first try often
// finds no Secret; production then waits 30 s, which would only make the tests slow.
const ManagerConnectionRetryInterval = time.Second

// StartManager runs a manager in the test process against the lab's host apiserver until the
// test ends, for the controller packages' tests: the cache, client and ClusterCache options of
// main.go (internal/manager), with opts (set
// opts.WatchNamespace to the test's namespace so tests cannot see each other's objects), and
// the controllers that setup registers. Metrics and health probes are disabled, so nothing
// binds a port. The manager logs to a file in the lab directory; its tail is printed when
// the test fails.
//
// Every test may start its own manager: controller name validation is skipped, since the
// same controllers are registered again in the same process.
func StartManager(t testing.TB, l *Lab, opts manager.Options, setup SetupFunc) ctrl.Manager {
	t.Helper()
	logPath := filepath.Join(l.Dir, "manager-"+logFileName(t.Name())+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("creating manager log: %v", err)
	}
	mgr, stop, err := RunManager(context.Background(), l, opts, setup, fileLogger(logFile))
	if err != nil {
		_ = logFile.Close()
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("%v", err)
		}
		_ = logFile.Close()
		if t.Failed() {
			t.Logf("manager log %s, last lines:\n%s", logPath, tail(logPath, 6000))
		}
	})
	return mgr
}

// RunManager is StartManager for callers that are not tests (the demo): it starts the
// manager, logging to logger, waits until its cache is synced and returns it with the
// function that stops it.
func RunManager(ctx context.Context, l *Lab, opts manager.Options, setup SetupFunc, logger klog.Logger) (ctrl.Manager, func() error, error) {
	return RunManagerAs(ctx, l, l.Host.Config, opts, setup, logger)
}

// RunManagerAs is RunManager with the manager talking to the host apiserver as hostConfig
// says (e.g. as a ServiceAccount bound to the generated RBAC, instead of the lab's admin).
func RunManagerAs(ctx context.Context, _ *Lab, hostConfig *rest.Config, opts manager.Options, setup SetupFunc, logger klog.Logger) (ctrl.Manager, func() error, error) {
	if opts.SyncPeriod == 0 {
		opts.SyncPeriod = ManagerSyncPeriod
	}
	restConfig := rest.CopyConfig(hostConfig)
	restConfig.UserAgent = manager.Name
	restConfig.QPS, restConfig.Burst = 100, 200

	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                  Scheme,
		Logger:                  logger,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		Cache:                   opts.CacheOptionsFor(restConfig),
		Client:                  manager.ClientOptions(),
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
		GracefulShutdownTimeout: ptr.To(10 * time.Second),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating manager: %w", err)
	}

	runCtx, cancel := context.WithCancel(ctrl.LoggerInto(context.Background(), logger))
	cc, err := manager.SetupClusterCache(runCtx, mgr, opts)
	if err == nil {
		s, ok := cc.(interface{ SetConnectionCreationRetryInterval(time.Duration) })
		if !ok {
			err = fmt.Errorf("the ClusterCache (%T) no longer has SetConnectionCreationRetryInterval", cc)
		} else {
			s.SetConnectionCreationRetryInterval(ManagerConnectionRetryInterval)
			err = setup(runCtx, mgr, cc, opts)
		}
	}
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("setting up manager: %w", err)
	}

	done := make(chan error, 1)
	go func() { done <- mgr.Start(runCtx) }()
	stop := func() error {
		cancel()
		var err error
		select {
		case err = <-done:
			if err != nil {
				err = fmt.Errorf("manager stopped with an error: %w", err)
			}
		case <-time.After(30 * time.Second):
			err = fmt.Errorf("manager did not stop within 30s")
		}
		// The ClusterCache's per-cluster caches do not stop with the manager.
		if s, ok := cc.(interface{ Shutdown() }); ok {
			s.Shutdown()
		}
		return err
	}

	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	select {
	case <-mgr.Elected():
	case err := <-done:
		cancel()
		return nil, nil, fmt.Errorf("manager stopped before it started: %w", err)
	case <-syncCtx.Done():
		_ = stop()
		return nil, nil, fmt.Errorf("manager did not start within a minute")
	}
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		_ = stop()
		return nil, nil, fmt.Errorf("manager cache did not sync within a minute")
	}
	return mgr, stop, nil
}

// fileLogger logs to w in klog's text format at verbosity 4 (guestnet's debug level).
func fileLogger(w io.Writer) klog.Logger {
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(w), textlogger.Verbosity(4)))
}

var globalLoggerOnce sync.Once

// setGlobalLoggerOnce gives controller-runtime's global logger (used where no logger is at
// hand) a file in dir, so that it does not complain on stderr that it was never set.
func setGlobalLoggerOnce(dir string) {
	globalLoggerOnce.Do(func() {
		w := io.Discard
		if f, err := os.Create(filepath.Join(dir, "controller-runtime.log")); err == nil {
			w = f // stays open for the rest of the process
		}
		ctrl.SetLogger(fileLogger(w))
	})
}

var unsafeFileChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func logFileName(testName string) string {
	return unsafeFileChars.ReplaceAllString(testName, "_")
}

// tail returns the last n bytes of the file at path, from a line start.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read: %v)", err)
	}
	if len(data) > n {
		data = data[len(data)-n:]
		for i, b := range data {
			if b == '\n' {
				data = data[i+1:]
				break
			}
		}
	}
	return string(data)
}
