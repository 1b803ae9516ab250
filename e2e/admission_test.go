package e2e

// The optional admission of the release (admission-policies.yaml, built by `make
// release-manifests` from config/admission; docs/install.md#admission-policies,
// docs/decisions/0007-admission-policies.md), against the lab's real kube-apiserver: what a
// tenant must not write for guestnet's promises to hold (docs/security.md#what-the-platform-must-forbid)
// is possible for the tenant without the policies, refused with them (with a message that
// says what and why), and still possible for the exempt identities; guestnet's manager, Cluster
// API and Kubernetes' garbage collector keep working with them.
//
// Every attempt of a tenant is a dry-run request: it goes through authorization and admission
// like a real one and changes nothing, so one set of objects serves every attempt.
//
// Run with: labtest ./e2e/ -run TestAdmission -v (after `make release-manifests`).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// The policies of the release, by name, and the ClusterRole whose holders they let through.
var admissionPolicies = []string{
	"guestnet-kubeconfig-secrets", "guestnet-finalizers", "guestnet-host-services", "guestnet-watch-filter", "guestnet-pause",
	"guestnet-control-plane-endpoint", "guestnet-kubevirt-namespaces", "guestnet-control-plane-service-annotations",
}

const admissionExemptRole = "guestnet-admission-exempt"

// The release file holds the eight policies, a binding for each, and the exemption's
// ClusterRole and ClusterRoleBinding, labelled for clusterctl; none of it is in the components
// file (the admission is optional), and the exemption's role is aggregated nowhere.
func TestAdmission_ReleaseFile(t *testing.T) {
	g := NewWithT(t)
	objs := admissionReleaseObjects(t)
	kinds := map[string][]string{}
	for _, o := range objs {
		kinds[o.GetKind()] = append(kinds[o.GetKind()], o.GetName())
		g.Expect(o.GetLabels()).To(HaveKeyWithValue(providerLabel, addonLabel), "%s %s", o.GetKind(), o.GetName())
	}
	g.Expect(kinds["ValidatingAdmissionPolicy"]).To(ConsistOf(admissionPolicies))
	g.Expect(kinds["ValidatingAdmissionPolicyBinding"]).To(ConsistOf(admissionPolicies))
	g.Expect(kinds["ClusterRole"]).To(Equal([]string{admissionExemptRole}))
	g.Expect(kinds["ClusterRoleBinding"]).To(Equal([]string{admissionExemptRole}))
	g.Expect(kinds).To(HaveLen(4))
	for _, o := range objs {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			g.Expect(o.Object["spec"]).To(HaveKeyWithValue("failurePolicy", "Fail"), o.GetName())
			conds, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchConditions")
			g.Expect(conds).To(ContainElement(HaveKeyWithValue("name", "not-exempt")), "%s lets the exempt identities through", o.GetName())
		case "ValidatingAdmissionPolicyBinding":
			policy, _, _ := unstructured.NestedString(o.Object, "spec", "policyName")
			g.Expect(policy).To(Equal(o.GetName()))
			actions, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "validationActions")
			g.Expect(actions).To(Equal([]string{"Deny"}))
		case "ClusterRole":
			for k := range o.GetLabels() {
				g.Expect(k).NotTo(HavePrefix("rbac.authorization.k8s.io/aggregate-to-"), "the exemption must never reach tenants' roles")
			}
		}
	}

	rel := lookupRelease(t)
	raw, err := os.ReadFile(filepath.Join(rel.dir, "addon-components.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	components, err := lab.DecodeObjects(raw)
	g.Expect(err).NotTo(HaveOccurred())
	for _, o := range components {
		g.Expect(o.GetKind()).NotTo(HavePrefix("ValidatingAdmissionPolicy"), "the admission is optional: clusterctl does not install it")
		g.Expect(o.GetName()).NotTo(Equal(admissionExemptRole))
	}
}

// One attempt of a forbidden write: what it does (with dry-run options), and what the refusal
// says.
type admissionAttempt struct {
	name    string
	policy  string
	message string
	do      func(ctx context.Context, c client.Client) error
}

// Every write the policies forbid, tried by a tenant holding Kubernetes' `admin` role in its
// namespace (and the right to edit its Clusters): possible without the policies, refused
// with them (Forbidden, naming the policy, the object and why), possible for the exempt
// identities (the lab's admin, a platform admin bound to guestnet-admission-exempt, Cluster
// API's ServiceAccounts and the kube-controller-manager of the shipped binding). What the
// tenant may still do is not refused, and a tenant cannot exempt itself.
func TestAdmission_TenantIsRefusedWhatGuestnetTrusts(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	host := l.Host.Client
	ns := uniqueName("adm")
	filter := ns
	g.Expect(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	tenant := tenantClient(t, l, ns)
	allowClusterWrites(t, l, ns, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant@" + ns})

	// What CAPI, guestnet and the admin hold in the namespace. No manager runs here: nothing
	// but the test writes these objects.
	gc := createIngressCluster(t, l, ns, "tenant-a", 32310, 32311)
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gc.Name}}
	labelForFilter(t, l, cluster, filter)
	g.Expect(host.Patch(ctx, cluster.DeepCopy(), client.RawPatch(types.MergePatchType,
		[]byte(`{"spec":{"controlPlaneEndpoint":{"host":"10.97.110.1","port":6443}}}`)))).To(Succeed())
	kubeconfig := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gc.Name + "-kubeconfig"}}
	guestSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "projectcontour", Name: "envoy"}}
	gi := newGuestIngress(ns, "web", gc.Name, guestSvc, "10.98.110.10", nil, nil)
	gi.Labels = map[string]string{clusterv1.WatchLabel: filter}
	gi.Finalizers = []string{guestnetv1.GuestIngressFinalizer}
	g.Expect(host.Create(ctx, gi)).To(Succeed())
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bridge", Finalizers: []string{guestnetv1.GuestWebhookBridgeFinalizer},
			Annotations: map[string]string{clusterv1.PausedAnnotation: ""}},
		Spec: guestnetv1.GuestWebhookBridgeSpec{ClusterName: gc.Name, NodePortRange: guestnetv1.NodePortRange{Start: 32312, Size: 2},
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{"cert-manager-webhook"}}},
	}
	g.Expect(host.Create(ctx, gwb)).To(Succeed())
	t.Cleanup(func() {
		for _, o := range []client.Object{gi, gwb} {
			_ = host.Patch(context.Background(), o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
			_ = host.Delete(context.Background(), o)
		}
	})
	hostSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: hostnames.HostService(gi), Labels: ownership.Labels(gi), Annotations: ownership.Annotations(gi)},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "none"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
	g.Expect(host.Create(ctx, hostSvc)).To(Succeed())

	dry := client.DryRunAll
	patch := func(obj client.Object, p string) func(context.Context, client.Client) error {
		return func(ctx context.Context, c client.Client) error {
			return c.Patch(ctx, obj.DeepCopyObject().(client.Object), client.RawPatch(types.MergePatchType, []byte(p)), dry)
		}
	}
	create := func(obj client.Object) func(context.Context, client.Client) error {
		return func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, obj.DeepCopyObject().(client.Object), dry)
		}
	}
	deleteObj := func(obj client.Object) func(context.Context, client.Client) error {
		return func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, obj.DeepCopyObject().(client.Object), dry)
		}
	}
	service := func(name string, labels, annotations map[string]string, owners ...metav1.OwnerReference) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations, OwnerReferences: owners},
			Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}
	}
	// A copy of the worker template whose VMs CAPK would create in namespace vmNamespace.
	vmTemplateIn := func(vmNamespace string) *unstructured.Unstructured {
		tmpl := &unstructured.Unstructured{}
		tmpl.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
		g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.WorkerTemplate}, tmpl)).To(Succeed())
		out := &unstructured.Unstructured{Object: map[string]any{"apiVersion": tmpl.GetAPIVersion(), "kind": tmpl.GetKind(), "spec": tmpl.Object["spec"]}}
		out.SetNamespace(ns)
		out.SetName("elsewhere")
		g.Expect(unstructured.SetNestedField(out.Object, vmNamespace, "spec", "template", "spec", "virtualMachineTemplate", "metadata", "namespace")).To(Succeed())
		return out
	}
	live := &guestnetv1.GuestIngress{}
	g.Expect(host.Get(ctx, client.ObjectKeyFromObject(gi), live)).To(Succeed())
	giOwner := metav1.OwnerReference{APIVersion: guestnetv1.GroupVersion.String(), Kind: "GuestIngress", Name: gi.Name, UID: live.UID, Controller: ptr.To(true)}

	// k0smotron's kinds (stand-in CRDs) for the control plane Service's annotations.
	g.Expect(l.InstallK0smotronCRDs()).To(Succeed())
	attempts := []admissionAttempt{
		{name: "kubeconfig-create", policy: "guestnet-kubeconfig-secrets",
			message: fmt.Sprintf("may not create Secret %s/victim-kubeconfig: a <cluster>-kubeconfig Secret is the Cluster API kubeconfig of a guest cluster", ns),
			do: create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "victim-kubeconfig"},
				Data: map[string][]byte{"value": []byte("apiVersion: v1\nkind: Config\n")}})},
		{name: "kubeconfig-update", policy: "guestnet-kubeconfig-secrets",
			message: fmt.Sprintf("may not update Secret %s/%s", ns, kubeconfig.Name), do: patch(kubeconfig, `{"data":{"value":"ZXZpbA=="}}`)},
		{name: "kubeconfig-delete", policy: "guestnet-kubeconfig-secrets",
			message: fmt.Sprintf("may not delete Secret %s/%s", ns, kubeconfig.Name), do: deleteObj(kubeconfig)},
		{name: "finalizer-guestingress", policy: "guestnet-finalizers",
			message: fmt.Sprintf("may not remove the finalizer %s of GuestIngress %s/web: guestnet removes it once it has deleted what it created on the host", guestnetv1.GuestIngressFinalizer, ns),
			do:      patch(gi, `{"metadata":{"finalizers":null}}`)},
		{name: "finalizer-guestwebhookbridge", policy: "guestnet-finalizers",
			message: fmt.Sprintf("may not remove the finalizer %s of GuestWebhookBridge %s/bridge", guestnetv1.GuestWebhookBridgeFinalizer, ns),
			do:      patch(gwb, `{"metadata":{"finalizers":["example.com/mine"]}}`)},
		{name: "host-service-update", policy: "guestnet-host-services",
			message: fmt.Sprintf("may not update Service %s/%s: it is a host Service of guestnet (label app.kubernetes.io/managed-by=guestnet", ns, hostSvc.Name),
			do:      patch(hostSvc, `{"metadata":{"annotations":{"lbipam.cilium.io/ips":"10.97.0.1"}}}`)},
		{name: "host-service-unmark", policy: "guestnet-host-services",
			message: fmt.Sprintf("may not update Service %s/%s: it is a host Service of guestnet", ns, hostSvc.Name),
			do:      patch(hostSvc, `{"metadata":{"labels":{"app.kubernetes.io/managed-by":null}}}`)},
		{name: "host-service-delete", policy: "guestnet-host-services",
			message: fmt.Sprintf("may not delete Service %s/%s: it is a host Service of guestnet", ns, hostSvc.Name), do: deleteObj(hostSvc)},
		{name: "impersonate-managed-by", policy: "guestnet-host-services",
			message: fmt.Sprintf("may not create Service %s/fake with guestnet's marks (label app.kubernetes.io/managed-by=guestnet): only the host Services guestnet creates carry them", ns),
			do:      create(service("fake", map[string]string{ownership.ManagedByLabel: ownership.ManagedByValue}, nil))},
		{name: "impersonate-annotation", policy: "guestnet-host-services",
			message: fmt.Sprintf("with guestnet's marks (annotation %s)", ownership.GuestIngressAnnotation),
			do:      create(service("fake", nil, map[string]string{ownership.GuestIngressAnnotation: ns + "/web"}))},
		{name: "impersonate-owner", policy: "guestnet-host-services",
			message: "with guestnet's marks (owner GuestIngress web)", do: create(service("fake", nil, nil, giOwner))},
		{name: "watch-filter-guestingress", policy: "guestnet-watch-filter",
			message: fmt.Sprintf("may not change the label cluster.x-k8s.io/watch-filter of GuestIngress %s/web from %s to nothing", ns, filter),
			do:      patch(gi, `{"metadata":{"labels":{"cluster.x-k8s.io/watch-filter":null}}}`)},
		{name: "watch-filter-cluster", policy: "guestnet-watch-filter",
			message: fmt.Sprintf("may not change the label cluster.x-k8s.io/watch-filter of Cluster %s/%s from %s to other", ns, gc.Name, filter),
			do:      patch(cluster, `{"metadata":{"labels":{"cluster.x-k8s.io/watch-filter":"other"}}}`)},
		{name: "pause-guestingress", policy: "guestnet-pause",
			message: fmt.Sprintf("may not pause GuestIngress %s/web (annotation cluster.x-k8s.io/paused)", ns),
			do:      patch(gi, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":"true"}}}`)},
		{name: "pause-cluster", policy: "guestnet-pause",
			message: fmt.Sprintf("may not pause Cluster %s/%s (annotation cluster.x-k8s.io/paused or spec.paused)", ns, gc.Name),
			do:      patch(cluster, `{"spec":{"paused":true}}`)},
		{name: "pause-cluster-annotation", policy: "guestnet-pause",
			message: fmt.Sprintf("may not pause Cluster %s/%s", ns, gc.Name),
			do:      patch(cluster, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":""}}}`)},
		{name: "control-plane-endpoint", policy: "guestnet-control-plane-endpoint",
			message: fmt.Sprintf("may not change spec.controlPlaneEndpoint of Cluster %s/%s from 10.97.110.1:6443 to 10.0.0.1:6443", ns, gc.Name),
			do:      patch(cluster, `{"spec":{"controlPlaneEndpoint":{"host":"10.0.0.1"}}}`)},
		{name: "kubevirt-vm-namespace", policy: "guestnet-kubevirt-namespaces",
			message: fmt.Sprintf("may not create KubevirtMachineTemplate %s/elsewhere naming namespace victim-ns for its VirtualMachines: CAPK would create them there, in a namespace that is not the Cluster's", ns),
			do:      create(vmTemplateIn("victim-ns"))},
		{name: "kubevirt-service-namespace", policy: "guestnet-kubevirt-namespaces",
			message: fmt.Sprintf("may not create KubevirtCluster %s/elsewhere naming namespace victim-ns for its control plane Service", ns),
			do: create(&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": ports.KubevirtMachineTemplateGVK.GroupVersion().String(), "kind": "KubevirtCluster",
				"metadata": map[string]any{"namespace": ns, "name": "elsewhere"},
				"spec": map[string]any{"controlPlaneServiceTemplate": map[string]any{
					"metadata": map[string]any{"namespace": "victim-ns"}, "spec": map[string]any{"type": "ClusterIP"}}},
			}})},
		{name: "control-plane-lbipam-k0smotron", policy: "guestnet-control-plane-service-annotations",
			message: fmt.Sprintf("may not create K0smotronControlPlane %s/asks with the annotation lbipam.cilium.io/ips for its control plane Service", ns),
			do: create(&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": lab.ControlPlaneGVK.GroupVersion().String(), "kind": lab.ControlPlaneGVK.Kind,
				"metadata": map[string]any{"namespace": ns, "name": "asks"},
				"spec": map[string]any{"version": "v1.37.2", "service": map[string]any{"type": "LoadBalancer",
					"annotations": map[string]any{"lbipam.cilium.io/ips": "10.244.0.1", "example.com/team": "web"}}},
			}})},
		{name: "control-plane-sharing-key-capk", policy: "guestnet-control-plane-service-annotations",
			message: fmt.Sprintf("may not create KubevirtCluster %s/shares with the annotation lbipam.cilium.io/sharing-key for its control plane Service", ns),
			do: create(&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": ports.KubevirtMachineTemplateGVK.GroupVersion().String(), "kind": "KubevirtCluster",
				"metadata": map[string]any{"namespace": ns, "name": "shares"},
				"spec": map[string]any{"controlPlaneServiceTemplate": map[string]any{
					"metadata": map[string]any{"annotations": map[string]any{"lbipam.cilium.io/sharing-key": "victim"}}, "spec": map[string]any{"type": "LoadBalancer"}}},
			}})},
	}

	// Without the policies, the tenant's RBAC alone allows every one of them.
	for _, a := range attempts {
		g.Expect(a.do(ctx, tenant)).To(Succeed(), "%s: without the policies the tenant's RBAC allows it (else the test proves nothing)", a.name)
	}

	installAdmissionPolicies(t, l, ns)

	for _, a := range attempts {
		t.Run(a.name, func(t *testing.T) {
			expectRefused(t, a, tenant)
		})
	}

	// What the tenant may still do.
	t.Run("tenant-still-may", func(t *testing.T) {
		g := NewWithT(t)
		for name, do := range map[string]func(context.Context, client.Client) error{
			"create an ordinary Secret":  create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app-credentials"}}),
			"create an ordinary Service": create(service("mine", map[string]string{"app": "mine"}, nil)),
			"edit its GuestIngress":      patch(gi, `{"metadata":{"labels":{"example.com/team":"web"}},"spec":{"loadBalancer":{"ip":"10.98.110.11"}}}`),
			"add its own finalizer":      patch(gwb, fmt.Sprintf(`{"metadata":{"finalizers":[%q,"example.com/mine"]}}`, guestnetv1.GuestWebhookBridgeFinalizer)),
			"opt into the watch filter":  patch(gwb, fmt.Sprintf(`{"metadata":{"labels":{"cluster.x-k8s.io/watch-filter":%q}}}`, filter)),
			"unpause":                    patch(gwb, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":null}}}`),
			"delete its GuestIngress":    deleteObj(gi),
			"read its kubeconfig": func(ctx context.Context, c client.Client) error {
				return c.Get(ctx, client.ObjectKeyFromObject(kubeconfig), &corev1.Secret{})
			},
			"label its Cluster":             patch(cluster, `{"metadata":{"labels":{"example.com/team":"web"}}}`),
			"keep its VMs in its namespace": create(vmTemplateIn(ns)),
			"annotate its control plane Service with its own keys": create(&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": lab.ControlPlaneGVK.GroupVersion().String(), "kind": lab.ControlPlaneGVK.Kind,
				"metadata": map[string]any{"namespace": ns, "name": "own-keys"},
				"spec": map[string]any{"version": "v1.37.2", "service": map[string]any{"type": "LoadBalancer",
					"annotations": map[string]any{"example.com/team": "web"}}},
			}}),
		} {
			g.Expect(do(ctx, tenant)).To(Succeed(), name)
		}
	})

	// A tenant cannot give itself the exemption: RBAC's escalation check refuses a binding of
	// a role it does not hold, and a RoleBinding could not grant a cluster-wide check anyway.
	t.Run("tenant-cannot-exempt-itself", func(t *testing.T) {
		g := NewWithT(t)
		err := tenant.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "exempt-me"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: admissionExemptRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant@" + ns}},
		}, client.DryRunAll)
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
	})

	// The exempt identities: each gets the tenant's RBAC in the namespace, so that only the
	// exemption differs.
	exempt := map[string]client.Client{"lab admin (system:masters)": host}
	platformAdmin := rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "platform-admins-" + ns}
	bindExemption(t, l, ns, platformAdmin)
	for name, id := range map[string]struct {
		user   string
		groups []string
	}{
		"platform admin (bound to guestnet-admission-exempt)": {user: "alice@" + ns, groups: []string{platformAdmin.Name}},
		"Cluster API's controller (shipped binding)":          {user: "system:serviceaccount:capi-system:capi-manager", groups: []string{"system:serviceaccounts", "system:serviceaccounts:capi-system"}},
		"kube-controller-manager (shipped binding)":           {user: "system:kube-controller-manager"},
	} {
		subject := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: id.user}
		bindAdmin(t, l, ns, subject)
		allowClusterWrites(t, l, ns, subject)
		exempt[name] = impersonate(t, l, id.user, id.groups...)
	}
	for _, a := range attempts {
		t.Run(a.name+"/exempt", func(t *testing.T) {
			g := NewWithT(t)
			for name, c := range exempt {
				g.Expect(a.do(ctx, c)).To(Succeed(), "%s is exempt", name)
			}
		})
	}

	// During the deletion too: the tenant deletes its GuestIngress (allowed), and may not take
	// the finalizer off the deleting object; the admin may.
	t.Run("finalizer-during-deletion", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(tenant.Delete(ctx, gi)).To(Succeed())
		a := attempts[slices.IndexFunc(attempts, func(a admissionAttempt) bool { return a.name == "finalizer-guestingress" })]
		expectRefused(t, a, tenant)
		g.Expect(host.Patch(ctx, gi.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))).To(Succeed())
		g.Eventually(func() bool {
			return apierrors.IsNotFound(host.Get(ctx, client.ObjectKeyFromObject(gi), &guestnetv1.GuestIngress{}))
		}).
			WithTimeout(giTimeout).Should(BeTrue())
	})
}

// guestnet's manager, as a ServiceAccount with the generated RBAC and the exemption the
// release binds to it, works with the policies installed: a tenant's GuestIngress is admitted
// and gets its host objects, the tenant cannot touch them, and when the tenant deletes the
// GuestIngress the manager deletes the cluster-scoped pool and L2 policy, removes its
// finalizer, and the garbage collector deletes the host Service. None of its requests is
// refused by a policy.
func TestAdmission_GuestnetWorksWithThePolicies(t *testing.T) {
	e := newSecurityEnv(t, "10.98.111")
	bindExemption(t, e.l, e.ns, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: e.ns, Name: "guestnet-manager"})
	installAdmissionPolicies(t, e.l, e.ns)
	e.createPolicy("admission")

	gi := e.newGuestIngress("web", "10.98.111.10")
	e.g.Expect(e.tenant.Create(e.ctx, gi)).To(Succeed())
	e.eventuallyAdmitted(t, gi, metav1.ConditionTrue)
	svc := e.eventuallyHostService(t, gi)
	e.getCilium(t, ingress.NewPool(), hostnames.Pool(gi))
	e.getCilium(t, ingress.NewL2Policy(), hostnames.L2Policy(gi))
	e.g.Eventually(func() []string { return getGuestIngress(t, e.l, gi).Finalizers }).WithTimeout(giTimeout).
		Should(ContainElement(guestnetv1.GuestIngressFinalizer))

	// The tenant cannot change the real host Service or take the real finalizer off.
	expectRefused(t, admissionAttempt{name: "real host Service", policy: "guestnet-host-services",
		message: fmt.Sprintf("may not update Service %s/%s: it is a host Service of guestnet", e.ns, svc.Name),
		do: func(ctx context.Context, c client.Client) error {
			return c.Patch(ctx, svc.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"lbipam.cilium.io/ips":"10.97.0.1"}}}`)), client.DryRunAll)
		}}, e.tenant)
	expectRefused(t, admissionAttempt{name: "real finalizer", policy: "guestnet-finalizers",
		message: "may not remove the finalizer " + guestnetv1.GuestIngressFinalizer,
		do: func(ctx context.Context, c client.Client) error {
			return c.Patch(ctx, gi.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)), client.DryRunAll)
		}}, e.tenant)

	e.g.Expect(e.tenant.Delete(e.ctx, gi)).To(Succeed())
	e.g.Eventually(func() bool {
		return apierrors.IsNotFound(e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), &guestnetv1.GuestIngress{}))
	}).WithTimeout(giTimeout).Should(BeTrue(), "the manager removes its finalizer")
	e.g.Eventually(func() bool {
		return apierrors.IsNotFound(e.host.Get(e.ctx, client.ObjectKeyFromObject(svc), &corev1.Service{}))
	}).WithTimeout(giTimeout).Should(BeTrue(), "the garbage collector deletes the host Service")
	for _, obj := range []*unstructured.Unstructured{ingress.NewPool(), ingress.NewL2Policy()} {
		err := e.tryGetCilium(obj, hostnames.Pool(gi))
		e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s of %s: %v", obj.GetKind(), gi.Name, err)
	}
	// (newSecurityEnv fails the test if the manager logged a refused request; a refusal by a
	// policy is a Forbidden too, and its message names the policy.)
}

// --- the release's admission, installed for one namespace ----------------------------------

// admissionReleaseObjects decodes admission-policies.yaml of the release `make
// release-manifests` wrote (GUESTNET_RELEASE_DIR).
func admissionReleaseObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	rel := lookupRelease(t)
	raw, err := os.ReadFile(filepath.Join(rel.dir, "admission-policies.yaml"))
	if err != nil {
		t.Fatalf("the release has no admission-policies.yaml (run `make release-manifests`): %v", err)
	}
	objs, err := lab.DecodeObjects(raw)
	if err != nil {
		t.Fatalf("decoding admission-policies.yaml: %v", err)
	}
	return objs
}

// installAdmissionPolicies applies the release's admission to the lab, as written but for
// two things that keep the lab's other tests out of it: each policy and binding is named
// <name>-<ns>, and each binding selects namespace ns only. The exemption's ClusterRole and
// ClusterRoleBinding are applied as they are. It returns once every policy refuses a probe.
func installAdmissionPolicies(t *testing.T, l *lab.Lab, ns string) {
	t.Helper()
	g := NewWithT(t)
	ctx := testContext(t)
	host := l.Host.Client
	for _, o := range admissionReleaseObjects(t) {
		o = o.DeepCopy()
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			o.SetName(o.GetName() + "-" + ns)
		case "ValidatingAdmissionPolicyBinding":
			policy, _, _ := unstructured.NestedString(o.Object, "spec", "policyName")
			g.Expect(unstructured.SetNestedField(o.Object, policy+"-"+ns, "spec", "policyName")).To(Succeed())
			g.Expect(unstructured.SetNestedField(o.Object, map[string]any{"namespaceSelector": map[string]any{
				"matchLabels": map[string]any{corev1.LabelMetadataName: ns}}}, "spec", "matchResources")).To(Succeed())
			o.SetName(o.GetName() + "-" + ns)
		}
		g.Expect(host.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("admission-test"), client.ForceOwnership)).
			To(Succeed(), "applying %s %s", o.GetKind(), o.GetName())
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			t.Cleanup(func() { _ = host.Delete(context.Background(), o) })
		}
	}
	// A policy whose expressions do not type-check against the kinds it matches says so in
	// its status, where the kube-controller-manager's validatingadmissionpolicy-status
	// controller runs (the lab's does not run it); the test logs what it finds.
	// Policies and bindings come into force through the apiserver's informers: expectRefused
	// waits for that.
	g.Eventually(func(g Gomega) {
		for _, p := range admissionPolicies {
			vap := &unstructured.Unstructured{}
			vap.SetAPIVersion("admissionregistration.k8s.io/v1")
			vap.SetKind("ValidatingAdmissionPolicy")
			g.Expect(host.Get(ctx, client.ObjectKey{Name: p + "-" + ns}, vap)).To(Succeed())
			warnings, _, _ := unstructured.NestedSlice(vap.Object, "status", "typeChecking", "expressionWarnings")
			for _, w := range warnings {
				data, _ := json.Marshal(w)
				t.Logf("policy %s: type checking: %s", p, data)
			}
		}
	}).WithTimeout(giTimeout).Should(Succeed())
}

// expectRefused waits until a's attempt by c is refused by a's policy (the apiserver may take
// a moment to put a new binding in force), with a Forbidden error whose message names the
// policy and says what a.message says.
func expectRefused(t *testing.T, a admissionAttempt, c client.Client) {
	t.Helper()
	ctx := testContext(t)
	var err error
	NewWithT(t).Eventually(func() error {
		err = a.do(ctx, c)
		return err
	}).WithTimeout(giTimeout).WithPolling(200*time.Millisecond).Should(HaveOccurred(), "%s: never refused", a.name)
	t.Logf("%s: %v", a.name, err)
	g := NewWithT(t)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s: %v", a.name, err)
	g.Expect(err.Error()).To(ContainSubstring("ValidatingAdmissionPolicy '%s-", a.policy), "%s: refused by its policy", a.name)
	g.Expect(err.Error()).To(ContainSubstring("guestnet admission (ValidatingAdmissionPolicy %s)", a.policy), a.name)
	g.Expect(err.Error()).To(ContainSubstring(a.message), a.name)
}

// allowClusterWrites lets subject edit the CAPI Clusters, KubevirtClusters,
// KubevirtMachineTemplates and K0smotronControlPlanes of ns, as the tenant of docs/security.md
// may (Kubernetes' admin role does not include CAPI's kinds).
func allowClusterWrites(t *testing.T, l *lab.Lab, ns string, subject rbacv1.Subject) {
	t.Helper()
	g := NewWithT(t)
	ctx := testContext(t)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cluster-writer"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{clusterv1.GroupVersion.Group}, Resources: []string{"clusters"}, Verbs: []string{"get", "list", "watch", "update", "patch"},
	}, {
		APIGroups: []string{ports.KubevirtMachineTemplateGVK.Group}, Resources: []string{"kubevirtmachinetemplates", "kubevirtclusters"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
	}, {
		APIGroups: []string{lab.ControlPlaneGVK.Group}, Resources: []string{"k0smotroncontrolplanes"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
	}}}
	if err := l.Host.Client.Create(ctx, role); !apierrors.IsAlreadyExists(err) {
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(l.Host.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "cluster-writer-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{subject},
	})).To(Succeed())
}

// bindAdmin binds Kubernetes' admin role in ns to subject.
func bindAdmin(t *testing.T, l *lab.Lab, ns string, subject rbacv1.Subject) {
	t.Helper()
	NewWithT(t).Expect(l.Host.Client.Create(testContext(t), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "admin-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
		Subjects:   []rbacv1.Subject{subject},
	})).To(Succeed())
}

// bindExemption binds the release's guestnet-admission-exempt ClusterRole to subject, as a
// platform adds its admins (docs/install.md#admission-policies).
func bindExemption(t *testing.T, l *lab.Lab, ns string, subject rbacv1.Subject) {
	t.Helper()
	host := l.Host.Client
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + admissionExemptRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: admissionExemptRole},
		Subjects:   []rbacv1.Subject{subject},
	}
	NewWithT(t).Expect(host.Create(testContext(t), binding)).To(Succeed())
	t.Cleanup(func() { _ = host.Delete(context.Background(), binding) })
}

// impersonate is a client acting as user (and groups, and system:authenticated), impersonated
// by the lab's admin.
func impersonate(t *testing.T, l *lab.Lab, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(l.Host.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append([]string{"system:authenticated"}, groups...)}
	c, err := client.New(cfg, client.Options{Scheme: lab.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
