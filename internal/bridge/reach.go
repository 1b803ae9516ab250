package bridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// Konnectivity agents, as k0s, Kamaji and kubeadm's konnectivity set-up deploy them.
const (
	KonnectivityNamespace  = "kube-system"
	KonnectivityAgentLabel = "k8s-app"
	KonnectivityAgentValue = "konnectivity-agent"
)

// EgressCheck is the guest apiserver's answer to a GET it proxied to a guest Service
// (services/proxy): it dials the Service's endpoint through its `cluster` egress, the path
// of a webhook's service reference. Failure is empty when the Service answered (any HTTP
// status), else what the apiserver said ("error trying to reach service: No agent
// available") or that it did not answer in time.
type EgressCheck struct {
	Service ServiceRef
	Failure string
	// NoEndpoints: the Service has no ready endpoint, nothing was dialed: the check proves
	// nothing either way (a bridge would not reach it either).
	NoEndpoints bool
}

// GuestReachesServices weighs the evidence that the guest apiserver reaches guest Services
// by itself, which is what a service reference needs. It does when konnectivity agents are
// ready in the guest (the apiserver then sends `cluster` egress through them) and the guest
// apiserver reaches each checked Service through that egress, unless an APIService that
// still references its own Service fails its discovery check: then the agents are there but
// the path is broken, and only the bridge helps (docs/runbook.md, "Konnectivity: working or
// broken"). Ready agent Pods alone prove nothing: the agents' DaemonSets have no readiness
// probe, so an agent that cannot reach the konnectivity server is Ready all the same
// (checked with the real konnectivity).
// Without checks (nil) the verdict rests on the Pods and APIServices only.
func GuestReachesServices(agents []corev1.Pod, apiServices []apiregistrationv1.APIService, checks []EgressCheck) Reachability {
	r := guestReachesServices(agents, apiServices, checks)
	r.Agents = len(agents)
	return r
}

func guestReachesServices(agents []corev1.Pod, apiServices []apiregistrationv1.APIService, checks []EgressCheck) Reachability {
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
	var reached []string
	for _, c := range checks {
		if c.NoEndpoints {
			continue
		}
		if c.Failure != "" {
			return Reachability{Evidence: fmt.Sprintf("%d konnectivity agents are ready, but the guest apiserver cannot reach Service %s through them: %s",
				ready, c.Service, c.Failure)}
		}
		reached = append(reached, c.Service.String())
	}
	if len(reached) > 0 {
		return Reachability{Reaches: true, Evidence: fmt.Sprintf("%d konnectivity agents are ready, the guest apiserver reaches Service %s through them and no APIService fails to reach its Service",
			ready, strings.Join(reached, ", "))}
	}
	return Reachability{Reaches: true, Evidence: fmt.Sprintf("%d konnectivity agents are ready and no APIService fails to reach its Service: the guest apiserver reaches guest Services", ready)}
}

// CheckEgress classifies the guest apiserver's answer to a GET it proxied to a guest Service
// (err: no answer at all, within the timeout or from the apiserver): answered when the
// Service answered (an HTTP error status of the server is an answer), else why the guest
// apiserver did not reach it. The apiserver reports a failed dial as a 503 Status "error
// trying to reach service: ..." (k8s.io/apimachinery/pkg/util/proxy), a Service without
// endpoints (or whose endpoints are not Pods) as a 503 Status "no endpoints available for
// service". (client-go's typed clients lose that message: read the body.)
func CheckEgress(ref ServiceRef, code int, body []byte, err error) EgressCheck {
	c := EgressCheck{Service: ref}
	switch {
	case err != nil:
		c.Failure = err.Error()
	case code != http.StatusServiceUnavailable:
		// the server answered
	case bytes.Contains(body, []byte("error trying to reach service")):
		c.Failure = proxyMessage(body)
	case bytes.Contains(body, []byte("no endpoints available")):
		c.NoEndpoints = true
	}
	return c
}

// proxyMessage is the message of the apiserver's Status in body, or the body itself.
func proxyMessage(body []byte) string {
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Message != "" {
		return st.Message
	}
	return Truncate(strings.TrimSpace(string(body)), 256)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
