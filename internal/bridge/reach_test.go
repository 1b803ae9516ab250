package bridge

import (
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
			r := GuestReachesServices(tt.agents, tt.apiServices)
			g.Expect(r.Reaches).To(Equal(tt.wantReaches))
			g.Expect(r.Evidence).To(ContainSubstring(tt.wantEvidence))
		})
	}
}
