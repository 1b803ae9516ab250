package guestnodeidentity

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
)

// The guest's Cilium agent reads its node IP once, at start, and falls back to the VM's own
// address when its Node has no InternalIP yet (cilium v1.20.2 pkg/node/sync; decision 11). It
// tolerates every taint, so on a new worker it usually starts before guestnet initializes the
// Node, and its CiliumNode then names 10.0.2.2: the tunnel to that node goes nowhere. For a
// while after guestnet writes a Node's addresses, it compares the Node's CiliumNode with them
// and deletes that node's Cilium agent pod when they differ; the DaemonSet starts a new one,
// which reads the right address. Only then: at steady state guestnet reads nothing of Cilium.

// ciliumNodeGVK is Cilium's per-node object (cluster-scoped, named after the Node).
var ciliumNodeGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumNode"}

// Cilium's agent pods: namespace and label of its DaemonSet (the Helm chart's).
const (
	ciliumNamespace  = "kube-system"
	ciliumAgentLabel = "k8s-app"
	ciliumAgentValue = "cilium"
)

// ciliumWatchFor is how long after writing a Node's addresses guestnet compares its CiliumNode
// (an agent may create it late), and ciliumRecheckEvery how often in that window.
const (
	ciliumWatchFor     = 2 * time.Minute
	ciliumRecheckEvery = 10 * time.Second
)

// writtenNodes remembers when guestnet wrote which guest Node's addresses, by Cluster.
type writtenNodes struct {
	mu sync.Mutex
	at map[client.ObjectKey]map[string]time.Time
}

func (w *writtenNodes) wrote(cluster client.ObjectKey, node string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.at == nil {
		w.at = map[client.ObjectKey]map[string]time.Time{}
	}
	if w.at[cluster] == nil {
		w.at[cluster] = map[string]time.Time{}
	}
	w.at[cluster][node] = now
}

// recent returns the Nodes of cluster written within ciliumWatchFor of now, and forgets the
// others.
func (w *writtenNodes) recent(cluster client.ObjectKey, now time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for node, at := range w.at[cluster] {
		if now.Sub(at) < ciliumWatchFor {
			out = append(out, node)
		} else {
			delete(w.at[cluster], node)
		}
	}
	if len(w.at[cluster]) == 0 {
		delete(w.at, cluster)
	}
	slices.Sort(out)
	return out
}

// restartStaleCiliumAgents deletes the Cilium agent pod of each recently written Node whose
// CiliumNode names other InternalIPs than the Node, and reports whether to look again soon.
// Reads are live (the uncached guest client): only in the window after a write.
func (r *Reconciler) restartStaleCiliumAgents(ctx context.Context, s *scope, internalIPs map[string][]string) (again bool, err error) {
	cluster := client.ObjectKeyFromObject(s.cluster)
	recent := r.written.recent(cluster, time.Now())
	if len(recent) == 0 {
		return false, nil
	}
	guest, err := r.ClusterCache.GetUncachedClient(ctx, cluster)
	if err != nil {
		return true, err
	}
	for _, node := range recent {
		want, ok := internalIPs[node]
		if !ok || len(want) == 0 {
			continue
		}
		cn := &unstructured.Unstructured{}
		cn.SetGroupVersionKind(ciliumNodeGVK)
		switch err := guest.Get(ctx, client.ObjectKey{Name: node}, cn); {
		case meta.IsNoMatchError(err):
			return false, nil // no Cilium in this guest
		case apierrors.IsNotFound(err):
			continue // not created yet: looked at again within the window
		case err != nil:
			return true, fmt.Errorf("reading CiliumNode %s in the guest: %w", node, err)
		}
		have := ciliumInternalIPs(cn)
		if len(have) == 0 || slices.ContainsFunc(have, func(ip string) bool { return slices.Contains(want, ip) }) {
			continue
		}
		pods := &corev1.PodList{}
		if err := guest.List(ctx, pods, client.InNamespace(ciliumNamespace), client.MatchingLabels{ciliumAgentLabel: ciliumAgentValue},
			client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", node)}); err != nil {
			return true, fmt.Errorf("listing the Cilium agent of %s in the guest: %w", node, err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp != nil {
				continue
			}
			if err := guest.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
				return true, fmt.Errorf("restarting the Cilium agent %s/%s: %w", p.Namespace, p.Name, err)
			}
			record.Written(ctx, r.recorder, s.gni, record.Write{Type: corev1.EventTypeNormal, Reason: "CiliumAgentRestarted", Action: "Delete", Object: p,
				Note: fmt.Sprintf("Restarted the Cilium agent %s of guest Node %s: its CiliumNode names %v, the Node %v (Cilium reads its node IP once, at start)",
					p.Name, node, have, want)})
		}
	}
	return true, nil
}

// ciliumInternalIPs are the InternalIP addresses of a CiliumNode's spec.addresses.
func ciliumInternalIPs(cn *unstructured.Unstructured) []string {
	addrs, _, _ := unstructured.NestedSlice(cn.Object, "spec", "addresses")
	var out []string
	for _, a := range addrs {
		m, ok := a.(map[string]any)
		if !ok || m["type"] != "InternalIP" {
			continue
		}
		if ip, ok := m["ip"].(string); ok {
			out = append(out, ip)
		}
	}
	return out
}
