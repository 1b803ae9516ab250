package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// The load-balancer IP of the demo, in the lab's "physical" range (lab.LoadBalancerCIDR).
const demoIP = "10.98.0.10"

// The host admin's GuestIngressPolicy for the tenant's namespace: guestnet fails closed, and
// a GuestIngress no policy admits gets nothing on the host.
const guestIngressPolicyYAML = `apiVersion: guestnet.addons.cluster.x-k8s.io/v1alpha1
kind: GuestIngressPolicy
metadata:
  name: %s
spec:
  namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: %s
  addresses: [%s]
  l2Announcement:
    interfaces: ["^eth0$"]
    nodeSelector: {}
`

const guestIngressYAML = `apiVersion: guestnet.addons.cluster.x-k8s.io/v1alpha1
kind: GuestIngress
metadata:
  name: web
  namespace: %s
spec:
  clusterName: %s
  guestService: {namespace: projectcontour, name: envoy}
  ports:
  - {name: http, port: 80, nodePort: 30080}
  - {name: https, port: 443, nodePort: 30443}
  loadBalancer:
    ip: %s
    l2:
      interfaces: ["^eth0$"]
`

// guestIngressTour applies a GuestIngress and follows a request from the load-balancer IP to
// Envoy in the guest (guestnet and the Cilium stand-in run already).
func guestIngressTour(ctx context.Context, l *lab.Lab, s *scenario, host, guest kubectlFunc) error {
	section("Guest: Contour's Envoy Service (ClusterIP, ports 80/443); an Envoy stand-in in every worker VM answers with its machine name")
	s.boot.set(serveEnvoy) // in the VMs the rollout below boots too
	if err := createContour(ctx, l, s.workers); err != nil {
		return err
	}
	guest("get", "service", "-n", "projectcontour", "envoy")

	section("Host admin: a GuestIngressPolicy says what the GuestIngresses of namespace " + clusterNamespace + " may claim (tenants cannot write it)")
	policyPath := filepath.Join(l.Dir, "guestingresspolicy.yaml")
	policyManifest := fmt.Sprintf(guestIngressPolicyYAML, clusterNamespace, clusterNamespace, lab.LoadBalancerCIDR)
	if err := os.WriteFile(policyPath, []byte(policyManifest), 0o600); err != nil {
		return err
	}
	fmt.Print(policyManifest)
	host("apply", "-f", policyPath)

	section("Host: apply a GuestIngress (one physical IP for the guest's ingress controller)")
	path := filepath.Join(l.Dir, "guestingress.yaml")
	manifest := fmt.Sprintf(guestIngressYAML, clusterNamespace, clusterName, demoIP)
	if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
		return err
	}
	fmt.Print(manifest)
	fmt.Println("\nbefore: CAPI's MachineDeployment, its one MachineSet and two Machines, on the user's worker template")
	host("get", "machinedeployments,machinesets,machines", "-n", clusterNamespace)
	host("get", "machinedeployments", "-n", clusterNamespace, "-o", "custom-columns=NAME:.metadata.name,TEMPLATE:.spec.template.spec.infrastructureRef.name")
	host("apply", "-f", path)
	gi := &guestnetv1.GuestIngress{}
	key := client.ObjectKey{Namespace: clusterNamespace, Name: "web"}
	if err := waitFor(ctx, func() bool {
		return l.Host.Client.Get(ctx, key, gi) == nil && gi.Status.LoadBalancerIP != "" && gi.Status.ReadyEndpoints > 0
	}); err != nil {
		return fmt.Errorf("waiting for the GuestIngress's IP and endpoints: %w", err)
	}
	host("get", "gi", "-n", clusterNamespace)
	host("get", "gip")
	host("get", "services,endpointslices", "-n", clusterNamespace, "-l", "app.kubernetes.io/managed-by=guestnet", "-o", "wide")
	host("get", "ciliumloadbalancerippools,ciliuml2announcementpolicies")
	guest("get", "service", "-n", "projectcontour", "envoy")

	section("A request to the load-balancer IP: LB IP -> host Service -> virt-launcher pod -> masquerade NAT -> VM nodePort -> Envoy")
	curl(ctx, 80, 4)

	section("Port 443: nodePort 30443 is not declared on the workers' masquerade interface, so it never reaches the VMs")
	curl(ctx, 443, 1)
	md := &clusterv1.MachineDeployment{}
	if err := waitFor(ctx, func() bool {
		return l.Host.Client.Get(ctx, client.ObjectKey{Namespace: clusterNamespace, Name: s.cluster.MachineDeployment}, md) == nil &&
			md.Spec.Template.Spec.InfrastructureRef.Name != s.cluster.WorkerTemplate
	}); err != nil {
		return fmt.Errorf("waiting for guestnet to declare the nodePorts on a new worker template: %w", err)
	}
	fmt.Println("\nguestnet declared it on a new worker template and repointed the MachineDeployment:")
	host(portsDeclared...)
	host("get", "machinedeployments", "-n", clusterNamespace, "-o", "custom-columns=NAME:.metadata.name,TEMPLATE:.spec.template.spec.infrastructureRef.name")

	section("CAPI's MachineDeployment controller (the real one, core v1.14.2) rolls the workers onto the template guestnet generated; the real CAPK (v0.11.2) creates each new VM from it, the KubeVirt stand-in boots it; the old VMs go")
	started := time.Now()
	generated := md.Spec.Template.Spec.InfrastructureRef.Name
	if err := waitFor(ctx, func() bool {
		return finishEvictedGuestPods(ctx, l) == nil && len(vmsClonedFrom(ctx, l, generated)) > 0
	}); err != nil {
		return fmt.Errorf("waiting for CAPK to create a VM from %s: %w", generated, err)
	}
	fmt.Println("\nthe rollout under way: a new MachineSet for the generated template, surging one Machine (maxSurge 1, maxUnavailable 0); CAPK created its VM, whose interface declares 30443:")
	host("get", "machinedeployments,machinesets,machines", "-n", clusterNamespace)
	host(vmPorts...)
	host(portsDeclared...)
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		if err := finishEvictedGuestPods(ctx, l); err != nil {
			return false, err
		}
		all := machineSetsFor(ctx, l, s.cluster, "")
		workers := s.kubevirt.Workers()
		return machineDeploymentAvailable(ctx, l, s.cluster, 2) && len(workers) == 2 &&
			!slices.ContainsFunc(workers, func(w *lab.Worker) bool { return !slices.Contains(w.Declared, 30443) }) &&
			len(all) == 1 && all[0].Spec.Template.Spec.InfrastructureRef.Name == generated, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CAPI's rollout to finish: %w", err)
	}
	fmt.Printf("\nthe rollout finished in %s: the old MachineSet scaled down and deleted, both workers run the generated template\n", time.Since(started).Round(100*time.Millisecond))
	host("get", "machinedeployments,machinesets,machines", "-n", clusterNamespace)
	host(vmPorts...)
	host(portsDeclared...)
	if err := waitFor(ctx, func() bool {
		return l.Host.Client.Get(ctx, key, gi) == nil && conditions.IsTrue(gi, guestnetv1.ReadyCondition) && gi.Status.ReadyEndpoints == 2
	}); err != nil {
		return fmt.Errorf("waiting for the GuestIngress to be Ready: %w", err)
	}
	host("get", "pods", "-n", clusterNamespace, "-o", "wide", "-l", "kubevirt.io=virt-launcher")
	host("get", "gi", "-n", clusterNamespace)
	curl(ctx, 443, 4)
	return nil
}

// portsDeclared are the kubectl arguments that print the GuestIngress's PortsDeclared condition.
var portsDeclared = []string{"get", "gi", "web", "-n", clusterNamespace, "-o", `jsonpath={range .status.conditions[?(@.type=="PortsDeclared")]}{.type}={.status} {.reason}: {.message}{"\n"}{end}`}

// vmPorts are the kubectl arguments that print the workers' VMs (CAPK's) with the ports
// their masquerade interface declares.
var vmPorts = []string{"get", "virtualmachines", "-n", clusterNamespace, "-o", "custom-columns=VM:.metadata.name,READY:.status.ready,DECLARED PORTS:.spec.template.spec.domain.devices.interfaces[0].ports[*].port"}

// vmsClonedFrom lists the VMs CAPK created for KubevirtMachines cloned from template.
func vmsClonedFrom(ctx context.Context, l *lab.Lab, template string) []string {
	machines := &unstructured.UnstructuredList{}
	machines.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtMachineList"))
	if err := l.Host.Client.List(ctx, machines, client.InNamespace(clusterNamespace)); err != nil {
		return nil
	}
	var out []string
	for _, m := range machines.Items {
		vm := &kubevirtv1.VirtualMachine{}
		if m.GetAnnotations()[clusterv1.TemplateClonedFromNameAnnotation] == template &&
			l.Host.Client.Get(ctx, client.ObjectKey{Namespace: clusterNamespace, Name: m.GetName()}, vm) == nil {
			out = append(out, vm.Name)
		}
	}
	return out
}

// serveEnvoy runs the Envoy stand-in of a worker VM.
func serveEnvoy(w *lab.Worker) error {
	for _, port := range []int32{30080, 30443} {
		if err := w.ServeMachineName(port); err != nil {
			return err
		}
	}
	return nil
}

// machineSetsFor lists the MachineSets CAPI created for the cluster's MachineDeployment, those
// of one worker template only if template is not empty.
func machineSetsFor(ctx context.Context, l *lab.Lab, gc *lab.GuestCluster, template string) []clusterv1.MachineSet {
	list := &clusterv1.MachineSetList{}
	if err := l.Host.Client.List(ctx, list, client.InNamespace(gc.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: gc.MachineDeployment}); err != nil {
		return nil
	}
	return slices.DeleteFunc(list.Items, func(ms clusterv1.MachineSet) bool {
		return template != "" && ms.Spec.Template.Spec.InfrastructureRef.Name != template
	})
}

// createContour creates Contour's Envoy Service in the guest and runs an Envoy stand-in on
// the nodePorts the GuestIngress will fix, in every worker VM.
func createContour(ctx context.Context, l *lab.Lab, workers []*lab.Worker) error {
	if err := l.Guest.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "projectcontour"}}); err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "projectcontour", Name: "envoy", Labels: map[string]string{"app.kubernetes.io/name": "contour"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app.kubernetes.io/name": "contour", "app.kubernetes.io/component": "envoy"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromString("http")},
				{Name: "https", Port: 443, TargetPort: intstr.FromString("https")},
			},
		},
	}
	if err := l.Guest.Client.Create(ctx, svc, client.FieldOwner("helm")); err != nil {
		return err
	}
	for _, w := range workers {
		if err := serveEnvoy(w); err != nil {
			return err
		}
	}
	return nil
}

// curl sends n requests to the load-balancer IP and prints who answered.
func curl(ctx context.Context, port int32, n int) {
	for range n {
		fmt.Printf("\n$ curl http://%s:%d/\n", demoIP, port)
		body, err := lab.Get(ctx, demoIP, port)
		if err != nil {
			fmt.Printf("curl: %v\n", err)
			continue
		}
		fmt.Printf("%s    (the Envoy stand-in in worker VM %s answered)\n", body, body)
	}
}

// waitFor polls done for up to 3 minutes: on a busy 2-core machine CAPI's first rollout alone
// can take more than one.
func waitFor(ctx context.Context, done func() bool) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return done(), nil
	})
}
