package optional

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// The optional APIs of the host cluster.
var (
	// CiliumLBIPAM is what a GuestIngress is built on: the pool its IP comes from and the L2
	// policy that announces it. Without it GuestIngresses report
	// CiliumLBIPAMNotInstalled and create nothing; GuestWebhookBridges do not need it.
	CiliumLBIPAM = API{
		Name:  "Cilium LB-IPAM",
		Kinds: []schema.GroupVersionKind{ingress.PoolGVK, ingress.L2PolicyGVK},
		Install: "install Cilium with LB-IPAM and L2 announcements in the host cluster " +
			"(its CRDs ciliumloadbalancerippools.cilium.io and ciliuml2announcementpolicies.cilium.io)",
	}
	// CAPK is the KubeVirt infrastructure provider, whose worker templates the worker ports
	// controller declares ports on. Without it no MachineDeployment can use one, so there
	// is nothing to declare; the controller only stops watching templates.
	CAPK = API{
		Name:    "Cluster API Provider KubeVirt",
		Kinds:   []schema.GroupVersionKind{ports.KubevirtMachineTemplateGVK},
		Install: "install Cluster API Provider KubeVirt (clusterctl init --infrastructure kubevirt)",
	}
	// CiliumBGP is the BGP control plane's API, which a GuestIngress of Cilium's BGP class
	// needs for its CiliumBGPAdvertisement (CiliumBGP returns it for the version in use).
	// Without it such a GuestIngress reports HostObjectRejected with the gate's message; the
	// others work.
	CiliumBGP = API{
		Name:    "Cilium BGP control plane",
		Kinds:   []schema.GroupVersionKind{ingress.BGPAdvertisementGVK},
		Install: "enable Cilium's BGP control plane in the host cluster (ciliumbgpadvertisements.cilium.io: v2 since Cilium 1.18, v2alpha1 in 1.16 and 1.17)",
	}
	// MetalLB is MetalLB's API, which a GuestIngress of MetalLB's class needs for its
	// IPAddressPool and advertisements.
	MetalLB = API{
		Name:    "MetalLB",
		Kinds:   []schema.GroupVersionKind{ingress.MetalLBPoolGVK, ingress.MetalLBL2AdvertisementGVK, ingress.MetalLBBGPAdvertisementGVK},
		Install: "install MetalLB (v0.13 or later serves ipaddresspools, l2advertisements and bgpadvertisements.metallb.io as v1beta1)",
	}
)
