//go:build tools

// Package tools pins clusterctl (sigs.k8s.io/cluster-api/cmd/clusterctl) and the Cluster API
// core manager (sigs.k8s.io/cluster-api/core, the lab's real CAPI controllers) for the Makefile.
package tools

import (
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/core"
)
