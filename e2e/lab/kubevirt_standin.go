package lab

import (
	"context"
	"crypto/sha1" //nolint:gosec // KubeVirt's own choice for the VMI ID label, not a security use
	"fmt"
	"maps"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// KubeVirt facts the stand-in plays, from kubevirt/kubevirt v1.9.0 (the release of the
// kubevirt.io/api the provider uses): the labels virt-controller puts on a virt-launcher
// pod (pkg/virt-controller/services/template.go, podLabels: the VMI's labels, then these),
// the VM controller's finalizer, and the label it adds to a scheduled VMI.
const (
	kubevirtLabel          = "kubevirt.io"
	kubevirtLauncherValue  = "virt-launcher"
	kubevirtCreatedByLabel = "kubevirt.io/created-by"
	// vm.kubevirt.io/name holds the VMI's host name (deprecated name, still set).
	kubevirtVMNameLabel = "vm.kubevirt.io/name"
	kubevirtVMIIDLabel  = "vmi.kubevirt.io/id"
	kubevirtNodeLabel   = "kubevirt.io/nodeName"
	kubevirtVMFinalizer = "kubevirt.io/virtualMachineControllerFinalize"
)

// virtLauncherPodLabels are the labels virt-controller gives the virt-launcher pod of vmi:
// the VMI's labels (those of the VM's template, never the VM's own) and its own.
func virtLauncherPodLabels(vmi *kubevirtv1.VirtualMachineInstance) map[string]string {
	labels := maps.Clone(vmi.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[kubevirtLabel] = kubevirtLauncherValue
	labels[kubevirtCreatedByLabel] = string(vmi.UID)
	labels[kubevirtVMNameLabel] = vmiHostname(vmi)
	labels[kubevirtVMIIDLabel] = vmiID(vmi.Name)
	return labels
}

// vmiHostname is KubeVirt's host name of a VMI (pkg/util/net/dns SanitizeHostname).
func vmiHostname(vmi *kubevirtv1.VirtualMachineInstance) string {
	if vmi.Spec.Hostname != "" {
		return vmi.Spec.Hostname
	}
	h, _, _ := strings.Cut(vmi.Name, ".")
	if len(h) > 63 {
		h = h[:63]
	}
	return h
}

// vmiID is KubeVirt's stable ID of a VMI name (pkg/apimachinery CalculateVirtualMachineInstanceID).
func vmiID(name string) string {
	if len(name) <= 63 {
		return name
	}
	sum := sha1.Sum([]byte(name)) //nolint:gosec // as KubeVirt computes it
	return fmt.Sprintf("%s-%x", name[:63-8-1], sum[:4])
}

// KubeVirtOptions tune the KubeVirt stand-in.
type KubeVirtOptions struct {
	// WorkerSubnet is the /24 in 10.244.0.0/17 from which virt-launcher pods get their IPs,
	// .1 upwards to .253, never reused (the lab's "pod network"); distinct per test in one lab.
	WorkerSubnet string
	// KernelDatapath plays each VM and its virt-launcher pod with network namespaces and
	// KubeVirt's own nftables rules (kerneldatapath.go) instead of the userspace masquerade
	// stand-in; the subnet then belongs to the lab's host pod network (no userspace worker in
	// it). DualStack adds the pods' IPv6 addresses and KubeVirt's IPv6 masquerade.
	KernelDatapath, DualStack bool
	// OnBoot, when set, runs once a VM has booted (its Worker serves the declared ports, its
	// guest Node is registered): what the test runs inside the VM (ServeInVM).
	OnBoot func(context.Context, *Worker) error
	// GuestKubelet is how the VMs' kubelets register their guest Nodes (the zero value:
	// KubeletNodeIPIsPodIP).
	GuestKubelet KubeletMode
}

// KubeletMode is how a played guest kubelet sets its Node's addresses, as the real kubelet's
// NodeAddress setter does (k8s.io/kubernetes v1.37.2 pkg/kubelet/nodestatus/setters.go;
// docs/node-identity-research.md).
type KubeletMode int

const (
	// KubeletNodeIPIsPodIP registers the pod IP as InternalIP: a kubelet started with
	// --node-ip=<pod IP>, as the field report's SSH daemon left it (the lab's default, for the
	// tests that are not about node identity).
	KubeletNodeIPIsPodIP KubeletMode = iota
	// KubeletMasquerade is a kubelet without --node-ip behind KubeVirt's masquerade: it
	// registers the VM's own address (10.0.2.2) and writes it again on every status update
	// (every kubeletStatusEvery in the lab, 10 s in production), reverting any other writer.
	KubeletMasquerade
	// KubeletExternal is a kubelet with --cloud-provider=external (k0s:
	// --enable-cloud-provider) and no --node-ip: it registers a Hostname address only and the
	// taint node.cloudprovider.kubernetes.io/uninitialized, and never writes the addresses
	// again once they are set (a cloud-node controller's job).
	KubeletExternal
)

// kubeletStatusEvery is how often a KubeletMasquerade kubelet writes its addresses again.
const kubeletStatusEvery = 2 * time.Second

// KubeVirt stands in for KubeVirt (virt-controller, virt-handler, the hypervisor) and for
// the kubelets of the host and of the guest VMs, for the VirtualMachines of one namespace,
// which the real CAPK creates (StartCAPK). KubeVirt needs a hypervisor and the kubelet a
// container runtime: neither runs here. For each VirtualMachine that should run
// (runStrategy Always, RerunOnFailure or Once, or running: true) it does what they do:
//   - virt-controller: its finalizer on the VM; the VMI (named after the VM, the template's
//     metadata and spec, owned by the VM); the virt-launcher Pod (generateName
//     virt-launcher-<vmi>-, labelled as virt-controller labels it, virtLauncherPodLabels,
//     annotated for the Unix migration transport, owned by the VMI) on a host node; the VMI
//     labelled with that node, its status.migrationTransport Unix;
//   - the host kubelet: the Pod Running and Ready with the next IP of WorkerSubnet;
//   - virt-handler and the hypervisor: the VMI Running, Ready, LiveMigratable (masquerade on
//     the pod network, no disks to migrate), its interface with the pod IP (masquerade
//     reports the pod's address); the masquerade datapath for exactly the ports the VMI's
//     masquerade interface declares (all when it declares none): the kernel's with
//     KernelDatapath (KubeVirt's nft rules in the pod's namespace), else the userspace
//     stand-in (masqueradeNAT); the VM Ready;
//   - the guest kubelet: a Ready Node named after the VM's host name with the pod IP as
//     InternalIP and no providerID (there is no KubeVirt cloud provider: CAPK patches it).
//
// When a VM is deleted it shuts the VM down (its datapath and what runs in it), deletes the
// Pod and the VMI, then releases its finalizer. The guest Node stays: deleting it is CAPI's
// job. When a VM's virt-launcher Pod goes while the VM should run, the VM is down: the
// stand-in shuts it down and deletes its VMI, and starts it again as KubeVirt does for a VM
// that should run: a new VMI, a new Pod with the next pod IP (the guest Node keeps its old
// address: a real kubelet would rewrite it, the node-identity work's subject).
// It logs to <lab>/kubevirt-stand-in-<ns>.log.
type KubeVirt struct {
	*standIn
	l      *Lab
	ns     string
	opts   KubeVirtOptions
	subnet net.IP

	mu      sync.Mutex
	workers map[string]*Worker // by VM name
	booted  map[string]bool
	next    int
	held    bool
	wake    chan event.GenericEvent
}

// StartKubeVirtStandIn starts the KubeVirt stand-in for namespace ns.
func (l *Lab) StartKubeVirtStandIn(ctx context.Context, ns string, opts KubeVirtOptions) (*KubeVirt, error) {
	ip, subnet, err := net.ParseCIDR(opts.WorkerSubnet)
	if err != nil || !subnet.IP.Equal(ip) || subnet.Mask.String() != net.CIDRMask(24, 32).String() {
		return nil, fmt.Errorf("KubeVirt stand-in: WorkerSubnet %q is not a /24", opts.WorkerSubnet)
	}
	if _, err := vmAddress(ip.String()); err != nil {
		return nil, err
	}
	if opts.DualStack {
		opts.KernelDatapath = true
	}
	if opts.KernelDatapath {
		if _, err := podSubnetOf(nextIP(ip)); err != nil {
			return nil, fmt.Errorf("KubeVirt stand-in: WorkerSubnet %s: %w", opts.WorkerSubnet, err)
		}
	}
	if err := l.installKubeVirtCRDs(); err != nil {
		return nil, err
	}
	k := &KubeVirt{
		l: l, ns: ns, opts: opts, subnet: ip.To4(), workers: map[string]*Worker{}, booted: map[string]bool{},
		wake: make(chan event.GenericEvent, 64),
	}
	k.standIn, err = startStandIn(ctx, l, "kubevirt-stand-in-"+ns, l.Host.Config, func(mgr ctrl.Manager, _ logr.Logger) (func(), error) {
		inNamespace := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == ns })
		err := ctrl.NewControllerManagedBy(mgr).Named("kubevirt-stand-in").
			For(&kubevirtv1.VirtualMachine{}, builder.WithPredicates(inNamespace)).
			// A virt-launcher Pod going takes its VM down (its VMI is named after the VM).
			Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(vmOfLauncherPod), builder.WithPredicates(inNamespace)).
			WatchesRawSource(source.Channel(k.wake, &handler.EnqueueRequestForObject{})).
			Complete(&kubevirtReconciler{k: k, c: mgr.GetClient(), reader: mgr.GetAPIReader(), guest: l.Guest.Client})
		return k.shutDownAll, err
	})
	if err != nil {
		return nil, err
	}
	l.onStop(k.Stop)
	return k, nil
}

// Workers returns the running VMs' workers, by name.
func (k *KubeVirt) Workers() []*Worker {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := slices.Collect(maps.Values(k.workers))
	slices.SortFunc(out, func(a, b *Worker) int { return strings.Compare(a.Machine, b.Machine) })
	return out
}

// Hold keeps new VMs from starting (no VMI, no pod), as when the host cluster has no room
// for them; VMs already running go on, deleted ones still go. Release starts them.
func (k *KubeVirt) Hold() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.held = true
}

func (k *KubeVirt) isHeld() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.held
}

// Release starts the VMs Hold kept from starting.
func (k *KubeVirt) Release(ctx context.Context) error {
	k.mu.Lock()
	k.held = false
	k.mu.Unlock()
	vms := &kubevirtv1.VirtualMachineList{}
	if err := k.l.Host.Client.List(ctx, vms, client.InNamespace(k.ns)); err != nil {
		return err
	}
	for i := range vms.Items {
		select {
		case k.wake <- event.GenericEvent{Object: &vms.Items[i]}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (k *KubeVirt) shutDownAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, w := range k.workers {
		w.stop()
	}
}

// nextIP returns the next pod IP of the subnet.
func (k *KubeVirt) nextIP() (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.next >= hostPodGatewayHost-1 {
		return "", fmt.Errorf("KubeVirt stand-in: no pod IP left in %s", k.opts.WorkerSubnet)
	}
	k.next++
	ip := slices.Clone(k.subnet)
	ip[3] = byte(k.next)
	return ip.String(), nil
}

type kubevirtReconciler struct {
	k *KubeVirt
	c client.Client
	// reader reads VMIs and Pods from the apiserver: the cache may not hold a Pod just
	// created, or still hold a VMI just deleted.
	reader client.Reader
	guest  client.Client
}

// vmOfLauncherPod maps a virt-launcher Pod to its VM: the VMI that owns it has the VM's name.
func vmOfLauncherPod(_ context.Context, o client.Object) []ctrl.Request {
	if o.GetLabels()[kubevirtLabel] != kubevirtLauncherValue {
		return nil
	}
	for _, ref := range o.GetOwnerReferences() {
		if ref.Kind == "VirtualMachineInstance" {
			return []ctrl.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: ref.Name}}}
		}
	}
	return nil
}

func (r *kubevirtReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vm := &kubevirtv1.VirtualMachine{}
	if err := r.c.Get(ctx, req.NamespacedName, vm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if vm.DeletionTimestamp != nil {
		return ctrl.Result{}, r.shutDown(ctx, vm)
	}
	if controllerutil.AddFinalizer(vm, kubevirtVMFinalizer) {
		return ctrl.Result{}, r.c.Update(ctx, vm)
	}
	r.k.mu.Lock()
	running := r.k.workers[vm.Name]
	held := r.k.held && running == nil
	r.k.mu.Unlock()
	if running != nil {
		down, err := r.podGone(ctx, vm.Namespace, running.Pod)
		if err != nil {
			return ctrl.Result{}, err
		}
		if down {
			// The VM starts again below, in a new VMI and Pod.
			if err := r.restart(ctx, vm, running); err != nil {
				return ctrl.Result{}, err
			}
			held = r.k.isHeld()
		}
	}
	if held || !shouldRun(vm) {
		return ctrl.Result{}, nil
	}
	vmi, err := r.ensureVMI(ctx, vm)
	if err != nil {
		return ctrl.Result{}, err
	}
	w, err := r.ensureWorker(ctx, vm, vmi)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.setVMIRunning(ctx, vmi, w); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.setVMReady(ctx, vm); err != nil {
		return ctrl.Result{}, err
	}
	if err := registerGuestNode(ctx, r.guest, vmiHostname(vmi), w, r.k.opts.GuestKubelet); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.boot(ctx, w); err != nil {
		return ctrl.Result{}, err
	}
	if r.k.opts.GuestKubelet == KubeletMasquerade {
		// The kubelet's next status update.
		return ctrl.Result{RequeueAfter: kubeletStatusEvery}, nil
	}
	return ctrl.Result{}, nil
}

// podGone reports whether a running VM's virt-launcher Pod is deleted or being deleted.
func (r *kubevirtReconciler) podGone(ctx context.Context, ns, name string) (bool, error) {
	pod := &corev1.Pod{}
	switch err := r.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod); {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, err
	}
	return pod.DeletionTimestamp != nil, nil
}

// restart plays a VM whose virt-launcher Pod is going: the VM stops (its datapath and what
// runs in it), the host kubelet finishes the Pod's deletion, its VMI goes (virt-controller
// fails it, the VM controller replaces it); the next reconcile starts a new VMI and Pod.
func (r *kubevirtReconciler) restart(ctx context.Context, vm *kubevirtv1.VirtualMachine, w *Worker) error {
	k := r.k
	k.mu.Lock()
	delete(k.workers, vm.Name)
	delete(k.booted, vm.Name)
	k.mu.Unlock()
	w.stop()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: w.Pod}}
	if err := r.c.Delete(ctx, pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		return err
	}
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name}}
	return client.IgnoreNotFound(r.c.Delete(ctx, vmi))
}

func shouldRun(vm *kubevirtv1.VirtualMachine) bool {
	if vm.Spec.RunStrategy != nil {
		switch *vm.Spec.RunStrategy {
		case kubevirtv1.RunStrategyAlways, kubevirtv1.RunStrategyRerunOnFailure, kubevirtv1.RunStrategyOnce:
			return true
		}
		return false
	}
	return ptr.Deref(vm.Spec.Running, false) // deprecated, still starts VMs
}

// ensureVMI creates the VM's VMI as virt-controller does (SetupVMIFromVM): the template's
// metadata and spec, the VM's name and namespace, owned by the VM.
func (r *kubevirtReconciler) ensureVMI(ctx context.Context, vm *kubevirtv1.VirtualMachine) (*kubevirtv1.VirtualMachineInstance, error) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := r.reader.Get(ctx, client.ObjectKeyFromObject(vm), vmi); !apierrors.IsNotFound(err) {
		if err == nil && vmi.DeletionTimestamp != nil {
			return nil, fmt.Errorf("VMI %s is being deleted", vm.Name)
		}
		return vmi, err
	}
	if vm.Spec.Template == nil {
		return nil, fmt.Errorf("VirtualMachine %s has no template", vm.Name)
	}
	vmi = &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: *vm.Spec.Template.ObjectMeta.DeepCopy(),
		Spec:       *vm.Spec.Template.Spec.DeepCopy(),
	}
	vmi.Name, vmi.GenerateName, vmi.Namespace = vm.Name, "", vm.Namespace
	vmi.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(vm, kubevirtv1.VirtualMachineGroupVersionKind)}
	if err := r.c.Create(ctx, vmi); err != nil {
		return nil, fmt.Errorf("creating VMI %s: %w", vm.Name, err)
	}
	return vmi, nil
}

// ensureWorker starts the VM once: its virt-launcher Pod, Running with the next pod IP,
// and the masquerade datapath for the ports the VMI declares.
func (r *kubevirtReconciler) ensureWorker(ctx context.Context, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (*Worker, error) {
	k := r.k
	k.mu.Lock()
	w := k.workers[vm.Name]
	k.mu.Unlock()
	if w != nil {
		return w, nil
	}
	ip, err := k.nextIP()
	if err != nil {
		return nil, err
	}
	if w, err = k.l.newWorker(vm.Name, ip, &vmi.Spec, workerOptions{kernel: k.opts.KernelDatapath, dualStack: k.opts.DualStack}); err != nil {
		return nil, err
	}
	node := hostNodeFor(vm.Name)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    vm.Namespace,
			GenerateName: "virt-launcher-" + vmi.Name + "-",
			Labels:       virtLauncherPodLabels(vmi),
			// virt-controller's template for new virt-launchers (pkg/virt-controller/services/template.go).
			Annotations:     map[string]string{kubevirtv1.MigrationTransportUnixAnnotation: "true"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vmi, kubevirtv1.VirtualMachineInstanceGroupVersionKind)},
		},
		Spec: corev1.PodSpec{
			NodeName:      node,
			Hostname:      vmiHostname(vmi),
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"}},
		},
	}
	if err := r.c.Create(ctx, pod); err != nil {
		w.stop()
		return nil, fmt.Errorf("creating virt-launcher pod of %s: %w", vm.Name, err)
	}
	w.Pod = pod.Name
	k.mu.Lock()
	k.workers[vm.Name] = w
	k.mu.Unlock()
	k.l.track(w)
	if err := setPodRunning(ctx, r.c, pod, w); err != nil {
		return nil, err
	}
	return w, nil
}

// masqueradePorts returns the TCP ports of the VMI's masquerade interface on the pod
// network, and whether every port is forwarded (no ports list).
func masqueradePorts(spec *kubevirtv1.VirtualMachineInstanceSpec) (declared []int32, all bool) {
	iface, _, ok := masqueradeInterface(spec)
	if !ok {
		return nil, false
	}
	if len(iface.Ports) == 0 {
		return nil, true
	}
	for _, p := range iface.Ports {
		if p.Protocol == "" || strings.EqualFold(p.Protocol, "TCP") {
			declared = append(declared, p.Port)
		}
	}
	return declared, false
}

// setPodRunning plays the host kubelet: the pod runs, Ready, with the worker's pod IPs.
func setPodRunning(ctx context.Context, c client.Client, pod *corev1.Pod, w *Worker) error {
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  w.IP,
		PodIPs: w.podIPs(),
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "compute", Image: pod.Spec.Containers[0].Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("setting virt-launcher pod status: %w", err)
	}
	return nil
}

// setVMIRunning plays virt-controller and virt-handler once the pod runs.
func (r *kubevirtReconciler) setVMIRunning(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, w *Worker) error {
	if vmi.Status.Phase == kubevirtv1.Running {
		return nil
	}
	node := hostNodeFor(vmi.Name)
	if vmi.Labels == nil {
		vmi.Labels = map[string]string{}
	}
	if vmi.Labels[kubevirtNodeLabel] != node {
		vmi.Labels[kubevirtNodeLabel] = node
		if err := r.c.Update(ctx, vmi); err != nil {
			return err
		}
	}
	now := metav1.Now()
	ifaceName := "default"
	if len(vmi.Spec.Domain.Devices.Interfaces) > 0 {
		ifaceName = vmi.Spec.Domain.Devices.Interfaces[0].Name
	}
	var ips []string
	for _, ip := range w.podIPs() {
		ips = append(ips, ip.IP)
	}
	vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{
		Phase:    kubevirtv1.Running,
		NodeName: node,
		// Set by virt-controller when it schedules a VMI whose pod has the Unix transport
		// annotation (pkg/virt-controller/watch/vmi/lifecycle.go): no legacy migration ports
		// in the masquerade rules.
		MigrationTransport: kubevirtv1.MigrationTransportUnix,
		Conditions: []kubevirtv1.VirtualMachineInstanceCondition{
			{Type: kubevirtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{
			Name: ifaceName, IP: w.IP, IPs: ips, InterfaceName: "eth0", InfoSource: "domain, guest-agent",
		}},
	}
	if err := r.c.Status().Update(ctx, vmi); err != nil {
		return fmt.Errorf("setting VMI %s running: %w", vmi.Name, err)
	}
	return nil
}

func (r *kubevirtReconciler) setVMReady(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	if vm.Status.Ready {
		return nil
	}
	vm.Status = kubevirtv1.VirtualMachineStatus{
		Created: true, Ready: true, PrintableStatus: kubevirtv1.VirtualMachineStatusRunning,
		Conditions: []kubevirtv1.VirtualMachineCondition{{
			Type: kubevirtv1.VirtualMachineReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(),
		}},
	}
	if err := r.c.Status().Update(ctx, vm); err != nil {
		return fmt.Errorf("setting VM %s ready: %w", vm.Name, err)
	}
	return nil
}

// boot runs OnBoot once per VM.
func (r *kubevirtReconciler) boot(ctx context.Context, w *Worker) error {
	k := r.k
	k.mu.Lock()
	done := k.booted[w.Machine]
	k.mu.Unlock()
	if done || k.opts.OnBoot == nil {
		return nil
	}
	if err := k.opts.OnBoot(ctx, w); err != nil {
		return fmt.Errorf("booting %s: %w", w.Machine, err)
	}
	k.mu.Lock()
	k.booted[w.Machine] = true
	k.mu.Unlock()
	return nil
}

// shutDown plays the deletion of a VM: the VM stops (datapath and what runs in it), the pod and
// the VMI go, then the finalizer is released.
func (r *kubevirtReconciler) shutDown(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	k := r.k
	k.mu.Lock()
	w := k.workers[vm.Name]
	delete(k.workers, vm.Name)
	delete(k.booted, vm.Name)
	k.mu.Unlock()
	if w != nil {
		w.stop()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: w.Pod}}
		if err := r.c.Delete(ctx, pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name}}
	if err := r.c.Delete(ctx, vmi); client.IgnoreNotFound(err) != nil {
		return err
	}
	if controllerutil.RemoveFinalizer(vm, kubevirtVMFinalizer) {
		return client.IgnoreNotFound(r.c.Update(ctx, vm))
	}
	return nil
}

// registerGuestNode plays the kubelet of a booted VM joining the guest: a Ready Node with
// the conditions a kubelet reports (CAPI's NodeHealthy reads the pressure ones too), the
// labels every kubelet sets, its addresses as mode says, and no providerID (CAPI copies
// CAPK's). A Node that exists already keeps its addresses, except in mode KubeletMasquerade,
// whose kubelet writes 10.0.2.2 again on each status update.
func registerGuestNode(ctx context.Context, guest client.Client, name string, w *Worker, mode KubeletMode) error {
	addresses := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: w.IP}, {Type: corev1.NodeHostName, Address: name}}
	switch mode {
	case KubeletMasquerade:
		addresses[0].Address = w.VMAddress
	case KubeletExternal:
		addresses = addresses[1:]
	}
	node := &corev1.Node{}
	if err := guest.Get(ctx, client.ObjectKey{Name: name}, node); err == nil {
		if mode != KubeletMasquerade || equality.Semantic.DeepEqual(node.Status.Addresses, addresses) {
			return nil
		}
		node.Status.Addresses = addresses
		return guest.Status().Update(ctx, node, client.FieldOwner(kubeletFieldManager))
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: runtime.GOARCH,
	}}}
	if mode == KubeletExternal {
		node.Spec.Taints = []corev1.Taint{{Key: "node.cloudprovider.kubernetes.io/uninitialized", Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	}
	if err := guest.Create(ctx, node, client.FieldOwner(kubeletFieldManager)); err != nil {
		return fmt.Errorf("registering guest Node %s: %w", name, err)
	}
	now := metav1.Now()
	node.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "lab node (KubeVirt stand-in)", LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	for _, t := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
		node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{
			Type: t, Status: corev1.ConditionFalse, Reason: "KubeletHas" + strings.TrimSuffix(string(t), "Pressure") + "Available",
			LastHeartbeatTime: now, LastTransitionTime: now,
		})
	}
	node.Status.Addresses = addresses
	if err := guest.Status().Update(ctx, node, client.FieldOwner(kubeletFieldManager)); err != nil {
		return fmt.Errorf("setting status of guest Node %s: %w", name, err)
	}
	return nil
}

// kubeletFieldManager is the field manager of a kubelet's writes of its Node.
const kubeletFieldManager = "kubelet"

// CreateWorkerVM creates, as CAPK does for KubevirtMachine name of the Cluster
// namespace/cluster, a VirtualMachine that should run, its VMI template labelled with CAPK's
// labels for that Cluster, namespace and machine (virtlauncher.MachineSelector, without the
// label KubeVirt adds to the pod) and a masquerade interface on the pod network declaring the
// tcp and udp ports, for a KubeVirt stand-in to boot without the real CAPK.
func CreateWorkerVM(ctx context.Context, c client.Client, namespace, cluster, name string, tcp, udp []int32) error {
	labels := virtlauncher.MachineSelector(namespace, cluster, name)
	delete(labels, virtlauncher.KubeVirtLabel)
	var declared []kubevirtv1.Port
	for _, p := range tcp {
		declared = append(declared, kubevirtv1.Port{Port: p})
	}
	for _, p := range udp {
		declared = append(declared, kubevirtv1.Port{Port: p, Protocol: "UDP"})
	}
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
						Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
						Ports: declared,
					}}}},
					Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
				},
			},
		},
	}
	if err := c.Create(ctx, vm); err != nil {
		return fmt.Errorf("creating VirtualMachine %s/%s: %w", namespace, name, err)
	}
	return nil
}
