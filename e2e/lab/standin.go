package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// standIn runs the controllers of one of the lab's stand-ins (Cilium on the host, kube-proxy
// in the guest) in a controller-runtime manager of its own, logging to <lab>/<name>.log.
type standIn struct {
	name     string
	cancel   context.CancelFunc
	done     chan error
	log      *os.File
	closeAll func()
	stopOnce sync.Once
}

// startStandIn creates the stand-in's manager on cfg, lets register add its controllers
// (and return what closes its listeners on Stop), starts it and waits for its cache.
func startStandIn(ctx context.Context, l *Lab, name string, cfg *rest.Config, register func(ctrl.Manager, logr.Logger) (closeAll func(), err error)) (_ *standIn, err error) {
	logFile, err := os.Create(filepath.Join(l.Dir, name+".log"))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = logFile.Close()
		}
	}()
	logger := fileLogger(logFile)
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = name
	cfg.QPS, cfg.Burst = 100, 200
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 Scheme,
		Logger:                 logger,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, err
	}
	closeAll, err := register(mgr, logger)
	if err != nil {
		return nil, err
	}

	runCtx, cancel := context.WithCancel(ctrl.LoggerInto(context.Background(), logger))
	s := &standIn{name: name, cancel: cancel, done: make(chan error, 1), log: logFile, closeAll: closeAll}
	go func() { s.done <- mgr.Start(runCtx) }()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		s.Stop()
		return nil, fmt.Errorf("the %s's cache did not sync", name)
	}
	return s, nil
}

// Stop stops the stand-in, closes every listener (and the connections through them) and
// its log.
func (s *standIn) Stop() {
	s.cancel()
	select {
	case <-s.done: //nolint:errcheck // stopped on purpose: the manager's error after cancel says nothing
	case <-time.After(30 * time.Second):
	}
	s.closeAll()
	_ = s.log.Close()
}
