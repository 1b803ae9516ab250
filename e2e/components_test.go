package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

const providerLabel = "cluster.x-k8s.io/provider"

// The components file (`kustomize build config/default`, what clusterctl installs) holds one
// Namespace, our CRDs, RBAC and a manager Deployment, all labelled for clusterctl, and the
// real host apiserver accepts every object of it.
func TestComponentsFile(t *testing.T) {
	g := NewWithT(t)
	objs := buildComponents(t)

	kinds := map[string][]string{}
	for _, o := range objs {
		kinds[o.GetKind()] = append(kinds[o.GetKind()], o.GetName())
		g.Expect(o.GetLabels()).To(HaveKeyWithValue(providerLabel, "addon-guestnet"), "%s %s lacks the provider label", o.GetKind(), o.GetName())
	}
	g.Expect(kinds["Namespace"]).To(Equal([]string{"guestnet-system"}))
	g.Expect(kinds["CustomResourceDefinition"]).To(ConsistOf(
		"guestingresses.guestnet.addons.cluster.x-k8s.io",
		"guestingresspolicies.guestnet.addons.cluster.x-k8s.io",
		"guestnodeidentities.guestnet.addons.cluster.x-k8s.io",
		"guestwebhookbridges.guestnet.addons.cluster.x-k8s.io",
	))
	g.Expect(kinds["Deployment"]).To(HaveLen(1))
	// The manager's role, and the roles for tenants and operators (docs/rbac.md).
	g.Expect(kinds["ClusterRole"]).To(ConsistOf("guestnet-manager-role", "guestnet-tenant-edit", "guestnet-tenant-view", "guestnet-policy-view"))
	g.Expect(kinds).To(HaveKey("ServiceAccount"))

	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		containers, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(containers).To(HaveLen(1))
		g.Expect(containers[0]).To(HaveKeyWithValue("name", "manager"))
		g.Expect(o.GetNamespace()).To(Equal("guestnet-system"))
	}

	// Apply everything, server-side, to the real host apiserver (CRDs are already installed
	// by the lab from the same files; applying them again must be a no-op).
	l := startLab(t)
	ctx := testContext(t)
	for _, o := range objs {
		g.Expect(l.Host.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("components-test"), client.ForceOwnership)).
			To(Succeed(), "applying %s %s", o.GetKind(), o.GetName())
	}
}

// buildComponents runs the pinned kustomize (installed by the Makefile, GUESTNET_KUSTOMIZE)
// on config/default and decodes its output.
func buildComponents(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	kustomize := os.Getenv("GUESTNET_KUSTOMIZE")
	if kustomize == "" {
		lab.RequireLab(t) // same rule: skip outside `make test`, fail under CI
		t.Skip("GUESTNET_KUSTOMIZE is not set; run with `make test`")
	}
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(kustomize, "build", "config/default")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build config/default: %v\n%s", err, stderr.String())
	}
	objs, err := lab.DecodeObjects(out)
	if err != nil {
		t.Fatalf("decoding the components file: %v", err)
	}
	return objs
}
