package nodeagent

import (
	"context"
	"flag"
	"fmt"
	"io"

	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// Command runs `manager node-agent ARGS` until ctx ends and returns the exit code. The guest
// apiserver is reached with the in-cluster configuration (the DaemonSet sets
// KUBERNETES_SERVICE_HOST/PORT to the Cluster's control plane endpoint) or --kubeconfig.
func Command(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("node-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := Options{}
	kubeconfig := ""
	fs.StringVar(&o.NodeName, "node-name", "", "The agent's own Node (the DaemonSet passes spec.nodeName).")
	fs.BoolVar(&o.Remove, "remove", false, "Take off what the agent put in the kernel and keep it off (the opt-out).")
	fs.IntVar(&o.HealthPort, "health-port", HealthPort, "Port of /readyz on 127.0.0.1 and of /healthz on the node IP.")
	fs.DurationVar(&o.ResyncEvery, "resync-period", 0, "How often the kernel is checked without a Node event (default 30s).")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "Path to a kubeconfig; in-cluster configuration when empty.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", "", "Serve /metrics at this address too (it is always served on 127.0.0.1:<health-port>), e.g. :9442.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := klog.Background().WithName("node-agent")
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	config, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil && !o.Remove {
		fmt.Fprintf(stderr, "node-agent: no configuration for the guest apiserver: %v\n", err)
		return 1
	}
	if err := Run(ctx, config, o, log); err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	return 0
}
