package diagnose

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/kubeconfig"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

// Scheme knows every type diagnose reads, in the host and in the guest.
var Scheme = scheme.New()

// ErrClusterNotFound says the Cluster named on the command line does not exist.
var ErrClusterNotFound = errors.New("no such Cluster")

// GatherOptions say what to read.
type GatherOptions struct {
	Namespace string
	Cluster   string
	// GuestConfig, when set, is used for the guest instead of the Cluster's
	// <cluster>-kubeconfig Secret (GuestSource then names it).
	GuestConfig *rest.Config
	GuestSource string
	// Configure adjusts the guest's rest.Config (timeouts, user agent).
	Configure func(*rest.Config)
}

// Gather reads everything the checks look at. An error means the host could not be read
// (nothing can be said then); a guest that cannot be read is a finding (State.Guest.Err).
func Gather(ctx context.Context, host client.Reader, o GatherOptions) (*State, error) {
	s := &State{Namespace: o.Namespace, ClusterName: o.Cluster, Now: time.Now()}
	cluster, err := clusterscope.GetCluster(ctx, host, o.Namespace, o.Cluster)
	if err != nil {
		return nil, err
	}
	if cluster == nil {
		return nil, fmt.Errorf("%w %s/%s in the host (kubectl get clusters -A)", ErrClusterNotFound, o.Namespace, o.Cluster)
	}
	s.Cluster = cluster

	consumers, err := ports.ListConsumers(ctx, host, cluster)
	if err != nil {
		return nil, fmt.Errorf("listing GuestIngresses and GuestWebhookBridges: %w", err)
	}
	for _, gi := range consumers.Ingresses {
		s.Ingresses = append(s.Ingresses, *gi)
	}
	for _, gwb := range consumers.Bridges {
		s.Bridges = append(s.Bridges, *gwb)
	}
	s.Admission, s.AdmissionErr = admission(ctx, host, s.Ingresses)
	if s.NodeIdentities, err = listNodeIdentities(ctx, host, o.Namespace, o.Cluster); err != nil {
		return nil, err
	}
	_, annotated := cluster.Annotations[guestnetv1.ExtraWorkerPortsAnnotation]
	s.Managed = !consumers.Empty() || annotated

	services, slices := &corev1.ServiceList{}, &discoveryv1.EndpointSliceList{}
	for _, list := range []client.ObjectList{services, slices} {
		if err := host.List(ctx, list, client.InNamespace(o.Namespace)); err != nil {
			return nil, fmt.Errorf("listing %T in namespace %s: %w", list, o.Namespace, err)
		}
	}
	s.Services, s.EndpointSlices = services.Items, slices.Items
	pods := &corev1.PodList{}
	switch err := host.List(ctx, pods, client.InNamespace(o.Namespace)); {
	case err == nil:
		s.Pods = pods.Items
	case apierrors.IsForbidden(err):
		s.PodsErr = err
	default:
		return nil, fmt.Errorf("listing the pods of namespace %s: %w", o.Namespace, err)
	}

	var guest client.Reader
	if clusterscope.IsProvisioned(cluster) {
		var g *Guest
		g, guest = readGuest(ctx, host, cluster, o)
		s.Guest = g
	}
	if guest != nil {
		s.Required, _, s.RequiredErr = ports.ForCluster(ctx, guest, cluster, consumers)
	} else {
		s.RequiredErr = errors.New("the guest cannot be read, so neither can its kube-system/cilium-config")
	}
	if s.Workers, err = ports.ListWorkers(ctx, host, cluster, s.Required); err != nil {
		return nil, fmt.Errorf("listing the worker MachineDeployments and their templates: %w", err)
	}
	return s, nil
}

// admission decides, for each GuestIngress, what the GuestIngressPolicies admit (nil when
// there are none).
func admission(ctx context.Context, host client.Reader, ingresses []guestnetv1.GuestIngress) (map[string]policy.Decision, error) {
	if len(ingresses) == 0 {
		return nil, nil
	}
	// The host's own addresses, which no policy hands out (the manager keeps them in a cache).
	reserved, err := hostaddrs.Read(ctx, host)
	if err != nil {
		return nil, err
	}
	world, err := policy.Observe(ctx, host, reserved)
	if err != nil {
		return nil, err
	}
	out := map[string]policy.Decision{}
	for i := range ingresses {
		in, err := world.Input(ctx, &ingresses[i])
		if err != nil {
			return nil, err
		}
		out[ingresses[i].Name] = policy.Admit(in)
	}
	return out, nil
}

// readGuest reads the guest through the Cluster's kubeconfig Secret (or o.GuestConfig). It
// returns the client it used when the guest could be read. The Secret's kubeconfig is
// checked as guestnet's manager checks it (internal/kubeconfig): a tenant can write it, and
// diagnose runs with the rights of the admin who runs it, so an exec plugin, a file, a proxy
// or a server that is not the Cluster's endpoint is refused (Guest.Err is then a
// *kubeconfig.RefusedError) before anything is read, run or dialled.
func readGuest(ctx context.Context, host client.Reader, cluster *clusterv1.Cluster, o GatherOptions) (*Guest, client.Reader) {
	g := &Guest{Source: o.GuestSource}
	cfg := o.GuestConfig
	if cfg == nil {
		name := secret.Name(cluster.Name, secret.Kubeconfig)
		g.Source = fmt.Sprintf("Secret %s/%s", cluster.Namespace, name)
		s := &corev1.Secret{}
		if err := host.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, s); err != nil {
			g.Err = err
			return g, nil
		}
		data, err := kubeconfig.FromSecret(s, cluster)
		if err != nil {
			g.Err = err
			return g, nil
		}
		if cfg, err = clientcmd.RESTConfigFromKubeConfig(data); err != nil {
			g.Err = fmt.Errorf("reading the kubeconfig: %w", err)
			return g, nil
		}
	}
	cfg = rest.CopyConfig(cfg)
	if o.Configure != nil {
		o.Configure(cfg)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		g.Err = err
		return g, nil
	}
	version, err := dc.ServerVersion()
	if err != nil {
		g.Err = err
		return g, nil
	}
	g.Version = version.GitVersion
	c, err := client.New(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		g.Err = err
		return g, nil
	}

	apiServices := &apiregistrationv1.APIServiceList{}
	validating := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	mutating := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	services := &corev1.ServiceList{}
	for _, list := range []client.ObjectList{apiServices, validating, mutating, services} {
		if err := c.List(ctx, list); err != nil {
			g.Err = fmt.Errorf("listing %T: %w", list, err)
			return g, nil
		}
	}
	g.Observed = bridge.Observed{APIServices: apiServices.Items, ValidatingWebhooks: validating.Items, MutatingWebhooks: mutating.Items}
	g.Services = services.Items

	agents := &corev1.PodList{}
	if err := c.List(ctx, agents, client.InNamespace(bridge.KonnectivityNamespace),
		client.MatchingLabels{bridge.KonnectivityAgentLabel: bridge.KonnectivityAgentValue}); err != nil {
		g.Err = fmt.Errorf("listing the konnectivity agents: %w", err)
		return g, nil
	}
	g.Agents = agents.Items
	if len(g.Agents) > 0 {
		// Ready agent Pods are no proof: ask the guest apiserver to reach the webhooks'
		// Services through its egress, as the bridge does in mode Auto.
		var targets []bridge.Target
		for i := range g.Observed.ValidatingWebhooks {
			targets = append(targets, bridge.WebhookTargets(&g.Observed.ValidatingWebhooks[i])...)
		}
		for i := range g.Observed.MutatingWebhooks {
			targets = append(targets, bridge.WebhookTargets(&g.Observed.MutatingWebhooks[i])...)
		}
		for _, ref := range bridge.EgressRefs(targets) {
			g.Egress = append(g.Egress, bridge.ProbeEgress(ctx, cfg, ref))
		}
	}

	cm := &corev1.ConfigMap{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "cilium-config"}, cm); {
	case err == nil:
		g.CiliumConfig = cm.Data
		if g.CiliumConfig == nil {
			g.CiliumConfig = map[string]string{}
		}
	case !apierrors.IsNotFound(err):
		g.Err = fmt.Errorf("reading kube-system/cilium-config: %w", err)
		return g, nil
	}

	// The node identity checks' Nodes and CiliumNodes: what cannot be read is said by those
	// checks, the rest of the guest is checked anyway.
	g.Nodes, g.NodesTruncated, g.NodesErr = listGuestNodes(ctx, c)
	g.CiliumNodes, g.CiliumNodesErr = listCiliumNodes(ctx, c)
	return g, c
}

// Prober is bridge.Probe's signature (tests replace it).
type Prober func(ctx context.Context, addr, serverName string, caBundle []byte, insecure bool) bridge.ProbeResult

// ProbeTargets calls, as the guest apiserver does, every target that goes through a bridge
// (at its host Service's ClusterIP, verifying the certificate for the name the guest
// apiserver dials: bridge.Probe, as the controller does) and every webhook url. It must run
// where the host's ClusterIPs are reachable (a pod or a node of the host): elsewhere every
// probe fails. Probes run in parallel, each bounded by bridge.ProbeTimeout.
func ProbeTargets(ctx context.Context, s *State, probe Prober) {
	s.Probed = true
	if s.Probes == nil {
		s.Probes = map[string]ProbeOutcome{}
	}
	if s.Guest == nil || s.Guest.Err != nil {
		return
	}
	views, _ := Classify(s)
	var mu sync.Mutex
	var wg sync.WaitGroup
	run := func(key, addr, serverName string, caBundle []byte, insecure bool) {
		wg.Go(func() {
			res := probe(ctx, addr, serverName, caBundle, insecure)
			mu.Lock()
			defer mu.Unlock()
			s.Probes[key] = ProbeOutcome{Addr: addr, ServerName: serverName, Result: res}
		})
	}
	for i := range views {
		v := &views[i]
		t := v.Observed
		switch {
		case v.ViaBridge() && v.Plan.ViaBridge():
			svc := serviceNamed(s.Services, v.Plan.Backend.HostService)
			if svc == nil || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
				continue
			}
			addr := net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(v.Plan.Port)))
			run(t.Key(), addr, v.Plan.TLSServerName, t.CABundle, !t.IsWebhook() && t.InsecureSkipTLSVerify)
		case t.IsWebhook() && t.Service == nil && t.URL != "":
			addr, serverName, _, err := urlAddress(t.URL, s.Namespace, s.Services)
			if err != nil {
				continue
			}
			run(t.Key(), addr, serverName, t.CABundle, false)
		}
	}
	wg.Wait()
}

func serviceNamed(services []corev1.Service, name string) *corev1.Service {
	for i := range services {
		if services[i].Name == name {
			return &services[i]
		}
	}
	return nil
}
