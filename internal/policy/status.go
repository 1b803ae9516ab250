package policy

import (
	"fmt"
	"regexp"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Usable says whether p can be used as written (the policy's Ready condition): reason is
// ReadyReason, or names the first problem, and message says what to fix. pools are all
// CiliumLoadBalancerIPPools by name. What a problem breaks is refused by Admit too, so a
// broken policy never admits more than it says.
func Usable(p *guestnetv1.GuestIngressPolicy, pools Pools) (reason, message string) {
	if _, err := metav1.LabelSelectorAsSelector(&p.Spec.NamespaceSelector); err != nil {
		return guestnetv1.InvalidSelectorReason, fmt.Sprintf("spec.namespaceSelector is invalid (%v): the policy selects no namespace. Correct it", err)
	}
	if l2 := p.Spec.L2Announcement; l2 != nil {
		if _, err := metav1.LabelSelectorAsSelector(&l2.NodeSelector); err != nil {
			return guestnetv1.InvalidSelectorReason, fmt.Sprintf("spec.l2Announcement.nodeSelector is invalid (%v): the policy admits no "+
				"GuestIngress announced by Cilium's L2 announcer. Correct it", err)
		}
		for _, i := range l2.Interfaces {
			if _, err := regexp.Compile(i); err != nil {
				return guestnetv1.InvalidInterfaceReason, fmt.Sprintf("spec.l2Announcement.interfaces: %s is not a regular expression (%v): "+
					"GuestIngresses that would announce on it are not admitted. Correct it, e.g. ^eth0$", i, err)
			}
		}
	}
	for _, name := range p.Spec.SharedPools {
		pool := pools.Get(name)
		if pool == nil {
			return guestnetv1.SharedPoolNotFoundReason, fmt.Sprintf("spec.sharedPools: CiliumLoadBalancerIPPool %s does not exist; "+
				"GuestIngresses naming it are not admitted. Create it, or remove it from the list", name)
		}
		if why := UnsafeSharedPool(pool); why != "" {
			return guestnetv1.SharedPoolUnsafeReason, fmt.Sprintf("spec.sharedPools: CiliumLoadBalancerIPPool %s %s, so guestnet does not use it "+
				"for any GuestIngress. Give it a serviceSelector with matchLabels io.kubernetes.service.namespace: <namespace> "+
				"(or matchExpressions io.kubernetes.service.namespace In [...]); never select by a label such as "+
				"cluster.x-k8s.io/cluster-name, whose value a tenant chooses", name, why)
		}
	}
	return guestnetv1.ReadyReason, "The policy can be used as written"
}
