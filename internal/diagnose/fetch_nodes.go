package diagnose

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
)

const (
	// maxGuestNodes is how many guest Nodes (and CiliumNodes) diagnose reads at most: the cap
	// guestnet puts on what it caches of a kind per guest (decision 9).
	maxGuestNodes = guestbounds.DefaultMaxObjects
	// guestPageSize is the page of those lists: a Node's images and conditions can be tens of
	// kilobytes, and each page is trimmed before the next is read.
	guestPageSize = 500
)

// ciliumNodeListGVK is the guest Cilium's CiliumNode list (cilium.io/v2, cluster-scoped;
// github.com/cilium/cilium v1.20.2 pkg/k8s/apis/cilium.io/v2/types.go).
var ciliumNodeListGVK = CiliumNodeGVK.GroupVersion().WithKind("CiliumNodeList")

// listNodeIdentities lists the GuestNodeIdentities of cluster; none when the host does not
// serve the kind (a guestnet release without it).
func listNodeIdentities(ctx context.Context, host client.Reader, namespace, cluster string) ([]guestnetv1.GuestNodeIdentity, error) {
	list := &guestnetv1.GuestNodeIdentityList{}
	switch err := host.List(ctx, list, client.InNamespace(namespace)); {
	case meta.IsNoMatchError(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("listing GuestNodeIdentities in namespace %s: %w", namespace, err)
	}
	var out []guestnetv1.GuestNodeIdentity
	for _, gni := range list.Items {
		if gni.Spec.ClusterName == cluster {
			out = append(out, gni)
		}
	}
	return out, nil
}

// listGuestNodes reads the guest's Nodes in pages, each Node trimmed to what the checks read
// (nodeidentity.TrimNode keeps the providerID, taints, addresses and who wrote them), and
// stops after maxGuestNodes (truncated is then true).
func listGuestNodes(ctx context.Context, guest client.Reader) (nodes []corev1.Node, truncated bool, err error) {
	cont := ""
	for {
		page := &corev1.NodeList{}
		if err := guest.List(ctx, page, client.Limit(guestPageSize), client.Continue(cont)); err != nil {
			return nil, false, err
		}
		for i := range page.Items {
			if len(nodes) == maxGuestNodes {
				return nodes, true, nil
			}
			nodes = append(nodes, *nodeidentity.TrimNode(&page.Items[i]))
		}
		if cont = page.Continue; cont == "" {
			return nodes, false, nil
		}
		if len(nodes) == maxGuestNodes {
			return nodes, true, nil
		}
	}
}

// listCiliumNodes reads the guest's CiliumNodes in pages, each reduced to its name and
// InternalIPs, at most maxGuestNodes of them. A guest that does not serve the kind (no
// Cilium) has none: nil, no error.
func listCiliumNodes(ctx context.Context, guest client.Reader) ([]CiliumNode, error) {
	out := []CiliumNode{}
	cont := ""
	for {
		page := &unstructured.UnstructuredList{}
		page.SetGroupVersionKind(ciliumNodeListGVK)
		switch err := guest.List(ctx, page, client.Limit(guestPageSize), client.Continue(cont)); {
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, err
		}
		for _, item := range page.Items {
			if len(out) == maxGuestNodes {
				return out, nil
			}
			cn := CiliumNode{Name: item.GetName()}
			addresses, _, _ := unstructured.NestedSlice(item.Object, "spec", "addresses")
			for _, a := range addresses {
				m, ok := a.(map[string]any)
				if !ok {
					continue
				}
				if typ, _ := m["type"].(string); typ == string(corev1.NodeInternalIP) {
					if ip, _ := m["ip"].(string); ip != "" {
						cn.InternalIPs = append(cn.InternalIPs, ip)
					}
				}
			}
			out = append(out, cn)
		}
		if cont = page.GetContinue(); cont == "" || len(out) == maxGuestNodes {
			return out, nil
		}
	}
}
