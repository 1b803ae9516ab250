package bench_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// Drift repair latency, from the apiservers' view: for each kind of drift, a watch on the one
// object drifted sees the drift's own event and then the first version that is repaired; the
// latency is the time between the two events' arrival at the same watch (its delivery delay
// cancels out). Drifts are made one at a time, on members spread over the fleet, at steady
// state.

var (
	servicesGVR = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	poolsGVR    = schema.GroupVersionResource{Group: ingress.PoolGVK.Group, Version: ingress.PoolGVK.Version, Resource: "ciliumloadbalancerippools"}
	webhooksGVR = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}
)

// repairTimeout bounds one repair; a drift not repaired within it counts as a failure.
const repairTimeout = time.Minute

// RepairStats are the latencies of one kind of drift, in seconds.
type RepairStats struct {
	Kind     string  `json:"kind"`
	Count    int     `json:"count"`
	Failures int     `json:"failures"`
	P50      float64 `json:"p50Seconds"`
	P99      float64 `json:"p99Seconds"`
	Max      float64 `json:"maxSeconds"`
	// Errors are the first few failures, as said.
	Errors []string `json:"errors,omitempty"`
	// Workers is what each controller did while this kind was measured (workers_lab_test.go),
	// over WindowSeconds.
	Workers       []ControllerWindow `json:"workers,omitempty"`
	WindowSeconds float64            `json:"windowSeconds"`
}

// drift is one kind of drift: for member i it names the object (its resource interface and
// name), makes the change (returning the resourceVersion its write produced, "" for a
// delete) and says of a later version whether it is repaired.
type drift struct {
	kind string
	// bridged: only members with a GuestWebhookBridge.
	bridged bool
	target  func(i int) (dynamic.ResourceInterface, string)
	change  func(ctx context.Context, ri dynamic.ResourceInterface, live *unstructured.Unstructured) (rv string, repaired func(*unstructured.Unstructured) bool, err error)
}

func repairCount() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_REPAIRS")); err == nil && n > 0 {
		return n
	}
	return 50
}

// measureRepairs makes `count` drifts of each kind, on members spread over the fleet.
func measureRepairs(ctx context.Context, l *lab.Lab, members []*lab.FleetMember, count int) ([]RepairStats, error) {
	host, err := dynamic.NewForConfig(l.Host.Config)
	if err != nil {
		return nil, err
	}
	// Each member's guest apiserver (its shard), and a nodePort none of their Services holds.
	guests := map[*lab.Cluster]dynamic.Interface{}
	for _, m := range members {
		if guests[m.Guest] == nil {
			if guests[m.Guest], err = dynamic.NewForConfig(m.Guest.Config); err != nil {
				return nil, err
			}
		}
	}
	freePort, err := freeGuestNodePort(ctx, slices.Collect(maps.Values(guests)))
	if err != nil {
		return nil, err
	}
	drifts := []drift{
		{
			kind: "host Service deleted",
			target: func(i int) (dynamic.ResourceInterface, string) {
				gi := members[i].GuestIngress
				return host.Resource(servicesGVR).Namespace(gi.Namespace), hostnames.HostService(gi)
			},
			change: func(ctx context.Context, ri dynamic.ResourceInterface, live *unstructured.Unstructured) (string, func(*unstructured.Unstructured) bool, error) {
				return "", func(*unstructured.Unstructured) bool { return true }, ri.Delete(ctx, live.GetName(), metav1.DeleteOptions{})
			},
		},
		{
			kind: "pool edited",
			target: func(i int) (dynamic.ResourceInterface, string) {
				return host.Resource(poolsGVR), hostnames.Pool(members[i].GuestIngress)
			},
			change: func(ctx context.Context, ri dynamic.ResourceInterface, live *unstructured.Unstructured) (string, func(*unstructured.Unstructured) bool, error) {
				want, _, _ := unstructured.NestedSlice(live.Object, "spec", "blocks")
				edited := live.DeepCopy()
				// Another block: the Service keeps its IP, guestnet must take the block out.
				_ = unstructured.SetNestedSlice(edited.Object, append(want, map[string]any{"cidr": "10.99.0.1/32"}), "spec", "blocks")
				out, err := ri.Update(ctx, edited, metav1.UpdateOptions{FieldManager: "bench"})
				if err != nil {
					return "", nil, err
				}
				return out.GetResourceVersion(), func(u *unstructured.Unstructured) bool {
					got, _, _ := unstructured.NestedSlice(u.Object, "spec", "blocks")
					return reflect.DeepEqual(got, want)
				}, nil
			},
		},
		{
			kind: "guest Service nodePort changed",
			target: func(i int) (dynamic.ResourceInterface, string) {
				gi := members[i].GuestIngress
				return guests[members[i].Guest].Resource(servicesGVR).Namespace(gi.Spec.GuestService.Namespace), gi.Spec.GuestService.Name
			},
			change: func(ctx context.Context, ri dynamic.ResourceInterface, live *unstructured.Unstructured) (string, func(*unstructured.Unstructured) bool, error) {
				want := nodePorts(live)
				edited := live.DeepCopy()
				ports, _, _ := unstructured.NestedSlice(edited.Object, "spec", "ports")
				ports[0].(map[string]any)["nodePort"] = int64(freePort)
				_ = unstructured.SetNestedSlice(edited.Object, ports, "spec", "ports")
				out, err := ri.Update(ctx, edited, metav1.UpdateOptions{FieldManager: "bench"})
				if err != nil {
					return "", nil, err
				}
				return out.GetResourceVersion(), func(u *unstructured.Unstructured) bool { return reflect.DeepEqual(nodePorts(u), want) }, nil
			},
		},
		{
			kind:    "webhook service put back (Helm-style replace)",
			bridged: true,
			target: func(i int) (dynamic.ResourceInterface, string) {
				return guests[members[i].Guest].Resource(webhooksGVR), fmt.Sprintf("webhook-%04d", members[i].Index)
			},
			change: func(ctx context.Context, ri dynamic.ResourceInterface, live *unstructured.Unstructured) (string, func(*unstructured.Unstructured) bool, error) {
				want := webhookClientConfigs(live)
				// What the chart installed (lab.CreateServiceWebhook), written whole with PUT as
				// `helm upgrade --force` does.
				replaced := live.DeepCopy()
				hooks, _, _ := unstructured.NestedSlice(replaced.Object, "webhooks")
				for _, h := range hooks {
					cc := h.(map[string]any)["clientConfig"].(map[string]any)
					delete(cc, "url")
					cc["service"] = map[string]any{"namespace": live.GetName(), "name": "cert-manager-webhook", "path": "/validate", "port": int64(443)}
				}
				_ = unstructured.SetNestedSlice(replaced.Object, hooks, "webhooks")
				out, err := ri.Update(ctx, replaced, metav1.UpdateOptions{FieldManager: "helm"})
				if err != nil {
					return "", nil, err
				}
				return out.GetResourceVersion(), func(u *unstructured.Unstructured) bool { return reflect.DeepEqual(webhookClientConfigs(u), want) }, nil
			},
		},
	}

	var bridged []int
	for i, m := range members {
		if m.Bridge != nil {
			bridged = append(bridged, i)
		}
	}
	var stats []RepairStats
	for _, d := range drifts {
		candidates := make([]int, len(members))
		for i := range candidates {
			candidates[i] = i
		}
		if d.bridged {
			candidates = bridged
		}
		s := RepairStats{Kind: d.kind}
		if len(candidates) == 0 {
			stats = append(stats, s)
			continue
		}
		metricsBefore, err := lab.GatherMetrics(diagnosticsAddress)
		if err != nil {
			return nil, err
		}
		windowStart := time.Now()
		var times []float64
		for j := range count {
			i := candidates[(j*len(candidates)/count+j)%len(candidates)]
			ri, name := d.target(i)
			latency, err := measureRepair(ctx, ri, name, d.change)
			if err != nil {
				if ctx.Err() != nil {
					return nil, err
				}
				s.Failures++
				if len(s.Errors) < 3 {
					s.Errors = append(s.Errors, fmt.Sprintf("member %d: %v", i, err))
				}
				continue
			}
			times = append(times, latency.Seconds())
			time.Sleep(100 * time.Millisecond) // the repair's own aftermath (events, status)
		}
		metricsAfter, err := lab.GatherMetrics(diagnosticsAddress)
		if err != nil {
			return nil, err
		}
		s.Workers, s.WindowSeconds = controllerWindows(metricsBefore, metricsAfter), time.Since(windowStart).Seconds()
		s.Count = len(times)
		if len(times) > 0 {
			sort.Float64s(times)
			s.P50, s.P99, s.Max = quantile(times, 0.5), quantile(times, 0.99), times[len(times)-1]
		}
		stats = append(stats, s)
	}
	return stats, nil
}

// measureRepair drifts one object and returns the time between the drift's watch event and
// the repaired version's.
func measureRepair(ctx context.Context, ri dynamic.ResourceInterface, name string,
	change func(context.Context, dynamic.ResourceInterface, *unstructured.Unstructured) (string, func(*unstructured.Unstructured) bool, error)) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, repairTimeout)
	defer cancel()
	live, err := ri.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	// From the watch cache's latest state (an ADDED event first), not from live's
	// resourceVersion: under load the watch cache may lag the quorum read, and a watch from a
	// newer version than it has fails ("Too large resource version").
	w, err := ri.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	rv, repaired, err := change(ctx, ri, live)
	if err != nil {
		return 0, err
	}
	var drifted time.Time
	for {
		select {
		case ev, ok := <-w.ResultChan():
			now := time.Now()
			if !ok {
				return 0, fmt.Errorf("watch of %s ended", name)
			}
			if ev.Type == watch.Error {
				return 0, apierrors.FromObject(ev.Object)
			}
			u, isObj := ev.Object.(*unstructured.Unstructured)
			if !isObj || ev.Type == watch.Bookmark {
				continue
			}
			if drifted.IsZero() {
				if (rv == "" && ev.Type == watch.Deleted) || (rv != "" && u.GetResourceVersion() == rv) {
					drifted = now
				}
				continue
			}
			if ev.Type != watch.Deleted && repaired(u) {
				return now.Sub(drifted), nil
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("%s not repaired within %v", name, repairTimeout)
		}
	}
}

func nodePorts(u *unstructured.Unstructured) []any {
	ports, _, _ := unstructured.NestedSlice(u.Object, "spec", "ports")
	var out []any
	for _, p := range ports {
		out = append(out, p.(map[string]any)["nodePort"])
	}
	return out
}

func webhookClientConfigs(u *unstructured.Unstructured) []any {
	hooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
	var out []any
	for _, h := range hooks {
		out = append(out, h.(map[string]any)["clientConfig"])
	}
	return out
}

// freeGuestNodePort is a nodePort no Service of the guests holds, from the top of the range
// (the fleet's address plan fills it from the bottom).
func freeGuestNodePort(ctx context.Context, guests []dynamic.Interface) (int, error) {
	used := map[int64]bool{}
	for _, guest := range guests {
		list, err := guest.Resource(servicesGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		for i := range list.Items {
			for _, p := range nodePorts(&list.Items[i]) {
				if n, ok := p.(int64); ok {
					used[n] = true
				}
			}
		}
	}
	for p := int64(32767); p >= 30000; p-- {
		if !used[p] {
			return int(p), nil
		}
	}
	return 0, fmt.Errorf("no free nodePort in the guests")
}
