package policy

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// World is what admission reads besides the GuestIngress itself: every policy and every
// pool (cluster-wide), and the namespaces and GuestIngresses read so far. Its pools and
// GuestIngresses are a cache's own objects when the reader is one (listed without a deep
// copy: every admission reads them all): nothing may change them.
type World struct {
	Policies       []guestnetv1.GuestIngressPolicy
	Pools          PoolMap
	Host           hostaddrs.Set
	namespaces     map[string]*corev1.Namespace
	guestIngresses map[string][]guestnetv1.GuestIngress
	reader         client.Reader
}

// Observe reads the policies and pools from reader (the manager's cache, or the API server
// in `manager diagnose`); host are the host's own addresses (hostaddrs.Watcher, or
// hostaddrs.Read).
func Observe(ctx context.Context, reader client.Reader, host hostaddrs.Set) (*World, error) {
	policies := &guestnetv1.GuestIngressPolicyList{}
	if err := reader.List(ctx, policies); err != nil {
		return nil, fmt.Errorf("listing GuestIngressPolicies: %w", err)
	}
	pools := &unstructured.UnstructuredList{}
	pools.SetGroupVersionKind(ingress.PoolGVK.GroupVersion().WithKind(ingress.PoolGVK.Kind + "List"))
	// A host that serves no pools (Cilium not installed) has none.
	if err := reader.List(ctx, pools, client.UnsafeDisableDeepCopy); err != nil && !meta.IsNoMatchError(err) {
		return nil, fmt.Errorf("listing CiliumLoadBalancerIPPools: %w", err)
	}
	w := &World{
		Policies:       policies.Items,
		Pools:          make(map[string]*unstructured.Unstructured, len(pools.Items)),
		Host:           host,
		namespaces:     map[string]*corev1.Namespace{},
		guestIngresses: map[string][]guestnetv1.GuestIngress{},
		reader:         reader,
	}
	for i := range pools.Items {
		w.Pools[pools.Items[i].GetName()] = &pools.Items[i]
	}
	return w, nil
}

// Input reads what admission needs for gi (its namespace and the namespace's
// GuestIngresses, once per namespace) and returns it. A namespace that does not exist is
// nil in the Input: nothing is admitted.
func (w *World) Input(ctx context.Context, gi *guestnetv1.GuestIngress) (Input, error) {
	ns, ok := w.namespaces[gi.Namespace]
	if !ok {
		ns = &corev1.Namespace{}
		if err := w.reader.Get(ctx, client.ObjectKey{Name: gi.Namespace}, ns); err != nil {
			if !apierrors.IsNotFound(err) {
				return Input{}, fmt.Errorf("reading namespace %s: %w", gi.Namespace, err)
			}
			ns = nil
		}
		w.namespaces[gi.Namespace] = ns
	}
	siblings, ok := w.guestIngresses[gi.Namespace]
	if !ok {
		list := &guestnetv1.GuestIngressList{}
		if err := w.reader.List(ctx, list, client.InNamespace(gi.Namespace), client.UnsafeDisableDeepCopy); err != nil {
			return Input{}, fmt.Errorf("listing GuestIngresses of namespace %s: %w", gi.Namespace, err)
		}
		siblings = list.Items
		w.guestIngresses[gi.Namespace] = siblings
	}
	return Input{GuestIngress: gi, Namespace: ns, Policies: w.Policies, Siblings: siblings, Pools: w.Pools, Host: w.Host}, nil
}
