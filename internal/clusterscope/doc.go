// Package clusterscope holds what guestnet's controllers share about the CAPI Cluster an
// object serves (spec.clusterName, in the object's namespace): looking the Cluster up and
// reaching its guest apiserver (ClusterAvailable), the pause rule (Paused), and the index and
// mappers that turn a Cluster or MachineDeployment event into requests for the objects that
// name it. How a reconcile reports is internal/status; its events, internal/record.
//
// Keeping these in one place keeps the controllers' behaviour identical where users expect it
// to be: the same pause semantics, the same messages.
package clusterscope
