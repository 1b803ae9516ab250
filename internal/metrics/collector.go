package metrics

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Target states (label state of guestnet_bridge_targets).
const (
	TargetBridged     = "bridged"
	TargetNotBridged  = "not_bridged"
	TargetUnreachable = "unreachable"
)

// NoCondition is the reason label of an object that has no such condition yet (created, not
// reconciled yet).
const NoCondition = "NoCondition"

// listTimeout bounds the cache reads of one scrape.
const listTimeout = 10 * time.Second

var (
	guestIngressesDesc = prometheus.NewDesc(GuestIngressesName,
		"GuestIngresses by the status and reason of their Ready condition.",
		[]string{"status", "reason"}, nil)
	bridgeTargetsDesc = prometheus.NewDesc(BridgeTargetsName,
		"Targets of the GuestWebhookBridges: bridged and not_bridged by the reason of the bridge's TargetsBridged "+
			"condition, unreachable by the reason of its TargetsReachable condition.",
		[]string{"state", "reason"}, nil)
	guestsUnreachableDesc = prometheus.NewDesc(GuestsUnreachableName,
		"Guest clusters whose apiserver guestnet cannot reach or will not use: a GuestIngress or GuestWebhookBridge of theirs has "+
			"ClusterAvailable=False with reason GuestUnreachable, KubeconfigRefused or GuestTooLarge.",
		nil, nil)
)

// Collector computes the gauges from the manager's cache on every scrape (see the package
// comment for why). Register it once per process, on the manager's cache.
type Collector struct {
	// Reader lists GuestIngresses and GuestWebhookBridges (the manager's cache).
	Reader client.Reader
	// Elected is closed when this replica leads (the manager's Elected()); until then the
	// gauges are not reported, so that a standby replica does not report them twice. Nil:
	// always reported.
	Elected <-chan struct{}
}

var _ prometheus.Collector = &Collector{}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- guestIngressesDesc
	ch <- bridgeTargetsDesc
	ch <- guestsUnreachableDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.Elected != nil {
		select {
		case <-c.Elected:
		default:
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	gis := &guestnetv1.GuestIngressList{}
	if err := c.Reader.List(ctx, gis); err != nil {
		ctrl.Log.WithName("metrics").Error(err, "Listing GuestIngresses for the metrics")
		ch <- prometheus.NewInvalidMetric(guestIngressesDesc, err)
		return
	}
	gwbs := &guestnetv1.GuestWebhookBridgeList{}
	if err := c.Reader.List(ctx, gwbs); err != nil {
		ctrl.Log.WithName("metrics").Error(err, "Listing GuestWebhookBridges for the metrics")
		ch <- prometheus.NewInvalidMetric(bridgeTargetsDesc, err)
		return
	}
	for _, m := range Gauges(gis.Items, gwbs.Items) {
		ch <- m
	}
}

// unservedGuestReasons are the ClusterAvailable reasons of a guest guestnet does not reach:
// it does not answer, its kubeconfig is refused (decision 6), or it is past the cap of what
// guestnet caches (decision 9). For each, guestnet changes nothing in the guest and repairs wait.
var unservedGuestReasons = []string{guestnetv1.GuestUnreachableReason, guestnetv1.KubeconfigRefusedReason, guestnetv1.GuestTooLargeReason}

// Gauges are the gauges of these GuestIngresses and GuestWebhookBridges.
func Gauges(gis []guestnetv1.GuestIngress, gwbs []guestnetv1.GuestWebhookBridge) []prometheus.Metric {
	var out []prometheus.Metric
	unreachable := map[types.NamespacedName]bool{}
	noteUnreachable := func(namespace, cluster string, conds []metav1.Condition) {
		if c := find(conds, guestnetv1.ClusterAvailableCondition); c != nil && c.Status == metav1.ConditionFalse &&
			slices.Contains(unservedGuestReasons, c.Reason) {
			unreachable[types.NamespacedName{Namespace: namespace, Name: cluster}] = true
		}
	}

	type statusReason struct{ status, reason string }
	ready := map[statusReason]int{}
	for i := range gis {
		gi := &gis[i]
		k := statusReason{string(metav1.ConditionUnknown), NoCondition}
		if c := find(gi.Status.Conditions, guestnetv1.ReadyCondition); c != nil {
			k = statusReason{string(c.Status), c.Reason}
		}
		ready[k]++
		noteUnreachable(gi.Namespace, gi.Spec.ClusterName, gi.Status.Conditions)
	}
	for k, n := range ready {
		out = append(out, prometheus.MustNewConstMetric(guestIngressesDesc, prometheus.GaugeValue, float64(n), k.status, k.reason))
	}

	targets := map[statusReason]int{} // here: state and reason
	for i := range gwbs {
		gwb := &gwbs[i]
		noteUnreachable(gwb.Namespace, gwb.Spec.ClusterName, gwb.Status.Conditions)
		bridgedReason, reachableReason := NoCondition, NoCondition
		if c := find(gwb.Status.Conditions, guestnetv1.TargetsBridgedCondition); c != nil {
			bridgedReason = c.Reason
		}
		if c := find(gwb.Status.Conditions, guestnetv1.TargetsReachableCondition); c != nil {
			reachableReason = c.Reason
		}
		bridged, total := int(gwb.Status.BridgedTargets), int(gwb.Status.TotalTargets)
		if bridged > 0 {
			targets[statusReason{TargetBridged, bridgedReason}] += bridged
		}
		if total > bridged {
			targets[statusReason{TargetNotBridged, bridgedReason}] += total - bridged
		}
		for _, t := range gwb.Status.Targets {
			if t.Reachable != nil && !*t.Reachable {
				targets[statusReason{TargetUnreachable, reachableReason}]++
			}
		}
	}
	for k, n := range targets {
		out = append(out, prometheus.MustNewConstMetric(bridgeTargetsDesc, prometheus.GaugeValue, float64(n), k.status, k.reason))
	}

	out = append(out, prometheus.MustNewConstMetric(guestsUnreachableDesc, prometheus.GaugeValue, float64(len(unreachable))))
	return out
}

func find(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}
