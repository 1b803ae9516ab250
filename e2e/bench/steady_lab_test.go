package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// statusSnapshot is the status of every GuestIngress and bridge, with its resourceVersion,
// by "<kind> <namespace>/<name>".
type statusSnapshot map[string]versionedStatus

type versionedStatus struct {
	resourceVersion string
	status          map[string]any
}

// snapshotStatuses lists every GuestIngress and GuestWebhookBridge from the host apiserver.
func snapshotStatuses(ctx context.Context, t *testing.T, c client.Client) statusSnapshot {
	t.Helper()
	out := statusSnapshot{}
	add := func(kind string, obj client.Object, status any) {
		raw, err := json.Marshal(status)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]any{}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		out[kind+" "+obj.GetNamespace()+"/"+obj.GetName()] = versionedStatus{obj.GetResourceVersion(), m}
	}
	gis := &guestnetv1.GuestIngressList{}
	if err := c.List(ctx, gis); err != nil {
		t.Fatal(err)
	}
	for i := range gis.Items {
		add("GuestIngress", &gis.Items[i], gis.Items[i].Status)
	}
	gwbs := &guestnetv1.GuestWebhookBridgeList{}
	if err := c.List(ctx, gwbs); err != nil {
		t.Fatal(err)
	}
	for i := range gwbs.Items {
		add("GuestWebhookBridge", &gwbs.Items[i], gwbs.Items[i].Status)
	}
	return out
}

// maxStatusChanges bounds the objects statusChanges describes.
const maxStatusChanges = 10

// statusChanges says, for the objects written between before and after (at most
// maxStatusChanges of them, in name order), which status fields changed and how: what a
// steady-state write was for. An object written twice shows the net change; one whose status
// did not change was written elsewhere (metadata, spec).
func statusChanges(before, after statusSnapshot) (written int, changes []string) {
	for _, k := range sortedKeys(after) {
		old, ok := before[k]
		now := after[k]
		if !ok || old.resourceVersion == now.resourceVersion {
			continue
		}
		written++
		if len(changes) >= maxStatusChanges {
			continue
		}
		diff := diffFields("status", old.status, now.status)
		if len(diff) == 0 {
			diff = []string{"status unchanged"}
		}
		changes = append(changes, k+": "+strings.Join(diff, "; "))
	}
	return written, changes
}

// diffFields lists the leaves that differ between a and b as "path: old -> new". A
// condition is named by its type rather than its index, and its lastTransitionTime is left
// out (it moves only with its status).
func diffFields(path string, a, b any) []string {
	if am, ok := a.(map[string]any); ok {
		if bm, ok := b.(map[string]any); ok {
			var out []string
			for _, k := range sortedKeys(am, bm) {
				if k == "lastTransitionTime" {
					continue
				}
				out = append(out, diffFields(path+"."+k, am[k], bm[k])...)
			}
			return out
		}
	}
	if path == "status.conditions" {
		return diffFields(path, byType(a), byType(b))
	}
	if as, ok := a.([]any); ok {
		if bs, ok := b.([]any); ok && len(as) == len(bs) {
			var out []string
			for i := range as {
				out = append(out, diffFields(fmt.Sprintf("%s[%d]", path, i), as[i], bs[i])...)
			}
			return out
		}
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if bytes.Equal(ja, jb) {
		return nil
	}
	return []string{fmt.Sprintf("%s: %s -> %s", path, clip(string(ja)), clip(string(jb)))}
}

// byType keys a list of conditions by their type.
func byType(list any) map[string]any {
	out := map[string]any{}
	items, _ := list.([]any)
	for _, c := range items {
		if m, ok := c.(map[string]any); ok {
			out[fmt.Sprint(m["type"])] = m
		}
	}
	return out
}

// sortedKeys are the keys of all of ms, each once, in order.
func sortedKeys[V any](ms ...map[string]V) []string {
	union := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			union[k] = true
		}
	}
	return slices.Sorted(maps.Keys(union))
}

// clip keeps a changed value short enough for a table, its end included (where dial errors
// and counts are).
func clip(s string) string {
	const keep = 160
	if len(s) <= 2*keep {
		return s
	}
	return s[:keep] + " … " + s[len(s)-keep:]
}
