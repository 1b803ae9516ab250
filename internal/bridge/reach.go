package bridge

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// Konnectivity agents, as k0s, Kamaji and kubeadm's konnectivity set-up deploy them.
const (
	KonnectivityNamespace  = "kube-system"
	KonnectivityAgentLabel = "k8s-app"
	KonnectivityAgentValue = "konnectivity-agent"
)

// GuestReachesServices weighs the evidence that the guest apiserver reaches guest Services
// by itself, which is what a service reference needs. It does when konnectivity agents are
// ready in the guest (the apiserver then sends `cluster` egress through them), unless an
// APIService that still references its own Service fails its discovery check: then the
// agents are there but the path is broken, and only the bridge helps (docs/runbook.md, "Konnectivity: working or broken").
func GuestReachesServices(agents []corev1.Pod, apiServices []apiregistrationv1.APIService) Reachability {
	ready := 0
	for _, p := range agents {
		if podReady(&p) {
			ready++
		}
	}
	if ready == 0 {
		return Reachability{Evidence: fmt.Sprintf("no ready konnectivity agent (pods %s=%s in %s): the guest apiserver cannot reach guest Services",
			KonnectivityAgentLabel, KonnectivityAgentValue, KonnectivityNamespace)}
	}
	var failing []string
	for _, a := range apiServices {
		if a.Spec.Service == nil || hasRecord(&a) {
			continue
		}
		for _, c := range a.Status.Conditions {
			if c.Type == apiregistrationv1.Available && c.Status == apiregistrationv1.ConditionFalse && c.Reason == "FailedDiscoveryCheck" {
				failing = append(failing, a.Name)
			}
		}
	}
	if len(failing) > 0 {
		return Reachability{Evidence: fmt.Sprintf("%d konnectivity agents are ready, but APIService %s fails its discovery check through its Service: the agents do not carry the traffic",
			ready, strings.Join(failing, ", "))}
	}
	return Reachability{Reaches: true, Evidence: fmt.Sprintf("%d konnectivity agents are ready and no APIService fails to reach its Service: the guest apiserver reaches guest Services", ready)}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
