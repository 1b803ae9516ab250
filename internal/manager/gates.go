package manager

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
)

// Gates say which optional APIs the host serves (internal/optional): each was looked up once
// at setup and, while missing, is looked for again by the manager.
type Gates struct {
	// Cilium is Cilium LB-IPAM, which GuestIngresses need.
	Cilium *optional.Gate
	// CAPK is Cluster API Provider KubeVirt, whose templates the worker ports controller watches.
	CAPK *optional.Gate
	// CiliumBGP and MetalLB are the announcers a policy may choose besides Cilium's L2.
	CiliumBGP, MetalLB *optional.Gate
}

// SetupGates looks up the optional APIs with mgr's RESTMapper and adds the gates of those
// that are missing to mgr, which looks for them every optional.DefaultInterval.
func SetupGates(mgr ctrl.Manager) (Gates, error) {
	// The CiliumBGPAdvertisement version this host serves, v2 when none (then the gate
	// looks for v2).
	if v := optional.ServedVersion(mgr.GetRESTMapper(), ingress.BGPAdvertisementGVK.GroupKind(), ingress.BGPAdvertisementVersions...); v != "" {
		ingress.UseBGPAdvertisementVersion(v)
	}
	ciliumBGP := optional.CiliumBGP
	ciliumBGP.Kinds = []schema.GroupVersionKind{ingress.BGPAdvertisementGVK}
	g := Gates{
		Cilium:    optional.NewGate(optional.CiliumLBIPAM, mgr.GetRESTMapper(), 0),
		CAPK:      optional.NewGate(optional.CAPK, mgr.GetRESTMapper(), 0),
		CiliumBGP: optional.NewGate(ciliumBGP, mgr.GetRESTMapper(), 0),
		MetalLB:   optional.NewGate(optional.MetalLB, mgr.GetRESTMapper(), 0),
	}
	for _, gate := range []*optional.Gate{g.Cilium, g.CAPK, g.CiliumBGP, g.MetalLB} {
		if err := mgr.Add(gate); err != nil {
			return Gates{}, fmt.Errorf("adding the gate of %s: %w", gate.API().Name, err)
		}
	}
	return g, nil
}
