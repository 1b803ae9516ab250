package lab

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubevirtMachineTemplateGVK is CAPK's worker template kind. CAPK's Go module cannot be
// imported next to k8s 0.37 (design notes), so the lab handles it as unstructured.
var KubevirtMachineTemplateGVK = schema.GroupVersionKind{
	Group: "infrastructure.cluster.x-k8s.io", Version: "v1alpha1", Kind: "KubevirtMachineTemplate",
}

// Labels KubeVirt puts on every virt-launcher pod, and the ones CAPK puts on the VMI
// template (so KubeVirt copies them to the pod). CAPI's own labels come from clusterv1.
const (
	kubevirtLabel          = "kubevirt.io"
	kubevirtLauncherValue  = "virt-launcher"
	kubevirtCreatedByLabel = "kubevirt.io/created-by"
	kubevirtVMNameLabel    = "vm.kubevirt.io/name"
	capkVMLabel            = "kubevirt.io/vm"
	capkNameLabel          = "name"
	capkMachineNameLabel   = "capk.cluster.x-k8s.io/kubevirt-machine-name"
	capkMachineNSLabel     = "capk.cluster.x-k8s.io/kubevirt-machine-namespace"
	clusterRoleLabel       = "cluster.x-k8s.io/role"
	workerRoleValue        = "worker"
	// VMTemplateLabel is the label the lab's worker template puts in
	// virtualMachineTemplate.metadata.labels, where the field report first put its selector.
	VMTemplateLabel = "lab.guestnet.dev/worker-pool"
)

// GuestCluster is a CAPI cluster in the host whose control plane is the lab's guest.
type GuestCluster struct {
	Namespace string
	Name      string
	// WorkerTemplate and MachineDeployment name the worker KubevirtMachineTemplate and the
	// MachineDeployment that uses it (both "<cluster>-md-0").
	WorkerTemplate    string
	MachineDeployment string
}

// WorkerTemplateOptions shape the masquerade interface of the worker template.
type WorkerTemplateOptions struct {
	// Ports declared on the masquerade interface; nil means no ports list (every port is
	// forwarded into the VM).
	Ports []int32
}

// CreateGuestCluster creates, in the host namespace ns, what CAPI and CAPK hold for a guest
// cluster: the namespace, a provisioned Cluster, its <cluster>-kubeconfig Secret pointing at
// the guest apiserver, a worker KubevirtMachineTemplate with a masquerade interface, and a
// MachineDeployment using it.
func (l *Lab) CreateGuestCluster(ctx context.Context, ns, name string, tmpl WorkerTemplateOptions) (*GuestCluster, error) {
	c := l.Host.Client
	gc := &GuestCluster{Namespace: ns, Name: name, WorkerTemplate: name + "-md-0", MachineDeployment: name + "-md-0"}
	if err := createNamespaces(ctx, c, ns); err != nil {
		return nil, err
	}

	// A hosted control plane (k0smotron) on KubeVirt infrastructure; no provider runs in the
	// lab, so the referenced objects need not exist.
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneRef:   clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlane", Name: name},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: KubevirtMachineTemplateGVK.Group, Kind: "KubevirtCluster", Name: name},
		},
	}
	if err := c.Create(ctx, cluster); err != nil {
		return nil, fmt.Errorf("creating Cluster: %w", err)
	}
	// clustercache only connects to provisioned clusters.
	cluster.Status.Initialization = clusterv1.ClusterInitializationStatus{
		InfrastructureProvisioned: ptr.To(true), ControlPlaneInitialized: ptr.To(true),
	}
	if err := c.Status().Update(ctx, cluster); err != nil {
		return nil, fmt.Errorf("setting Cluster status: %w", err)
	}

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name + "-kubeconfig",
			Labels: map[string]string{clusterv1.ClusterNameLabel: name},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": l.Guest.Kubeconfig},
	}
	if err := c.Create(ctx, secret); err != nil {
		return nil, fmt.Errorf("creating kubeconfig Secret: %w", err)
	}

	if err := c.Create(ctx, workerTemplate(ns, gc.WorkerTemplate, tmpl)); err != nil {
		return nil, fmt.Errorf("creating KubevirtMachineTemplate: %w", err)
	}
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gc.MachineDeployment, Labels: map[string]string{clusterv1.ClusterNameLabel: name}},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: name,
			Replicas:    ptr.To[int32](2),
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineDeploymentNameLabel: gc.MachineDeployment}},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.ObjectMeta{Labels: map[string]string{clusterv1.MachineDeploymentNameLabel: gc.MachineDeployment}},
				Spec: clusterv1.MachineSpec{
					ClusterName: name,
					Version:     "v1.37.2",
					Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "K0sWorkerConfigTemplate", Name: name + "-md-0",
					}},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: KubevirtMachineTemplateGVK.Group, Kind: KubevirtMachineTemplateGVK.Kind, Name: gc.WorkerTemplate,
					},
				},
			},
		},
	}
	if err := c.Create(ctx, md); err != nil {
		return nil, fmt.Errorf("creating MachineDeployment: %w", err)
	}
	return gc, nil
}

// workerTemplate is a KubevirtMachineTemplate as users write them for masquerade workers,
// with a label in virtualMachineTemplate.metadata.labels (which KubeVirt never copies to pods).
func workerTemplate(ns, name string, opts WorkerTemplateOptions) *unstructured.Unstructured {
	iface := map[string]any{"name": "default", "masquerade": map[string]any{}}
	if opts.Ports != nil {
		ports := []any{}
		for _, p := range opts.Ports {
			ports = append(ports, map[string]any{"port": int64(p)})
		}
		iface["ports"] = ports
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"virtualMachineBootstrapCheck": map[string]any{"checkStrategy": "none"},
			"virtualMachineTemplate": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{VMTemplateLabel: name}},
				"spec": map[string]any{
					"runStrategy": "Always",
					"template": map[string]any{"spec": map[string]any{
						"domain": map[string]any{
							"cpu":     map[string]any{"cores": int64(2)},
							"memory":  map[string]any{"guest": "4Gi"},
							"devices": map[string]any{"interfaces": []any{iface}},
						},
						"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}},
					}},
				},
			},
		}}},
	}}
	u.SetGroupVersionKind(KubevirtMachineTemplateGVK)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// Worker is one worker VM of a guest cluster: a virt-launcher pod in the host, whose pod IP
// is the VM's only routable address, and the matching Node in the guest.
type Worker struct {
	Machine string
	IP      string
	Pod     string
}

// AddWorker adds a running worker VM to the guest cluster: a virt-launcher pod in the host,
// labelled exactly as KubeVirt labels the pod of a VM that CAPK created from the cluster's
// worker template, with its pod IP and Ready condition set through the status subresource
// (no kubelet runs in the lab), and a Ready Node in the guest with the same InternalIP.
func (l *Lab) AddWorker(ctx context.Context, gc *GuestCluster, machine, ip string) (*Worker, error) {
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(KubevirtMachineTemplateGVK)
	if err := l.Host.Client.Get(ctx, types.NamespacedName{Namespace: gc.Namespace, Name: gc.WorkerTemplate}, tmpl); err != nil {
		return nil, fmt.Errorf("reading worker template: %w", err)
	}
	vmiLabels, _, err := unstructured.NestedStringMap(tmpl.Object, "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "metadata", "labels")
	if err != nil {
		return nil, err
	}
	vmiUID := uuid.NewUUID()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: gc.Namespace,
			Name:      "virt-launcher-" + machine + "-" + utilrand.String(5),
			Labels:    VirtLauncherPodLabels(vmiLabels, gc, machine, vmiUID),
		},
		Spec: corev1.PodSpec{
			NodeName:   hostNodeFor(machine),
			Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"}},
		},
	}
	if err := l.Host.Client.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating virt-launcher pod: %w", err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  ip,
		PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if err := l.Host.Client.Status().Update(ctx, pod); err != nil {
		return nil, fmt.Errorf("setting virt-launcher pod status: %w", err)
	}
	if err := createReadyNode(ctx, l.Guest.Client, machine, ip); err != nil {
		return nil, err
	}
	return &Worker{Machine: machine, IP: ip, Pod: pod.Name}, nil
}

// RemoveWorker deletes a worker's virt-launcher pod and guest Node, as when CAPI deletes
// the Machine (the VM goes away with its pod).
func (l *Lab) RemoveWorker(ctx context.Context, gc *GuestCluster, w *Worker) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: gc.Namespace, Name: w.Pod}}
	if err := l.Host.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		return err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: w.Machine}}
	return client.IgnoreNotFound(l.Guest.Client.Delete(ctx, node))
}

// VirtLauncherPodLabels are the labels of the virt-launcher pod of a CAPK worker VM.
// KubeVirt copies the VMI template's labels (virtualMachineTemplate.spec.template.metadata
// .labels) to the pod and adds its own; CAPK adds its labels to that VMI template. The VM
// object's own labels (virtualMachineTemplate.metadata.labels) are NOT copied: a Service
// selecting by them has no endpoints (field notes, ingress break 1).
func VirtLauncherPodLabels(vmiTemplateLabels map[string]string, gc *GuestCluster, machine string, vmiUID types.UID) map[string]string {
	labels := maps.Clone(vmiTemplateLabels)
	if labels == nil {
		labels = map[string]string{}
	}
	// CAPK (pkg/kubevirt/utils.go, machine.go) on the VMI template.
	labels[capkVMLabel] = machine
	labels[capkNameLabel] = machine
	labels[clusterRoleLabel] = workerRoleValue
	labels[clusterv1.ClusterNameLabel] = gc.Name
	labels[capkMachineNameLabel] = machine
	labels[capkMachineNSLabel] = gc.Namespace
	// KubeVirt's virt-controller on the pod.
	labels[kubevirtLabel] = kubevirtLauncherValue
	labels[kubevirtCreatedByLabel] = string(vmiUID)
	labels[kubevirtVMNameLabel] = machine
	return labels
}

// hostNodeFor spreads worker VMs over the host nodes, always the same node for a machine.
func hostNodeFor(machine string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(machine))
	return HostNodes[int(h.Sum32())%len(HostNodes)]
}
