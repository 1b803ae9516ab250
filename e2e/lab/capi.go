package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// CAPIPodAddress is the host pod IP of the lab's Cluster API controller pods: where their
// webhook servers are published (each on a port of its own).
const CAPIPodAddress = "10.244.0.3"

// capiWebhookPort is the webhook server's port inside a CAPI manager's pod namespace
// (CAPI's default); health and diagnostics listen on 127.0.0.1 there.
const capiWebhookPort = 9443

// CAPI is a real Cluster API core manager (sigs.k8s.io/cluster-api/core, built by the
// Makefile as capi-manager) running against the host apiserver for the objects of one watch
// filter (CAPI's --watch-filter: the label cluster.x-k8s.io/watch-filter, see ForRealCAPI),
// its admission webhooks serving one namespace.
//
// It runs in a pod network namespace of its own (newPodNetnsTo, inside the lab's namespace,
// with no interface but lo): its webhook server listens on ":9443", every address, with no
// flag to choose one, so it must not run anywhere else. The
// host and guest apiservers are reachable from it (egress forwarders); its webhook server is
// published at CAPIPodAddress:<free port>, with a serving certificate from the host CA.
//
// It reconciles only labelled objects, so that the lab's other tests, which play CAPI with
// SetMachineDeploymentStatus, keep their MachineDeployments to themselves; its admission
// webhooks are registered with url clientConfigs and a namespaceSelector for the same
// reason. Not --namespace: with it CAPI v1.14.2's MachineDeployment controller fails on
// every reconcile ("failed to cast MachineSet informer to SharedIndexInformer": a namespaced
// cache's informer is not one). Not registered: the CRD conversion webhooks (cluster-wide;
// the lab and guestnet speak v1beta2 only, the CRDs' storage version) and the webhooks of the
// cluster-scoped ExtensionConfig (a namespaceSelector cannot limit them). The CRD migration
// phases are skipped (each manager would migrate every namespace's objects), and so are the
// MachineSet preflight checks: they judge the Cluster's control plane, which the lab only
// stands in for (a K0smotronControlPlane of a stand-in CRD, ForRealCAPI).
type CAPI struct {
	Namespace string
	providerManager
}

// StartCAPI starts the CAPI core manager for the objects labelled with watchFilter
// (ForRealCAPI), with ClusterTopology enabled, installs the stand-in control plane CRD,
// waits until the manager is ready (its webhook server serves), then registers its admission
// webhooks for namespace ns. It logs to <lab>/capi-<ns>.log. Stop it with Stop (the lab
// stops it too).
func (l *Lab) StartCAPI(ctx context.Context, ns, watchFilter string) (_ *CAPI, err error) {
	bin, err := findFile(l.Assets.binDirs, "capi-manager")
	if err != nil {
		return nil, err
	}
	manifests, err := os.ReadFile(filepath.Join(l.Assets.CRDDir, "capi-webhooks", "manifests.yaml"))
	if err != nil {
		return nil, fmt.Errorf("CAPI webhook manifests: %w (run `make lab-assets`)", err)
	}
	if err := l.installControlPlaneCRD(); err != nil {
		return nil, err
	}
	if err := l.installK0smotronTemplateCRDs(); err != nil {
		return nil, err
	}
	c := &CAPI{Namespace: ns}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := c.start(ctx, l, "capi-"+ns, bin, CAPIPodAddress, "capi-webhook-service", capiWebhookPort,
		"--watch-filter="+watchFilter,
		"--machineset-preflight-checks=",
		"--feature-gates=ClusterTopology=true",
		"--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields",
	); err != nil {
		return nil, err
	}
	l.onStop(c.Stop)
	if err := c.registerWebhooks(ctx, manifests); err != nil {
		return nil, err
	}
	return c, nil
}

// registerWebhooks creates CAPI's mutating and validating webhook configurations (core
// config/webhook/manifests.yaml) under names of this manager, each webhook pointing at the
// published server by url and limited to the manager's namespace.
func (c *CAPI) registerWebhooks(ctx context.Context, manifests []byte) (err error) {
	c.webhooks, err = registerURLWebhooks(ctx, c.l, manifests, "capi-"+c.Namespace, c.Namespace, c.WebhookAddress, clusterScoped)
	return err
}

// clusterScoped reports whether a webhook is for ExtensionConfigs, the one cluster-scoped
// kind of CAPI core (a namespaceSelector cannot limit it to one namespace).
func clusterScoped(hook map[string]any) bool {
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	for _, r := range rules {
		res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
		for _, s := range res {
			if strings.HasPrefix(s, "extensionconfigs") {
				return true
			}
		}
	}
	return false
}

// The lab's stand-in for k0smotron's control plane CRD: nothing of k0smotron runs, but CAPI
// reads the Cluster's control plane (initialized, ready) and refuses to delete a Machine's
// Node without it. Any spec and status; labelled for contract v1beta1 (the contract of
// k0smotron's v1beta1 API), so CAPI resolves the reference.
var controlPlaneGVK = schema.GroupVersionKind{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta1", Kind: "K0smotronControlPlane"}

func (l *Lab) installControlPlaneCRD() error {
	preserve := &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "k0smotroncontrolplanes." + controlPlaneGVK.Group,
			Labels: map[string]string{"cluster.x-k8s.io/v1beta1": controlPlaneGVK.Version, "lab.guestnet.dev/stand-in": "true"},
		},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: controlPlaneGVK.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: controlPlaneGVK.Kind, ListKind: controlPlaneGVK.Kind + "List", Plural: "k0smotroncontrolplanes", Singular: "k0smotroncontrolplane"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: controlPlaneGVK.Version, Served: true, Storage: true,
				Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: preserve},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
			}},
		},
	}
	_, err := envtest.InstallCRDs(l.Host.Config, envtest.CRDInstallOptions{
		CRDs: []*apiextensionsv1.CustomResourceDefinition{crd}, MaxTime: time.Minute, PollInterval: 100 * time.Millisecond,
	})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("installing the stand-in control plane CRD: %w", err)
	}
	return nil
}

// createControlPlane creates the guest cluster's K0smotronControlPlane, initialized and
// ready, as k0smotron reports a running hosted control plane; with
// WithControlPlaneLoadBalancer, exposed through a LoadBalancer Service and without status
// (the k0smotron stand-in writes it).
func (l *Lab) createControlPlane(ctx context.Context, gc *GuestCluster) error {
	cp := newUnstructured(controlPlaneGVK)
	cp.SetNamespace(gc.Namespace)
	cp.SetName(gc.Name)
	cp.Object["spec"] = map[string]any{"version": "v1.37.2"}
	if gc.controlPlaneLB {
		// The cluster-name label CAPI adds: the stand-in names the Secret by it.
		cp.SetLabels(map[string]string{clusterv1.ClusterNameLabel: gc.Name})
		cp.Object["spec"].(map[string]any)["service"] = map[string]any{
			"type": string(corev1.ServiceTypeLoadBalancer), "apiPort": int64(APIServerPort),
			"konnectivityPort": int64(KonnectivityAgentPort), "loadBalancerClass": ciliumL2AnnouncerClass,
		}
	}
	if err := l.Host.Client.Create(ctx, cp); err != nil {
		return fmt.Errorf("creating K0smotronControlPlane: %w", err)
	}
	if gc.controlPlaneLB {
		return nil
	}
	cp.Object["status"] = map[string]any{"initialized": true, "ready": true, "externalManagedControlPlane": true, "version": "v1.37.2"}
	if err := l.Host.Client.Status().Update(ctx, cp); err != nil {
		return fmt.Errorf("setting K0smotronControlPlane status: %w", err)
	}
	return nil
}
