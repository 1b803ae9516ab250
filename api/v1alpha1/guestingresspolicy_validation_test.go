package v1alpha1_test

// Server-side validation of GuestIngressPolicy (cluster-scoped), in the same real
// kube-apiserver as the other kinds: accepted, or rejected with a message naming the mistake.

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

const gipBase = `
namespaceSelector: {matchLabels: {tenant: a}}
addresses: [10.2.6.0/24]
`

func TestValidationGuestIngressPolicy(t *testing.T) {
	const forbidden = "no policy can allow this key"
	const keyFormat = "each entry must be a key such as example.com/team"
	cases := []specCase{
		{"minimal spec accepted", `{}`, ""},
		{"every namespace ({}) accepted", `{namespaceSelector: {}}`, ""},
		{"missing namespaceSelector rejected", `{namespaceSelector: null}`, `spec.namespaceSelector: Required value`},

		// addresses
		{"IPv4 and IPv6 ranges accepted", `{addresses: [10.2.6.0/24, 10.2.7.8/29, "fd00::/120"]}`, ""},
		{"a lone address as /32 accepted", `{addresses: [10.2.6.220/32]}`, ""},
		{"a bare IP rejected", `{addresses: [10.2.6.220]}`, `each address range must be a CIDR such as 10.2.6.0/24`},
		{"garbage rejected", `{addresses: [tenant-a]}`, `each address range must be a CIDR`},
		{"0.0.0.0/0 rejected", `{addresses: [0.0.0.0/0]}`, `an address range of prefix length 0 admits every address`},
		{"::/0 rejected", `{addresses: ["::/0"]}`, `an address range of prefix length 0 admits every address`},
		{"host bits set rejected", `{addresses: [10.2.6.5/24]}`, `write an address range with its network address`},
		{"65 ranges rejected", `{addresses: ` + cidrs(65) + `}`, `spec.addresses: Too many: 65: must have at most 64 items`},

		// classes, pools
		{"classes accepted", `{loadBalancerClasses: [io.cilium/l2-announcer, io.cilium/bgp-control-plane]}`, ""},
		{"empty class rejected", `{loadBalancerClasses: [""]}`, `spec.loadBalancerClasses[0] in body should be at least 1 chars long`},
		{"shared pools accepted", `{sharedPools: [shared, tenant-a.pool]}`, ""},
		{"empty shared pool name rejected", `{sharedPools: [""]}`, `spec.sharedPools[0] in body should be at least 1 chars long`},

		// l2Announcement
		{"l2Announcement accepted", `{l2Announcement: {interfaces: ["^eth0$", "^bond[0-9]+$"], nodeSelector: {matchLabels: {node-role.kubernetes.io/lb: ""}}}}`, ""},
		{"l2Announcement on every node accepted", `{l2Announcement: {interfaces: ["^eth0$"], nodeSelector: {}}}`, ""},
		{"l2Announcement without interfaces rejected", `{l2Announcement: {nodeSelector: {}}}`, `spec.l2Announcement.interfaces: Required value`},
		{"l2Announcement with no interface rejected", `{l2Announcement: {interfaces: [], nodeSelector: {}}}`, `spec.l2Announcement.interfaces in body should have at least 1 items`},
		{"l2Announcement without nodeSelector rejected", `{l2Announcement: {interfaces: ["^eth0$"]}}`, `spec.l2Announcement.nodeSelector: Required value`},

		// hostService keys
		{"exact keys and prefixes accepted", `{hostService: {allowedAnnotationKeys: [example.com/team, "external-dns.alpha.kubernetes.io/*", team], allowedLabelKeys: ["example.com/*", tier]}}`, ""},
		{"a key of another cilium.io domain accepted", `{hostService: {allowedAnnotationKeys: ["service.cilium.io/lb-algorithm", "cilium.io/*"]}}`, ""},
		{"app.kubernetes.io/name accepted", `{hostService: {allowedLabelKeys: [app.kubernetes.io/name]}}`, ""},
		{"lbipam.cilium.io/ips rejected", `{hostService: {allowedAnnotationKeys: [lbipam.cilium.io/ips]}}`, forbidden},
		{"lbipam.cilium.io/sharing-key rejected", `{hostService: {allowedAnnotationKeys: [lbipam.cilium.io/sharing-key]}}`, forbidden},
		{"lbipam.cilium.io/* rejected", `{hostService: {allowedAnnotationKeys: ["lbipam.cilium.io/*"]}}`, forbidden},
		{"io.cilium/lb-ipam-ips rejected", `{hostService: {allowedAnnotationKeys: [io.cilium/lb-ipam-ips]}}`, forbidden},
		{"io.cilium/* rejected (covers io.cilium/lb-ipam-*)", `{hostService: {allowedAnnotationKeys: ["io.cilium/*"]}}`, forbidden},
		{"metallb.io/loadBalancerIPs rejected", `{hostService: {allowedAnnotationKeys: [metallb.io/loadBalancerIPs]}}`, forbidden},
		{"guestnet's own annotation rejected", `{hostService: {allowedAnnotationKeys: [guestnet.addons.cluster.x-k8s.io/guestingress]}}`, forbidden},
		{"cluster.x-k8s.io/* label rejected (covers the cluster-name label)", `{hostService: {allowedLabelKeys: ["cluster.x-k8s.io/*"]}}`, forbidden},
		{"cluster.x-k8s.io/cluster-name label rejected", `{hostService: {allowedLabelKeys: [cluster.x-k8s.io/cluster-name]}}`, forbidden},
		{"app.kubernetes.io/* label rejected (covers managed-by)", `{hostService: {allowedLabelKeys: ["app.kubernetes.io/*"]}}`, forbidden},
		{"service-proxy-name label rejected", `{hostService: {allowedLabelKeys: [service.kubernetes.io/service-proxy-name]}}`, forbidden},
		{"service.kubernetes.io/* label rejected", `{hostService: {allowedLabelKeys: ["service.kubernetes.io/*"]}}`, forbidden},
		{"Cilium's pseudo-label rejected", `{hostService: {allowedLabelKeys: [io.kubernetes.service.namespace]}}`, forbidden},
		{"a bare * rejected", `{hostService: {allowedLabelKeys: ["*"]}}`, keyFormat},
		{"a partial wildcard rejected", `{hostService: {allowedLabelKeys: ["example.com/te*"]}}`, keyFormat},
		{"an upper-case prefix rejected", `{hostService: {allowedAnnotationKeys: [Example.com/team]}}`, keyFormat},
		{"a key with spaces rejected", `{hostService: {allowedAnnotationKeys: ["team name"]}}`, keyFormat},

		// externalTrafficPolicies, cap
		{"Local accepted", `{hostService: {externalTrafficPolicies: [Cluster, Local]}}`, ""},
		{"unknown traffic policy rejected", `{hostService: {externalTrafficPolicies: [Nearest]}}`, `Unsupported value: "Nearest"`},
		{"a cap of 0 accepted", `{maxGuestIngressesPerNamespace: 0}`, ""},
		{"a negative cap rejected", `{maxGuestIngressesPerNamespace: -1}`, `spec.maxGuestIngressesPerNamespace in body should be greater than or equal to 0`},

		// announcers
		{"Cilium BGP accepted", `{loadBalancerClasses: [io.cilium/bgp-control-plane], bgpAdvertisement: {advertisementLabels: {advertise: tenants}, allowedAdvertisementLabels: ["upstream=transit"], communities: {standard: ["65000:100"], wellKnown: [no-export]}}}`, ""},
		{"Cilium BGP without advertisement labels rejected", `{bgpAdvertisement: {advertisementLabels: {}}}`, `spec.bgpAdvertisement.advertisementLabels in body should have at least 1 properties`},
		{"an allowed advertisement label that is no key=value rejected", `{bgpAdvertisement: {advertisementLabels: {a: b}, allowedAdvertisementLabels: [upstream]}}`, `spec.bgpAdvertisement.allowedAdvertisementLabels[0] in body should match`},
		{"MetalLB with L2 and BGP accepted", `{loadBalancerClasses: [metallb.io/metallb], metalLB: {loadBalancerClass: metallb.io/metallb, l2Advertisement: {interfaces: [eth0], nodeSelectors: [{matchLabels: {lb: "true"}}]}, bgpAdvertisement: {peers: [tor-a], communities: {large: ["64512:1:100"]}}}}`, ""},
		{"MetalLB without its class rejected", `{metalLB: {namespace: metallb-system}}`, `spec.metalLB.loadBalancerClass: Required value`},
	}
	// Every key and prefix that guestnet never passes (the Go lists its builders use) is
	// rejected as an exact key and as a prefix, in both lists.
	for _, key := range guestnetv1.ForbiddenHostServiceKeys {
		cases = append(cases,
			specCase{"forbidden annotation key " + key, fmt.Sprintf(`{hostService: {allowedAnnotationKeys: [%q]}}`, key), forbidden},
			specCase{"forbidden label key " + key, fmt.Sprintf(`{hostService: {allowedLabelKeys: [%q]}}`, key), forbidden})
	}
	for _, prefix := range guestnetv1.ForbiddenHostServiceKeyPrefixes {
		key := prefix + "x"
		cases = append(cases,
			specCase{"forbidden annotation key " + key, fmt.Sprintf(`{hostService: {allowedAnnotationKeys: [%q]}}`, key), forbidden},
			specCase{"forbidden label key " + key, fmt.Sprintf(`{hostService: {allowedLabelKeys: [%q]}}`, key), forbidden})
	}
	runPolicyCases(t, cases)
}

func runPolicyCases(t *testing.T, cases []specCase) {
	c := hostLab(t).Host.Client
	prefix := "gip-" + utilrand.String(5)
	for i, tc := range cases {
		t.Run(tc.intent, func(t *testing.T) {
			g := NewWithT(t)
			spec := mergeYAML(t, gipBase, tc.patch)
			obj := newObject("GuestIngressPolicy", "", fmt.Sprintf("%s-%03d", prefix, i), spec)
			err := c.Create(context.Background(), obj, client.FieldValidation("Strict"))
			if err == nil {
				t.Cleanup(func() { _ = c.Delete(context.Background(), obj) })
			}
			if tc.want == "" {
				g.Expect(err).NotTo(HaveOccurred(), "spec:\n%s", toYAML(spec))
				return
			}
			g.Expect(err).To(HaveOccurred(), "the apiserver accepted it; expected a rejection containing %q; spec:\n%s", tc.want, toYAML(spec))
			g.Expect(apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)).To(BeTrue(), "unexpected kind of error: %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.want))
			g.Expect(err.Error()).NotTo(Or(ContainSubstring("no such overload"), ContainSubstring("no such key"),
				ContainSubstring("evaluation error"), ContainSubstring("cost")))
		})
	}
}

func TestValidationGuestIngressPolicyDefaults(t *testing.T) {
	c := hostLab(t).Host.Client
	ctx := context.Background()
	g := NewWithT(t)

	obj := newObject("GuestIngressPolicy", "", "gip-defaults-"+utilrand.String(5), mergeYAML(t, gipBase, `{}`))
	g.Expect(c.Create(ctx, obj, client.FieldValidation("Strict"))).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), obj) })
	p := &guestnetv1.GuestIngressPolicy{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(obj), p)).To(Succeed())
	// Omitted: only Cilium's L2 announcer class and Cluster traffic are admitted, no key
	// passes, no shared pool, no cap, no announcement (so the default class admits nothing
	// until the admin says where it may be announced).
	g.Expect(p.Spec.LoadBalancerClasses).To(Equal([]string{"io.cilium/l2-announcer"}))
	g.Expect(p.Spec.HostService).To(Equal(guestnetv1.HostServicePolicy{
		ExternalTrafficPolicies: []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster},
	}))
	g.Expect(p.Spec.SharedPools).To(BeEmpty())
	g.Expect(p.Spec.L2Announcement).To(BeNil())
	g.Expect(p.Spec.MaxGuestIngressesPerNamespace).To(BeNil())

	// A typed Go object with only the namespace selector is defaulted the same.
	typed := &guestnetv1.GuestIngressPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gip-typed-" + utilrand.String(5)}}
	g.Expect(c.Create(ctx, typed)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), typed) })
	g.Expect(typed.Spec.LoadBalancerClasses).To(Equal([]string{"io.cilium/l2-announcer"}))
	g.Expect(typed.Spec.HostService.ExternalTrafficPolicies).To(Equal([]corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster}))
}

// `kubectl get gip` shows what a policy admits: the namespaces it selects, its address
// ranges and classes, how many GuestIngresses it admits, Ready and age.
func TestValidationGuestIngressPolicyNamesAndPrinterColumns(t *testing.T) {
	l := hostLab(t)
	c := l.Host.Client
	ctx := context.Background()
	g := NewWithT(t)

	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "guestingresspolicies.guestnet.addons.cluster.x-k8s.io"}, crd)).To(Succeed())
	g.Expect(crd.Spec.Names.Kind).To(Equal("GuestIngressPolicy"))
	g.Expect(crd.Spec.Scope).To(Equal(apiextensionsv1.ClusterScoped))
	g.Expect(crd.Status.AcceptedNames.ShortNames).To(ConsistOf("gip"))
	g.Expect(crd.Spec.Names.Categories).To(ConsistOf("guestnet"))
	g.Expect(crd.Spec.Versions).To(HaveLen(1))
	g.Expect(crd.Spec.Versions[0].Subresources.Status).NotTo(BeNil(), "no status subresource")

	p := &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "gip-columns-" + utilrand.String(5)},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector:   metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}},
			Addresses:           []string{"10.2.6.0/24", "10.2.7.0/28"},
			LoadBalancerClasses: []string{"io.cilium/l2-announcer"},
		},
	}
	g.Expect(c.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), p) })
	p.Status.Selector = "tenant=a"
	p.Status.Namespaces = 2
	p.Status.AdmittedGuestIngresses = 3
	p.Status.Conditions = []metav1.Condition{readyCondition()}
	g.Expect(c.Status().Update(ctx, p)).To(Succeed())

	row := tableRow(t, l.Host.Config, "/apis/guestnet.addons.cluster.x-k8s.io/v1alpha1/guestingresspolicies/"+p.Name)
	g.Expect(row.columns).To(Equal([]string{"Name", "Selector", "Namespaces", "Addresses", "Classes", "Admitted", "Ready", "Age"}))
	g.Expect(row.cells[:7]).To(Equal([]string{p.Name, "tenant=a", "2", `["10.2.6.0/24","10.2.7.0/28"]`, `["io.cilium/l2-announcer"]`, "3", "True"}))
}
