package lab

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// Labels CAPK (pkg/kubevirt/utils.go, machine.go) puts on the VMI template of a VM, so that
// KubeVirt copies them to the virt-launcher pod (virtLauncherPodLabels adds KubeVirt's own).
// AddWorker plays CAPK with them; the real CAPK (StartCAPK) sets its own, and
// TestLab_RealCAPKCreatesTheVMs checks that these are the same. CAPI's come from clusterv1.
// They are spelled here as CAPK sets them, on purpose independently of guestnet's selector
// (internal/virtlauncher): the lab plays reality, and a wrong selector in guestnet must find
// no pod here, as in production.
const (
	clusterRoleLabel     = "cluster.x-k8s.io/role"
	workerRoleValue      = "worker"
	capkVMLabel          = "kubevirt.io/vm"
	capkNameLabel        = "name"
	capkMachineNameLabel = "capk.cluster.x-k8s.io/kubevirt-machine-name"
	capkMachineNSLabel   = "capk.cluster.x-k8s.io/kubevirt-machine-namespace"
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
	// Guest is the control plane the cluster lives on (its Nodes, its kubeconfig Secret's
	// server): a guest shard (OnGuest), or nil for the lab's guest.
	Guest *Cluster

	// controlPlaneLB: WithControlPlaneLoadBalancer.
	controlPlaneLB bool
}

// WorkerTemplateOptions shape the masquerade interface of the worker template.
type WorkerTemplateOptions struct {
	// Ports (TCP) and UDPPorts declared on the masquerade interface; both nil means no ports
	// list (every port is forwarded into the VM).
	Ports    []int32
	UDPPorts []int32
	// VMNamespace, when set, is virtualMachineTemplate.metadata.namespace: CAPK creates the
	// VMs there instead of in the Cluster's namespace.
	VMNamespace string
	// VMILabels are more labels of the VMI template (virtualMachineTemplate.spec.template
	// .metadata.labels), which KubeVirt copies to the virt-launcher pod.
	VMILabels map[string]string
	// As creates the template: a tenant's identity (a KubevirtMachineTemplate is the
	// tenant's to write); the lab's admin when nil.
	As client.Client
}

// CreateGuestCluster creates, in the host namespace ns, what CAPI and CAPK hold for a guest
// cluster: the namespace, a provisioned Cluster, its <cluster>-kubeconfig Secret pointing at
// the guest apiserver, a worker KubevirtMachineTemplate with a masquerade interface, and a
// MachineDeployment using it. With WithControlPlaneLoadBalancer the Cluster is neither
// provisioned nor given an endpoint or a Secret: see there.
func (l *Lab) CreateGuestCluster(ctx context.Context, ns, name string, tmpl WorkerTemplateOptions, opts ...GuestClusterOption) (*GuestCluster, error) {
	c := l.Host.Client
	gc := &GuestCluster{Namespace: ns, Name: name, WorkerTemplate: name + "-md-0", MachineDeployment: name + "-md-0"}
	if err := createNamespaces(ctx, c, ns); err != nil {
		return nil, err
	}

	// A hosted control plane (k0smotron) on KubeVirt infrastructure; no provider runs in the
	// lab, so the referenced objects need not exist. The control plane endpoint is the lab
	// guest's apiserver, as the control plane provider reports it (guestnet connects only to
	// the endpoint the Cluster names, internal/kubeconfig).
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneEndpoint: GuestControlPlaneEndpoint(),
			ControlPlaneRef:      clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlane", Name: name},
			InfrastructureRef:    clusterv1.ContractVersionedObjectReference{APIGroup: ports.KubevirtMachineTemplateGVK.Group, Kind: "KubevirtCluster", Name: name},
		},
	}
	for _, o := range opts {
		gc.controlPlaneLB = gc.controlPlaneLB || o.controlPlaneLB
	}
	if gc.controlPlaneLB {
		cluster.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{}
	}
	kubeconfig, secretWriter := l.Guest.Kubeconfig, c
	for _, o := range opts {
		gc.Guest = cmp.Or(o.guest, gc.Guest)
	}
	if gc.Guest != nil {
		if gc.controlPlaneLB {
			return nil, fmt.Errorf("OnGuest: a guest shard has no control plane load balancer")
		}
		cluster.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: gc.Guest.Options.Address, Port: APIServerPort}
		kubeconfig = gc.Guest.Kubeconfig
	}
	ownKubeconfig := false
	for _, o := range opts {
		if o.cluster != nil {
			o.cluster(cluster)
		}
		if o.kubeconfig != nil {
			kubeconfig, secretWriter, ownKubeconfig = o.kubeconfig, o.secretWriter, true
		}
	}
	if gc.controlPlaneLB && (ownKubeconfig || cluster.Spec.ControlPlaneEndpoint.IsValid()) {
		return nil, fmt.Errorf("WithControlPlaneLoadBalancer: the endpoint and the kubeconfig are the control plane's, not the test's")
	}
	if gc.controlPlaneLB {
		// The stand-in's to write, and CAPI's to mark the Cluster provisioned.
		if err := c.Create(ctx, cluster); err != nil {
			return nil, fmt.Errorf("creating Cluster: %w", err)
		}
		return gc, l.createWorkersAndRunAfter(ctx, gc, tmpl, opts)
	}
	// The kubeconfig Secret comes first, so the ClusterCache's first connection succeeds: a
	// failed one is retried only after 30 s, and the manager binary the e2e tests run cannot
	// shorten that.
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name + "-kubeconfig",
			Labels: map[string]string{clusterv1.ClusterNameLabel: name},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": kubeconfig},
	}
	if err := secretWriter.Create(ctx, secret); err != nil {
		return nil, fmt.Errorf("creating kubeconfig Secret: %w", err)
	}

	if err := c.Create(ctx, cluster); err != nil {
		return nil, fmt.Errorf("creating Cluster: %w", err)
	}
	// clustercache only connects to provisioned clusters. The condition is what the real
	// Cluster controller (StartCAPI) sets once the control plane says so, and never unsets;
	// the lab has no control-plane object for it to read (no k0smotron), and the real
	// Machine controller looks for Nodes only once it is True.
	// The real Cluster controller may write the new Cluster first (finalizer, status).
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err != nil {
			return err
		}
		cluster.Status.Initialization = clusterv1.ClusterInitializationStatus{
			InfrastructureProvisioned: ptr.To(true), ControlPlaneInitialized: ptr.To(true),
		}
		cluster.Status.Conditions = []metav1.Condition{{
			Type: clusterv1.ClusterControlPlaneInitializedCondition, Status: metav1.ConditionTrue,
			Reason: clusterv1.ClusterControlPlaneInitializedReason, LastTransitionTime: metav1.Now(),
		}}
		return c.Status().Update(ctx, cluster)
	}); err != nil {
		return nil, fmt.Errorf("setting Cluster status: %w", err)
	}
	return gc, l.createWorkersAndRunAfter(ctx, gc, tmpl, opts)
}

// createWorkersAndRunAfter creates the guest cluster's worker template and MachineDeployment,
// then runs the options' after.
func (l *Lab) createWorkersAndRunAfter(ctx context.Context, gc *GuestCluster, tmpl WorkerTemplateOptions, opts []GuestClusterOption) error {
	c, ns, name := l.Host.Client, gc.Namespace, gc.Name
	templateWriter := c
	if tmpl.As != nil {
		templateWriter = tmpl.As
	}
	if err := templateWriter.Create(ctx, workerTemplate(ns, gc.WorkerTemplate, tmpl)); err != nil {
		return fmt.Errorf("creating KubevirtMachineTemplate: %w", err)
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
					// A ready bootstrap Secret instead of a bootstrap provider's config
					// template: no bootstrap provider runs in the lab, and the real CAPI
					// (StartCAPI) needs the referenced template to exist to create Machines.
					Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(name + "-md-0-bootstrap")},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: ports.KubevirtMachineTemplateGVK.Group, Kind: ports.KubevirtMachineTemplateGVK.Kind, Name: gc.WorkerTemplate,
					},
				},
			},
		},
	}
	for _, o := range opts {
		if o.machineDeployment != nil {
			o.machineDeployment(md)
		}
	}
	if err := c.Create(ctx, md); err != nil {
		return fmt.Errorf("creating MachineDeployment: %w", err)
	}
	for _, o := range opts {
		if o.after != nil {
			if err := o.after(ctx, l, gc); err != nil {
				return err
			}
		}
	}
	return nil
}

// GuestClusterOption changes the Cluster and MachineDeployment CreateGuestCluster creates,
// and may add objects once they exist.
type GuestClusterOption struct {
	cluster           func(*clusterv1.Cluster)
	machineDeployment func(*clusterv1.MachineDeployment)
	after             func(context.Context, *Lab, *GuestCluster) error
	// kubeconfig, when set, is the value of the <cluster>-kubeconfig Secret, which
	// secretWriter creates.
	kubeconfig   []byte
	secretWriter client.Client
	// controlPlaneLB: WithControlPlaneLoadBalancer.
	controlPlaneLB bool
	// guest: OnGuest.
	guest *Cluster
}

// OnGuest puts the guest cluster on guest (a guest shard, StartGuestShards) instead of the
// lab's guest: the Cluster's endpoint is guest's apiserver, its kubeconfig Secret is guest's
// admin kubeconfig, and its workers' Nodes are created there.
func OnGuest(guest *Cluster) GuestClusterOption { return GuestClusterOption{guest: guest} }

// guestOf is the control plane gc lives on.
func (l *Lab) guestOf(gc *GuestCluster) *Cluster { return cmp.Or(gc.Guest, l.Guest) }

// GuestControlPlaneEndpoint is the lab guest apiserver's address and port: the
// spec.controlPlaneEndpoint of every Cluster whose control plane is the lab's guest.
func GuestControlPlaneEndpoint() clusterv1.APIEndpoint {
	return clusterv1.APIEndpoint{Host: GuestAPIServerAddress, Port: APIServerPort}
}

// WithControlPlaneEndpoint sets the Cluster's spec.controlPlaneEndpoint to host:port instead
// of the lab guest apiserver's (GuestControlPlaneEndpoint); a zero endpoint leaves it unset.
func WithControlPlaneEndpoint(endpoint clusterv1.APIEndpoint) GuestClusterOption {
	return GuestClusterOption{cluster: func(c *clusterv1.Cluster) { c.Spec.ControlPlaneEndpoint = endpoint }}
}

// WithControlPlaneLoadBalancer gives the guest cluster a control plane that k0smotron exposes
// through a LoadBalancer Service, as a tenant's template asks with service.type LoadBalancer:
// its K0smotronControlPlane has spec.service {type: LoadBalancer, apiPort: APIServerPort,
// konnectivityPort: KonnectivityAgentPort, loadBalancerClass: io.cilium/l2-announcer} and no
// status. The Cluster has no endpoint and is not marked provisioned, and no kubeconfig Secret
// is written: the k0smotron stand-in (StartK0smotronStandIn) applies the Service
// kmc-<name>-lb (ControlPlaneServiceName) and, once LB-IPAM gave it an IP (request
// GuestControlPlaneLoadBalancerIP: the only one the guest apiserver's certificate holds),
// writes the control plane's endpoint (IP:APIServerPort) and the Secret (server
// https://IP:APIServerPort), and reports it running. The real CAPI (StartCAPI, ForRealCAPI)
// then copies the endpoint into the Cluster and marks it provisioned; with ForRealCAPK the
// KubevirtCluster has no endpoint, or CAPI would take the KubevirtCluster's first.
func WithControlPlaneLoadBalancer() GuestClusterOption {
	return GuestClusterOption{
		controlPlaneLB: true,
		after: func(ctx context.Context, l *Lab, gc *GuestCluster) error {
			return l.createControlPlane(ctx, gc)
		},
	}
}

// WithKubeconfig makes writer (e.g. a tenant's client) create the <cluster>-kubeconfig Secret
// with value, instead of the lab's admin with the lab guest's admin kubeconfig. The Secret is
// still created before the Cluster, so the ClusterCache's first connection reads it.
func WithKubeconfig(writer client.Client, value []byte) GuestClusterOption {
	return GuestClusterOption{kubeconfig: value, secretWriter: writer}
}

// ForRealCAPI makes the guest cluster one for the real CAPI started with watchFilter
// (StartCAPI): the Cluster, the MachineDeployment and its Machine template carry CAPI's
// watch-filter label (MachineSets and Machines inherit the template's labels), and the
// Cluster's control plane exists, initialized and ready, as k0smotron reports it (a
// K0smotronControlPlane of the lab's stand-in CRD, which StartCAPI installs): CAPI reads it
// before it deletes a Machine's Node.
func ForRealCAPI(watchFilter string) GuestClusterOption {
	return GuestClusterOption{
		cluster: func(c *clusterv1.Cluster) { c.Labels = withLabel(c.Labels, clusterv1.WatchLabel, watchFilter) },
		machineDeployment: func(md *clusterv1.MachineDeployment) {
			md.Labels = withLabel(md.Labels, clusterv1.WatchLabel, watchFilter)
			md.Spec.Template.Labels = withLabel(md.Spec.Template.Labels, clusterv1.WatchLabel, watchFilter)
		},
		after: func(ctx context.Context, l *Lab, gc *GuestCluster) error {
			if gc.controlPlaneLB {
				return nil // WithControlPlaneLoadBalancer creates it
			}
			return l.createControlPlane(ctx, gc)
		},
	}
}

// withLabel returns labels (a new map when nil) with key set to value.
func withLabel(labels map[string]string, key, value string) map[string]string {
	if labels == nil {
		labels = map[string]string{}
	}
	labels[key] = value
	return labels
}

// workerTemplate is a KubevirtMachineTemplate as users write them for masquerade workers,
// with a label in virtualMachineTemplate.metadata.labels (which KubeVirt never copies to pods).
func workerTemplate(ns, name string, opts WorkerTemplateOptions) *unstructured.Unstructured {
	iface := map[string]any{"name": "default", "masquerade": map[string]any{}}
	if opts.Ports != nil || opts.UDPPorts != nil {
		ports := []any{}
		for _, p := range opts.Ports {
			ports = append(ports, map[string]any{"port": int64(p)})
		}
		for _, p := range opts.UDPPorts {
			ports = append(ports, map[string]any{"port": int64(p), "protocol": "UDP"})
		}
		iface["ports"] = ports
	}
	vmMetadata := map[string]any{"labels": map[string]any{VMTemplateLabel: name}}
	if opts.VMNamespace != "" {
		vmMetadata["namespace"] = opts.VMNamespace
	}
	vmiTemplate := map[string]any{"spec": map[string]any{
		"domain": map[string]any{
			"cpu":     map[string]any{"cores": int64(2)},
			"memory":  map[string]any{"guest": "4Gi"},
			"devices": map[string]any{"interfaces": []any{iface}},
		},
		"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}},
	}}
	if len(opts.VMILabels) > 0 {
		vmiLabels := map[string]any{}
		for k, v := range opts.VMILabels {
			vmiLabels[k] = v
		}
		vmiTemplate["metadata"] = map[string]any{"labels": vmiLabels}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"virtualMachineBootstrapCheck": map[string]any{"checkStrategy": "none"},
			"virtualMachineTemplate": map[string]any{
				"metadata": vmMetadata,
				"spec":     map[string]any{"runStrategy": "Always", "template": vmiTemplate},
			},
		}}},
	}}
	u.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// Worker is one worker VM of a guest cluster: a virt-launcher pod in the host, whose pod IP
// is the VM's only routable address, and the matching Node in the guest. Its datapath is
// either the kernel's (network namespaces with KubeVirt's NAT rules, kerneldatapath.go) or
// the userspace masquerade stand-in (masquerade.go).
type Worker struct {
	Machine string
	IP      string
	Pod     string
	// Template is the KubevirtMachineTemplate the VM was created from: its declared ports
	// are fixed for the VM's life, as in KubeVirt.
	Template string
	// VMAddress is where what runs inside the VM listens (see ServeInVM): on the kernel
	// datapath the VM's masquerade address (10.0.2.2), in the VM's own network namespace;
	// with the userspace stand-in an address of the lab namespace for this VM alone.
	VMAddress string
	// Declared are the TCP ports the VM's masquerade interface declares (nil: no ports
	// list, every port is forwarded).
	Declared []int32

	nat    *masqueradeNAT // the userspace stand-in, or
	kernel *kernelVM      // the kernel datapath
	mu     sync.Mutex
	vm     []net.Listener
}

// WorkerOption chooses the datapath of a worker AddWorker adds.
type WorkerOption func(*workerOptions)

type workerOptions struct {
	kernel, dualStack bool
	hostNode          string
}

// OnKernelDatapath puts the worker on the kernel datapath (kerneldatapath.go): its pod IP
// must be in a /24 of 10.244.1.0-10.244.127.255 that holds no userspace worker, not .254.
func OnKernelDatapath() WorkerOption { return func(o *workerOptions) { o.kernel = true } }

// DualStack gives a kernel worker's pod an IPv6 address too (fd00:10:244:X::Y for
// 10.244.X.Y), and its VM KubeVirt's IPv6 masquerade (fd10:0:2::2 behind fd10:0:2::1, the
// ip6 nat rules), as KubeVirt does for a pod with a global IPv6 address.
func DualStack() WorkerOption { return func(o *workerOptions) { o.kernel, o.dualStack = true, true } }

// OnHostNode runs the worker's virt-launcher pod on the host node name (one of HostNodes)
// instead of the one the machine's name hashes to: its EndpointSlice endpoints carry that
// nodeName, which externalTrafficPolicy Local goes by.
func OnHostNode(name string) WorkerOption { return func(o *workerOptions) { o.hostNode = name } }

// newWorker starts the datapath of a worker VM with pod IP ip and VMI spec vmi: the kernel's
// or the userspace masquerade stand-in's.
func (l *Lab) newWorker(machine, ip string, vmi *kubevirtv1.VirtualMachineInstanceSpec, opts workerOptions) (*Worker, error) {
	declared, forwardAll := masqueradePorts(vmi)
	w := &Worker{Machine: machine, IP: ip, Declared: declared}
	if forwardAll {
		w.Declared = nil
	}
	if opts.kernel {
		k, err := l.startKernelVM(kernelVMSpec{name: machine, podIP: net.ParseIP(ip), dualStack: opts.dualStack, vmi: vmi})
		if err != nil {
			return nil, err
		}
		w.kernel, w.VMAddress = k, k.vmAddr.String()
		return w, nil
	}
	if l.onKernelSubnet(ip) {
		return nil, fmt.Errorf("worker %s: pod IP %s is in a /24 of the kernel datapath: add it with lab.OnKernelDatapath", machine, ip)
	}
	vmAddr, err := vmAddress(ip)
	if err != nil {
		return nil, err
	}
	if w.nat, err = newMasqueradeNAT(ip, vmAddr, declared, forwardAll); err != nil {
		return nil, err
	}
	w.VMAddress = vmAddr
	return w, nil
}

// AddWorker adds a running worker VM to the guest cluster, created from the template its
// MachineDeployment points at now: a virt-launcher pod in the host, labelled exactly as
// KubeVirt labels the pod of a VM that CAPK created from that template, with its pod IP and
// Ready condition set through the status subresource (no kubelet runs in the lab), a Ready
// Node in the guest with the same InternalIP, and the datapath that forwards the template's
// declared ports from the pod IP into the VM: the userspace masquerade stand-in, or the
// kernel's with OnKernelDatapath.
func (l *Lab) AddWorker(ctx context.Context, gc *GuestCluster, machine, ip string, opts ...WorkerOption) (*Worker, error) {
	var o workerOptions
	for _, opt := range opts {
		opt(&o)
	}
	tmpl, err := l.currentWorkerTemplate(ctx, gc)
	if err != nil {
		return nil, err
	}
	vmiLabels, _, err := unstructured.NestedStringMap(tmpl.Object, "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "metadata", "labels")
	if err != nil {
		return nil, err
	}
	// The ports the VM's masquerade interface declares, read as KubeVirt reads them (the
	// stand-in's own rule, not guestnet's analysis of the template).
	vmiSpecMap, _, err := unstructured.NestedMap(tmpl.Object, "spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec")
	if err != nil {
		return nil, err
	}
	vmiSpec := &kubevirtv1.VirtualMachineInstanceSpec{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(vmiSpecMap, vmiSpec); err != nil {
		return nil, fmt.Errorf("reading the VM spec of template %s: %w", tmpl.GetName(), err)
	}
	w, err := l.newWorker(machine, ip, vmiSpec, o)
	if err != nil {
		return nil, err
	}
	w.Template = tmpl.GetName()
	l.track(w)

	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{
		Name: machine, UID: uuid.NewUUID(), Labels: playedCAPKVMILabels(vmiLabels, gc, machine),
	}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: gc.Namespace,
			Name:      "virt-launcher-" + machine + "-" + utilrand.String(5),
			Labels:    virtLauncherPodLabels(vmi),
		},
		Spec: corev1.PodSpec{
			NodeName:   cmp.Or(o.hostNode, hostNodeFor(machine)),
			Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"}},
		},
	}
	if err := l.Host.Client.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating virt-launcher pod: %w", err)
	}
	w.Pod = pod.Name
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  ip,
		PodIPs: w.podIPs(),
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "compute", Image: pod.Spec.Containers[0].Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	if err := l.Host.Client.Status().Update(ctx, pod); err != nil {
		return nil, fmt.Errorf("setting virt-launcher pod status: %w", err)
	}
	if err := createReadyNode(ctx, l.guestOf(gc).Client, machine, ip); err != nil {
		return nil, err
	}
	return w, nil
}

// currentWorkerTemplate reads the KubevirtMachineTemplate the cluster's MachineDeployment
// points at now (guestnet may have repointed it).
func (l *Lab) currentWorkerTemplate(ctx context.Context, gc *GuestCluster) (*unstructured.Unstructured, error) {
	md := &clusterv1.MachineDeployment{}
	if err := l.Host.Client.Get(ctx, types.NamespacedName{Namespace: gc.Namespace, Name: gc.MachineDeployment}, md); err != nil {
		return nil, fmt.Errorf("reading MachineDeployment: %w", err)
	}
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	name := md.Spec.Template.Spec.InfrastructureRef.Name
	if err := l.Host.Client.Get(ctx, types.NamespacedName{Namespace: gc.Namespace, Name: name}, tmpl); err != nil {
		return nil, fmt.Errorf("reading worker template %s: %w", name, err)
	}
	return tmpl, nil
}

// ServeInVM listens on port inside the worker VM, where a guest workload behind a NodePort
// (kube-proxy in the VM forwarding to, say, Envoy) would answer. From outside the VM it is
// reachable only through the worker's pod IP, and only if the port is declared.
//
// On the kernel datapath it listens on every address of the VM's network namespace, as a
// server on a VM's host network does: 10.0.2.2 (and fd10:0:2::2) on its eth0, and its lo.
func (w *Worker) ServeInVM(port int32) (net.Listener, error) {
	if w.kernel != nil {
		return w.kernel.listenInVM(port)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(w.VMAddress, strconv.Itoa(int(port))))
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.vm = append(w.vm, l)
	w.mu.Unlock()
	if w.nat.forwardAll {
		if err := w.nat.forward(port); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	return l, nil
}

// forwardsEveryPort reports whether the userspace stand-in of a worker without a ports list
// must be told about a port a process serves in the VM (the kernel's NAT needs no telling);
// forward tells it.
func (w *Worker) forwardsEveryPort() bool { return w.nat != nil && w.nat.forwardAll }

// podIPs are the worker's pod IPs as a Pod's status lists them.
func (w *Worker) podIPs() []corev1.PodIP {
	ips := []corev1.PodIP{{IP: w.IP}}
	if v6 := w.IPv6(); v6 != "" {
		ips = append(ips, corev1.PodIP{IP: v6})
	}
	return ips
}

// stop ends the worker's datapath and what runs in its VM.
func (w *Worker) stop() {
	if w.kernel != nil {
		w.kernel.close()
	} else {
		w.nat.stop()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.vm {
		_ = l.Close()
	}
	w.vm = nil
}

func (l *Lab) track(w *Worker) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.workers = append(l.workers, w)
}

// RemoveWorker deletes a worker's virt-launcher pod and guest Node, as when CAPI deletes
// the Machine: the VM and everything in it go away with its pod.
func (l *Lab) RemoveWorker(ctx context.Context, gc *GuestCluster, w *Worker) error {
	w.stop()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: gc.Namespace, Name: w.Pod}}
	if err := l.Host.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		return err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: w.Machine}}
	return client.IgnoreNotFound(l.guestOf(gc).Client.Delete(ctx, node))
}

// SetMachineDeploymentStatus stands in for CAPI's MachineDeployment controller (none runs
// in the lab): it reports the MachineDeployment's current generation as observed, with
// replicas workers of which upToDate run its current template. Tests call it after they
// replaced workers, to play a rollout.
func (l *Lab) SetMachineDeploymentStatus(ctx context.Context, gc *GuestCluster, replicas, upToDate int32) error {
	md := &clusterv1.MachineDeployment{}
	if err := l.Host.Client.Get(ctx, types.NamespacedName{Namespace: gc.Namespace, Name: gc.MachineDeployment}, md); err != nil {
		return err
	}
	md.Status.ObservedGeneration = md.Generation
	md.Status.Replicas = ptr.To(replicas)
	md.Status.UpToDateReplicas = ptr.To(upToDate)
	md.Status.ReadyReplicas = ptr.To(replicas)
	md.Status.AvailableReplicas = ptr.To(replicas)
	return l.Host.Client.Status().Update(ctx, md)
}

// playedCAPKVMILabels are the labels of the VMI template of a worker VM CAPK creates from
// a KubevirtMachineTemplate whose VMI template carries vmiTemplateLabels: those, and CAPK's.
// The VM object's own labels (virtualMachineTemplate.metadata.labels) are NOT among them,
// and KubeVirt copies only the VMI's to the pod: a Service selecting by them has no
// endpoints (docs/runbook.md, "the host Service selects no worker").
func playedCAPKVMILabels(vmiTemplateLabels map[string]string, gc *GuestCluster, machine string) map[string]string {
	labels := maps.Clone(vmiTemplateLabels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[capkVMLabel] = machine
	labels[capkNameLabel] = machine
	labels[clusterRoleLabel] = workerRoleValue
	labels[clusterv1.ClusterNameLabel] = gc.Name
	labels[capkMachineNameLabel] = machine
	labels[capkMachineNSLabel] = gc.Namespace
	return labels
}

// hostNodeFor spreads worker VMs over the host nodes, always the same node for a machine.
func hostNodeFor(machine string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(machine))
	return HostNodes[int(h.Sum32())%len(HostNodes)]
}
