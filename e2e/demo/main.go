// Command demo starts the two-cluster lab (host + guest control planes) with a guest cluster
// as the field report found it, and shows its state the way an operator sees it: kubectl on
// the host and on the guest. The Cluster API core manager and CAPK are the real ones
// (lab.StartCAPI, lab.StartCAPK; KubeVirt is played, lab.StartKubeVirtStandIn): the
// GuestIngress part shows the worker rollout they run when guestnet repoints the
// MachineDeployment. Run it with `make demo`: it needs the lab's private network
// namespace (hack/labns) and the lab assets the Makefile builds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

const (
	clusterNamespace = "tenant-a"
	clusterName      = "guest-1"
)

func main() {
	hold := flag.Bool("hold", false, "keep the lab running after the tour, until interrupted")
	dir := flag.String("dir", "", "directory for the lab's certificates, data and logs (default: a temporary one)")
	flag.Parse()
	if err := run(*hold, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(hold bool, dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	section("Starting the lab: host and guest control planes (etcd, kube-apiserver; kube-controller-manager on the host)")
	started := time.Now()
	// No lab-wide policy: the demo's host admin writes the one its tenant needs (guestIngressTour).
	l, err := lab.Start(ctx, lab.Options{Dir: dir, SkipLabPolicy: true})
	if err != nil {
		return err
	}
	defer l.Stop()
	fmt.Printf("host apiserver  %s\nguest apiserver %s  (a host pod IP: the hosted control plane lives on the host network)\nready in %s, logs and kubeconfigs in %s\n",
		l.Host.Server(), l.Guest.Server(), time.Since(started).Round(100*time.Millisecond), l.Dir)

	s, err := setUpFieldReport(ctx, l)
	if err != nil {
		return err
	}

	section("Host: the CAPI cluster, its worker template, the workers' VMs (CAPK's) and their virt-launcher pods")
	host := kubectl(l, l.Host)
	host("get", "clusters,machinedeployments,machinesets,machines,kubevirtmachinetemplates,kubevirtmachines,virtualmachines,virtualmachineinstances", "-n", clusterNamespace)
	host("get", "pods", "-n", clusterNamespace, "-o", "wide", "-L", "cluster.x-k8s.io/cluster-name,cluster.x-k8s.io/role,"+lab.VMTemplateLabel)

	section("Host: two Services for the workers. The field report's selected by virtualMachineTemplate.metadata.labels (KubeVirt never copies those to the pods): no endpoints. The CAPI labels select every worker")
	host("get", "services", "-n", clusterNamespace, "-o", "custom-columns=NAME:.metadata.name,SELECTOR:.spec.selector")
	host("get", "endpointslices", "-n", clusterNamespace)

	section("Guest: the workers as nodes")
	guest := kubectl(l, l.Guest)
	guest("get", "nodes", "-o", "wide")

	section("Guest: `kubectl top` fails: metrics-server's APIService is dialed at a guest ClusterIP the host network cannot reach")
	guest("get", "apiservice", lab.MetricsAPIServiceName)
	guest("top", "nodes")

	section("Guest: every request a Service-referencing webhook intercepts fails (cert-manager's real webhook here)")
	guest("create", "-f", s.clusterIssuer)

	section("Summary")
	fmt.Println("These are the failures guestnet exists to fix: GuestWebhookBridge repoints the webhooks and the APIService at")
	fmt.Println("endpoints the guest control plane can reach; GuestIngress gives the workers a host Service that selects them.")

	section("guestnet: start the manager, Cilium's real LB-IPAM and the Cilium stand-in (L2 announcement, kube-proxy: no Cilium datapath runs in the lab)")
	standIn, err := lab.StartCiliumStandIn(ctx, l)
	if err != nil {
		return err
	}
	defer standIn.Stop()
	mgr, err := l.RunManagerBinary(ctx, "manager-demo", lab.ManagerFlags{})
	if err != nil {
		return err
	}
	defer mgr.Stop()
	fmt.Printf("manager log: %s\n", mgr.LogPath)

	if err := webhookBridgeTour(ctx, l, s, host, guest); err != nil {
		return err
	}
	if err := guestIngressTour(ctx, l, s, host, guest); err != nil {
		return err
	}
	if err := nodeIdentityTour(ctx, l, host, guest); err != nil {
		return err
	}

	if hold {
		pid := os.Getpid()
		section("Holding the lab until interrupted (Ctrl-C)")
		fmt.Printf("From another shell, as root:\n  nsenter --target %d --net --mount %s --kubeconfig %s get nodes\n", pid, l.Assets.Kubectl, l.Guest.KubeconfigPath)
		fmt.Printf("  nsenter --target %d --net --mount %s --kubeconfig %s get pods -A\n", pid, l.Assets.Kubectl, l.Host.KubeconfigPath)
		<-ctx.Done()
	}
	return nil
}

type scenario struct {
	cluster *lab.GuestCluster
	// kubevirt boots the VMs the real CAPK creates (KubeVirt stand-in); boot is what runs
	// in each; workers are the first two, in order.
	kubevirt      *lab.KubeVirt
	boot          vmBoot
	workers       []*lab.Worker
	certManager   *lab.CertManager
	clusterIssuer string // path of a ClusterIssuer manifest
}

// bridgeNodePorts is the GuestWebhookBridge's default nodePort range (30064-30079). The
// demo's worker template declares it already, as the ClusterClass in templates/ does from
// its guestnet variable: the servers below run in the workers' VMs, and rolling the workers
// would take them away with the VMs.
func bridgeNodePorts() []int32 {
	var out []int32
	for p := int32(30064); p < 30080; p++ {
		out = append(out, p)
	}
	return out
}

// setUpFieldReport builds the guest cluster as the field report found it, its workers those
// of the real CAPI and CAPK managers it starts (lab.StartCAPI, lab.StartCAPK; KubeVirt is
// played, lab.StartKubeVirtStandIn): two workers running the real cert-manager webhook (and
// cainjector) and the real metrics-server, a host Service selecting the workers by the wrong
// labels; then waits until the host's controller manager and the guest's aggregator have
// reacted.
func setUpFieldReport(ctx context.Context, l *lab.Lab) (*scenario, error) {
	ports := append([]int32{22, 10250, lab.WorkerServicePort}, bridgeNodePorts()...)
	capi, err := l.StartCAPI(ctx, clusterNamespace, capiWatchFilter)
	if err != nil {
		return nil, err
	}
	fmt.Printf("Cluster API core manager v1.14.2 running (log %s)\n", capi.LogPath())
	capk, err := l.StartCAPK(ctx, clusterNamespace)
	if err != nil {
		return nil, err
	}
	fmt.Printf("CAPK manager v0.11.2 running (log %s)\n", capk.LogPath())
	gc, err := l.CreateGuestCluster(ctx, clusterNamespace, clusterName, lab.WorkerTemplateOptions{Ports: ports},
		lab.ForRealCAPI(capiWatchFilter), lab.ForRealCAPK())
	if err != nil {
		return nil, err
	}
	// CAPI creates the MachineSet and its two Machines, CAPK their VMs; the KubeVirt stand-in
	// boots them, until the MachineDeployment is available.
	s := &scenario{cluster: gc}
	if s.kubevirt, err = l.StartKubeVirtStandIn(ctx, clusterNamespace, lab.KubeVirtOptions{WorkerSubnet: workerSubnet, OnBoot: s.boot.onBoot}); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, func() bool { return machineDeploymentAvailable(ctx, l, gc, 2) }); err != nil {
		return nil, fmt.Errorf("waiting for CAPI's MachineDeployment to be available (logs: %s, %s): %w", capi.LogPath(), capk.LogPath(), err)
	}
	workers := s.kubevirt.Workers()
	for i, w := range workers {
		usage := lab.KubeletUsage{CPUCores: 0.25 * float64(i+1), MemoryBytes: (1536 + 512*int64(i)) << 20}
		if i == 1 {
			usage.Pods = []lab.PodUsage{lab.MetricsServerPodUsage(0.05, 40<<20)}
		}
		if err := w.ServeKubeletStandIn(usage); err != nil {
			return nil, err
		}
	}
	if _, err := lab.HostServiceForWorkers(ctx, l.Host.Client, clusterNamespace, "ingress-by-vm-template-labels", map[string]string{lab.VMTemplateLabel: gc.WorkerTemplate}); err != nil {
		return nil, err
	}
	if _, err := lab.HostServiceForWorkers(ctx, l.Host.Client, clusterNamespace, "ingress-by-capi-labels", virtlauncher.WorkerSelector(gc.Namespace, gc.Name)); err != nil {
		return nil, err
	}
	fmt.Println("installing cert-manager v1.11.5 (webhook, cainjector) and metrics-server v0.8.0 in the guest, on the worker VMs ...")
	cm, err := l.InstallCertManager(ctx, workers[0])
	if err != nil {
		return nil, err
	}
	if _, err := l.InstallMetricsServer(ctx, workers[1]); err != nil {
		return nil, err
	}
	clusterIssuer := filepath.Join(l.Dir, "clusterissuer.yaml")
	if err := os.WriteFile(clusterIssuer, []byte(clusterIssuerYAML), 0o600); err != nil {
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got := &apiregistrationv1.APIService{}
		if err := l.Guest.Client.Get(ctx, client.ObjectKey{Name: lab.MetricsAPIServiceName}, got); err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiregistrationv1.Available && c.Reason == "FailedDiscoveryCheck" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the guest aggregator to check the metrics APIService: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		eps := &corev1.EndpointsList{}
		if err := l.Host.Client.List(ctx, eps, client.InNamespace(clusterNamespace)); err != nil {
			return false, err
		}
		return len(eps.Items) >= 2, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the host controller manager: %w", err)
	}
	s.workers, s.certManager, s.clusterIssuer = workers, cm, clusterIssuer
	return s, nil
}

// machineDeploymentAvailable reports whether CAPI says the cluster's MachineDeployment has
// observed its current spec and runs replicas available, up-to-date Machines and no others.
func machineDeploymentAvailable(ctx context.Context, l *lab.Lab, gc *lab.GuestCluster, replicas int32) bool {
	md := &clusterv1.MachineDeployment{}
	if err := l.Host.Client.Get(ctx, client.ObjectKey{Namespace: gc.Namespace, Name: gc.MachineDeployment}, md); err != nil {
		return false
	}
	return md.Status.ObservedGeneration == md.Generation &&
		ptr.Deref(md.Status.Replicas, -1) == replicas &&
		ptr.Deref(md.Status.UpToDateReplicas, -1) == replicas &&
		ptr.Deref(md.Status.AvailableReplicas, -1) == replicas
}

const clusterIssuerYAML = `apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata:
  name: selfsigned
spec:
  selfSigned: {}
`

// kubectl returns a function that prints and runs a kubectl command against one cluster.
func kubectl(l *lab.Lab, cluster *lab.Cluster) kubectlFunc {
	return func(args ...string) {
		fmt.Printf("\n$ kubectl --context %s %s\n", cluster.Options.Name, strings.Join(args, " "))
		cmd := l.Assets.KubectlCommand(cluster.KubeconfigPath, args...)
		out, err := cmd.CombinedOutput()
		fmt.Print(string(out))
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			fmt.Printf("(exit status %d)\n", exitErr.ExitCode())
		} else if err != nil {
			fmt.Printf("(kubectl failed: %v)\n", err)
		}
	}
}

type kubectlFunc func(args ...string)

func section(title string) {
	fmt.Printf("\n=== %s\n", title)
}
