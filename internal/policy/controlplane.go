package policy

import (
	corev1 "k8s.io/api/core/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// ControlPlaneClaim is what the control plane address of gni claims on the host, in the shape
// admission decides for a GuestIngress: one IP, announced by Cilium's L2 announcer as l2 says,
// on a host Service with the default class and traffic policy and no annotation or label of
// the tenant's (the control plane provider owns the Service). Its name is the
// GuestNodeIdentity's.
func ControlPlaneClaim(gni *guestnetv1.GuestNodeIdentity) *guestnetv1.GuestIngress {
	cp := gni.Spec.ControlPlane
	claim := &guestnetv1.GuestIngress{}
	claim.Namespace, claim.Name, claim.UID = gni.Namespace, gni.Name, gni.UID
	claim.CreationTimestamp = gni.CreationTimestamp
	claim.Spec.ClusterName = gni.Spec.ClusterName
	if cp == nil {
		return claim
	}
	claim.Spec.LoadBalancer = guestnetv1.LoadBalancerSpec{
		IP:                    cp.IP,
		L2:                    cp.L2,
		Class:                 guestnetv1.DefaultLoadBalancerClass,
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
	}
	return claim
}

// AdmitControlPlane decides the control plane address of gni exactly as Admit decides a
// GuestIngress (the same policies, the first by name that selects the namespace and allows
// all of it, the host's own addresses never), except that it takes no room under a policy's
// maxGuestIngressesPerNamespace. in.GuestIngress is ignored; in.Siblings are not read.
func AdmitControlPlane(in Input, gni *guestnetv1.GuestNodeIdentity) Decision {
	in.GuestIngress = ControlPlaneClaim(gni)
	in.Siblings = nil
	return admit(in, words{subject: "the control plane address of this GuestNodeIdentity", field: "spec.controlPlane"})
}
