package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

const webhookBridgeYAML = `apiVersion: guestnet.addons.cluster.x-k8s.io/v1alpha1
kind: GuestWebhookBridge
metadata:
  name: guest-1
  namespace: %s
spec:
  clusterName: %s
  apiServices: {names: [v1beta1.metrics.k8s.io]}
  validatingWebhooks: {names: [cert-manager-webhook]}
  mutatingWebhooks: {names: [cert-manager-webhook]}
`

// webhookBridgeTour applies a GuestWebhookBridge and shows, through the guest apiserver,
// `kubectl top` and a cert-manager resource working. The guest kube-proxy stand-in forwards
// the bridge's nodePorts inside the worker VMs (the lab's guest has no kube-proxy).
func webhookBridgeTour(ctx context.Context, l *lab.Lab, s *scenario, host, guest kubectlFunc) error {
	kubeProxy, err := lab.StartGuestKubeProxyStandIn(ctx, l)
	if err != nil {
		return err
	}
	defer kubeProxy.Stop()

	section("Host: apply a GuestWebhookBridge next to the Cluster")
	path := filepath.Join(l.Dir, "guestwebhookbridge.yaml")
	manifest := fmt.Sprintf(webhookBridgeYAML, clusterNamespace, clusterName)
	if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
		return err
	}
	fmt.Print(manifest)
	host("apply", "-f", path)
	gwb := &guestnetv1.GuestWebhookBridge{}
	key := client.ObjectKey{Namespace: clusterNamespace, Name: "guest-1"}
	if err := waitFor(ctx, func() bool {
		return l.Host.Client.Get(ctx, key, gwb) == nil && conditions.IsTrue(gwb, guestnetv1.TargetsBridgedCondition) &&
			conditions.Get(gwb, guestnetv1.TargetsReachableCondition) != nil && gwb.Status.BridgedTargets == 3
	}); err != nil {
		return fmt.Errorf("waiting for the bridge: %w", err)
	}
	host("get", "gwb", "-n", clusterNamespace)
	host("get", "gwb", "guest-1", "-n", clusterNamespace, "-o",
		`jsonpath={range .status.targets[*]}{.kind} {.name}: guest nodePort {.nodePort}, host Service {.hostService}{"\n"}{end}`)
	host("get", "services,endpointslices", "-n", clusterNamespace, "-l", ownership.BridgeNameLabel+"=guest-1", "-o", "wide")
	guest("get", "validatingwebhookconfiguration", lab.CertManagerWebhookName, "-o", `jsonpath=url: {.webhooks[0].clientConfig.url}{"\n"}service: {.webhooks[0].clientConfig.service}{"\n"}`)
	guest("get", "apiservice", lab.MetricsAPIServiceName, "-o", `jsonpath={.spec.service}{"\n"}`)
	guest("get", "services", "-n", lab.CertManagerNamespace)

	section("The bridge checks each target as the guest apiserver will call it: cert-manager's certificate lacks the bridge's name")
	host("get", "gwb", "guest-1", "-n", clusterNamespace, "-o", `jsonpath={.status.conditions[?(@.type=="TargetsReachable")].message}{"\n"}`)
	guest("create", "-f", s.clusterIssuer)

	serverName := hostnames.ServiceDNSName(clusterNamespace, hostnames.BridgeHostService(clusterName, lab.CertManagerNamespace, lab.CertManagerWebhookName))
	section("Do what the condition says: cert-manager's webhook serves " + serverName + " too (its --dynamic-serving-dns-names; the chart value webhook.url.host sets it)")
	if err := s.certManager.SetWebhookDNSNames(ctx, l, serverName); err != nil {
		return err
	}
	// A restarted webhook changes nothing the bridge watches: ask it to probe again now.
	host("annotate", "gwb", "guest-1", "-n", clusterNamespace, guestnetv1.RecheckAnnotation+"=1", "--overwrite")
	if err := waitFor(ctx, func() bool {
		return l.Host.Client.Get(ctx, key, gwb) == nil && conditions.IsTrue(gwb, guestnetv1.ReadyCondition)
	}); err != nil {
		return fmt.Errorf("waiting for the bridge to be Ready: %w", err)
	}
	host("get", "gwb", "-n", clusterNamespace)

	section("Guest: cert-manager's webhook runs for the guest apiserver: the ClusterIssuer is created")
	guest("create", "-f", s.clusterIssuer)
	guest("get", "clusterissuers")

	section("Guest: the metrics API is available, `kubectl top` works")
	err = wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		got := &apiregistrationv1.APIService{}
		if err := l.Guest.Client.Get(ctx, client.ObjectKey{Name: lab.MetricsAPIServiceName}, got); err != nil {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiregistrationv1.Available && c.Status == apiregistrationv1.ConditionTrue {
				return metricsReady(ctx, l), nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the metrics API: %w", err)
	}
	guest("get", "apiservice", lab.MetricsAPIServiceName)
	guest("top", "nodes")
	return nil
}

// metricsReady reports whether metrics-server has scraped every worker (two scrapes each).
func metricsReady(ctx context.Context, l *lab.Lab) bool {
	cmd := l.Assets.KubectlCommand(l.Guest.KubeconfigPath, "top", "nodes", "--no-headers")
	out, err := cmd.CombinedOutput()
	return err == nil && len(out) > 0 && ctx.Err() == nil
}
