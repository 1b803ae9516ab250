// Package feature holds guestnet's feature gates. They are set with --feature-gates and
// follow the Kubernetes life cycle (alpha: off by default, may change or go away).
package feature

import (
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/component-base/featuregate"
)

const (
	// ClusterTopologyVariables lets guestnet hand the ports the workers must declare to
	// ClusterClass-managed clusters through topology variables, instead of leaving those
	// clusters alone: their MachineDeployments belong to the topology controller and
	// guestnet never edits them directly.
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
