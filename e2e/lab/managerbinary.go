package lab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ManagerFlags choose how the lab runs guestnet's manager binary: the flags an operator
// would set, on top of the lab's (loopback probe and diagnostics addresses, the default
// resync period, debug logs).
type ManagerFlags struct {
	// Namespace is --namespace: set it to the test's namespace so that tests cannot see each
	// other's objects. A manager with no namespace sees every one; give it a WatchFilter.
	Namespace string
	// WatchFilter is --watch-filter.
	WatchFilter string
	// SyncPeriod is --sync-period; ManagerSyncPeriod when zero.
	SyncPeriod time.Duration
	// FeatureGates is --feature-gates, e.g. "ClusterTopologyVariables=true".
	FeatureGates string
	// As is who the manager is towards the host apiserver (e.g. a ServiceAccount bound to
	// the generated RBAC); the lab's admin when nil.
	As *rest.Config
	// Args are further flags, e.g. "--guest-max-objects=40".
	Args []string
}

// ManagerBinary is guestnet's manager binary running as its own process in the lab.
type ManagerBinary struct {
	// LogPath is the manager's log file (klog text, verbosity 4).
	LogPath string
	// DiagnosticsAddress serves /metrics over plain HTTP.
	DiagnosticsAddress string
	proc               *process
}

// Log returns what the manager has logged so far.
func (m *ManagerBinary) Log() string {
	data, _ := os.ReadFile(m.LogPath)
	return string(data)
}

// StartManagerBinary runs the manager binary that ships (ManagerBinaryPath) against the lab's
// host apiserver until the test ends, and waits until it is ready. Its log's tail is printed
// when the test fails.
func (l *Lab) StartManagerBinary(t testing.TB, f ManagerFlags) *ManagerBinary {
	t.Helper()
	m, err := l.RunManagerBinary(context.Background(), "manager-"+logFileName(t.Name()), f)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		m.Stop()
		if t.Failed() {
			t.Logf("manager log %s, last lines:\n%s", m.LogPath, tail(m.LogPath, 6000))
		}
	})
	return m
}

// RunManagerBinary is StartManagerBinary for callers that are not tests (the demo): name
// names its log file in the lab directory; Stop ends it.
func (l *Lab) RunManagerBinary(ctx context.Context, name string, f ManagerFlags) (*ManagerBinary, error) {
	bin, err := ManagerBinaryPath()
	if err != nil {
		return nil, err
	}
	kubeconfig := l.Host.KubeconfigPath
	if f.As != nil {
		kubeconfig = filepath.Join(l.Dir, name+".kubeconfig")
		if err := writeKubeconfig(kubeconfig, f.As); err != nil {
			return nil, err
		}
	}
	health, err := freeLoopbackAddress()
	if err != nil {
		return nil, err
	}
	diagnostics, err := freeLoopbackAddress()
	if err != nil {
		return nil, err
	}
	if f.SyncPeriod == 0 {
		f.SyncPeriod = ManagerSyncPeriod
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--health-addr=" + health,
		"--diagnostics-address=" + diagnostics, "--insecure-diagnostics",
		"--sync-period=" + f.SyncPeriod.String(),
		"--v=4",
		// Not in a pod: the node agent's image is named (the lab runs the agent binary itself).
		"--node-agent-image=" + NodeAgentImage,
	}
	if f.Namespace != "" {
		args = append(args, "--namespace="+f.Namespace)
	}
	if f.WatchFilter != "" {
		args = append(args, "--watch-filter="+f.WatchFilter)
	}
	if f.FeatureGates != "" {
		args = append(args, "--feature-gates="+f.FeatureGates)
	}
	args = append(args, f.Args...)
	p, err := startProcess(l.Dir, name, bin, args...)
	if err != nil {
		return nil, err
	}
	m := &ManagerBinary{LogPath: p.logPath, DiagnosticsAddress: diagnostics, proc: p}
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.waitReady(readyCtx, func(ctx context.Context) error {
		return httpOK(ctx, http.DefaultClient, "http://"+health+"/readyz")
	}); err != nil {
		p.stop()
		return nil, err
	}
	return m, nil
}

// Exited reports whether the manager's process has ended (by itself or by Stop).
func (m *ManagerBinary) Exited() bool {
	select {
	case <-m.proc.done:
		return true
	default:
		return false
	}
}

// Stop terminates the manager, politely first.
func (m *ManagerBinary) Stop() { m.proc.stop() }

// freeLoopbackAddress returns 127.0.0.1:<a port free now>.
func freeLoopbackAddress() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// writeKubeconfig writes a kubeconfig file for cfg (server, CA and a token or client
// certificate).
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["lab"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["lab"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "lab"}
	kc.CurrentContext = "lab"
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

var managerBinary struct {
	once sync.Once
	path string
	err  error
}

// ManagerBinaryPath is the manager binary the lab runs: GUESTNET_MANAGER_BIN (the Makefile
// hands over the one it put into the image), or else one built once per test process from the
// repository with the module cache only (the lab's network namespace reaches no proxy).
func ManagerBinaryPath() (string, error) {
	if bin := os.Getenv("GUESTNET_MANAGER_BIN"); bin != "" {
		return bin, nil
	}
	managerBinary.once.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			managerBinary.err = err
			return
		}
		dir, err := os.MkdirTemp("", "guestnet-manager-")
		if err != nil {
			managerBinary.err = err
			return
		}
		out := filepath.Join(dir, "manager")
		cmd := exec.Command("go", "build", "-o", out, ".")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod")
		if msg, err := cmd.CombinedOutput(); err != nil {
			managerBinary.err = fmt.Errorf("building the manager binary (or set GUESTNET_MANAGER_BIN): %w: %s", err, strings.TrimSpace(string(msg)))
			return
		}
		managerBinary.path = out
	})
	return managerBinary.path, managerBinary.err
}

// Gather scrapes the manager's /metrics page, so that a test reads the metrics an operator's
// Prometheus would (a prometheus.Gatherer, for internal/test/metricstest).
func (m *ManagerBinary) Gather() ([]*dto.MetricFamily, error) {
	return GatherMetrics(m.DiagnosticsAddress)
}

// GatherMetrics scrapes the /metrics page a manager serves at address (its
// --diagnostics-address with --insecure-diagnostics).
func GatherMetrics(address string) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/metrics", http.NoBody)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	families := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		families = append(families, f)
	}
	return families, nil
}
