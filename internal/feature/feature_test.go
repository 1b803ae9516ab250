package feature

import "testing"

func TestClusterTopologyVariablesIsAlphaAndOff(t *testing.T) {
	if Gates.Enabled(ClusterTopologyVariables) {
		t.Fatal("ClusterTopologyVariables is alpha and must default to false")
	}
	if err := MutableGates.Set("ClusterTopologyVariables=true"); err != nil {
		t.Fatalf("the gate must be settable through --feature-gates: %v", err)
	}
	if !Gates.Enabled(ClusterTopologyVariables) {
		t.Fatal("ClusterTopologyVariables=true did not enable the gate")
	}
}
