package lab

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// guestnet fails closed: a GuestIngress that no GuestIngressPolicy admits gets nothing on
// the host. Every lab therefore starts with one lab-wide policy, LabPolicy, that admits what
// the tests and the demo use, in every namespace that does not opt out; tests of admission
// itself (e2e/security_test.go) label their namespaces with NoLabPolicyLabel and write their
// own policies. Options.SkipLabPolicy starts a lab without it.

// LabPolicyName names the lab-wide GuestIngressPolicy.
const LabPolicyName = "lab"

// LabBGPAdvertisementLabel is the label LabPolicy puts on guestnet's CiliumBGPAdvertisements,
// which the tests' CiliumBGPPeerConfigs select.
const LabBGPAdvertisementLabel = "bgp.lab.guestnet.dev/advertise"

// NoLabPolicyLabel keeps LabPolicy from selecting a namespace that carries it (any value).
const NoLabPolicyLabel = "test.guestnet.dev/no-lab-policy"

// LabPolicy admits, in every namespace without NoLabPolicyLabel: the lab's load-balancer range
// (LoadBalancerCIDR), the documentation's 10.2.6.0/24 and 10.3.0.0/16 (where the controllers'
// shared tests draw one IP per GuestIngress, apart from every other test's); Cilium's L2 announcer on ^eth0$ and
// ^bond[0-9]+$ of every node, and the BGP control plane (advertisements labelled
// LabBGPAdvertisementLabel=tenants, no community); Cluster and Local traffic; the
// annotation and label keys the tests write (example.com/*, test.guestnet.dev/*, a, b, c, x,
// y, new). No shared pool and no cap.
func LabPolicy() *guestnetv1.GuestIngressPolicy { //nolint:revive // LabPolicy, LabPolicyName, NoLabPolicyLabel and Options.SkipLabPolicy name one thing
	keys := []string{"example.com/*", "test.guestnet.dev/*", "a", "b", "c", "x", "y", "new"}
	return &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: LabPolicyName},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: NoLabPolicyLabel, Operator: metav1.LabelSelectorOpDoesNotExist},
			}},
			Addresses:           []string{LoadBalancerCIDR, "10.2.6.0/24", "10.3.0.0/16"},
			LoadBalancerClasses: []string{guestnetv1.DefaultLoadBalancerClass, "io.cilium/bgp-control-plane"},
			L2Announcement: &guestnetv1.L2AnnouncementPolicy{
				Interfaces: []string{"^eth0$", "^bond[0-9]+$"},
			},
			BGPAdvertisement: &guestnetv1.BGPAdvertisementPolicy{
				AdvertisementLabels: map[string]string{LabBGPAdvertisementLabel: "tenants"},
			},
			HostService: guestnetv1.HostServicePolicy{
				AllowedAnnotationKeys: keys,
				AllowedLabelKeys:      keys,
				ExternalTrafficPolicies: []corev1.ServiceExternalTrafficPolicy{
					corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal,
				},
			},
		},
	}
}

// createLabPolicy creates LabPolicy in the host.
func (l *Lab) createLabPolicy(ctx context.Context) error {
	if err := l.Host.Client.Create(ctx, LabPolicy()); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the lab-wide GuestIngressPolicy: %w", err)
	}
	return nil
}
