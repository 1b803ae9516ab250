package lab

import (
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// ForRealCAPITopology labels a Cluster with a topology (ClusterClass) for the real CAPI
// started with watchFilter (StartCAPI), as ForRealCAPI does a hand-made guest cluster: the
// Cluster carries CAPI's watch-filter label, and so do the objects its topology controller
// creates, through the topology's metadata, which CAPI copies onto them: the control plane
// (spec.topology.controlPlane.metadata) and each MachineDeployment, its MachineSets and
// Machines (spec.topology.workers.machineDeployments[].metadata, also put into
// spec.template.metadata). CAPI adds no watch-filter label of its own to what it generates;
// without these, its MachineDeployment and MachineSet controllers never see the workers.
// The ClusterClass needs the label too (its controller computes status.variables, without
// which CAPI's topology controller waits and its Cluster webhook validates no variable).
func ForRealCAPITopology(c *clusterv1.Cluster, watchFilter string) {
	c.Labels = withLabel(c.Labels, clusterv1.WatchLabel, watchFilter)
	t := &c.Spec.Topology
	t.ControlPlane.Metadata.Labels = withLabel(t.ControlPlane.Metadata.Labels, clusterv1.WatchLabel, watchFilter)
	for i := range t.Workers.MachineDeployments {
		md := &t.Workers.MachineDeployments[i]
		md.Metadata.Labels = withLabel(md.Metadata.Labels, clusterv1.WatchLabel, watchFilter)
	}
}
