// Package feature holds guestnet's feature gates. They are set with --feature-gates and
// follow the Kubernetes life cycle (alpha: off by default, may change or go away).
package feature

import (
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/component-base/featuregate"
)

const (
	// ClusterTopologyVariables turns on the exp/topology controller: for a ClusterClass
	// cluster whose `guestnet` topology variable has `ingress` or `webhookBridge`, it creates,
	// updates and deletes the cluster's GuestIngress and GuestWebhookBridge (owned by the
	// Cluster). The ClusterClass patch declares the ports the same variable implies, so the
	// topology controller and guestnet never edit the same objects.
	//
	// alpha: v0.1
	ClusterTopologyVariables featuregate.Feature = "ClusterTopologyVariables"
)

var (
	// MutableGates is the mutable view of Gates; only main (flag parsing) and tests that
	// flip a gate for their duration should use it.
	MutableGates featuregate.MutableFeatureGate = featuregate.NewFeatureGate()

	// Gates is the read-only view the controllers consult.
	Gates featuregate.FeatureGate = MutableGates
)

var defaultGates = map[featuregate.Feature]featuregate.FeatureSpec{
	ClusterTopologyVariables: {Default: false, PreRelease: featuregate.Alpha},
}

func init() {
	runtime.Must(MutableGates.Add(defaultGates))
}
