// Package nodeagent is guestnet's agent inside the guest cluster (docs/decisions/0011):
// `manager node-agent`, run by a DaemonSet guestnet applies into each guest that opts in to
// node identity, keeps the VM's kernel in step with its Node (the node IP, its virt-launcher
// pod IP, as a local address; KubeVirt's masquerade address 10.0.2.2 translated to it and back).
//
// This file is the contract between the manager's node-identity controller, which calls Apply
// and Delete with a guest client, and the agent's own code in this package: the objects the
// agent needs in the guest are made and written here, in one place.
package nodeagent

import (
	"context"
	"errors"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Params are what the agent's guest objects are made from.
type Params struct {
	// Image is the manager's own image (the agent is its `node-agent` subcommand).
	Image string
	// APIServerHost and APIServerPort are where the agent reaches the guest apiserver from
	// inside a VM: the Cluster's spec.controlPlaneEndpoint, not the guest's ClusterIP (which
	// needs a working CNI).
	APIServerHost string
	APIServerPort int32
	// Remove rolls the agents out with --remove: they take off what they put in the kernel
	// (the opt-out), and Status.Removed says when every one has.
	Remove bool
}

// Status is what the agent's DaemonSet reports.
type Status struct {
	// Desired, Updated and Ready count the agent pods (the DaemonSet's status for the
	// generation applied).
	Desired, Updated, Ready int32
	// RolledOut: every desired pod runs the applied template and is ready.
	RolledOut bool
}

// ErrNotImplemented is returned until the agent's objects are built.
var ErrNotImplemented = errors.New("nodeagent: not implemented yet")

// Apply server-side applies the agent's objects into the guest (its namespace, ServiceAccount,
// read-only RBAC on nodes, DaemonSet) and reports the DaemonSet's state.
func Apply(_ context.Context, _ client.Client, _ Params) (Status, error) {
	return Status{}, ErrNotImplemented
}

// Delete deletes the agent's objects from the guest; gone is true once none is left. Call it
// only after a Remove rollout reported RolledOut, so that no VM keeps what an agent put in its
// kernel.
func Delete(_ context.Context, _ client.Client) (gone bool, err error) {
	return false, ErrNotImplemented
}
