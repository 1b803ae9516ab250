// Command lbipam is the lab's Cilium LB-IPAM: the operator's own lbipam cell from the pinned
// github.com/cilium/cilium module, run alone against one apiserver. The full operator cannot
// be built here (operator/k8s pulls in dependencies the module proxy refuses), so this main
// provides the cell's few dependencies itself: the k8s client (its --k8s-kubeconfig-path
// flag), the Service and CiliumLoadBalancerIPPool resources, the daemon config.
package main

import (
	"fmt"
	"os"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	"k8s.io/client-go/util/workqueue"

	"github.com/cilium/cilium/operator/pkg/lbipam"
	"github.com/cilium/cilium/pkg/hive"
	"github.com/cilium/cilium/pkg/k8s"
	cilium_api_v2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	"github.com/cilium/cilium/pkg/k8s/client"
	"github.com/cilium/cilium/pkg/k8s/resource"
	"github.com/cilium/cilium/pkg/k8s/utils"
	"github.com/cilium/cilium/pkg/logging"
	"github.com/cilium/cilium/pkg/option"
)

func main() {
	// As a cluster whose Helm values enable IPv4 and IPv6, L2 announcements and the BGP
	// control plane configures the operator. LB-IPAM serves Services of class io.cilium/l2-announcer
	// (io.cilium/bgp-control-plane) only when L2 announcements (the BGP control plane) are
	// enabled; with them off it leaves such Services alone.
	option.Config.EnableIPv4 = true
	option.Config.EnableIPv6 = true
	option.Config.EnableL2Announcements = true
	option.Config.EnableBGPControlPlane = true

	h := hive.New(
		client.Cell,
		cell.Config(k8s.DefaultConfig),
		cell.Provide(
			k8s.DefaultServiceWatchConfig,
			k8s.ServiceResource,
			poolResource,
			func() *option.DaemonConfig { return option.Config },
		),
		lbipam.Cell,
	)
	h.RegisterFlags(pflag.CommandLine)
	pflag.Parse()
	if err := h.Run(logging.DefaultSlogLogger); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// poolResource is what the operator's k8s.LBIPPoolsResource provides (operator/k8s is not
// importable here): a shared informer of CiliumLoadBalancerIPPools.
func poolResource(lc cell.Lifecycle, cs client.Clientset, mp workqueue.MetricsProvider) resource.Resource[*cilium_api_v2.CiliumLoadBalancerIPPool] {
	lw := utils.ListerWatcherFromTyped(cs.CiliumV2().CiliumLoadBalancerIPPools())
	return resource.New[*cilium_api_v2.CiliumLoadBalancerIPPool](lc, lw, mp, resource.WithMetric("CiliumLoadBalancerIPPool"))
}
