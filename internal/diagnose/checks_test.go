package diagnose

import (
	"context"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/kubeconfig"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

func TestDiagnose_HealthyStateIsAllOK(t *testing.T) {
	g := NewWithT(t)
	rep := Diagnose(healthy(t))
	for _, r := range rep.Results {
		g.Expect(r.Verdict).To(Equal(OK), r.Line())
	}
	g.Expect(rep.ExitCode()).To(Equal(ExitOK))
	g.Expect(rep.Verdict).To(Equal(OK))

	// One line per item the runbook lists.
	for _, item := range []struct{ check, object string }{
		{CheckCluster, ns + "/" + clusterName}, {CheckGuest, ""}, {CheckWorkers, ""},
		{CheckService, webHostService}, {CheckLoadBalancer, webHostService}, {CheckService, cmHostService}, {CheckService, msHostService},
		{CheckPorts, mdName}, {CheckTunnel, ""}, {CheckAPIService, metricsAPI}, {CheckValidatingWebhook, cmConfig + "/" + cmWebhook},
		{CheckKonnectivity, ""}, {CheckControlPlaneEndpoint, ""}, {CheckNodeAddress, ""}, {CheckCiliumNode, ""},
		{CheckAdmission, "web"}, {CheckGuestIngress, "web"}, {CheckGuestWebhookBridge, bridgeName},
	} {
		find(t, rep, item.check, item.object)
	}
	g.Expect(find(t, rep, CheckWorkers, "").Detail).To(ContainSubstring(
		"2 virt-launcher pods (2 ready) match capk.cluster.x-k8s.io/kubevirt-machine-namespace=k0smotron,cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher"))
	g.Expect(find(t, rep, CheckAPIService, metricsAPI).Detail).To(Equal(
		"Available=True through GuestWebhookBridge webhooks (guest Service kube-system/metrics-server:443, host Service tenant-a-kube-system-metrics-server) (certificate not verified: insecureSkipTLSVerify)"))
	g.Expect(find(t, rep, CheckValidatingWebhook, cmConfig+"/"+cmWebhook).Detail).To(ContainSubstring(
		"bridged by GuestWebhookBridge webhooks (url https://" + cmServerName + "/validate); answers through the bridge with a certificate valid for " + cmServerName))
	// The local APIService (served by the guest apiserver itself) is not listed.
	for _, r := range rep.Results {
		g.Expect(r.Object).NotTo(Equal("v1.apps"))
	}
}

func TestDiagnose_Workers(t *testing.T) {
	tests := []struct {
		name    string
		pods    func(s *State)
		verdict Verdict
		detail  string
	}{
		{name: "no virt-launcher pod", pods: func(s *State) { s.Pods = s.Pods[2:] }, verdict: Fail, detail: "0 virt-launcher pods (0 ready) match"},
		{name: "pods labelled by the VM template only", pods: func(s *State) {
			for i := range s.Pods[:2] {
				s.Pods[i].Labels = map[string]string{vmLabel: "md-0", "kubevirt.io": "virt-launcher"}
			}
		}, verdict: Fail, detail: "the MachineDeployments want 2 workers: every host Service of the cluster has no endpoint"},
		{name: "none ready", pods: func(s *State) {
			s.Pods[0], s.Pods[1] = workerPod("a", "10.244.1.11", false), workerPod("b", "10.244.1.12", false)
		}, verdict: Fail, detail: "none is ready"},
		{name: "one booting", pods: func(s *State) { s.Pods = s.Pods[1:] }, verdict: Warn, detail: "1 virt-launcher pods (1 ready)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			s := healthy(t)
			tt.pods(s)
			r := checkWorkers(s)
			g.Expect(r.Verdict).To(Equal(tt.verdict), r.Line())
			g.Expect(r.Detail).To(ContainSubstring(tt.detail))
			g.Expect(r.Runbook).To(Equal(rbNoWorkers))
		})
	}
}

func TestDiagnose_ServiceSelectingByVMTemplateLabelsFails(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	// The field report's first host Service: selector from virtualMachineTemplate.metadata.labels.
	s.Services = append(s.Services, corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ingress"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{vmLabel: "md-0"},
			Ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(30443)}}},
	})
	r := find(t, Diagnose(s), CheckService, "ingress")
	g.Expect(r.Verdict).To(Equal(Fail))
	g.Expect(r.Detail).To(ContainSubstring("its selector example.com/pool=md-0 uses example.com/pool of virtualMachineTemplate.metadata.labels, which KubeVirt does not copy to virt-launcher pods"))
	g.Expect(r.Fix).To(ContainSubstring("select the workers with capk.cluster.x-k8s.io/kubevirt-machine-namespace=k0smotron,cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher"))
	g.Expect(r.Runbook).To(Equal("docs/runbook.md#ingress-no-endpoints"))

	// A Service of someone else that selects nothing of the cluster is none of diagnose's business.
	s.Services = append(s.Services, corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "x"}}})
	for _, res := range Diagnose(s).Results {
		g.Expect(res.Object).NotTo(Equal("other"))
	}
}

func TestDiagnose_ServiceEndpoints(t *testing.T) {
	t.Run("guestnet's Service without ready endpoint", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.EndpointSlices[1].Endpoints[0].Conditions.Ready = ptr.To(false)
		s.EndpointSlices[1].Endpoints[1].Conditions.Ready = ptr.To(false)
		r := find(t, Diagnose(s), CheckService, cmHostService)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("2 pods match"))
	})
	t.Run("hand-made Service selecting by the cluster name and a typo", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Services = append(s.Services, corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "typo"},
			Spec:       corev1.ServiceSpec{Selector: map[string]string{"cluster.x-k8s.io/cluster-name": clusterName, "cluster.x-k8s.io/role": "wroker"}},
		})
		r := find(t, Diagnose(s), CheckService, "typo")
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("matches no pod in namespace k0smotron"))
		g.Expect(r.Fix).To(HavePrefix("select the workers with"))
	})
	t.Run("hand-made Service forwarding to a port the workers do not declare", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Services = append(s.Services, corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "by-hand"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"cluster.x-k8s.io/cluster-name": clusterName},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(31999)}, {Port: 443, TargetPort: intstr.FromInt32(30443)}}},
		})
		addSlice(s, "by-hand")
		r := find(t, Diagnose(s), CheckService, "by-hand")
		g.Expect(r.Verdict).To(Equal(Fail), r.Line())
		g.Expect(r.Detail).To(ContainSubstring("2 of 2 endpoints ready, but it forwards to 31999/TCP, which the workers do not declare (KubevirtMachineTemplate tenant-a-md-0 lacks 31999/TCP)"))
		g.Expect(r.Runbook).To(Equal(rbUndeclaredPort))
	})
	t.Run("LoadBalancer Service without IP", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Services[0].Status.LoadBalancer.Ingress = nil
		s.Services[0].Status.Conditions = []metav1.Condition{cond("cilium.io/IPAMRequestSatisfied", metav1.ConditionFalse, "no_pool", "There are no enabled CiliumLoadBalancerIPPools that match this service")}
		r := find(t, Diagnose(s), CheckLoadBalancer, webHostService)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("no load-balancer IP (Cilium: cilium.io/IPAMRequestSatisfied no_pool: There are no enabled"))
		g.Expect(r.Runbook).To(Equal(rbNoIP))
	})
}

func addSlice(s *State, service string) {
	addHostService(s, "scratch", true)
	s.Services = s.Services[:len(s.Services)-1]
	s.EndpointSlices[len(s.EndpointSlices)-1].Labels["kubernetes.io/service-name"] = service
}

func TestDiagnose_Ports(t *testing.T) {
	t.Run("a template missing required ports, guestnet managing the workers", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Workers = []ports.Workers{workers(t, []ports.Port{ports.TCP(22), ports.TCP(10250)}, s.Required)}
		r := find(t, Diagnose(s), CheckPorts, mdName)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("KubevirtMachineTemplate tenant-a-md-0 lacks 30064/TCP (GuestWebhookBridge webhooks nodePort range)"))
		g.Expect(r.Detail).To(ContainSubstring("30080/TCP (GuestIngress web port http)"))
		g.Expect(r.Fix).To(ContainSubstring("guestnet creates a KubevirtMachineTemplate <base>-<hash>"))
		g.Expect(r.Runbook).To(Equal(rbUndeclaredPort))
	})
	t.Run("not managed by guestnet", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Managed = false
		s.Workers = []ports.Workers{workers(t, []ports.Port{ports.TCP(22)}, s.Required)}
		g.Expect(checkPorts(s)[0].Fix).To(ContainSubstring("guestnet does not manage this cluster's workers"))
	})
	t.Run("topology-managed workers get the variable's value", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		w := workers(t, []ports.Port{ports.TCP(22)}, s.Required)
		w.MachineDeployment.Labels = map[string]string{clusterv1.ClusterTopologyOwnedLabel: ""}
		s.Workers = []ports.Workers{w}
		g.Expect(checkPorts(s)[0].Fix).To(ContainSubstring(`set the Cluster topology variable guestnet to {"workerPorts":[{"port":22,"protocol":"TCP"},{"port":10250,"protocol":"TCP"}`))
	})
	// The exact ports list to declare in the source, when guestnet stopped repointing.
	stopped := func(t *testing.T, plan ports.Plan) (*State, Result) {
		s := healthy(t)
		w := workers(t, []ports.Port{ports.TCP(22)}, s.Required)
		copyOf, err := ports.Declare(w.Template, w.Analysis.Missing, clusterName, "")
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
		plan.Template = copyOf
		w.Plan = plan
		s.Workers = []ports.Workers{w}
		return s, checkPorts(s)[0]
	}
	list := `[{"port":22,"protocol":"TCP"},{"port":10250,"protocol":"TCP"}`
	for p := 30064; p <= 30079; p++ { // the bridge's range
		list += fmt.Sprintf(`,{"port":%d,"protocol":"TCP"}`, p)
	}
	list += `,{"port":30080,"protocol":"TCP"},{"port":30443,"protocol":"TCP"}]`
	wantList := "set the ports of interface default (spec.template.spec.virtualMachineTemplate.spec.template.spec.domain.devices.interfaces) of KubevirtMachineTemplate tenant-a-md-0 to " + list
	t.Run("repoint reverted by a GitOps tool", func(t *testing.T) {
		g := NewWithT(t)
		_, r := stopped(t, ports.Plan{Action: ports.Reverted, RevertedBy: []string{"kustomize-controller"}})
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("field manager kustomize-controller set the MachineDeployment back to it"))
		g.Expect(r.Fix).To(HavePrefix("declare the ports in the template's source (the repository field manager kustomize-controller applies): " + wantList))
		g.Expect(r.Fix).To(ContainSubstring("remove the MachineDeployment's annotation " + guestnetv1.RepointedFromAnnotation))
		g.Expect(r.Runbook).To(Equal(rbRepointStopped))
	})
	t.Run("the copy's name is taken", func(t *testing.T) {
		g := NewWithT(t)
		_, r := stopped(t, ports.Plan{Action: ports.NameTaken, Conflict: "KubevirtMachineTemplate x already exists with another spec than the copy guestnet would write"})
		g.Expect(r.Detail).To(ContainSubstring("does not adopt the object that holds the name of its copy: KubevirtMachineTemplate x already exists"))
		g.Expect(r.Fix).To(ContainSubstring(wantList))
		g.Expect(r.Runbook).To(Equal(rbRepointStopped))
	})
	t.Run("not managed: the list for a new template", func(t *testing.T) {
		g := NewWithT(t)
		s, _ := stopped(t, ports.Plan{Action: ports.Repoint})
		s.Managed = false
		g.Expect(checkPorts(s)[0].Fix).To(ContainSubstring("; in the new template, " + wantList))
	})
	t.Run("rolling out", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Workers[0].MachineDeployment.Generation = 2
		r := checkPorts(s)[0]
		g.Expect(r.Verdict).To(Equal(Warn))
		g.Expect(r.Detail).To(ContainSubstring("rolling out to it: 0 of 2 workers run it"))
		g.Expect(r.Runbook).To(Equal(rbWorkerRollout))
	})
	t.Run("no ports list", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Workers = []ports.Workers{workers(t, nil, s.Required)}
		r := checkPorts(s)[0]
		g.Expect(r.Verdict).To(Equal(OK))
		g.Expect(r.Detail).To(ContainSubstring("no ports list, every port reaches the VMs"))
	})
	t.Run("template missing", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Workers[0].Template, s.Workers[0].TemplateErr = nil, errString("KubevirtMachineTemplate x (MachineDeployment tenant-a-md-0) does not exist")
		g.Expect(checkPorts(s)[0].Verdict).To(Equal(Fail))
		Diagnose(s) // the other checks cope with a missing template
	})
}

type errString string

func (e errString) Error() string { return string(e) }

func TestDiagnose_Tunnel(t *testing.T) {
	tests := []struct {
		name     string
		config   map[string]string
		declared []ports.Port
		verdict  Verdict
		detail   string
	}{
		{name: "no cilium-config", verdict: Ok(), detail: "no kube-system/cilium-config in the guest"},
		{name: "native routing", config: map[string]string{"routing-mode": "native"}, verdict: Ok(), detail: "native routing"},
		{name: "the field report's 8473 undeclared", config: map[string]string{"tunnel-port": "8473"}, declared: []ports.Port{ports.TCP(22), ports.UDP(8472)},
			verdict: Fail, detail: "guest Cilium tunnels with vxlan on 8473/UDP, which KubevirtMachineTemplate tenant-a-md-0 (MachineDeployment tenant-a-md-0) does not declare"},
		{name: "declared", config: map[string]string{"tunnel-port": "8473"}, declared: []ports.Port{ports.UDP(8473)}, verdict: Ok(), detail: "declared on every worker template"},
		{name: "invalid", config: map[string]string{"tunnel-protocol": "gre"}, verdict: Fail, detail: "unknown tunnel protocol"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			s := healthy(t)
			s.Guest.CiliumConfig = tt.config
			if tt.declared != nil {
				s.Workers = []ports.Workers{workers(t, tt.declared, nil)}
			}
			r := checkTunnel(s)
			g.Expect(r.Verdict).To(Equal(tt.verdict), r.Line())
			g.Expect(r.Detail).To(ContainSubstring(tt.detail))
		})
	}
}

func Ok() Verdict { return OK }

func TestDiagnose_APIServices(t *testing.T) {
	t.Run("Available=False, no bridge", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Bridges = nil
		s.Guest.Observed.APIServices[0] = *chartAPIService(apiregistrationv1.ConditionFalse)
		r := find(t, Diagnose(s), CheckAPIService, metricsAPI)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(HavePrefix("Available=False (FailedDiscoveryCheck): failing or missing response from https://10.96.0.10:443"))
		g.Expect(r.Fix).To(Equal("bridge it: add v1beta1.metrics.k8s.io to spec.apiServices.names of a GuestWebhookBridge of Cluster tenant-a"))
		g.Expect(r.Runbook).To(Equal(rbAPIServiceAvailable))
	})
	t.Run("Available=False, selected by a bridge that waits for its Service", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Guest.Observed.APIServices[0] = *chartAPIService(apiregistrationv1.ConditionFalse)
		s.Guest.Services = s.Guest.Services[:1] // no metrics-server Service
		r := find(t, Diagnose(s), CheckAPIService, metricsAPI)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Fix).To(ContainSubstring("GuestWebhookBridge webhooks selects it but has not bridged it: GuestServiceNotFound: its Service kube-system/metrics-server does not exist in the guest"))
	})
	t.Run("bridged, the bridge cannot call it", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Guest.Observed.APIServices[0] = *bridgedAPIService(t, apiregistrationv1.ConditionFalse)
		s.Bridges[0].Status.Targets[0].Reachable = ptr.To(false)
		s.Bridges[0].Status.Targets[0].Message = "no answer through host Service k0smotron/tenant-a-kube-system-metrics-server (10.97.0.3:443): dial tcp: connection refused"
		r := find(t, Diagnose(s), CheckAPIService, metricsAPI)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Fix).To(ContainSubstring("GuestWebhookBridge webhooks cannot call it: no answer through host Service"))
	})
	t.Run("not checked yet", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Guest.Observed.APIServices[0] = *chartAPIService("")
		g.Expect(find(t, Diagnose(s), CheckAPIService, metricsAPI).Verdict).To(Equal(Warn))
	})
	t.Run("rewritten by a bridge that is gone", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Bridges = nil
		s.Guest.Observed.APIServices[0] = *bridgedAPIService(t, apiregistrationv1.ConditionFalse)
		r := find(t, Diagnose(s), CheckAPIService, metricsAPI)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("rewritten by GuestWebhookBridge k0smotron/webhooks, which is not a bridge of this Cluster any more"))
		g.Expect(r.Runbook).To(Equal(rbOrphaned))
	})
}

func TestDiagnose_Webhooks(t *testing.T) {
	key := cmConfig + "/" + cmWebhook
	t.Run("service reference, no bridge, no konnectivity: failed calling webhook", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Bridges = nil
		s.Guest.Observed.ValidatingWebhooks[0] = *chartValidating()
		r := find(t, Diagnose(s), CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(Equal("references Service cert-manager/cert-manager-webhook:443: the guest apiserver dials its ClusterIP, which it cannot reach from the host network: " +
			"requests it intercepts fail with `failed calling webhook \"webhook.cert-manager.io\"`"))
		g.Expect(r.Fix).To(Equal("bridge it: add cert-manager-webhook to spec.validatingWebhooks.names of a GuestWebhookBridge of Cluster tenant-a; " +
			"its serving certificate must then carry " + cmServerName))
		g.Expect(r.Runbook).To(Equal(rbWebhookFailed))
	})
	t.Run("service reference reached through konnectivity", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Bridges = nil
		s.Guest.Observed.ValidatingWebhooks[0] = *chartValidating()
		s.Guest.Observed.APIServices[0] = *chartAPIService(apiregistrationv1.ConditionTrue)
		s.Guest.Agents = []corev1.Pod{agent(true)}
		rep := Diagnose(s)
		r := find(t, rep, CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(OK), r.Line())
		g.Expect(r.Detail).To(ContainSubstring("left alone (mode Auto): 1 konnectivity agents are ready"))
		g.Expect(find(t, rep, CheckKonnectivity, "").Verdict).To(Equal(OK))
		g.Expect(rep.ExitCode()).To(Equal(ExitOK))
	})
	t.Run("a Helm revert put the service back", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		vwc := bridgedValidating(t)
		vwc.Webhooks[0].ClientConfig = chartValidating().Webhooks[0].ClientConfig
		s.Guest.Observed.ValidatingWebhooks[0] = *vwc
		r := find(t, Diagnose(s), CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("a Helm upgrade or GitOps sync put the chart's service back"))
		g.Expect(r.Runbook).To(Equal(rbHelmRevert))
	})
	t.Run("bridged, TLS name missing, from the bridge's status", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		st := &s.Bridges[0].Status.Targets[1]
		st.Reachable = ptr.To(false)
		st.Message = "its certificate carries [cert-manager-webhook.cert-manager.svc] but not " + cmServerName + ", the name the guest apiserver verifies; add that name to the serving certificate"
		s.Bridges[0].Status.Conditions = []metav1.Condition{
			cond(guestnetv1.ReadyCondition, metav1.ConditionFalse, guestnetv1.NotReadyReason, ""),
			cond(guestnetv1.TargetsReachableCondition, metav1.ConditionFalse, guestnetv1.TLSNameMismatchReason, "1 of 2 bridged targets cannot be called: ..."),
		}
		rep := Diagnose(s)
		r := find(t, rep, CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("but not " + cmServerName))
		g.Expect(r.Runbook).To(Equal(rbTLS))
		b := find(t, rep, CheckGuestWebhookBridge, bridgeName)
		g.Expect(b.Verdict).To(Equal(Fail))
		g.Expect(b.Detail).To(HavePrefix("TargetsReachable=False TLSNameMismatch: 1 of 2 bridged targets cannot be called"))
		g.Expect(b.Runbook).To(Equal(rbTLS))
	})
	t.Run("bridged, not probed yet", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Bridges[0].Status.Targets[1].Reachable = nil
		r := find(t, Diagnose(s), CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(Warn))
		g.Expect(r.Fix).To(Equal(fixUnprobed))
	})
	t.Run("weakened failurePolicy and timeoutSeconds", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		vwc := &s.Guest.Observed.ValidatingWebhooks[0]
		vwc.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
		vwc.Webhooks[0].TimeoutSeconds = ptr.To[int32](5)
		r := find(t, Diagnose(s), CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(Warn))
		g.Expect(r.Fix).To(Equal("failurePolicy is Ignore: requests pass unchecked whenever the webhook fails; with the bridge in place, set it back to Fail (the chart default); " +
			"timeoutSeconds is 5, shortened below the default 10; set it back"))
		g.Expect(r.Runbook).To(Equal(rbWeakened))
	})
	t.Run("the field report's url with a worker IP", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Bridges = nil
		vwc := chartValidating()
		vwc.Webhooks[0].ClientConfig.Service = nil
		vwc.Webhooks[0].ClientConfig.URL = ptr.To("https://10.244.1.11:30443/validate")
		s.Guest.Observed.ValidatingWebhooks[0] = *vwc
		r := find(t, Diagnose(s), CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(Warn))
		g.Expect(r.Detail).To(ContainSubstring("names an IP (the field report's workaround)"))

		// With --probe: the certificate has DNS names only.
		s.Probes = map[string]ProbeOutcome{"ValidatingWebhookConfiguration/" + cmConfig + "/" + cmWebhook: {
			Addr: "10.244.1.11:30443", ServerName: "10.244.1.11",
			Result: bridge.ProbeResult{Answered: true, NameMissing: true, DNSNames: []string{"cert-manager-webhook.cert-manager.svc"}}}}
		r = find(t, Diagnose(s), CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("its certificate carries [cert-manager-webhook.cert-manager.svc] but not 10.244.1.11"))
		g.Expect(r.Fix).To(HavePrefix("bridge it instead"))
	})
	t.Run("the chart switched to webhook.url.host after the bridge was deleted", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Bridges = nil
		vwc := chartValidating()
		vwc.Webhooks[0].ClientConfig.Service = nil
		vwc.Webhooks[0].ClientConfig.URL = ptr.To("https://" + cmServerName + "/validate")
		s.Guest.Observed.ValidatingWebhooks[0] = *vwc
		s.EndpointSlices[1].Endpoints = nil
		r := find(t, Diagnose(s), CheckValidatingWebhook, key)
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(ContainSubstring("names host Service " + cmHostService + ", which has no ready endpoint"))
	})
}

func agent(ready bool) corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "konnectivity-agent-" + strings.ToLower(string(status)), Labels: map[string]string{"k8s-app": "konnectivity-agent"}},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func TestDiagnose_Konnectivity(t *testing.T) {
	tests := []struct {
		name    string
		agents  []corev1.Pod
		apiSvc  *apiregistrationv1.APIService
		egress  []bridge.EgressCheck
		verdict Verdict
		detail  string
	}{
		{name: "none", verdict: OK, detail: "no ready konnectivity agent"},
		{name: "ready, carrying traffic", agents: []corev1.Pod{agent(true)}, verdict: OK, detail: "1 konnectivity agents are ready and no APIService fails"},
		{name: "none ready", agents: []corev1.Pod{agent(false)}, verdict: Warn, detail: "1 konnectivity agent pods: no ready konnectivity agent"},
		{name: "ready, but an APIService fails through its Service", agents: []corev1.Pod{agent(true)}, apiSvc: chartAPIService(apiregistrationv1.ConditionFalse),
			verdict: Warn, detail: "but APIService v1beta1.metrics.k8s.io fails its discovery check through its Service: the agents do not carry the traffic"},
		// Agents cut off from the konnectivity server stay Ready (no readiness probe).
		{name: "ready, but the guest apiserver cannot reach a webhook's Service through them", agents: []corev1.Pod{agent(true)},
			egress:  []bridge.EgressCheck{{Service: bridge.ServiceRef{Namespace: "cert-manager", Name: "cert-manager-webhook", Port: 443}, Failure: "error trying to reach service: No agent available"}},
			verdict: Warn, detail: "cannot reach Service cert-manager/cert-manager-webhook:443 through them: error trying to reach service: No agent available"},
		{name: "ready, and the guest apiserver reaches the webhooks' Services", agents: []corev1.Pod{agent(true)},
			egress:  []bridge.EgressCheck{{Service: bridge.ServiceRef{Namespace: "cert-manager", Name: "cert-manager-webhook", Port: 443}}},
			verdict: OK, detail: "reaches Service cert-manager/cert-manager-webhook:443 through them"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			s := healthy(t)
			s.Guest.Agents = tt.agents
			s.Guest.Egress = tt.egress
			if tt.apiSvc != nil {
				s.Guest.Observed.APIServices[0] = *tt.apiSvc
			}
			r := checkKonnectivity(s)
			g.Expect(r.Verdict).To(Equal(tt.verdict), r.Line())
			g.Expect(r.Detail).To(ContainSubstring(tt.detail))
		})
	}
}

// A GuestIngress that no policy admits gets nothing on the host: diagnose says so from the
// policies as they are, with the fix, whatever the GuestIngress's status says.
func TestDiagnose_Admission(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	g.Expect(find(t, Diagnose(s), CheckAdmission, "web").Detail).To(Equal("GuestIngressPolicy tenants admits 10.2.6.220"))

	other := tenantsPolicy()
	other.Spec.NamespaceSelector = metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}}
	s.Admission["web"] = policy.Admit(policy.Input{
		GuestIngress: &s.Ingresses[0],
		Namespace:    &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		Policies:     []guestnetv1.GuestIngressPolicy{other},
	})
	r := find(t, Diagnose(s), CheckAdmission, "web")
	g.Expect(r.Verdict).To(Equal(Fail))
	g.Expect(r.Detail).To(ContainSubstring("not admitted (NoPolicy): No GuestIngressPolicy selects namespace k0smotron"))
	g.Expect(r.Detail).To(ContainSubstring("GuestIngressPolicy tenants would allow it but does not select namespace k0smotron (its namespaceSelector: team=b)"))
	g.Expect(r.Fix).To(ContainSubstring("matchLabels kubernetes.io/metadata.name: k0smotron"))
	g.Expect(r.Runbook).To(Equal(rbNotAdmitted))

	s.Admission, s.AdmissionErr = nil, errString(`guestingresspolicies.guestnet.addons.cluster.x-k8s.io is forbidden`)
	r = find(t, Diagnose(s), CheckAdmission, "web")
	g.Expect(r.Verdict).To(Equal(Warn))
	g.Expect(r.Fix).To(ContainSubstring("may list guestingresspolicies"))
}

func TestDiagnose_GuestnetObjects(t *testing.T) {
	t.Run("no status: the manager does not run", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Ingresses[0].Status = guestnetv1.GuestIngressStatus{}
		r := find(t, Diagnose(s), CheckGuestIngress, "web")
		g.Expect(r.Verdict).To(Equal(Warn))
		g.Expect(r.Runbook).To(Equal(rbManager))
	})
	t.Run("not Ready: the first condition that breaks the chain", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Ingresses[0].Status.Conditions = []metav1.Condition{
			cond(guestnetv1.ReadyCondition, metav1.ConditionFalse, guestnetv1.NotReadyReason, ""),
			cond(guestnetv1.ClusterAvailableCondition, metav1.ConditionTrue, guestnetv1.ClusterAvailableReason, ""),
			cond(guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.PoolConflictReason, "pool overlaps k0smotron.tenant-b-web"),
			cond(guestnetv1.PortsDeclaredCondition, metav1.ConditionFalse, guestnetv1.RollingOutReason, "1 of 2 workers run it"),
		}
		r := find(t, Diagnose(s), CheckGuestIngress, "web")
		g.Expect(r.Verdict).To(Equal(Fail))
		g.Expect(r.Detail).To(Equal("LoadBalancerReady=False PoolConflict: pool overlaps k0smotron.tenant-b-web; PortsDeclared=False RollingOut: 1 of 2 workers run it"))
		g.Expect(r.Runbook).To(Equal(rbNoIP))
	})
	t.Run("paused", func(t *testing.T) {
		g := NewWithT(t)
		s := healthy(t)
		s.Bridges[0].Status.Conditions = append(s.Bridges[0].Status.Conditions, cond(guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason, "Cluster tenant-a has spec.paused set to true"))
		g.Expect(find(t, Diagnose(s), CheckGuestWebhookBridge, bridgeName).Verdict).To(Equal(Warn))
	})
}

// A Secret whose kubeconfig guestnet refuses: the guest is not read, the report names the
// refused field and says how to correct the Secret, or to pass a kubeconfig of one's own.
func TestDiagnose_KubeconfigRefused(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Guest = &Guest{Source: "Secret k0smotron/tenant-a-kubeconfig", Err: &kubeconfig.RefusedError{
		Source:   "Secret k0smotron/tenant-a-kubeconfig",
		Problems: []kubeconfig.Problem{{Field: "users[tenant].exec", Why: "runs a command", Fix: "write the credential itself"}},
	}}
	rep := Diagnose(s)
	r := find(t, rep, CheckGuest, "")
	g.Expect(r.Verdict).To(Equal(Fail))
	g.Expect(r.Detail).To(And(ContainSubstring("Secret k0smotron/tenant-a-kubeconfig"), ContainSubstring("users[tenant].exec runs a command")))
	g.Expect(r.Fix).To(And(ContainSubstring("client-certificate-data"), ContainSubstring("--guest-kubeconfig")))
	g.Expect(r.Runbook).To(Equal(rbKubeconfigRefused))
	for _, res := range rep.Results {
		g.Expect(res.Check).NotTo(BeElementOf(CheckTunnel, CheckAPIService, CheckValidatingWebhook, CheckKonnectivity), "no guest checks without a guest")
	}
}

func TestDiagnose_GuestUnreachableAndUnprovisioned(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Guest = &Guest{Source: "Secret k0smotron/tenant-a-kubeconfig", Err: errString("dial tcp 10.244.0.5:6443: connect: connection refused")}
	rep := Diagnose(s)
	r := find(t, rep, CheckGuest, "")
	g.Expect(r.Verdict).To(Equal(Fail))
	g.Expect(r.Runbook).To(Equal(rbGuestUnreachable))
	for _, res := range rep.Results {
		g.Expect(res.Check).NotTo(BeElementOf(CheckTunnel, CheckAPIService, CheckValidatingWebhook, CheckKonnectivity), "no guest checks without a guest")
	}
	g.Expect(rep.ExitCode()).To(Equal(ExitFail))

	s.Cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(false)
	s.Guest = nil
	rep = Diagnose(s)
	g.Expect(find(t, rep, CheckCluster, ns+"/"+clusterName).Verdict).To(Equal(Fail))
}

func TestDiagnose_ClassifyUsesTheBridgesOwnDecisions(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	views, errs := Classify(s)
	g.Expect(errs).To(BeEmpty())
	g.Expect(views).To(HaveLen(2))
	for _, v := range views {
		g.Expect(v.Bridge).NotTo(BeNil())
		g.Expect(v.ViaBridge()).To(BeTrue(), v.Observed.Key())
		g.Expect(v.Status).NotTo(BeNil())
	}
	g.Expect(views[1].Plan.TLSServerName).To(Equal(cmServerName))
	g.Expect(views[1].Plan.Backend.HostService).To(Equal(cmHostService))

	// An annotation that is not guestnet's record is reported, not fatal.
	s.Guest.Observed.ValidatingWebhooks[0].Annotations[guestnetv1.BridgeOriginalAnnotation] = "not json"
	r := find(t, Diagnose(s), CheckValidatingWebhook, cmConfig)
	g.Expect(r.Verdict).To(Equal(Fail))
	g.Expect(r.Detail).To(ContainSubstring("is not guestnet's"))
}

func TestDiagnose_ProbeTargets(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	type call struct {
		addr, serverName string
		insecure         bool
	}
	var calls []call
	prober := func(_ context.Context, addr, serverName string, _ []byte, insecure bool) bridge.ProbeResult {
		calls = append(calls, call{addr, serverName, insecure})
		if insecure {
			return bridge.ProbeResult{Answered: true, Insecure: true}
		}
		return bridge.ProbeResult{Answered: true, NameMissing: true, DNSNames: []string{"cert-manager-webhook.cert-manager.svc"}}
	}
	serial := func(ctx context.Context, addr, serverName string, ca []byte, insecure bool) bridge.ProbeResult {
		return prober(ctx, addr, serverName, ca, insecure)
	}
	ProbeTargets(context.Background(), s, syncProber(serial))
	// As the guest apiserver calls them: the host Service's ClusterIP at the guest Service's
	// port, the certificate checked for the name it dials.
	g.Expect(calls).To(ConsistOf(
		call{"10.97.0.2:443", cmServerName, false},
		call{"10.97.0.3:443", "metrics-server-guestnet.kube-system.svc", true},
	))
	rep := Diagnose(s)
	r := find(t, rep, CheckValidatingWebhook, cmConfig+"/"+cmWebhook)
	g.Expect(r.Verdict).To(Equal(Fail))
	g.Expect(r.Detail).To(ContainSubstring("its certificate carries [cert-manager-webhook.cert-manager.svc] but not " + cmServerName +
		", the name the guest apiserver verifies; add that name to the serving certificate (cert-manager's webhook: chart value webhook.url.host=" + cmServerName))
	g.Expect(r.Detail).To(ContainSubstring("(probed by diagnose)"))
	g.Expect(r.Runbook).To(Equal(rbTLS))
	g.Expect(find(t, rep, CheckAPIService, metricsAPI).Verdict).To(Equal(OK))
}

// syncProber serialises a prober that appends to a slice (ProbeTargets probes in parallel).
func syncProber(p Prober) Prober {
	ch := make(chan struct{}, 1)
	return func(ctx context.Context, addr, serverName string, ca []byte, insecure bool) bridge.ProbeResult {
		ch <- struct{}{}
		defer func() { <-ch }()
		return p(ctx, addr, serverName, ca, insecure)
	}
}

func TestDiagnose_PodsNotReadable(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Pods, s.PodsErr = nil, errString(`pods is forbidden: User "system:serviceaccount:guestnet-system:guestnet-manager" cannot list resource "pods"`)
	rep := Diagnose(s)
	g.Expect(find(t, rep, CheckWorkers, "").Verdict).To(Equal(Warn))
	g.Expect(find(t, rep, CheckService, cmHostService).Verdict).To(Equal(OK), "the EndpointSlices still tell")
	g.Expect(rep.ExitCode()).To(Equal(ExitOK))

	s.EndpointSlices[1].Endpoints = nil
	r := find(t, Diagnose(s), CheckService, cmHostService)
	g.Expect(r.Verdict).To(Equal(Fail))
	g.Expect(r.Detail).To(HavePrefix("no ready endpoint (0 endpoints) for its selector capk.cluster.x-k8s.io/kubevirt-machine-namespace=k0smotron,cluster.x-k8s.io/cluster-name=tenant-a"))
}
