package e2e

// `manager diagnose` against the lab: a healthy cluster (guestnet's manager running, a
// GuestIngress and a GuestWebhookBridge Ready, a webhook and an APIService called by the real
// guest apiserver through the bridge) and a broken one (the field report's failures: a host
// Service selecting by virtualMachineTemplate labels, a worker template missing the tunnel
// and a required port, an APIService Available=False, a webhook referencing a Service with no
// bridge). The command runs in the test process, which is inside the lab's network namespace
// (so --probe reaches the host ClusterIPs, as from a host pod), and once as the built binary.
//
// The lab's guest is shared by every guest cluster of the package, and diagnose reads the
// whole guest (every APIService and webhook): each test removes its cluster-wide guest objects
// when it ends, and both check that no other test left any (they run before the tests that
// install cluster-wide third-party objects for the whole binary: file order).
//
// Run with: make test TEST_PKGS=./e2e/... TEST_ARGS='-run Diagnose -v'

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/diagnose"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

const diagnoseTimeout = 90 * time.Second

func TestDiagnose_HealthyClusterIsAllOK(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	host, guest := l.Host.Client, l.Guest.Client
	requireNoForeignGuestTargets(t, l)
	startCiliumStandIn(t, l)

	// The cluster: workers declaring SSH, the kubelet, the GuestIngress nodePorts and the
	// bridge's nodePort range, which is all the cluster requires (no guest Cilium).
	ns := uniqueName("diag-ok")
	const httpNodePort, httpsNodePort, bridgeFirst, bridgeSize int32 = 31950, 31951, 31960, 2
	gc := createIngressCluster(t, l, ns, "tenant-a", httpNodePort, httpsNodePort, bridgeFirst, bridgeFirst+1)

	// The guest's webhook and aggregated API, as a chart installs them: Services with
	// selectors, a validating webhook (which intercepts nothing: ConfigMaps of a namespace no
	// one creates) and an APIService.
	targetNS := uniqueName("diag-webhook")
	group := ns + ".diag.guestnet.dev"
	apiServiceName := "v1beta1." + group
	hostService := hostnames.BridgeHostService(gc.Name, targetNS, "webhook")
	serverName := hostnames.ServiceDNSName(ns, hostService)
	ca, err := lab.NewCA("diag-webhook-ca")
	g.Expect(err).NotTo(HaveOccurred())
	certPEM, keyPEM, err := ca.Issue(lab.CertRequest{CommonName: "webhook", DNSNames: []string{serverName}, Server: true})
	g.Expect(err).NotTo(HaveOccurred())
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	g.Expect(err).NotTo(HaveOccurred())

	// The servers run in the worker VMs on the bridge's nodePorts (the guest's kube-proxy in
	// the VM and the pods behind it, in one).
	for i, ip := range []string{"10.244.60.11", "10.244.60.12"} {
		w := addWorker(t, l, gc, fmt.Sprintf("%s-md-0-%c", ns, 'a'+i), ip)
		for p := bridgeFirst; p < bridgeFirst+bridgeSize; p++ {
			serveAggregatedAPIInVM(t, w, p, cert, group)
		}
	}

	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: targetNS}}
	apiService := &apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: apiServiceName}}
	// Cleanups run last first: the GuestIngress and the bridge are deleted while the manager
	// runs (the bridge restores the originals), then the manager stops, then the cluster-wide
	// guest objects go.
	t.Cleanup(func() { deleteGuestObjects(t, l, vwc, apiService) })
	g.Expect(createGuestNamespace(ctx, guest, targetNS)).To(Succeed())
	for _, name := range []string{"webhook", "api"} {
		g.Expect(guest.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: targetNS, Name: name},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app.kubernetes.io/name": name},
				Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}},
			},
		})).To(Succeed())
	}
	vwc.Webhooks = []admissionregistrationv1.ValidatingWebhook{{
		Name: "webhook.diag.guestnet.dev",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{
			Service:  &admissionregistrationv1.ServiceReference{Namespace: targetNS, Name: "webhook", Path: ptr.To("/validate"), Port: ptr.To[int32](443)},
			CABundle: ca.CertPEM(),
		},
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
		}},
		NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: targetNS + "-nothing"}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
	}}
	g.Expect(guest.Create(ctx, vwc)).To(Succeed())
	apiService.Spec = apiregistrationv1.APIServiceSpec{
		Service: &apiregistrationv1.ServiceReference{Namespace: targetNS, Name: "api", Port: ptr.To[int32](443)},
		Group:   group, Version: "v1beta1", InsecureSkipTLSVerify: true, GroupPriorityMinimum: 100, VersionPriority: 100,
	}
	g.Expect(guest.Create(ctx, apiService)).To(Succeed())

	// guestnet: a GuestIngress and a GuestWebhookBridge, both Ready.
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})
	gi := createGuestIngress(t, l, ns, "web", gc.Name, guestSvc, "10.98.9.10", ptr.To(httpNodePort), ptr.To(httpsNodePort))
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhooks"},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        gc.Name,
			APIServices:        &guestnetv1.TargetSelector{Names: []string{apiServiceName}},
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{vwc.Name}},
			NodePortRange:      guestnetv1.NodePortRange{Start: bridgeFirst, Size: bridgeSize},
			Mode:               guestnetv1.BridgeModeAlways,
		},
	}
	g.Expect(host.Create(ctx, gwb)).To(Succeed())
	t.Cleanup(func() { deleteAndWait(t, l, gwb, gi) })

	eventuallyGuestIngressReady(t, l, gi)
	eventuallyBridge(ctx, g, host, gwb, diagnoseTimeout, func(g Gomega, got *guestnetv1.GuestWebhookBridge) {
		g.Expect(conditions.IsTrue(got, guestnetv1.ReadyCondition)).To(BeTrue(), "%v", got.Status.Conditions)
	})
	// The real guest apiserver reaches the aggregated API through the bridge.
	g.Eventually(func(g Gomega) {
		got := &apiregistrationv1.APIService{}
		g.Expect(guest.Get(ctx, client.ObjectKeyFromObject(apiService), got)).To(Succeed())
		c := apiServiceCondition(got, apiregistrationv1.Available)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(apiregistrationv1.ConditionTrue), "%s: %s", c.Reason, c.Message)
	}).WithTimeout(diagnoseTimeout).WithPolling(time.Second).Should(Succeed())

	for _, args := range [][]string{nil, {"--probe"}} {
		code, text := runDiagnose(t, l, ns, gc.Name, args...)
		g.Expect(code).To(Equal(diagnose.ExitOK), text)
		g.Expect(strings.TrimSpace(text)).To(HaveSuffix(" 0 WARN, 0 FAIL"), text)
	}
	rep := runDiagnoseJSON(t, l, ns, gc.Name, diagnose.ExitOK, "--probe")
	g.Expect(rep.Verdict).To(Equal(diagnose.OK))
	for _, item := range []struct{ check, object, detail string }{
		{diagnose.CheckGuest, "", "the guest apiserver (v1.37.2) answers through Secret " + ns + "/tenant-a-kubeconfig"},
		{diagnose.CheckWorkers, "", "2 virt-launcher pods (2 ready) match capk.cluster.x-k8s.io/kubevirt-machine-namespace=" + ns + ",cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher"},
		{diagnose.CheckService, "tenant-a-web", "2 of 2 endpoints ready"},
		{diagnose.CheckLoadBalancer, "tenant-a-web", "IP 10.98.9.10"},
		{diagnose.CheckService, hostService, "2 of 2 endpoints ready"},
		// No 22: the lab's templates say checkStrategy: none, so CAPK never SSHes (they
		// declare 22 all the same; declared is not required).
		{diagnose.CheckPorts, gc.MachineDeployment, "declares every required port (10250/TCP, 31950/TCP, 31951/TCP, 31960/TCP, 31961/TCP)"},
		{diagnose.CheckTunnel, "", "no kube-system/cilium-config in the guest"},
		{diagnose.CheckAPIService, apiServiceName, "Available=True through GuestWebhookBridge webhooks"},
		{diagnose.CheckValidatingWebhook, vwc.Name + "/webhook.diag.guestnet.dev", "answers through the bridge with a certificate valid for " + serverName + " (probed by diagnose)"},
		{diagnose.CheckKonnectivity, "", "no ready konnectivity agent"},
		{diagnose.CheckAdmission, "web", "GuestIngressPolicy " + lab.LabPolicyName + " admits 10.98.9.10"},
		{diagnose.CheckGuestIngress, "web", "Ready: IP 10.98.9.10, 2 ready endpoints"},
		{diagnose.CheckGuestWebhookBridge, "webhooks", "Ready: 2 of 2 targets bridged"},
	} {
		r := result(t, rep, item.check, item.object)
		g.Expect(r.Verdict).To(Equal(diagnose.OK), "%s %s: %s", item.check, item.object, r.Detail)
		g.Expect(r.Detail).To(ContainSubstring(item.detail), "%s %s", item.check, item.object)
	}
}

func TestDiagnose_BrokenClusterFails(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	host, guest := l.Host.Client, l.Guest.Client
	requireNoForeignGuestTargets(t, l)

	// The workers declare SSH and the kubelet only, while the guest Cilium tunnels on 8473
	// and the Cluster asks for 30080; the host Service selects by a label of
	// virtualMachineTemplate.metadata.labels. guestnet does not run.
	ns := uniqueName("diag-broken")
	gc, err := l.CreateGuestCluster(ctx, ns, "tenant-b", lab.WorkerTemplateOptions{Ports: []int32{22, 10250}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(l.SetMachineDeploymentStatus(ctx, gc, 2, 2)).To(Succeed())
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cluster := &clusterv1.Cluster{}
		if err := host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.Name}, cluster); err != nil {
			return err
		}
		cluster.Annotations = map[string]string{guestnetv1.ExtraWorkerPortsAnnotation: fmt.Sprint(lab.WorkerServicePort)}
		return host.Update(ctx, cluster)
	})).To(Succeed())
	var workers []*lab.Worker
	for i, ip := range []string{"10.244.61.11", "10.244.61.12"} {
		workers = append(workers, addWorker(t, l, gc, fmt.Sprintf("%s-md-0-%c", ns, 'a'+i), ip))
	}
	// Node identity: the first worker's kubelet runs in external mode and nothing initializes
	// its Node (the taint, no InternalIP); the second's does not, and wrote the VM's own
	// masquerade address. Both Nodes go with the test: the lab's guest is shared, and a
	// GuestNodeIdentity of a later test would see a Node waiting for it.
	t.Cleanup(func() {
		for _, w := range workers {
			_ = guest.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: w.Machine}})
		}
	})
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := guest.Get(ctx, client.ObjectKey{Name: workers[0].Machine}, node); err != nil {
			return err
		}
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: "node.cloudprovider.kubernetes.io/uninitialized", Value: "true", Effect: corev1.TaintEffectNoSchedule})
		if err := guest.Update(ctx, node); err != nil {
			return err
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: node.Name}}
		return guest.Status().Update(ctx, node)
	})).To(Succeed())
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := guest.Get(ctx, client.ObjectKey{Name: workers[1].Machine}, node); err != nil {
			return err
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.2.2"}, {Type: corev1.NodeHostName, Address: node.Name}}
		return guest.Status().Update(ctx, node, client.FieldOwner("kubelet"))
	})).To(Succeed())
	_, err = lab.HostServiceForWorkers(ctx, host, ns, "by-vm-template-labels", map[string]string{lab.VMTemplateLabel: gc.WorkerTemplate})
	g.Expect(err).NotTo(HaveOccurred())

	// The guest: Cilium's tunnel on the field report's 8473, metrics-server's APIService and
	// cert-manager's webhook as their charts install them, and no bridge.
	ciliumConfig := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "cilium-config"},
		Data: map[string]string{"tunnel-protocol": "vxlan", "tunnel-port": "8473"}}
	api, err := lab.CreateMetricsAPI(ctx, guest, uniqueName("metrics"), ns+".metrics.k8s.io")
	g.Expect(err).NotTo(HaveOccurred())
	wh, err := lab.CreateServiceWebhook(ctx, guest, l.Guest.CA.CertPEM(), uniqueName("cert-manager"), uniqueName("app"))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { deleteGuestObjects(t, l, wh.Config, api.APIService, ciliumConfig) })
	g.Expect(guest.Create(ctx, ciliumConfig)).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := &apiregistrationv1.APIService{}
		g.Expect(guest.Get(ctx, client.ObjectKeyFromObject(api.APIService), got)).To(Succeed())
		c := apiServiceCondition(got, apiregistrationv1.Available)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal("FailedDiscoveryCheck"))
	}).WithTimeout(diagnoseTimeout).Should(Succeed())

	code, text := runDiagnose(t, l, ns, gc.Name)
	g.Expect(code).To(Equal(diagnose.ExitFail), text)
	rep := runDiagnoseJSON(t, l, ns, gc.Name, diagnose.ExitFail)
	g.Expect(rep.Verdict).To(Equal(diagnose.Fail))

	webhook := wh.Config.Name + "/" + lab.WebhookName
	for _, item := range []struct {
		check, object string
		verdict       diagnose.Verdict
		detail, fix   string
		runbook       string
	}{
		{check: diagnose.CheckCluster, object: ns + "/tenant-b", verdict: diagnose.OK},
		{check: diagnose.CheckGuest, verdict: diagnose.OK},
		{check: diagnose.CheckWorkers, verdict: diagnose.OK, detail: "2 virt-launcher pods (2 ready)"},
		{check: diagnose.CheckService, object: "by-vm-template-labels", verdict: diagnose.Fail,
			detail:  "uses " + lab.VMTemplateLabel + " of virtualMachineTemplate.metadata.labels, which KubeVirt does not copy to virt-launcher pods",
			fix:     "select the workers with capk.cluster.x-k8s.io/kubevirt-machine-namespace=" + ns + ",cluster.x-k8s.io/cluster-name=tenant-b,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher",
			runbook: "docs/runbook.md#ingress-no-endpoints"},
		{check: diagnose.CheckPorts, object: gc.MachineDeployment, verdict: diagnose.Fail,
			detail: "KubevirtMachineTemplate " + gc.WorkerTemplate + " lacks 8473/UDP (Cilium VXLAN tunnel), 30080/TCP (Cluster annotation " + guestnetv1.ExtraWorkerPortsAnnotation + ")",
			fix:    "guestnet creates a KubevirtMachineTemplate <base>-<hash> that declares them", runbook: "docs/runbook.md#ingress-undeclared-port"},
		{check: diagnose.CheckTunnel, verdict: diagnose.Fail, detail: "guest Cilium tunnels with vxlan on 8473/UDP, which KubevirtMachineTemplate " + gc.WorkerTemplate,
			runbook: "docs/runbook.md#ingress-tunnel-port"},
		{check: diagnose.CheckAPIService, object: api.APIService.Name, verdict: diagnose.Fail,
			detail:  "Available=False (FailedDiscoveryCheck): failing or missing response from https://" + api.Service.Spec.ClusterIP + ":443",
			fix:     "bridge it: add " + api.APIService.Name + " to spec.apiServices.names of a GuestWebhookBridge of Cluster tenant-b",
			runbook: "docs/runbook.md#apiservice-unavailable"},
		{check: diagnose.CheckValidatingWebhook, object: webhook, verdict: diagnose.Fail,
			detail:  "the guest apiserver dials its ClusterIP, which it cannot reach from the host network: requests it intercepts fail with `failed calling webhook \"" + lab.WebhookName + "\"`; also: timeoutSeconds is 5",
			fix:     "its serving certificate must then carry " + hostnames.ServiceDNSName(ns, hostnames.BridgeHostService(gc.Name, wh.Service.Namespace, wh.Service.Name)),
			runbook: "docs/runbook.md#webhook-failed-calling"},
		{check: diagnose.CheckKonnectivity, verdict: diagnose.OK, detail: "no ready konnectivity agent"},
		// Registered seconds ago: a WARN until the Node's first minute is over.
		{check: diagnose.CheckNodeUninitialized, object: workers[0].Machine, verdict: diagnose.Warn,
			detail:  "tainted node.cloudprovider.kubernetes.io/uninitialized for ",
			fix:     "if it stays, create a GuestNodeIdentity for Cluster tenant-b (docs/node-identity.md)",
			runbook: "docs/runbook.md#node-uninitialized"},
		{check: diagnose.CheckKubeletMode, object: workers[1].Machine, verdict: diagnose.Fail,
			detail:  "InternalIP 10.0.2.2 is KubeVirt's masquerade address of the VM, not its virt-launcher pod IP 10.244.61.12 (pod " + workers[1].Pod + "); the kubelet wrote it itself",
			fix:     "add --enable-cloud-provider to the K0sWorkerConfigTemplate's spec.args",
			runbook: "docs/runbook.md#kubelet-not-external"},
	} {
		r := result(t, rep, item.check, item.object)
		g.Expect(r.Verdict).To(Equal(item.verdict), "%s %s: %s", item.check, item.object, r.Detail)
		g.Expect(r.Detail).To(ContainSubstring(item.detail), "%s %s", item.check, item.object)
		g.Expect(r.Fix).To(ContainSubstring(item.fix), "%s %s", item.check, item.object)
		g.Expect(r.Runbook).To(Equal(item.runbook), "%s %s", item.check, item.object)
	}

	// The built binary: the same report, the same exit status.
	if testing.Short() {
		return
	}
	bin := buildManager(t)
	cmd := exec.CommandContext(ctx, bin, "diagnose", "--kubeconfig", l.Host.KubeconfigPath, "--namespace", ns, "--cluster", gc.Name, "--output", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exitErr *exec.ExitError
	g.Expect(errors.As(err, &exitErr)).To(BeTrue(), "%v: %s", err, stderr.String())
	g.Expect(exitErr.ExitCode()).To(Equal(diagnose.ExitFail), stderr.String())
	var fromBinary diagnose.Report
	g.Expect(json.Unmarshal(stdout.Bytes(), &fromBinary)).To(Succeed(), stdout.String())
	g.Expect(fromBinary.Verdict).To(Equal(diagnose.Fail))
	// (the uninitialized Node turns from WARN to FAIL after its first minute: the build may take that long)
	failsBut := func(r *diagnose.Report) int {
		n := 0
		for _, res := range r.Results {
			if res.Verdict == diagnose.Fail && res.Check != diagnose.CheckNodeUninitialized {
				n++
			}
		}
		return n
	}
	g.Expect(failsBut(&fromBinary)).To(Equal(failsBut(rep)))

	// A Cluster that does not exist is a usage error.
	cmd = exec.CommandContext(ctx, bin, "diagnose", "--kubeconfig", l.Host.KubeconfigPath, "-n", ns, "--cluster", "nope")
	out, err := cmd.CombinedOutput()
	g.Expect(errors.As(err, &exitErr)).To(BeTrue(), "%v: %s", err, out)
	g.Expect(exitErr.ExitCode()).To(Equal(diagnose.ExitUsage))
	g.Expect(string(out)).To(ContainSubstring("no such Cluster " + ns + "/nope"))
}

// --- helpers ------------------------------------------------------------------------------

// runDiagnose runs `manager diagnose` in the test process against the lab's host and returns
// its exit status and text output, which it logs.
func runDiagnose(t *testing.T, l *lab.Lab, ns, cluster string, extra ...string) (int, string) {
	t.Helper()
	args := append([]string{"--kubeconfig", l.Host.KubeconfigPath, "--namespace", ns, "--cluster", cluster}, extra...)
	var stdout, stderr bytes.Buffer
	code := diagnose.Run(testContext(t), args, &stdout, &stderr)
	t.Logf("manager diagnose --namespace %s --cluster %s %s (exit status %d):\n%s%s", ns, cluster, strings.Join(extra, " "), code, stdout.String(), stderr.String())
	return code, stdout.String()
}

func runDiagnoseJSON(t *testing.T, l *lab.Lab, ns, cluster string, wantCode int, extra ...string) *diagnose.Report {
	t.Helper()
	args := append([]string{"--kubeconfig", l.Host.KubeconfigPath, "--namespace", ns, "--cluster", cluster, "-o", "json"}, extra...)
	var stdout, stderr bytes.Buffer
	if code := diagnose.Run(testContext(t), args, &stdout, &stderr); code != wantCode {
		t.Fatalf("manager diagnose -o json: exit status %d, want %d\n%s%s", code, wantCode, stdout.String(), stderr.String())
	}
	rep := &diagnose.Report{}
	if err := json.Unmarshal(stdout.Bytes(), rep); err != nil {
		t.Fatalf("reading the JSON report: %v\n%s", err, stdout.String())
	}
	return rep
}

func result(t *testing.T, rep *diagnose.Report, check, object string) diagnose.Result {
	t.Helper()
	for _, r := range rep.Results {
		if r.Check == check && r.Object == object {
			return r
		}
	}
	var lines []string
	for _, r := range rep.Results {
		lines = append(lines, r.Line())
	}
	t.Fatalf("no result for %s %q in:\n%s", check, object, strings.Join(lines, "\n"))
	return diagnose.Result{}
}

// requireNoForeignGuestTargets fails the test when the shared guest holds APIServices that
// reference a Service, or webhook configurations, of other tests: diagnose reads the whole
// guest and would report them too.
func requireNoForeignGuestTargets(t *testing.T, l *lab.Lab) {
	t.Helper()
	ctx := testContext(t)
	var foreign []string
	apiServices := &apiregistrationv1.APIServiceList{}
	validating := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	mutating := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	for _, list := range []client.ObjectList{apiServices, validating, mutating} {
		if err := l.Guest.Client.List(ctx, list); err != nil {
			t.Fatalf("listing the guest: %v", err)
		}
	}
	for _, a := range apiServices.Items {
		if a.Spec.Service != nil {
			foreign = append(foreign, "APIService "+a.Name)
		}
	}
	for _, c := range validating.Items {
		foreign = append(foreign, "ValidatingWebhookConfiguration "+c.Name)
	}
	for _, c := range mutating.Items {
		foreign = append(foreign, "MutatingWebhookConfiguration "+c.Name)
	}
	if len(foreign) > 0 {
		t.Fatalf("the lab's guest holds cluster-wide objects of other tests (%s); the diagnose tests read the whole guest: "+
			"run them alone or before the third-party tests (make test TEST_PKGS=./e2e/... TEST_ARGS='-run Diagnose')", strings.Join(foreign, ", "))
	}
}

// serveAggregatedAPIInVM serves HTTPS with cert on port inside the worker's VM: the
// discovery document of group/v1beta1 (what the aggregator's availability check asks for),
// 404 for anything else (the aggregator then falls back from aggregated discovery).
func serveAggregatedAPIInVM(t *testing.T, w *lab.Worker, port int32, cert tls.Certificate, group string) {
	t.Helper()
	ln, err := w.ServeInVM(port)
	if err != nil {
		t.Fatalf("serving in VM %s: %v", w.Machine, err)
	}
	discovery := fmt.Sprintf(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"%s/v1beta1","resources":[]}`, group)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/apis/"+group+"/v1beta1" {
				http.NotFound(rw, r)
				return
			}
			rw.Header().Set("Content-Type", "application/json")
			_, _ = rw.Write([]byte(discovery))
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() {
		_ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	}()
	t.Cleanup(func() { _ = srv.Close() })
}

func createGuestNamespace(ctx context.Context, c client.Client, name string) error {
	return c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// deleteAndWait deletes host objects with finalizers and waits until they are gone (their
// controller restores what they changed in the guest).
func deleteAndWait(t *testing.T, l *lab.Lab, objs ...client.Object) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), diagnoseTimeout)
	defer cancel()
	for _, obj := range objs {
		if err := l.Host.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting %s: %v", obj.GetName(), err)
		}
	}
	g := NewWithT(t)
	for _, obj := range objs {
		g.Eventually(func() bool {
			return apierrors.IsNotFound(l.Host.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj))
		}).WithTimeout(diagnoseTimeout).Should(BeTrue(), "%T %s is not gone", obj, obj.GetName())
	}
}

// deleteGuestObjects deletes the test's cluster-wide (and kube-system) guest objects.
func deleteGuestObjects(t *testing.T, l *lab.Lab, objs ...client.Object) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, obj := range objs {
		if err := l.Guest.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting guest %T %s: %v", obj, obj.GetName(), err)
		}
	}
}

// buildManager builds the manager binary (main.go) into the test's temporary directory.
func buildManager(t *testing.T) string {
	t.Helper()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// go test puts its own go first in PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "manager")
	cmd := exec.Command(goBin, "build", "-o", bin, ".")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built %s in %s", bin, time.Since(start).Round(time.Second))
	return bin
}
