package diagnose

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
)

// Usage is the command's help text; the flags follow it.
const Usage = `Usage: manager diagnose --namespace <ns> --cluster <name> [--kubeconfig <host kubeconfig>] [--output text|json] [--probe]

Runs the runbook's checks (docs/runbook.md) against one guest cluster and prints one verdict
per item, [OK], [WARN] or [FAIL], with the fix for every WARN and FAIL: the worker
virt-launcher pods selected by the CAPI labels, the endpoints (and load-balancer IP) of every
Service that forwards to the workers, the ports each worker template declares against those
the cluster requires, the guest Cilium tunnel port, every APIService's availability, every
webhook's reachability and TLS, the konnectivity agents, the guest Nodes' identity (each
initialized, with its VM's virt-launcher pod IP as InternalIP, written by a kubelet in external
cloud-provider mode, and advertised by the guest Cilium's CiliumNode), and the conditions of
the cluster's GuestIngresses and GuestWebhookBridges.

It reads the host through --kubeconfig and the guest through the Cluster's
<cluster>-kubeconfig Secret (or --guest-kubeconfig), and changes nothing. A tenant can write
that Secret: diagnose checks it as guestnet's manager does and uses only its inline
credentials and CA, with the Cluster's spec.controlPlaneEndpoint as server; an exec plugin,
auth provider, file path, proxy or insecure TLS in it is refused, not run, read or dialled
(docs/decisions/0006-untrusted-kubeconfigs.md). --guest-kubeconfig is your own file and is
used as it is, with client-go's defaults (exec plugins included): name only one you trust.

Without --probe, a bridged target's reachability is the bridge's own last probe (status
.targets, probed by guestnet's controller from the host network). --probe calls every bridged
target and every webhook url now, as the guest apiserver does: run it where host ClusterIPs
are reachable (a pod or a node of the host cluster), or every probe fails.

Exit status: 0 when no check FAILs, 1 when one does, 2 on a usage error or when the host
cluster or the Cluster cannot be read.

Flags:
`

// options are the command's flags.
type options struct {
	kubeconfig      string
	context         string
	namespace       string
	cluster         string
	output          string
	probe           bool
	guestKubeconfig string
	timeout         time.Duration
	requestTimeout  time.Duration
}

func newFlagSet(o *options, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("diagnose", pflag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig of the host cluster (default: $KUBECONFIG, then ~/.kube/config).")
	fs.StringVar(&o.context, "context", "", "Context of the host kubeconfig to use (default: its current context).")
	fs.StringVarP(&o.namespace, "namespace", "n", "", "Namespace of the CAPI Cluster (required).")
	fs.StringVar(&o.cluster, "cluster", "", "Name of the CAPI Cluster (required).")
	fs.StringVarP(&o.output, "output", "o", "text", "Output format: text (one line per check) or json.")
	fs.BoolVar(&o.probe, "probe", false, "Call every bridged target and webhook url now, from here (needs host ClusterIPs to be reachable).")
	fs.StringVar(&o.guestKubeconfig, "guest-kubeconfig", "", "Kubeconfig of the guest cluster, instead of the Cluster's <cluster>-kubeconfig Secret; your own file, used as it is (exec plugins and files included), unlike the Secret, which is checked.")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "Time limit of the whole run.")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 15*time.Second, "Time limit of each request to the host or guest apiserver.")
	fs.Usage = func() {
		fmt.Fprint(out, Usage)
		fs.PrintDefaults()
	}
	return fs
}

// Run is `manager diagnose`: args are the arguments after "diagnose". It returns the exit
// status (ExitOK, ExitFail, ExitUsage).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := &options{}
	fs := newFlagSet(o, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		fmt.Fprintf(stderr, "manager diagnose: %v\nRun 'manager diagnose --help' for the usage.\n", err)
		return ExitUsage
	}
	usageError := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "manager diagnose: "+format+"\n", a...)
		fmt.Fprintln(stderr, "Run 'manager diagnose --help' for the usage.")
		return ExitUsage
	}
	switch {
	case fs.NArg() > 0:
		return usageError("unexpected arguments %q", fs.Args())
	case o.namespace == "" || o.cluster == "":
		return usageError("--namespace and --cluster are required")
	case o.output != "text" && o.output != "json":
		return usageError("--output must be text or json, not %q", o.output)
	}

	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	configure := func(c *rest.Config) {
		c.Timeout = o.requestTimeout
		c.UserAgent = "guestnet-diagnose"
		c.QPS, c.Burst = 50, 100
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	hostConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context}).ClientConfig()
	if err != nil {
		return usageError("loading the host kubeconfig: %v", err)
	}
	configure(hostConfig)
	host, err := client.New(hostConfig, client.Options{Scheme: Scheme})
	if err != nil {
		return usageError("connecting to the host cluster: %v", err)
	}
	gather := GatherOptions{Namespace: o.namespace, Cluster: o.cluster, Configure: configure}
	if o.guestKubeconfig != "" {
		if gather.GuestConfig, err = clientcmd.BuildConfigFromFlags("", o.guestKubeconfig); err != nil {
			return usageError("loading --guest-kubeconfig: %v", err)
		}
		gather.GuestSource = "--guest-kubeconfig " + o.guestKubeconfig
	}

	state, err := Gather(ctx, host, gather)
	if err != nil {
		fmt.Fprintf(stderr, "manager diagnose: reading the host cluster: %s\n", terminalSafe(err.Error()))
		return ExitUsage
	}
	if o.probe {
		ProbeTargets(ctx, state, bridge.Probe)
	}
	report := Diagnose(state)
	if o.output == "json" {
		err = report.WriteJSON(stdout)
	} else {
		err = report.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "manager diagnose: writing the report: %v\n", err)
		return ExitUsage
	}
	return report.ExitCode()
}
