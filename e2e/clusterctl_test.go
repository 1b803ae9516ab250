package e2e

// The install and template tests with the real clusterctl (Cluster API's cmd/clusterctl at the
// pinned release, built by the Makefile into the lab's binaries), run as a user runs it
// offline: every provider and cert-manager come from local file:// repositories named by a
// clusterctl.yaml the test writes, HOME and XDG_CONFIG_HOME are a temporary directory (no user
// configuration, overrides or version-check state are read), the version check is off
// (CLUSTERCTL_DISABLE_VERSIONCHECK) and clusterctl gets no other environment. Like every test
// binary it runs inside the lab's network namespace (hack/labns), where only lo exists: a
// clusterctl that tried to download anything would fail, not reach the internet.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/exp/topology"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

const (
	clusterctlLabel = "clusterctl.cluster.x-k8s.io"
	// moveHierarchyLabel on a CRD makes `clusterctl move` move every object of the kind, with
	// what it owns.
	moveHierarchyLabel = "clusterctl.cluster.x-k8s.io/move-hierarchy"
	addonName          = "guestnet"
	addonLabel         = "addon-guestnet"
	addonNamespace     = "guestnet-system"
)

// The release files (`make release-manifests`, out/) are what clusterctl expects of an add-on
// provider: one Namespace, the CRDs named <plural>.<group> with the move-hierarchy label, RBAC
// and the manager Deployment, every object labelled for clusterctl; no webhook configuration,
// Service or certificate (guestnet has no admission webhook, docs/decisions/0002); the
// tunables as ${VAR:=default} variables, all with a default and all documented in
// docs/install.md; the release's image; metadata.yaml as in the repository.
func TestClusterctlReleaseFiles(t *testing.T) {
	g := NewWithT(t)
	rel := lookupRelease(t)
	raw, err := os.ReadFile(filepath.Join(rel.dir, "addon-components.yaml"))
	g.Expect(err).NotTo(HaveOccurred())

	variables := clusterctlVariables(raw)
	g.Expect(variables).NotTo(BeEmpty())
	root, err := lab.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	installDoc, err := os.ReadFile(filepath.Join(root, "docs", "install.md"))
	g.Expect(err).NotTo(HaveOccurred())
	for name, def := range variables {
		g.Expect(def).To(HavePrefix(":="), "variable %s has no default: `clusterctl init --addon guestnet` would require it", name)
		g.Expect(string(installDoc)).To(ContainSubstring("`"+name+"`"), "variable %s is not documented in docs/install.md", name)
	}
	g.Expect(variables).To(HaveKeyWithValue("EXP_CLUSTER_TOPOLOGY_VARIABLES", ":=false"))

	// The file is valid YAML as it is, before clusterctl substitutes anything: clusterctl
	// needs that for `generate provider --describe` and `init list-images`.
	objs, err := lab.DecodeObjects(raw)
	g.Expect(err).NotTo(HaveOccurred())
	kinds := map[string][]string{}
	for _, o := range objs {
		kinds[o.GetKind()] = append(kinds[o.GetKind()], o.GetName())
		g.Expect(o.GetLabels()).To(HaveKeyWithValue(providerLabel, addonLabel), "%s %s", o.GetKind(), o.GetName())
		if o.GetKind() != "Namespace" && o.GetKind() != "CustomResourceDefinition" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" {
			g.Expect(o.GetNamespace()).To(Equal(addonNamespace), "%s %s", o.GetKind(), o.GetName())
		}
	}
	g.Expect(kinds["Namespace"]).To(Equal([]string{addonNamespace}))
	g.Expect(kinds["Deployment"]).To(HaveLen(1))
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
		g.Expect(kinds).To(HaveKey(k))
	}
	for _, k := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "Certificate", "Issuer", "Service"} {
		g.Expect(kinds).NotTo(HaveKey(k), "guestnet has no admission webhook (docs/decisions/0002)")
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "CustomResourceDefinition":
			crd := &apiextensionsv1.CustomResourceDefinition{}
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, crd)).To(Succeed())
			g.Expect(crd.Name).To(Equal(crd.Spec.Names.Plural+"."+crd.Spec.Group), "clusterctl requires <plural>.<group>")
			g.Expect(crd.Spec.Group).To(Equal(guestnetv1.GroupVersion.Group))
			g.Expect(crd.Labels).To(HaveKeyWithValue(moveHierarchyLabel, ""))
			g.Expect(crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy == apiextensionsv1.NoneConverter).To(BeTrue(), "no conversion webhook")
		case "Deployment":
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			g.Expect(containers).To(HaveLen(1))
			c := containers[0].(map[string]any)
			g.Expect(c).To(HaveKeyWithValue("name", "manager"), "clusterctl finds a provider's manager by its container name")
			g.Expect(c).To(HaveKeyWithValue("image", rel.image))
		}
	}
	g.Expect(kinds["CustomResourceDefinition"]).To(ConsistOf(
		"guestingresses.guestnet.addons.cluster.x-k8s.io", "guestingresspolicies.guestnet.addons.cluster.x-k8s.io",
		"guestnodeidentities.guestnet.addons.cluster.x-k8s.io", "guestwebhookbridges.guestnet.addons.cluster.x-k8s.io"))

	meta, err := os.ReadFile(filepath.Join(rel.dir, "metadata.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	repoMeta, err := os.ReadFile(filepath.Join(root, "metadata.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(meta).To(Equal(repoMeta))
	g.Expect(releaseSeriesContract(t, meta, rel.tag)).To(Equal("v1beta2"), "the release series of %s implements CAPI contract v1beta2", rel.tag)
}

// `clusterctl generate provider --addon guestnet` renders the components from a local
// repository: defaults applied when no variable is set, the environment's values when set,
// clusterctl's labels added; --describe lists the variables and the image without rendering.
func TestClusterctlGenerateProvider(t *testing.T) {
	g := NewWithT(t)
	cc := newClusterctl(t, nil)
	rel := lookupRelease(t)
	cc.addRelease(addonLabel, rel.tag, "addon-components.yaml", rel.dir)
	cc.writeConfig(map[string]any{"providers": []map[string]string{cc.providerEntry(addonName, "AddonProvider", addonLabel, rel.tag, "addon-components.yaml")}})

	describe := cc.run(nil, "generate", "provider", "--addon", addonName, "--describe")
	g.Expect(describe).To(ContainSubstring("Version:            " + rel.tag))
	g.Expect(describe).To(ContainSubstring("TargetNamespace:    " + addonNamespace))
	g.Expect(describe).To(ContainSubstring(rel.image))
	raw, err := os.ReadFile(filepath.Join(rel.dir, "addon-components.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	for name := range clusterctlVariables(raw) {
		g.Expect(describe).To(ContainSubstring("  - "+name+"\n"), "--describe lists %s", name)
	}

	args := func(out string) []string {
		objs, err := lab.DecodeObjects([]byte(out))
		g.Expect(err).NotTo(HaveOccurred())
		var args []string
		for _, o := range objs {
			g.Expect(o.GetLabels()).To(HaveKeyWithValue(providerLabel, addonLabel))
			g.Expect(o.GetLabels()).To(HaveKeyWithValue(clusterctlLabel, ""))
			if o.GetKind() == "Deployment" {
				containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
				args, _, _ = unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
			}
		}
		g.Expect(out).NotTo(ContainSubstring("${"), "every variable substituted")
		return args
	}
	g.Expect(args(cc.run(nil, "generate", "provider", "--addon", addonName))).To(ConsistOf(
		"--leader-elect",
		"--diagnostics-address=:8443",
		"--insecure-diagnostics=false",
		"--health-addr=:9440",
		"--feature-gates=ClusterTopologyVariables=false",
		"--guestingress-concurrency=10",
		"--guestwebhookbridge-concurrency=10",
		"--workerports-concurrency=10",
		"--guest-max-objects=5000",
		"--v=0",
	))
	g.Expect(args(cc.run([]string{"EXP_CLUSTER_TOPOLOGY_VARIABLES=true", "GUESTNET_LOGLEVEL=4", "GUESTNET_GUESTINGRESS_CONCURRENCY=3"},
		"generate", "provider", "--addon", addonName))).To(ContainElements(
		"--feature-gates=ClusterTopologyVariables=true", "--v=4", "--guestingress-concurrency=3"))

	// The image of a mirror, through an images: override (docs/install.md, offline).
	cc.writeConfig(map[string]any{
		"providers": []map[string]string{cc.providerEntry(addonName, "AddonProvider", addonLabel, rel.tag, "addon-components.yaml")},
		"images":    map[string]any{addonLabel: map[string]string{"repository": "registry.example.internal/capi"}},
	})
	_, name, _ := strings.Cut(rel.image[strings.LastIndex(rel.image, "/"):], "/")
	g.Expect(cc.run(nil, "generate", "provider", "--addon", addonName)).To(ContainSubstring("image: registry.example.internal/capi/" + name + "\n"))
}

// `clusterctl init --addon guestnet` installs guestnet into the lab's host apiserver, as on a
// new management cluster: clusterctl adds the core provider (cluster-api) and the kubeadm
// bootstrap and control-plane providers it installs by default, and cert-manager, all from
// local repositories, then every object of the guestnet components is created, labelled, and
// the Provider inventory names addon-guestnet at the release's version.
//
// The local repositories hold what the lab has of the same Cluster API release
// (hack/fetch-clusterctl-assets.sh): the providers' real CRDs and metadata.yaml, plus a
// Namespace and a manager Deployment each. No webhook configurations, Services or Certificates
// of theirs: no Cluster API controller or webhook runs in the lab, and a webhook configuration
// whose server is missing would make the apiserver refuse the Clusters the other tests create.
//
// cert-manager: clusterctl first tries to create its test Issuer and Certificate
// (cmd/clusterctl/client/cluster/cert_manager.go, EnsureInstalled); that fails on a cluster
// without cert-manager's CRDs, so it installs the components found at the `cert-manager:` URL
// of clusterctl.yaml and then retries creating them until they are accepted. The local
// cert-manager.yaml holds the real CRDs of the cert-manager release the lab runs (v1.11.5)
// and its Namespace, and no ValidatingWebhookConfiguration: with none, the apiserver accepts
// the test Issuer and Certificate once the CRDs are established, which is exactly what
// clusterctl waits for; with the release's, it would wait for a cert-manager webhook server
// that nothing runs in the lab's host. Nothing runs the Deployments either: the test checks
// what clusterctl created, not that the managers run.
func TestClusterctlInit(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	cc := newClusterctl(t, l)
	rel := lookupRelease(t)

	capiVersion := strings.TrimSpace(cc.run(nil, "version", "-o", "short"))
	g.Expect(capiVersion).To(MatchRegexp(`^v1\.14\.\d+$`))
	providers := []map[string]string{}
	// Namespaces, Deployments and images as in Cluster API's release components.
	for _, p := range []struct{ name, kind, label, file, namespace, image string }{
		{"cluster-api", "CoreProvider", "cluster-api", "core-components.yaml", "capi-system", "cluster-api-controller"},
		{"kubeadm", "BootstrapProvider", "bootstrap-kubeadm", "bootstrap-components.yaml", "capi-kubeadm-bootstrap-system", "kubeadm-bootstrap-controller"},
		{"kubeadm", "ControlPlaneProvider", "control-plane-kubeadm", "control-plane-components.yaml", "capi-kubeadm-control-plane-system", "kubeadm-control-plane-controller"},
	} {
		// hack/fetch-clusterctl-assets.sh names the CRD directories after the labels, but core/.
		crds := filepath.Join(cc.assets.CAPIDir, strings.Replace(p.label, "cluster-api", "core", 1))
		components := capiComponents(t, crds, p.namespace, strings.TrimSuffix(p.namespace, "-system")+"-controller-manager",
			"registry.k8s.io/cluster-api/"+p.image+":"+capiVersion)
		cc.addFile(p.label, capiVersion, p.file, components)
		cc.addFile(p.label, capiVersion, "metadata.yaml", mustRead(t, filepath.Join(cc.assets.CAPIDir, "metadata.yaml")))
		providers = append(providers, cc.providerEntry(p.name, p.kind, p.label, capiVersion, p.file))
	}
	cc.addRelease(addonLabel, rel.tag, "addon-components.yaml", rel.dir)
	providers = append(providers, cc.providerEntry(addonName, "AddonProvider", addonLabel, rel.tag, "addon-components.yaml"))

	tp, err := l.Assets.LookupThirdParty()
	g.Expect(err).NotTo(HaveOccurred())
	certManagerVersion := strings.TrimPrefix(filepath.Base(filepath.Dir(tp.CertManagerCRDDir)), "cert-manager-")
	cc.addFile("cert-manager", certManagerVersion, "cert-manager.yaml", certManagerComponents(t, tp.CertManagerCRDDir))
	cc.writeConfig(map[string]any{
		"providers": providers,
		"cert-manager": map[string]string{
			"url":     cc.url("cert-manager", certManagerVersion, "cert-manager.yaml"),
			"version": certManagerVersion,
			"timeout": "2m",
		},
	})

	// What an air-gapped user mirrors: guestnet's image among the others. (It takes seconds:
	// before init, clusterctl retries reading its inventory, whose CRD does not exist yet.)
	g.Expect(cc.run(nil, "init", "list-images", "--addon", addonName, "--kubeconfig", l.Host.KubeconfigPath)).
		To(ContainSubstring(rel.image + "\n"))

	out := cc.run(nil, "init", "--addon", addonName, "--kubeconfig", l.Host.KubeconfigPath)
	t.Logf("clusterctl init --addon %s:\n%s", addonName, out)
	g.Expect(out).To(ContainSubstring(`Installing provider="addon-guestnet" version="` + rel.tag + `" targetNamespace="` + addonNamespace + `"`))

	// Every object of the components, as clusterctl renders them, exists in the host.
	rendered, err := lab.DecodeObjects([]byte(cc.run(nil, "generate", "provider", "--addon", addonName)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rendered).NotTo(BeEmpty())
	for _, want := range rendered {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(want.GroupVersionKind())
		g.Expect(l.Host.Client.Get(ctx, client.ObjectKeyFromObject(want), got)).To(Succeed(), "%s %s/%s", want.GetKind(), want.GetNamespace(), want.GetName())
		g.Expect(got.GetLabels()).To(HaveKeyWithValue(providerLabel, addonLabel))
		g.Expect(got.GetLabels()).To(HaveKeyWithValue(clusterctlLabel, ""))
		switch want.GetKind() {
		case "Deployment":
			wantC, _, _ := unstructured.NestedSlice(want.Object, "spec", "template", "spec", "containers")
			gotC, _, _ := unstructured.NestedSlice(got.Object, "spec", "template", "spec", "containers")
			g.Expect(gotC).To(HaveLen(1))
			for _, field := range []string{"name", "image", "args"} {
				g.Expect(gotC[0]).To(HaveKeyWithValue(field, wantC[0].(map[string]any)[field]))
			}
		case "CustomResourceDefinition":
			// The schema arrives intact through clusterctl's variable processing (its
			// patterns are full of `$`).
			wantCRD, gotCRD := &apiextensionsv1.CustomResourceDefinition{}, &apiextensionsv1.CustomResourceDefinition{}
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(want.Object, wantCRD)).To(Succeed())
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, gotCRD)).To(Succeed())
			g.Expect(gotCRD.Spec.Versions[0].Schema).To(Equal(wantCRD.Spec.Versions[0].Schema))
			g.Expect(gotCRD.Labels).To(HaveKeyWithValue(moveHierarchyLabel, ""))
		}
	}

	// The inventory: addon-guestnet at the release's version, next to the providers and
	// cert-manager clusterctl installed with it.
	inventory := &unstructured.UnstructuredList{}
	inventory.SetGroupVersionKind(schema.GroupVersionKind{Group: "clusterctl.cluster.x-k8s.io", Version: "v1alpha3", Kind: "ProviderList"})
	g.Expect(l.Host.Client.List(ctx, inventory)).To(Succeed())
	installed := map[string]string{}
	for _, p := range inventory.Items {
		name, _, _ := unstructured.NestedString(p.Object, "providerName")
		kind, _, _ := unstructured.NestedString(p.Object, "type")
		version, _, _ := unstructured.NestedString(p.Object, "version")
		installed[p.GetNamespace()+"/"+p.GetName()] = name + " " + kind + " " + version
	}
	g.Expect(installed).To(HaveKeyWithValue(addonNamespace+"/"+addonLabel, addonName+" AddonProvider "+rel.tag))
	g.Expect(installed).To(HaveKeyWithValue("capi-system/cluster-api", "cluster-api CoreProvider "+capiVersion))
	certManagerNS := &corev1.Namespace{}
	g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Name: "cert-manager"}, certManagerNS)).To(Succeed())
	g.Expect(certManagerNS.Annotations).To(HaveKeyWithValue("cert-manager.clusterctl.cluster.x-k8s.io/version", certManagerVersion))
}

// Each flavor in templates/ (cluster-template*.yaml) and the ClusterClass render with
// `clusterctl generate cluster --from`, and every rendered object is accepted by the lab's
// host apiserver (server-side dry-run create with strict field validation, and server-side
// dry-run apply) with the real CRDs of CAPI, CAPK and guestnet,
// except the kinds of k0smotron: the Go module proxy refuses github.com/k0sproject/k0smotron
// and no Debian package ships its CRDs, so the lab cannot install them at a pinned version;
// those objects are checked to be referenced by the objects that were applied instead.
func TestClusterctlTemplateFlavors(t *testing.T) {
	l := startLab(t)
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	flavors, err := filepath.Glob(filepath.Join(root, "templates", "cluster-template*.yaml"))
	if err != nil || len(flavors) < 2 {
		t.Fatalf("templates/cluster-template*.yaml: %v %v", flavors, err)
	}
	files := append(flavors, filepath.Join(root, "templates", clusterClassFile))
	className := ""
	for _, o := range readTemplateObjects(t, clusterClassFile) {
		if o.GetKind() == "ClusterClass" {
			className = o.GetName()
		}
	}
	cc := newClusterctl(t, l)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			g := NewWithT(t)
			ctx := testContext(t)
			ns := uniqueName("flavor")
			g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
			objs, vars := renderFlavor(t, cc, file, ns)
			if filepath.Base(file) != clusterClassFile {
				g.Expect(vars).To(ContainSubstring("Required Variables:\n  - GUESTNET_CONTROL_PLANE_IP\n  - GUESTNET_INGRESS_IP\n  - KUBERNETES_VERSION\n\n"))
			}
			present := map[string]bool{}
			for _, o := range objs {
				present[o.GetKind()+"/"+o.GetName()] = true
			}
			var skipped []string
			for _, o := range objs {
				if o.GetNamespace() != ns {
					t.Errorf("%s %s is in namespace %q, not the target namespace", o.GetKind(), o.GetName(), o.GetNamespace())
				}
				if withoutCRDInLab[o.GroupVersionKind().GroupKind()] {
					skipped = append(skipped, o.GetKind()+"/"+o.GetName())
					continue
				}
				// As `kubectl create` (strict: an unknown field fails) and as a server-side apply.
				g.Expect(l.Host.Client.Create(ctx, o.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict"))).
					To(Succeed(), "dry-run create of %s %s", o.GetKind(), o.GetName())
				g.Expect(dryRunApply(ctx, l.Host.Client, o, nil)).To(Succeed(), "dry-run apply of %s %s", o.GetKind(), o.GetName())
			}
			// The references between the objects of the flavor resolve within it, but for the
			// ClusterClass of the topology flavor (in its own file). The ClusterClass's file
			// holds every template it refers to, k0smotron's too: CAPI's ClusterClass
			// controller reconciles no ClusterClass with a template missing.
			for _, ref := range flavorReferences(t, objs) {
				switch {
				case present[ref]:
				case ref == "ClusterClass/"+className:
				default:
					t.Errorf("reference to %s, which the flavor does not contain", ref)
				}
			}
			for _, s := range skipped {
				g.Expect(flavorReferences(t, objs)).To(ContainElement(s), "%s (not applied: no CRD in the lab) is referenced", s)
			}
		})
	}
}

// The topology flavor, applied next to the ClusterClass with the real CAPI running (its
// Cluster webhook validates the flavor's variables, its topology controller evaluates the
// ClusterClass's patches with them, e2e/templates_test.go), makes the workers declare exactly
// what guestnet requires for the flavor's GuestIngress and GuestWebhookBridge (as the
// apiserver stores them), with the guest Cilium's default VXLAN tunnel: what their
// PortsDeclared condition checks. The default flavor's worker template is one guestnet's worker
// ports controller can declare ports on (masquerade, no ports list yet). Both flavors opt in to
// node identity: their workers' bootstrap config runs the kubelet in external cloud-provider
// mode (for the topology flavor, through the ClusterClass's patch on guestnet.nodeIdentity).
// Both opt the control plane in to its address: their GuestNodeIdentity has controlPlane.ip
// GUESTNET_CONTROL_PLANE_IP, and their K0smotronControlPlane a LoadBalancer Service of Cilium's
// L2 announcer (for the topology flavor, through the ClusterClass's patch on
// guestnet.nodeIdentity.controlPlane), whose name is the one guestnet defaults to; once the
// Service has the address (guestnet's part played with guestnet's own pool and L2 policy: no
// guestnet manager runs, whose agents would go into the lab's shared guest), k0smotron's stand-in
// makes it the control plane's endpoint, CAPI the Cluster's, and only then does CAPI create
// the workers.
func TestClusterctlTemplateWorkerPorts(t *testing.T) {
	e := newTopologyEnv(t, "flavor-ports")
	g := e.g
	root, err := lab.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	cc := newClusterctl(t, e.l)
	e.createClusterClass()
	startCiliumStandIn(t, e.l)
	// The one load-balancer IP the lab guest apiserver's certificate holds.
	cpIP := lab.GuestControlPlaneLoadBalancerIP
	loadBalancer := map[string]any{"type": "LoadBalancer", "loadBalancerClass": "io.cilium/l2-announcer", "apiPort": int64(6443), "konnectivityPort": int64(8132)}

	// What guestnet requires for a flavor: base ports, the tunnel, its two objects as the
	// apiserver defaults them.
	required := func(objs []*unstructured.Unstructured) ports.Set {
		tunnel, _, err := ports.CiliumTunnel(map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		set := ports.Base(false).Union(tunnel) // the flavors' KubevirtCluster is managed by k0smotron: no SSH
		for _, o := range objs {
			switch o.GetKind() {
			case "GuestIngress":
				gi := &guestnetv1.GuestIngress{}
				g.Expect(dryRunApply(e.ctx, e.c, o.DeepCopy(), gi)).To(Succeed())
				set = set.Union(ports.ForGuestIngress(gi))
			case "GuestWebhookBridge":
				gwb := &guestnetv1.GuestWebhookBridge{}
				g.Expect(dryRunApply(e.ctx, e.c, o.DeepCopy(), gwb)).To(Succeed())
				set = set.Union(ports.ForBridge(gwb))
			}
		}
		return set
	}

	objs, _ := renderFlavor(t, cc, filepath.Join(root, "templates", "cluster-template-topology.yaml"), e.ns, "GUESTNET_CONTROL_PLANE_IP="+cpIP)
	want := required(objs)
	var cluster *clusterv1.Cluster
	for _, o := range objs {
		if o.GetKind() != "Cluster" {
			continue
		}
		cluster = &clusterv1.Cluster{}
		g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cluster)).To(Succeed())
		g.Expect(cluster.Spec.Topology.ClassRef.Name).To(Equal(clusterClassName))
		lab.ForRealCAPITopology(cluster, e.filter)
		g.Expect(e.c.Create(e.ctx, cluster)).To(Succeed(), "CAPI accepts the flavor's variables")
	}
	g.Expect(cluster).NotTo(BeNil())
	variable, _, err := topology.VariableOf(cluster)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(variable.NodeIdentity).To(HaveKeyWithValue("controlPlane", map[string]any{"ip": cpIP}), "guestnet.nodeIdentity.controlPlane")
	gni := flavorNodeIdentity(e, objs)
	g.Expect(gni.Spec.ControlPlane).To(Equal(&guestnetv1.ControlPlaneAddressSpec{IP: cpIP}))
	e.eventuallyControlPlaneService(cluster, loadBalancer)
	e.giveControlPlaneAddress(cluster, gni)
	g.Eventually(func(g Gomega) clusterv1.APIEndpoint {
		live := &clusterv1.Cluster{}
		g.Expect(e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), live)).To(Succeed())
		return live.Spec.ControlPlaneEndpoint
	}).Should(Equal(clusterv1.APIEndpoint{Host: cpIP, Port: lab.APIServerPort}), "the Cluster's endpoint is the flavor's control plane address")
	w := e.eventuallyWorkers(cluster, func(g Gomega, w ports.Workers) {
		g.Expect(w.Analysis.State).NotTo(Equal(ports.AllPortsForwarded), "patched")
	})
	after, err := ports.Analyze(w.Template, want)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.State).To(Equal(ports.PortsDeclared), "%s", after)
	g.Expect(after.Declared).To(Equal(want.Ports()), "the workers declare what guestnet requires (%s), nothing else", want)
	g.Expect(kindsOf(objs)).To(ContainElement("GuestNodeIdentity"))
	bootstrap := &unstructured.Unstructured{}
	bootstrap.SetGroupVersionKind(lab.WorkerConfigTemplateGVK)
	g.Eventually(func(g Gomega) []string {
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: w.MachineDeployment.Spec.Template.Spec.Bootstrap.ConfigRef.Name}, bootstrap)).To(Succeed())
		return workerArgs(g, bootstrap)
	}).Should(Equal([]string{"--enable-cloud-provider"}), "guestnet.nodeIdentity: the kubelets run in external cloud-provider mode")

	plain, _ := renderFlavor(t, cc, filepath.Join(root, "templates", "cluster-template.yaml"), e.ns)
	var worker *unstructured.Unstructured
	controlPlanes := 0
	for _, o := range plain {
		switch o.GroupVersionKind() {
		case ports.KubevirtMachineTemplateGVK:
			worker = o
		case lab.ControlPlaneGVK:
			controlPlanes++
			// Decoded from YAML (numbers are float64): compared as JSON.
			service, err := json.Marshal(o.Object["spec"].(map[string]any)["service"])
			g.Expect(err).NotTo(HaveOccurred())
			want, err := json.Marshal(loadBalancer)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(service).To(MatchJSON(want), "the control plane's Service is a LoadBalancer of Cilium's L2 announcer")
		}
	}
	g.Expect(controlPlanes).To(Equal(1))
	g.Expect(flavorNodeIdentity(e, plain).Spec.ControlPlane).To(Equal(&guestnetv1.ControlPlaneAddressSpec{IP: flavorControlPlaneIP}))
	g.Expect(worker).NotTo(BeNil())
	before, err := ports.Analyze(worker, required(plain))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(before.State).To(Equal(ports.AllPortsForwarded), "masquerade, no ports list: guestnet declares them")
	g.Expect(kindsOf(plain)).To(ContainElement("GuestNodeIdentity"))
	bootstraps := 0
	for _, o := range plain {
		if o.GroupVersionKind() == lab.WorkerConfigTemplateGVK {
			bootstraps++
			g.Expect(workerArgs(g, o)).To(Equal([]string{"--enable-cloud-provider"}), "the GuestNodeIdentity's kubelets run in external cloud-provider mode")
		}
	}
	g.Expect(bootstraps).To(Equal(1))
}

// flavorNodeIdentity is the rendered flavor's one GuestNodeIdentity, as the apiserver stores
// it (server-side dry-run apply).
func flavorNodeIdentity(e *topologyEnv, objs []*unstructured.Unstructured) *guestnetv1.GuestNodeIdentity {
	e.t.Helper()
	var gni *guestnetv1.GuestNodeIdentity
	for _, o := range objs {
		if o.GetKind() == "GuestNodeIdentity" {
			e.g.Expect(gni).To(BeNil(), "one GuestNodeIdentity")
			gni = &guestnetv1.GuestNodeIdentity{}
			e.g.Expect(dryRunApply(e.ctx, e.c, o.DeepCopy(), gni)).To(Succeed())
		}
	}
	e.g.Expect(gni).NotTo(BeNil(), "the flavor has a GuestNodeIdentity")
	return gni
}

// giveControlPlaneAddress plays guestnet's part for gni's control plane address: its pool and
// an L2 policy (on the lab's lo), as guestnet builds them, for the Service guestnet finds for
// the Cluster, which must be the one k0smotron (its stand-in) made; removed when the test ends
// (they are cluster-scoped). The real LB-IPAM then gives the Service the address.
func (e *topologyEnv) giveControlPlaneAddress(cluster *clusterv1.Cluster, gni *guestnetv1.GuestNodeIdentity) {
	e.t.Helper()
	live := &clusterv1.Cluster{}
	e.g.Eventually(func(g Gomega) string {
		g.Expect(e.c.Get(e.ctx, client.ObjectKeyFromObject(cluster), live)).To(Succeed())
		return live.Spec.ControlPlaneRef.Name
	}).ShouldNot(BeEmpty())
	name, ok := nodeidentity.ControlPlaneService(gni, live)
	e.g.Expect(ok).To(BeTrue())
	e.g.Expect(name).To(Equal(lab.ControlPlaneServiceName(live.Spec.ControlPlaneRef.Name)), "guestnet's default serviceName is k0smotron's Service")
	e.g.Eventually(func() error { return e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, &corev1.Service{}) }).Should(Succeed())
	l2, err := nodeidentity.ControlPlaneL2Policy(gni, name, ingress.Announcement{Interfaces: []string{"^lo$"}})
	e.g.Expect(err).NotTo(HaveOccurred())
	for _, o := range []*unstructured.Unstructured{nodeidentity.ControlPlanePool(gni, name), l2} {
		e.g.Expect(e.c.Create(e.ctx, o)).To(Succeed(), "creating %s %s", o.GetKind(), o.GetName())
		e.t.Cleanup(func() { _ = e.c.Delete(context.Background(), o) })
	}
}

// workerArgs are the k0s worker args of a K0sWorkerConfigTemplate.
func workerArgs(g Gomega, tmpl *unstructured.Unstructured) []string {
	args, _, err := unstructured.NestedStringSlice(tmpl.Object, "spec", "template", "spec", "args")
	g.Expect(err).NotTo(HaveOccurred())
	return args
}

func kindsOf(objs []*unstructured.Unstructured) []string {
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind())
	}
	return kinds
}

// Kinds the templates use whose CRDs the lab does not install (k0smotron's: see
// TestClusterctlTemplateFlavors).
var withoutCRDInLab = map[schema.GroupKind]bool{
	{Group: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlane"}:         true,
	{Group: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlaneTemplate"}: true,
	{Group: "bootstrap.cluster.x-k8s.io", Kind: "K0sWorkerConfigTemplate"}:          true,
}

// The flavors' required load-balancer IPs, as renderFlavor sets them.
const (
	flavorIngressIP      = "10.98.250.10"
	flavorControlPlaneIP = "10.98.250.11"
)

// renderFlavor runs `clusterctl generate cluster` on a template file with the variables a
// user sets (GUESTNET_INGRESS_IP flavorIngressIP, GUESTNET_CONTROL_PLANE_IP
// flavorControlPlaneIP, then env: NAME=value, the last of a name wins), and returns the
// objects and the `--list-variables` output (of the template alone: no variable set).
func renderFlavor(t *testing.T, cc *clusterctl, file, ns string, env ...string) ([]*unstructured.Unstructured, string) {
	t.Helper()
	args := []string{"generate", "cluster", "tenant-a", "--from", file, "--target-namespace", ns}
	vars := cc.run(nil, append(args, "--list-variables")...)
	env = append([]string{"GUESTNET_INGRESS_IP=" + flavorIngressIP, "GUESTNET_CONTROL_PLANE_IP=" + flavorControlPlaneIP}, env...)
	out := cc.run(env, append(args,
		"--kubernetes-version", "v1.33.1", "--control-plane-machine-count", "1", "--worker-machine-count", "2")...)
	if strings.Contains(out, "${") {
		t.Fatalf("unsubstituted variable in the rendered %s:\n%s", filepath.Base(file), out)
	}
	objs, err := lab.DecodeObjects([]byte(out))
	if err != nil {
		t.Fatalf("decoding the rendered %s: %v", filepath.Base(file), err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s rendered no object", filepath.Base(file))
	}
	return objs, vars
}

// flavorReferences lists, as Kind/name, the objects that the Cluster, MachineDeployments and
// ClusterClass of a flavor reference (ClusterClass by name: ClusterClass/<name>).
func flavorReferences(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var refs []string
	add := func(o *unstructured.Unstructured, path ...string) {
		if kind, ok, _ := unstructured.NestedString(o.Object, append(path, "kind")...); ok {
			name, _, _ := unstructured.NestedString(o.Object, append(path, "name")...)
			refs = append(refs, kind+"/"+name)
		}
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "Cluster":
			add(o, "spec", "controlPlaneRef")
			add(o, "spec", "infrastructureRef")
			if name, ok, _ := unstructured.NestedString(o.Object, "spec", "topology", "classRef", "name"); ok {
				refs = append(refs, "ClusterClass/"+name)
			}
		case "MachineDeployment":
			add(o, "spec", "template", "spec", "bootstrap", "configRef")
			add(o, "spec", "template", "spec", "infrastructureRef")
		case "ClusterClass":
			add(o, "spec", "controlPlane", "templateRef")
			add(o, "spec", "infrastructure", "templateRef")
			mds, _, _ := unstructured.NestedSlice(o.Object, "spec", "workers", "machineDeployments")
			for _, md := range mds {
				m := &unstructured.Unstructured{Object: md.(map[string]any)}
				add(m, "bootstrap", "templateRef")
				add(m, "infrastructure", "templateRef")
			}
		}
	}
	sort.Strings(refs)
	return slices.Compact(refs)
}

// clusterctl runs the lab's clusterctl with a configuration and repositories of its own in a
// temporary directory.
type clusterctl struct {
	t      *testing.T
	assets *lab.ClusterctlAssets
	dir    string // home/ (HOME and XDG_CONFIG_HOME), repository/, clusterctl.yaml
}

func newClusterctl(t *testing.T, l *lab.Lab) *clusterctl {
	t.Helper()
	if l == nil {
		lab.RequireLab(t)
	}
	assets, err := lab.LookupAssets()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := assets.LookupClusterctl()
	if err != nil {
		t.Fatal(err)
	}
	cc := &clusterctl{t: t, assets: ca, dir: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(cc.dir, "home", ".config"), 0o755); err != nil {
		t.Fatal(err)
	}
	cc.writeConfig(map[string]any{})
	return cc
}

// url is the file:// URL of a file of a provider's release in the local repository, in the
// layout clusterctl requires: {basepath}/{provider-label}/{version}/{file}.
func (c *clusterctl) url(label, version, file string) string {
	return "file://" + filepath.Join(c.dir, "repository", label, version, file)
}

func (c *clusterctl) addFile(label, version, file string, content []byte) {
	c.t.Helper()
	dir := filepath.Join(c.dir, "repository", label, version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), content, 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// addRelease copies a release directory's components file and metadata.yaml.
func (c *clusterctl) addRelease(label, version, components, releaseDir string) {
	c.t.Helper()
	for _, f := range []string{components, "metadata.yaml"} {
		c.addFile(label, version, f, mustRead(c.t, filepath.Join(releaseDir, f)))
	}
}

func (c *clusterctl) providerEntry(name, kind, label, version, file string) map[string]string {
	return map[string]string{"name": name, "type": kind, "url": c.url(label, version, file)}
}

func (c *clusterctl) writeConfig(config map[string]any) {
	c.t.Helper()
	data, err := yaml.Marshal(config)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "clusterctl.yaml"), data, 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// run runs clusterctl with the test's configuration, and the given variables as its only
// other environment; it fails the test when clusterctl fails, and returns its output.
func (c *clusterctl) run(env []string, args ...string) string {
	c.t.Helper()
	args = append(args, "--config", filepath.Join(c.dir, "clusterctl.yaml"))
	cmd := exec.Command(c.assets.Clusterctl, args...)
	home := filepath.Join(c.dir, "home")
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"TMPDIR=" + c.dir,
		"CLUSTERCTL_DISABLE_VERSIONCHECK=true",
	}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("clusterctl %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	// clusterctl logs to stderr; init's progress is part of what the tests read.
	return stdout.String() + stderr.String()
}

// release is the guestnet release `make release-manifests` wrote (GUESTNET_RELEASE_*).
type release struct{ dir, tag, image string }

func lookupRelease(t *testing.T) release {
	t.Helper()
	r := release{dir: os.Getenv("GUESTNET_RELEASE_DIR"), tag: os.Getenv("GUESTNET_RELEASE_TAG"), image: os.Getenv("GUESTNET_RELEASE_IMAGE")}
	if r.dir == "" || r.tag == "" || r.image == "" {
		lab.RequireLab(t) // same rule: skip outside `make test`, fail under CI
		t.Skip("GUESTNET_RELEASE_DIR/TAG/IMAGE are not set; run with `make test`")
	}
	if _, err := os.Stat(filepath.Join(r.dir, "addon-components.yaml")); err != nil {
		t.Fatalf("no release in GUESTNET_RELEASE_DIR (run `make release-manifests`): %v", err)
	}
	return r
}

var variableRE = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)((?::=|:-|=|-)[^}]*)?\}`)

// clusterctlVariables maps each ${NAME...} of a components file to what follows the name
// (":=default", or "" without a default).
func clusterctlVariables(raw []byte) map[string]string {
	vars := map[string]string{}
	for _, m := range variableRE.FindAllSubmatch(raw, -1) {
		vars[string(m[1])] = string(m[2])
	}
	return vars
}

// releaseSeriesContract returns the contract of the release series of tag in a clusterctl
// metadata.yaml.
func releaseSeriesContract(t *testing.T, metadata []byte, tag string) string {
	t.Helper()
	var meta struct {
		ReleaseSeries []struct {
			Major, Minor int
			Contract     string
		} `json:"releaseSeries"`
	}
	if err := yaml.Unmarshal(metadata, &meta); err != nil {
		t.Fatal(err)
	}
	var major, minor, patch int
	if _, err := fmt.Sscanf(tag, "v%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("release tag %q: %v", tag, err)
	}
	for _, s := range meta.ReleaseSeries {
		if s.Major == major && s.Minor == minor {
			return s.Contract
		}
	}
	return ""
}

// capiComponents builds a components file for a Cluster API provider from its real CRDs: the
// CRDs, a Namespace and a manager Deployment (see TestClusterctlInit for what is left out).
func capiComponents(t *testing.T, crdDir, namespace, deployment, image string) []byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("CRDs in %s: %v %v", crdDir, files, err)
	}
	docs := [][]byte{[]byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + namespace + "\n")}
	for _, f := range files {
		docs = append(docs, mustRead(t, f))
	}
	labels := map[string]string{"control-plane": "controller-manager"}
	dep := map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": deployment, "namespace": namespace, "labels": labels},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": labels},
			"template": map[string]any{
				"metadata": map[string]any{"labels": labels},
				"spec": map[string]any{"containers": []any{map[string]any{
					"name": "manager", "image": image, "args": []any{"--leader-elect"},
				}}},
			},
		},
	}
	data, err := yaml.Marshal(dep)
	if err != nil {
		t.Fatal(err)
	}
	return joinYAML(append(docs, data))
}

// certManagerComponents is the local cert-manager.yaml: its Namespace and real CRDs (see
// TestClusterctlInit for why no webhook configuration).
func certManagerComponents(t *testing.T, crdDir string) []byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("cert-manager CRDs in %s: %v %v", crdDir, files, err)
	}
	docs := [][]byte{[]byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cert-manager\n")}
	for _, f := range files {
		docs = append(docs, mustRead(t, f))
	}
	return joinYAML(docs)
}

func joinYAML(docs [][]byte) []byte {
	var out bytes.Buffer
	for _, d := range docs {
		out.WriteString("---\n")
		out.Write(bytes.TrimPrefix(d, []byte("---\n")))
		if !bytes.HasSuffix(d, []byte("\n")) {
			out.WriteString("\n")
		}
	}
	return out.Bytes()
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
