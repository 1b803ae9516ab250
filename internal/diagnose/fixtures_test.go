package diagnose

import (
	"encoding/json"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// Fixtures: the field report's cluster, healthy: Cluster k0smotron/tenant-a with two worker
// VMs, a GuestIngress "web" (host Service tenant-a-web), a GuestWebhookBridge "webhooks" that
// bridges cert-manager's validating webhook and metrics-server's APIService.

const (
	ns, clusterName = "k0smotron", "tenant-a"
	bridgeName      = "webhooks"
	bridgeID        = ns + "/" + bridgeName
	cmNS, cmSvc     = "cert-manager", "cert-manager-webhook"
	cmConfig        = "cert-manager-webhook"
	cmWebhook       = "webhook.cert-manager.io"
	msNS, msSvc     = "kube-system", "metrics-server"
	metricsAPI      = "v1beta1.metrics.k8s.io"
	cmHostService   = "tenant-a-cert-manager-cert-manager-webhook"
	msHostService   = "tenant-a-kube-system-metrics-server"
	cmServerName    = cmHostService + "." + ns + ".svc"
	webHostService  = "tenant-a-web"
	templateName    = "tenant-a-md-0"
	mdName          = "tenant-a-md-0"
	vmLabel         = "example.com/pool"
)

var workerIPs = []string{"10.244.1.11", "10.244.1.12"}

// now is the fixtures' State.Now; the guest Nodes registered an hour before.
var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// healthy returns the State of a cluster where everything works.
func healthy(t *testing.T) *State {
	t.Helper()
	s := &State{
		Namespace: ns, ClusterName: clusterName,
		Cluster: &clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: clusterName},
			// k0smotron's hosted control plane, at the load-balancer IP of its Service.
			Spec: clusterv1.ClusterSpec{
				ControlPlaneRef:      clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlane", Name: clusterName},
				ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: controlPlaneIP, Port: 6443},
			},
			Status: clusterv1.ClusterStatus{Initialization: clusterv1.ClusterInitializationStatus{
				InfrastructureProvisioned: ptr.To(true), ControlPlaneInitialized: ptr.To(true)}},
		},
		Managed: true,
		Now:     now,
	}
	s.Ingresses = []guestnetv1.GuestIngress{readyIngress()}
	s.Admission = map[string]policy.Decision{"web": policy.Admit(policy.Input{
		GuestIngress: &s.Ingresses[0],
		Namespace:    &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{corev1.LabelMetadataName: ns}}},
		Policies:     []guestnetv1.GuestIngressPolicy{tenantsPolicy()},
	})}
	s.Bridges = []guestnetv1.GuestWebhookBridge{readyBridge()}
	for i, ip := range workerIPs {
		s.Pods = append(s.Pods, workerPod(string(rune('a'+i)), ip, true))
	}
	s.Pods = append(s.Pods, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: controlPlanePod, Labels: map[string]string{"app": "k0smotron"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: controlPlanePodIP, PodIPs: []corev1.PodIP{{IP: controlPlanePodIP}}}})

	required := ports.Base(false)
	for _, gi := range s.Ingresses {
		required = required.Union(ports.ForGuestIngress(&gi))
	}
	for _, b := range s.Bridges {
		required = required.Union(ports.ForBridge(&b))
	}
	s.Required = required
	// The fixture's KubevirtCluster is CAPK's own and its template leaves checkStrategy
	// unset: CAPK SSHes into the VMs, so its workers need 22 as well (ports.ForWorkers).
	s.Workers = []ports.Workers{workers(t, ports.Base(true).Union(required).Ports(), required)}

	for _, svc := range []string{webHostService, cmHostService, msHostService} {
		addHostService(s, svc, true)
	}
	s.Services[0].Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Services[0].Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.2.6.220"}}
	s.Services = append(s.Services, controlPlaneService())

	s.Guest = &Guest{Source: "Secret k0smotron/tenant-a-kubeconfig", Version: "v1.37.2", Services: guestServices()}
	// Each worker's Node: named after its machine, providerID set by CAPK, its VM's pod IP as
	// InternalIP (a kubelet with --node-ip=<pod IP>), and its guest Cilium's CiliumNode.
	for i, ip := range workerIPs {
		name := machineName(string(rune('a' + i)))
		s.Guest.Nodes = append(s.Guest.Nodes, guestNode(name, ip, "kubelet"))
		s.Guest.CiliumNodes = append(s.Guest.CiliumNodes, CiliumNode{Name: name, InternalIPs: []string{ip}})
	}
	s.Guest.Observed.ValidatingWebhooks = []admissionregistrationv1.ValidatingWebhookConfiguration{*bridgedValidating(t)}
	s.Guest.Observed.APIServices = []apiregistrationv1.APIService{
		*bridgedAPIService(t, apiregistrationv1.ConditionTrue),
		{ObjectMeta: metav1.ObjectMeta{Name: "v1.apps"}, Spec: apiregistrationv1.APIServiceSpec{Group: "apps", Version: "v1"},
			Status: apiregistrationv1.APIServiceStatus{Conditions: []apiregistrationv1.APIServiceCondition{{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionTrue, Reason: "Local"}}}},
	}
	return s
}

// The hosted control plane: k0smotron's pod and its LoadBalancer Service kmc-tenant-a-lb,
// whose load-balancer IP is the Cluster's endpoint.
const (
	controlPlanePod       = "kmc-tenant-a-0"
	controlPlanePodIP     = "10.244.0.9"
	controlPlaneSvc       = "kmc-tenant-a-lb"
	controlPlaneClusterIP = "10.97.0.100"
	controlPlaneIP        = "10.2.6.221"
)

func controlPlaneService() corev1.Service {
	return corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: controlPlaneSvc},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: controlPlaneClusterIP, ClusterIPs: []string{controlPlaneClusterIP},
			Selector: map[string]string{"app": "k0smotron", "cluster": clusterName},
			Ports:    []corev1.ServicePort{{Name: "api", Port: 6443, TargetPort: intstr.FromInt32(6443)}},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: controlPlaneIP}}}},
	}
}

func workerPod(suffix, ip string, ready bool) corev1.Pod {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	labels := virtlauncher.WorkerSelector(ns, clusterName)
	labels["vm.kubevirt.io/name"] = machineName(suffix)
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-launcher-tenant-a-md-0-" + suffix, Labels: labels, UID: types.UID("uid-" + ip),
			// KubeVirt names the VMI (the KubevirtMachine's name) in this annotation.
			Annotations: map[string]string{"kubevirt.io/domain": machineName(suffix)}},
		Status: corev1.PodStatus{PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

// machineName is the KubevirtMachine (VM, VMI, guest Node) of worker suffix.
func machineName(suffix string) string { return "tenant-a-md-0-" + suffix }

// guestNode is a guest Node registered an hour ago with providerID kubevirt://<name>,
// InternalIP ip (none when empty) and a Hostname address, its addresses written by the field
// manager writer (none when empty).
func guestNode(name, ip, writer string) corev1.Node {
	n := corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
		Spec:       corev1.NodeSpec{ProviderID: "kubevirt://" + name},
	}
	if ip != "" {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	if writer != "" {
		n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: writer, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", APIVersion: "v1",
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:addresses":{}}}`)}}
	}
	return n
}

// workers is the cluster's one MachineDeployment whose template declares declared
// (nil: no ports list), analysed against what it must declare: required, and 22 for CAPK's
// SSH check (ports.ForWorkers; the fixture's KubevirtCluster is CAPK's own).
func workers(t *testing.T, declared []ports.Port, required ports.Set) ports.Workers {
	t.Helper()
	iface := map[string]any{"name": "default", "masquerade": map[string]any{}}
	if declared != nil {
		list := []any{}
		for _, p := range declared {
			list = append(list, map[string]any{"port": int64(p.Number), "protocol": string(p.Protocol)})
		}
		iface["ports"] = list
	}
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"virtualMachineTemplate": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{vmLabel: "md-0"}},
				"spec": map[string]any{"template": map[string]any{
					"metadata": map[string]any{"labels": map[string]any{"example.com/copied": "yes"}},
					"spec": map[string]any{
						"domain":   map[string]any{"devices": map[string]any{"interfaces": []any{iface}}},
						"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}},
					},
				}},
			},
		}}},
	}}
	tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	tmpl.SetNamespace(ns)
	tmpl.SetName(templateName)
	own := ports.ForWorkers(required, true, tmpl)
	analysis, err := ports.Analyze(tmpl, own)
	if err != nil {
		t.Fatalf("analysing the template: %v", err)
	}
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mdName, Generation: 1},
		Spec:       clusterv1.MachineDeploymentSpec{ClusterName: clusterName, Replicas: ptr.To[int32](2)},
		Status:     clusterv1.MachineDeploymentStatus{ObservedGeneration: 1, UpToDateReplicas: ptr.To[int32](2)},
	}
	return ports.Workers{MachineDeployment: md, Template: tmpl, Required: own, Analysis: analysis}
}

// addHostService adds a guestnet host Service of the cluster selecting the workers, with an
// EndpointSlice holding the worker pods (ready or not).
func addHostService(s *State, name string, ready bool) {
	s.Services = append(s.Services, corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			ownership.ManagedByLabel: ownership.ManagedByValue, ownership.ClusterNameLabel: clusterName}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.97.0." + string(rune('1'+len(s.Services))),
			Selector: virtlauncher.WorkerSelector(ns, clusterName),
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(30064)}},
		},
	})
	slice := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}}}
	for _, ip := range workerIPs {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}})
	}
	s.EndpointSlices = append(s.EndpointSlices, slice)
}

func guestServices() []corev1.Service {
	svc := func(namespace, name string) corev1.Service {
		return corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}}},
		}
	}
	return []corev1.Service{svc(cmNS, cmSvc), svc(msNS, msSvc)}
}

func chartValidating() *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: cmConfig},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: cmWebhook,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: cmNS, Name: cmSvc, Path: ptr.To("/validate"), Port: ptr.To[int32](443)},
				CABundle: []byte("-----BEGIN CERTIFICATE-----"),
			},
			FailurePolicy:  ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds: ptr.To[int32](10),
		}},
	}
}

// bridgedValidating is cert-manager's validating webhook as the bridge rewrote it.
func bridgedValidating(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	vwc := chartValidating()
	url := hostnames.BridgeURL(ns, cmHostService, 443, "/validate")
	if _, err := bridge.RewriteWebhook(vwc, cmWebhook, url, bridge.NewRecord(bridge.WebhookTargets(vwc)[0], bridgeID, url)); err != nil {
		t.Fatalf("rewriting: %v", err)
	}
	return vwc
}

func chartAPIService(available apiregistrationv1.ConditionStatus) *apiregistrationv1.APIService {
	a := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: metricsAPI},
		Spec: apiregistrationv1.APIServiceSpec{
			Service: &apiregistrationv1.ServiceReference{Namespace: msNS, Name: msSvc, Port: ptr.To[int32](443)},
			Group:   "metrics.k8s.io", Version: "v1beta1", InsecureSkipTLSVerify: true,
		},
	}
	if available != "" {
		c := apiregistrationv1.APIServiceCondition{Type: apiregistrationv1.Available, Status: available, Reason: "Passed"}
		if available == apiregistrationv1.ConditionFalse {
			c.Reason, c.Message = "FailedDiscoveryCheck", "failing or missing response from https://10.96.0.10:443/apis/metrics.k8s.io/v1beta1"
		}
		a.Status.Conditions = []apiregistrationv1.APIServiceCondition{c}
	}
	return a
}

func bridgedAPIService(t *testing.T, available apiregistrationv1.ConditionStatus) *apiregistrationv1.APIService {
	t.Helper()
	a := chartAPIService(available)
	ref := apiregistrationv1.ServiceReference{Namespace: msNS, Name: hostnames.BridgeExternalNameService(msSvc), Port: ptr.To[int32](443)}
	written := bridge.ServiceRef{Namespace: ref.Namespace, Name: ref.Name, Port: *ref.Port}.String()
	if _, err := bridge.RewriteAPIService(a, ref, bridge.NewRecord(bridge.APIServiceTarget(a), bridgeID, written)); err != nil {
		t.Fatalf("rewriting: %v", err)
	}
	return a
}

func cond(t string, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: t, Status: status, Reason: reason, Message: message}
}

// tenantsPolicy admits 10.2.6.0/24 in every namespace, announced on ^eth0$.
func tenantsPolicy() guestnetv1.GuestIngressPolicy {
	return guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "tenants"},
		Spec: guestnetv1.GuestIngressPolicySpec{
			Addresses:      []string{"10.2.6.0/24"},
			L2Announcement: &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$"}},
		},
	}
}

func readyIngress() guestnetv1.GuestIngress {
	return guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Generation: 1},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  clusterName,
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
			Ports:        []guestnetv1.IngressPort{{Name: "http", Port: 80, NodePort: ptr.To[int32](30080)}, {Name: "https", Port: 443, NodePort: ptr.To[int32](30443)}},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220", Class: guestnetv1.DefaultLoadBalancerClass},
		},
		Status: guestnetv1.GuestIngressStatus{
			LoadBalancerIP: "10.2.6.220", ReadyEndpoints: 2, HostService: webHostService, ObservedGeneration: 1,
			Ports:      []guestnetv1.IngressPortStatus{{Name: "http", Port: 80, NodePort: 30080}, {Name: "https", Port: 443, NodePort: 30443}},
			Conditions: []metav1.Condition{cond(guestnetv1.ReadyCondition, metav1.ConditionTrue, guestnetv1.ReadyReason, "")},
		},
	}
}

func readyBridge() guestnetv1.GuestWebhookBridge {
	return guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: bridgeName, Generation: 1},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        clusterName,
			APIServices:        &guestnetv1.TargetSelector{Names: []string{metricsAPI}},
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{cmConfig}},
			NodePortRange:      guestnetv1.NodePortRange{Start: 30064, Size: 16},
			Mode:               guestnetv1.BridgeModeAuto,
		},
		Status: guestnetv1.GuestWebhookBridgeStatus{
			BridgedTargets: 2, TotalTargets: 2, ObservedGeneration: 1,
			Targets: []guestnetv1.TargetStatus{
				{Kind: guestnetv1.APIServiceTarget, Name: metricsAPI, HostService: msHostService, Bridged: true, Reachable: ptr.To(true),
					Message: "answers through the bridge (certificate not verified: insecureSkipTLSVerify)"},
				{Kind: guestnetv1.ValidatingWebhookTarget, Name: cmConfig, Webhook: cmWebhook, HostService: cmHostService, Bridged: true, Reachable: ptr.To(true),
					TLSServerName: cmServerName, Message: "answers through the bridge with a certificate valid for " + cmServerName},
			},
			Conditions: []metav1.Condition{cond(guestnetv1.ReadyCondition, metav1.ConditionTrue, guestnetv1.ReadyReason, "")},
		},
	}
}

// find returns the result of check on object; it fails the test when there is none.
func find(t *testing.T, rep *Report, check, object string) Result {
	t.Helper()
	for _, r := range rep.Results {
		if r.Check == check && r.Object == object {
			return r
		}
	}
	data, _ := json.MarshalIndent(rep.Results, "", "  ")
	t.Fatalf("no result for %s %q in:\n%s", check, object, data)
	return Result{}
}
