// Package lab runs two real Kubernetes control planes on one machine, "host" and "guest",
// the way guestnet meets them in production: the guest apiserver lives on the host network
// (a hosted control plane such as k0smotron or Kamaji), the workers are KubeVirt VMs whose
// virt-launcher pods live in the host, and CAPI objects describe the guest cluster.
//
// The host runs etcd, kube-apiserver and kube-controller-manager (so EndpointSlices are filled
// from Service selectors and owner references are garbage collected, as in production) with
// the real CRDs of CAPI core, CAPK and Cilium, and guestnet's own. The guest runs etcd and
// kube-apiserver, set up for the aggregation layer as real clusters are.
//
// The lab only runs inside the private network namespace that hack/labns creates (no
// interface but lo): there, realistic addresses are safe, and nothing leaves the machine.
package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

// Scheme knows every type the lab and the tests use on either cluster.
var Scheme = newScheme()

func newScheme() *runtime.Scheme {
	s := scheme.New()
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	// The played KubeVirt (StartKubeVirtStandIn) writes VMs, VMIs and their status.
	utilruntime.Must(kubevirtv1.AddToScheme(s))
	return s
}

// HostNodes are the host cluster's nodes; virt-launcher pods are spread over them.
var HostNodes = []string{"host-node-1", "host-node-2"}

// Lab is a running host and guest cluster.
type Lab struct {
	Assets *Assets
	Dir    string
	Host   *Cluster
	Guest  *Cluster

	mu      sync.Mutex
	workers []*Worker
	// stops end what tests started in the lab (third-party servers, ...), last first.
	stops []func()
	dns   *hostDNS

	// Konnectivity is the guest's konnectivity server (Options.Konnectivity), nil without.
	Konnectivity *KonnectivityServer
	// The CAPI CRDs' conversion webhooks, served once per lab (serveCAPIConversion).
	conversionOnce sync.Once
	conversionErr  error
	conversionURL  string
	// withoutCRDs are the third-party CRD directories not installed (Options.WithoutCRDs).
	withoutCRDs []string
	// podNet is the host pod network of kernel workers (kerneldatapath.go), made on first use.
	podNet hostPodNetwork
	// extNet is the external network of clients outside the host cluster (kernel_lb.go).
	extNet externalNetwork
	// guestShards counts the guest shards started (StartGuestShards), for their addresses.
	guestShards int
}

// Cluster is one control plane of the lab with a client for it.
type Cluster struct {
	*ControlPlane
	Client client.Client
}

// Options tune a lab.
type Options struct {
	// Dir holds certificates, data and logs; a temporary directory when empty.
	Dir string
	// SkipGuest starts the host only (for tests that need no guest cluster).
	SkipGuest bool
	// SkipLabPolicy starts the lab without the lab-wide GuestIngressPolicy (LabPolicy).
	SkipLabPolicy bool
	// Audit makes both apiservers write an audit log (ControlPlane.AuditLogPath), for tests
	// that count the manager's requests.
	Audit bool
	// Konnectivity starts the guest flavour with konnectivity (konnectivity.go): the guest
	// apiserver sends its `cluster` egress (service-referenced webhooks, aggregated APIs)
	// through a konnectivity server next to it, which agents in the worker VMs
	// (StartKonnectivityAgent) connect to. Without it the guest apiserver dials directly.
	Konnectivity bool
	// WithoutCRDs names the third-party CRD directories of GUESTNET_LAB_CRDS ("cilium",
	// "capk", "metallb") the host starts without, as a host cluster that lacks that provider;
	// InstallThirdPartyCRDs installs one later.
	WithoutCRDs []string
}

// Start starts the host and guest control planes in parallel, installs the CRDs in the
// host, creates the lab-wide GuestIngressPolicy (unless opts.SkipLabPolicy) and the host
// nodes. Call Stop when done.
func Start(ctx context.Context, opts Options) (_ *Lab, err error) {
	assets, err := LookupAssets()
	if err != nil {
		return nil, err
	}
	if ok, why := InPrivateNetwork(); !ok {
		return nil, fmt.Errorf("refusing to start the lab outside its private network namespace: %s", why)
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "guestnet-lab-"); err != nil {
			return nil, err
		}
	}
	l := &Lab{Assets: assets, Dir: opts.Dir, withoutCRDs: opts.WithoutCRDs}
	defer func() {
		if err != nil {
			l.Stop()
		}
	}()

	// The host cluster's DNS, which the guest apiserver uses (hostDNS); it answers once the
	// host apiserver is up.
	resolvConf := filepath.Join(opts.Dir, "guest-resolv.conf")
	if !opts.SkipGuest {
		if l.dns, err = startHostDNS(); err != nil {
			return nil, err
		}
		if err := writeGuestResolvConf(resolvConf); err != nil {
			return nil, err
		}
	}

	var egressSelectorConfig string
	if opts.Konnectivity && !opts.SkipGuest {
		if egressSelectorConfig, err = writeEgressSelectorConfig(opts.Dir); err != nil {
			return nil, err
		}
	}

	var wg sync.WaitGroup
	var hostErr, guestErr error
	wg.Go(func() {
		l.Host, hostErr = startCluster(ctx, assets, ControlPlaneOptions{
			Name: "host", Address: HostAPIServerAddress, ServiceCIDR: HostServiceCIDR, ServiceCIDR6: HostServiceCIDR6,
			ControllerManager: true, Dir: filepath.Join(opts.Dir, "host"), Audit: opts.Audit, PublishEndpoints: true,
		})
	})
	if !opts.SkipGuest {
		wg.Go(func() {
			l.Guest, guestErr = startCluster(ctx, assets, ControlPlaneOptions{
				Name: "guest", Address: GuestAPIServerAddress, ServiceCIDR: GuestServiceCIDR, ServiceCIDR6: GuestServiceCIDR6,
				Dir: filepath.Join(opts.Dir, "guest"), ResolvConf: resolvConf, Audit: opts.Audit,
				EgressSelectorConfig: egressSelectorConfig,
				ExternalIPs:          []string{GuestControlPlaneLoadBalancerIP},
			})
		})
	}
	wg.Wait()
	if hostErr != nil {
		return nil, fmt.Errorf("starting host control plane: %w", hostErr)
	}
	if l.dns != nil {
		l.dns.setHost(l.Host.Client)
	}
	if guestErr != nil {
		return nil, fmt.Errorf("starting guest control plane: %w", guestErr)
	}
	if err := l.installHostCRDs(); err != nil {
		return nil, err
	}
	if egressSelectorConfig != "" {
		if err := l.startKonnectivityServer(ctx); err != nil {
			return nil, fmt.Errorf("starting the konnectivity server: %w", err)
		}
	}
	if !opts.SkipLabPolicy {
		if err := l.createLabPolicy(ctx); err != nil {
			return nil, err
		}
	}
	for _, name := range HostNodes {
		if err := createReadyNode(ctx, l.Host.Client, name, ""); err != nil {
			return nil, err
		}
	}
	// The lab's clients log through controller-runtime's global logger: into the lab
	// directory, not onto the demo's or the tests' output.
	setGlobalLoggerOnce(l.Dir)
	return l, nil
}

// Stop stops what tests started in the lab, the workers' stand-ins, both control planes and
// the DNS stand-in.
func (l *Lab) Stop() {
	l.mu.Lock()
	stops := l.stops
	l.stops = nil
	l.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	l.mu.Lock()
	for _, w := range l.workers {
		w.stop()
	}
	l.workers = nil
	l.mu.Unlock()
	for _, c := range []*Cluster{l.Guest, l.Host} {
		if c != nil {
			c.Stop()
		}
	}
	l.dns.stop()
}

// onStop registers f to run when the lab stops, before the workers and control planes stop.
func (l *Lab) onStop(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stops = append(l.stops, f)
}

func startCluster(ctx context.Context, assets *Assets, opts ControlPlaneOptions) (*Cluster, error) {
	cp, err := StartControlPlane(ctx, assets, opts)
	if err != nil {
		return nil, err
	}
	c, err := client.New(cp.Config, client.Options{Scheme: Scheme})
	if err != nil {
		cp.Stop()
		return nil, err
	}
	return &Cluster{ControlPlane: cp, Client: c}, nil
}

// CRD directories installed in the host: CAPI core, CAPK, Cilium and MetalLB from their pinned
// module zips (see hack/fetch-crds.sh), and guestnet's own from config/crd/bases.
func (l *Lab) hostCRDDirs() ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, d := range []string{"capi", "capk", "cilium", "metallb"} {
		if !slices.Contains(l.withoutCRDs, d) {
			dirs = append(dirs, filepath.Join(l.Assets.CRDDir, d))
		}
	}
	return append(dirs, filepath.Join(root, "config", "crd", "bases")), nil
}

// InstallThirdPartyCRDs installs, in the host, the CRDs of one directory of GUESTNET_LAB_CRDS
// ("cilium", "capk", "metallb") that the lab started without (Options.WithoutCRDs), and waits until
// they are served.
func (l *Lab) InstallThirdPartyCRDs(dir string) error {
	_, err := envtest.InstallCRDs(l.Host.Config, envtest.CRDInstallOptions{
		Paths:              []string{filepath.Join(l.Assets.CRDDir, dir)},
		ErrorIfPathMissing: true,
		MaxTime:            time.Minute,
		PollInterval:       100 * time.Millisecond,
	})
	if err != nil {
		return fmt.Errorf("installing the %s CRDs in the host: %w", dir, err)
	}
	return nil
}

func (l *Lab) installHostCRDs() error {
	dirs, err := l.hostCRDDirs()
	if err != nil {
		return err
	}
	_, err = envtest.InstallCRDs(l.Host.Config, envtest.CRDInstallOptions{
		Paths:              dirs,
		ErrorIfPathMissing: true,
		MaxTime:            time.Minute,
		PollInterval:       100 * time.Millisecond,
	})
	if err != nil {
		return fmt.Errorf("installing CRDs in the host: %w", err)
	}
	return nil
}

// RepoRoot finds the repository root (the directory holding the provider's go.mod) from
// the working directory, which `go test` sets to the package directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			len(data) > 0 && containsModule(string(data)) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("repository root not found above the working directory")
		}
		dir = parent
	}
}

func containsModule(goMod string) bool {
	const module = "module github.com/guestnet/cluster-api-addon-provider-guestnet\n"
	return len(goMod) >= len(module) && goMod[:len(module)] == module
}

// createReadyNode creates a Node whose Ready condition is True, with an InternalIP when ip
// is set. No kubelet runs in the lab: the Node only has to exist for the EndpointSlice
// controller (host) and to carry the worker's address (guest). A Node that exists already
// (the played CAPK may have created it for a KubevirtMachine first, with its providerID) is
// kept and given the status.
func createReadyNode(ctx context.Context, c client.Client, name, ip string) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, node); apierrors.IsAlreadyExists(err) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return fmt.Errorf("reading node %s: %w", name, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	if len(node.Status.Conditions) == 0 {
		node.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "lab node (no kubelet runs in the lab)", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}}
	if ip != "" {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	if err := c.Status().Update(ctx, node); err != nil {
		return fmt.Errorf("setting status of node %s: %w", name, err)
	}
	return nil
}
