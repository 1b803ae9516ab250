package bridge

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func agent(name string, ready corev1.ConditionStatus) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Namespace: KonnectivityNamespace, Name: name, Labels: map[string]string{KonnectivityAgentLabel: KonnectivityAgentValue},
	}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
	if ready != "" {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: ready})
	}
	return p
}

var (
	cmRef    = ServiceRef{Namespace: "cert-manager", Name: "cert-manager-webhook", Port: 443}
	otherRef = ServiceRef{Namespace: "o", Name: "o", Port: 443}
)

func TestCheckEgress(t *testing.T) {
	// The guest apiserver's answers, as the real one gives them through konnectivity.
	const (
		noAgent     = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"error trying to reach service: No agent available","reason":"ServiceUnavailable","code":503}`
		noEndpoints = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"no endpoints available for service \"cert-manager-webhook\"","reason":"ServiceUnavailable","code":503}`
	)
	g := NewWithT(t)
	g.Expect(CheckEgress(cmRef, 200, nil, nil)).To(Equal(EgressCheck{Service: cmRef}))
	g.Expect(CheckEgress(cmRef, 503, []byte(noAgent), nil)).
		To(Equal(EgressCheck{Service: cmRef, Failure: "error trying to reach service: No agent available"}))
	g.Expect(CheckEgress(cmRef, 503, []byte(noEndpoints), nil)).To(Equal(EgressCheck{Service: cmRef, NoEndpoints: true}))
	// The server answered, with an error of its own: reached.
	g.Expect(CheckEgress(cmRef, 404, []byte("404 page not found"), nil)).To(Equal(EgressCheck{Service: cmRef}))
	g.Expect(CheckEgress(cmRef, 503, []byte("webhook starting"), nil)).To(Equal(EgressCheck{Service: cmRef}))
	g.Expect(CheckEgress(cmRef, 0, nil, context.DeadlineExceeded)).To(Equal(EgressCheck{Service: cmRef, Failure: "context deadline exceeded"}))
}

func TestGuestReachesServices(t *testing.T) {
	recorded := metricsAPIService()
	recorded.Annotations = map[string]string{guestnetv1.BridgeOriginalAnnotation: "{}"}
	missingEndpoints := apiService("v1beta1.custom.metrics.k8s.io", apiRef("monitoring", "adapter", 443), apiregistrationv1.ConditionFalse)
	missingEndpoints.Status.Conditions[0].Reason = "MissingEndpoints"
	local := apiService("v1.apps", nil, apiregistrationv1.ConditionFalse)

	tests := []struct {
		name         string
		agents       []corev1.Pod
		apiServices  []apiregistrationv1.APIService
		checks       []EgressCheck
		wantReaches  bool
		wantEvidence string
	}{
		{
			name:         "no agents",
			wantEvidence: "no ready konnectivity agent (pods k8s-app=konnectivity-agent in kube-system): the guest apiserver cannot reach guest Services",
		},
		{
			name:         "agents, none ready",
			agents:       []corev1.Pod{agent("a", corev1.ConditionFalse), agent("b", "")},
			wantEvidence: "no ready konnectivity agent",
		},
		{
			name:         "agents ready",
			agents:       []corev1.Pod{agent("a", corev1.ConditionTrue), agent("b", corev1.ConditionTrue), agent("c", corev1.ConditionFalse)},
			apiServices:  []apiregistrationv1.APIService{*apiService(metricsAPI, apiRef(msNS, msSvc, 443), apiregistrationv1.ConditionTrue), *local, *missingEndpoints},
			wantReaches:  true,
			wantEvidence: "2 konnectivity agents are ready and no APIService fails to reach its Service",
		},
		{
			name:         "agents ready, but an APIService fails its discovery check through its Service",
			agents:       []corev1.Pod{agent("a", corev1.ConditionTrue)},
			apiServices:  []apiregistrationv1.APIService{*metricsAPIService(), *apiService("v1.other.io", apiRef("o", "o", 443), apiregistrationv1.ConditionFalse)},
			wantEvidence: "1 konnectivity agents are ready, but APIService v1beta1.metrics.k8s.io, v1.other.io fails its discovery check through its Service: the agents do not carry the traffic",
		},
		{
			// The real konnectivity: an agent cut off from the server runs, and its Pod is Ready.
			name:         "agents ready, but the guest apiserver cannot reach a webhook's Service through them",
			agents:       []corev1.Pod{agent("a", corev1.ConditionTrue)},
			checks:       []EgressCheck{{Service: cmRef}, {Service: otherRef, Failure: "error trying to reach service: No agent available"}},
			wantEvidence: "1 konnectivity agents are ready, but the guest apiserver cannot reach Service o/o:443 through them: error trying to reach service: No agent available",
		},
		{
			name:         "agents ready, and the guest apiserver reaches the webhooks' Services through them",
			agents:       []corev1.Pod{agent("a", corev1.ConditionTrue)},
			checks:       []EgressCheck{{Service: cmRef}, {Service: otherRef}},
			wantReaches:  true,
			wantEvidence: "1 konnectivity agents are ready, the guest apiserver reaches Service cert-manager/cert-manager-webhook:443, o/o:443 through them",
		},
		{
			name:         "a Service without endpoints proves nothing",
			agents:       []corev1.Pod{agent("a", corev1.ConditionTrue)},
			checks:       []EgressCheck{{Service: otherRef, NoEndpoints: true}},
			wantReaches:  true,
			wantEvidence: "1 konnectivity agents are ready and no APIService fails to reach its Service",
		},
		{
			name:         "no ready agents: no check makes the guest reach its Services",
			agents:       []corev1.Pod{agent("a", corev1.ConditionFalse)},
			checks:       []EgressCheck{{Service: cmRef}},
			wantEvidence: "no ready konnectivity agent",
		},
		{
			name:         "a failing APIService guestnet rewrote says nothing about the agents",
			agents:       []corev1.Pod{agent("a", corev1.ConditionTrue)},
			apiServices:  []apiregistrationv1.APIService{*recorded},
			wantReaches:  true,
			wantEvidence: "1 konnectivity agents are ready",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			r := GuestReachesServices(tt.agents, tt.apiServices, tt.checks)
			g.Expect(r.Reaches).To(Equal(tt.wantReaches))
			g.Expect(r.Agents).To(Equal(len(tt.agents)), "agent pods, ready or not")
			g.Expect(r.Evidence).To(ContainSubstring(tt.wantEvidence))
		})
	}
}
