// Package virtlauncher knows how the virt-launcher pods of a guest cluster's worker VMs are
// labelled in the host, and so how a host Service selects them.
//
// KubeVirt copies the labels of the VMI template (virtualMachineTemplate.spec.template.metadata
// .labels) to the virt-launcher pod and adds kubevirt.io=virt-launcher; CAPK puts
// cluster.x-k8s.io/cluster-name, cluster.x-k8s.io/role=worker and
// capk.cluster.x-k8s.io/kubevirt-machine-namespace on that VMI template. The VM object's own
// labels (virtualMachineTemplate.metadata.labels) are NOT copied: a Service that selects by
// them has no endpoints (docs/runbook.md, "the host Service selects no worker"). This package
// is the one place that spells the selector; the lab's virt-launcher pods are labelled from
// the same facts.
package virtlauncher

import (
	"fmt"
	"slices"
	"strings"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Labels on every worker virt-launcher pod of a CAPK cluster.
const (
	// KubeVirtLabel is set by KubeVirt's virt-controller on the pods it creates.
	KubeVirtLabel = "kubevirt.io"
	// LauncherValue is KubeVirtLabel's value on a VM's pod.
	LauncherValue = "virt-launcher"
	// RoleLabel is set by CAPK on the VMI template of every machine.
	RoleLabel = "cluster.x-k8s.io/role"
	// WorkerRole is RoleLabel's value on worker machines (control-plane machines have "control-plane").
	WorkerRole = "worker"
	// ClusterNameLabel is CAPI's cluster name label, set by CAPK on the VMI template.
	ClusterNameLabel = clusterv1.ClusterNameLabel
	// MachineNamespaceLabel is set by CAPK on the VM and on its VMI template to the namespace
	// of the KubevirtMachine the VM is made for, overriding whatever the template's labels
	// say (sigs.k8s.io/cluster-api-provider-kubevirt v0.11.2: constant
	// KubevirtMachineNamespaceLabel in api/v1alpha1/kubevirtcluster_types.go, set in the
	// mutate function of Machine.Create in pkg/kubevirt/machine.go, which runs on every
	// CreateOrUpdate of the VM). A tenant chooses its Cluster's name and, through CAPK
	// (virtualMachineTemplate.metadata.namespace), where its VMs go, but not this value: CAPK
	// reads it from the KubevirtMachine, which lives in the tenant's own namespace.
	MachineNamespaceLabel = "capk.cluster.x-k8s.io/kubevirt-machine-namespace"
	// MachineNameLabel is set by CAPK next to MachineNamespaceLabel, to the name of the
	// KubevirtMachine (constant KubevirtMachineNameLabel, same file and function): the name of
	// the VM, of its VMI and the host name the guest Node is named after.
	MachineNameLabel = "capk.cluster.x-k8s.io/kubevirt-machine-name"
)

// WorkerSelector selects the virt-launcher pods of the worker VMs of the Cluster
// namespace/cluster: those CAPK made for KubevirtMachines of that namespace. A cluster name
// is unique in its namespace only, and CAPK lets a KubevirtMachineTemplate put its VMs in
// another namespace: the cluster name and the role alone would also select the VMs another
// namespace's Cluster of the same name puts here, so the selector names the namespace of the
// KubevirtMachines too. A Service with this selector must live in the Cluster's namespace
// (Service selectors never cross namespaces: the Cluster's own VMs that CAPK put elsewhere
// are not selected either, which PortsDeclared reports as WorkersElsewhere).
func WorkerSelector(namespace, cluster string) map[string]string {
	return map[string]string{
		ClusterNameLabel:      cluster,
		RoleLabel:             WorkerRole,
		KubeVirtLabel:         LauncherValue,
		MachineNamespaceLabel: namespace,
	}
}

// MachineSelector selects the virt-launcher pods of the worker VM of KubevirtMachine machine
// of the Cluster namespace/cluster (WorkerSelector, narrowed to one machine).
func MachineSelector(namespace, cluster, machine string) map[string]string {
	s := WorkerSelector(namespace, cluster)
	s[MachineNameLabel] = machine
	return s
}

// FormatSelector renders a selector as kubectl's -l flag takes it, keys sorted:
// "capk.cluster.x-k8s.io/kubevirt-machine-namespace=k0smotron,cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher".
func FormatSelector(selector map[string]string) string {
	parts := make([]string, 0, len(selector))
	for k, v := range selector {
		parts = append(parts, fmt.Sprintf("%s=%s", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
