// Package virtlauncher knows how the virt-launcher pods of a guest cluster's worker VMs are
// labelled in the host, and so how a host Service selects them.
//
// KubeVirt copies the labels of the VMI template (virtualMachineTemplate.spec.template.metadata
// .labels) to the virt-launcher pod and adds kubevirt.io=virt-launcher; CAPK puts
// cluster.x-k8s.io/cluster-name and cluster.x-k8s.io/role=worker on that VMI template. The VM
// object's own labels (virtualMachineTemplate.metadata.labels) are NOT copied: a Service that
// selects by them has no endpoints (docs/runbook.md, "the host Service selects no worker"). This package is the one
// place that spells the selector; the lab's virt-launcher pods are labelled from the same
// constants.
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
)

// WorkerSelector selects the virt-launcher pods of the worker VMs of cluster. A cluster name
// is unique in its namespace only: a Service with this selector must live in the Cluster's
// namespace (Service selectors never cross namespaces, which is what keeps two clusters of
// the same name in two namespaces apart).
func WorkerSelector(cluster string) map[string]string {
	return map[string]string{
		ClusterNameLabel: cluster,
		RoleLabel:        WorkerRole,
		KubeVirtLabel:    LauncherValue,
	}
}

// FormatSelector renders a selector as kubectl's -l flag takes it, keys sorted:
// "cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher".
func FormatSelector(selector map[string]string) string {
	parts := make([]string, 0, len(selector))
	for k, v := range selector {
		parts = append(parts, fmt.Sprintf("%s=%s", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
