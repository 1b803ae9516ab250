package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// CAPKPodAddress is the host pod IP of the lab's CAPK controller pods: where their webhook
// servers are published (each on a port of its own).
const CAPKPodAddress = "10.244.0.4"

// CAPK is the real Cluster API provider for KubeVirt, sigs.k8s.io/cluster-api-provider-kubevirt
// (its root main package, built by the Makefile as capk-manager), running against the host
// apiserver for the objects of one namespace, with its admission webhook serving it.
//
// Like CAPI (StartCAPI) it runs in a pod network namespace of its own: its webhook server
// listens on ":9443", every address, with no flag to choose one; health (127.0.0.1:9440) and
// diagnostics (127.0.0.1:8443) stay in it; the host and guest apiservers are reachable from
// it, and its webhook server is published at CAPKPodAddress:<free port>, with a serving
// certificate from the host CA.
//
// Scoping: CAPK has no --watch-filter (unlike CAPI), so it runs with --namespace: it then
// caches and reconciles the objects of that namespace only, and the lab's other tests keep
// their KubevirtMachines to themselves. Its one webhook, the KubevirtMachineTemplate
// validator (which refuses spec changes: a new template is the only way), is registered
// with a url clientConfig and a namespaceSelector for the same reason.
//
// CAPK v0.11.2 reads Clusters and Machines as cluster.x-k8s.io/v1beta1 while the lab stores
// v1beta2: StartCAPK therefore has the CAPI CRDs' conversion webhooks served (once per lab,
// serveCAPIConversion), as clusterctl installs them.
type CAPK struct {
	Namespace string
	providerManager
}

// capkWebhookPort is the webhook server's port inside a CAPK manager's pod namespace.
const capkWebhookPort = 9443

// StartCAPK starts the CAPK manager for namespace ns, after installing the played KubeVirt
// CRDs (installKubeVirtCRDs) and serving the CAPI conversion webhooks; waits until it is
// ready, then registers its webhook for ns. It logs to <lab>/capk-<ns>.log. Its guest
// clusters are created with ForRealCAPI and ForRealCAPK; VMs only boot when the KubeVirt
// stand-in runs for ns (StartKubeVirtStandIn). Stop it with Stop (the lab stops it too).
func (l *Lab) StartCAPK(ctx context.Context, ns string) (_ *CAPK, err error) {
	bin, err := findFile(l.Assets.binDirs, "capk-manager")
	if err != nil {
		return nil, err
	}
	manifestPath, err := findFile(l.Assets.binDirs, "capk-webhooks.yaml")
	if err != nil {
		return nil, err
	}
	manifests, err := os.ReadFile(manifestPath)
	if err != nil {
		return nil, err
	}
	if err := l.installKubeVirtCRDs(); err != nil {
		return nil, err
	}
	if err := l.serveCAPIConversion(ctx); err != nil {
		return nil, err
	}

	name := "capk-" + ns
	c := &CAPK{Namespace: ns}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := c.start(ctx, l, name, bin, CAPKPodAddress, "capk-webhook-service", capkWebhookPort, "--namespace="+ns); err != nil {
		return nil, err
	}
	l.onStop(c.Stop)
	if c.webhooks, err = registerURLWebhooks(ctx, l, manifests, name, ns, c.WebhookAddress, nil); err != nil {
		return nil, err
	}
	return c, nil
}

// ForRealCAPK makes the guest cluster one for the real CAPK (StartCAPK; combine it with
// ForRealCAPI): what the lab plays around CAPK exists, as in a k0smotron cluster on KubeVirt:
//   - the KubevirtCluster, externally managed (annotation cluster.x-k8s.io/managed-by: CAPK's
//     KubevirtCluster controller then leaves it alone, no SSH keys, no load balancer) and
//     ready, with the guest apiserver as control plane endpoint, as k0smotron reports it
//     (none with WithControlPlaneLoadBalancer);
//   - the workers' bootstrap data Secret (bootstrap.dataSecretName of the
//     MachineDeployment, key "value"), as a bootstrap provider writes it: CAPK copies it
//     into the VM's cloud-init Secret (<name>-userdata) and refuses to create a VM without.
func ForRealCAPK() GuestClusterOption {
	return GuestClusterOption{after: func(ctx context.Context, l *Lab, gc *GuestCluster) error {
		c := l.Host.Client
		kc := newUnstructured(kubevirtClusterGVK)
		kc.SetNamespace(gc.Namespace)
		kc.SetName(gc.Name)
		kc.SetAnnotations(map[string]string{clusterv1.ManagedByAnnotation: "lab"})
		kc.Object["spec"] = map[string]any{"controlPlaneEndpoint": map[string]any{"host": GuestAPIServerAddress, "port": int64(APIServerPort)}}
		if gc.controlPlaneLB {
			kc.Object["spec"] = map[string]any{} // the control plane's endpoint is the Cluster's
		}
		if err := c.Create(ctx, kc); err != nil {
			return fmt.Errorf("creating KubevirtCluster: %w", err)
		}
		kc.Object["status"] = map[string]any{"ready": true}
		if err := c.Status().Update(ctx, kc); err != nil {
			return fmt.Errorf("setting KubevirtCluster ready: %w", err)
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: gc.Namespace, Name: gc.MachineDeployment + "-bootstrap",
				Labels: map[string]string{clusterv1.ClusterNameLabel: gc.Name},
			},
			Type: clusterv1.ClusterSecretType,
			Data: map[string][]byte{"value": []byte("#cloud-config\n# lab: no kubelet is bootstrapped\n"), "format": []byte("cloud-config")},
		}
		if err := c.Create(ctx, secret); err != nil {
			return fmt.Errorf("creating the workers' bootstrap data Secret: %w", err)
		}
		return nil
	}}
}

var kubevirtClusterGVK = ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtCluster")

// serveCAPIConversion serves the conversion webhooks of the CAPI CRDs for the whole lab: a
// CAPI core manager of its own, started once (StartCAPI, for a watch filter no object
// carries, so its controllers reconcile nothing), and every CAPI CRD that serves more than
// one version switched to strategy Webhook with a url clientConfig to it, as clusterctl
// installs them (with a Service). Conversion is cluster-wide, so it cannot belong to one
// test's manager; the lab and guestnet read the storage version (v1beta2), which needs no
// conversion. The CRDs are checked on every call (a Get each): whatever replaces CAPI's
// CRDs in the shared lab (their release YAML has no conversion, or a Service one) would undo
// it. (`clusterctl init` into the lab, TestClusterctlInit, was seen not to.)
func (l *Lab) serveCAPIConversion(ctx context.Context) error {
	l.conversionOnce.Do(func() {
		capi, err := l.StartCAPI(ctx, "lab-capi-conversion", "lab.guestnet.dev-conversion-only")
		if err != nil {
			l.conversionErr = fmt.Errorf("starting the CAPI conversion webhook server: %w", err)
			return
		}
		l.conversionURL = "https://" + capi.WebhookAddress + "/convert"
	})
	if l.conversionErr != nil {
		return l.conversionErr
	}
	objs, err := readCRDs(filepath.Join(l.Assets.CRDDir, "capi"))
	if err != nil {
		return err
	}
	for _, want := range objs {
		if len(want.Spec.Versions) < 2 {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := l.Host.Client.Get(ctx, types.NamespacedName{Name: want.Name}, crd); err != nil {
				return err
			}
			if c := crd.Spec.Conversion; c != nil && c.Webhook != nil && c.Webhook.ClientConfig != nil &&
				ptr.Deref(c.Webhook.ClientConfig.URL, "") == l.conversionURL {
				return nil
			}
			crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{
				Strategy: apiextensionsv1.WebhookConverter,
				Webhook: &apiextensionsv1.WebhookConversion{
					ConversionReviewVersions: []string{"v1"},
					ClientConfig: &apiextensionsv1.WebhookClientConfig{
						URL:      ptr.To(l.conversionURL),
						CABundle: l.Host.CA.CertPEM(),
					},
				},
			}
			return l.Host.Client.Update(ctx, crd)
		})
		if err != nil {
			return fmt.Errorf("registering the conversion webhook of %s: %w", want.Name, err)
		}
	}
	return nil
}

// readCRDs reads the CRDs of the YAML files in dir.
func readCRDs(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	opts := &envtest.CRDInstallOptions{Paths: []string{dir}, ErrorIfPathMissing: true}
	if err := envtest.ReadCRDFiles(opts); err != nil {
		return nil, err
	}
	return opts.CRDs, nil
}

// The KubeVirt CRDs the lab installs: KubeVirt ships none as YAML in a module the lab pins
// (virt-operator generates them in Go), so these are played, minimal: VirtualMachine and
// VirtualMachineInstance of kubevirt.io/v1, any spec and status, with the status
// subresource, and the short names kubectl users type.
func (l *Lab) installKubeVirtCRDs() error {
	preserve := &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}
	crd := func(kind, plural string, short ...string) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + ".kubevirt.io", Labels: map[string]string{"lab.guestnet.dev/stand-in": "true"}},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "kubevirt.io",
				Names: apiextensionsv1.CustomResourceDefinitionNames{
					Kind: kind, ListKind: kind + "List", Plural: plural, ShortNames: short, Categories: []string{"all"},
				},
				Scope: apiextensionsv1.NamespaceScoped,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1", Served: true, Storage: true,
					Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: preserve},
					Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				}},
			},
		}
	}
	_, err := envtest.InstallCRDs(l.Host.Config, envtest.CRDInstallOptions{
		CRDs: []*apiextensionsv1.CustomResourceDefinition{
			crd("VirtualMachine", "virtualmachines", "vm", "vms"),
			crd("VirtualMachineInstance", "virtualmachineinstances", "vmi", "vmis"),
		},
		MaxTime: time.Minute, PollInterval: 100 * time.Millisecond,
	})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("installing the played KubeVirt CRDs: %w", err)
	}
	return nil
}
