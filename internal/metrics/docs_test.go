package metrics

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

const metricsDoc = "../../docs/metrics.md"

// registered is every guestnet_* metric the manager serves, with its label names: the
// counters of controller-runtime's registry, and the gauges of a Collector that has one of
// each object to report on.
func registered(t *testing.T) map[string][]string {
	t.Helper()
	bridge := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "webhooks"},
		Status:     guestnetv1.GuestWebhookBridgeStatus{BridgedTargets: 1, TotalTargets: 1},
	}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(gi("web", "tenant-a"), bridge).Build()
	reg := prometheus.NewRegistry()
	reg.MustRegister(&Collector{Reader: c})

	out := map[string][]string{}
	for _, g := range []prometheus.Gatherer{ctrlmetrics.Registry, reg} {
		families, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if !strings.HasPrefix(f.GetName(), "guestnet_") {
				continue
			}
			var labels []string
			for _, l := range f.GetMetric()[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
			out[f.GetName()] = labels
		}
	}
	return out
}

var metricHeading = regexp.MustCompile("(?m)^### (guestnet_[a-z_]+)$")

// TestDocsListEveryMetric checks that docs/metrics.md has one section per registered
// guestnet_* metric and no other, and that each section names the metric's labels.
func TestDocsListEveryMetric(t *testing.T) {
	g := NewWithT(t)
	data, err := os.ReadFile(metricsDoc)
	g.Expect(err).NotTo(HaveOccurred())
	doc := string(data)

	sections := map[string]string{}
	matches := metricHeading.FindAllStringSubmatchIndex(doc, -1)
	for i, m := range matches {
		end := len(doc)
		if i+1 < len(matches) {
			end = matches[i+1][0]
		}
		sections[doc[m[2]:m[3]]] = doc[m[1]:end]
	}

	metrics := registered(t)
	g.Expect(sortedKeys(sections)).To(Equal(sortedKeys(metrics)), "the sections of %s are not the registered guestnet_* metrics", metricsDoc)
	for name, labels := range metrics {
		for _, l := range labels {
			g.Expect(sections[name]).To(ContainSubstring("| `"+l+"` |"), "%s does not describe label %s of %s", metricsDoc, l, name)
		}
		if len(labels) == 0 {
			g.Expect(sections[name]).To(ContainSubstring("No labels"), "%s: %s has no labels, say so", metricsDoc, name)
		}
	}
	// The values of the labels with fixed sets.
	for _, k := range RepairKinds {
		g.Expect(sections[RepairsName]).To(ContainSubstring("`"+string(k)+"`"), "kind %s", k)
	}
	for _, r := range ConflictReasons {
		g.Expect(sections[ConflictsRefusedName]).To(ContainSubstring("`"+r+"`"), "reason %s", r)
	}
	for _, r := range PolicyRefusalReasons {
		g.Expect(sections[PolicyRefusalsName]).To(ContainSubstring("`"+r+"`"), "reason %s", r)
	}
	for _, s := range []string{TargetBridged, TargetNotBridged, TargetUnreachable} {
		g.Expect(sections[BridgeTargetsName]).To(ContainSubstring("`"+s+"`"), "state %s", s)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
