//go:build tools

// Package tools pins clusterctl (sigs.k8s.io/cluster-api/cmd/clusterctl) for the Makefile.
package tools

import _ "sigs.k8s.io/cluster-api/cmd/clusterctl"
