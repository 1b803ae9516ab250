package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The Cilium BGP stand-in plays, for one host node, Cilium's BGP control plane v2 (v1.20.2):
// the operator's derivation of the node's config from CiliumBGPClusterConfigs and the
// agent's service advertisement, with real BGP sessions (lab-bgp speaker, GoBGP) from the
// node's own address, so each node's paths carry its own next hop. Cilium's own cells need
// the agent (see docs/lab.md, "BGP in the lab"). Behaviour, from github.com/cilium/cilium
// v1.20.2:
//
//   - CiliumBGPClusterConfig spec.nodeSelector against the Node's labels (none: every node);
//     each bgpInstances[] is a BGP instance with its localASN, router ID the node's IPv4
//     address; each peers[] a session to peerAddress/peerASN, on peerConfigRef's
//     transport.peerPort (179) (operator/pkg/bgp, pkg/bgp/manager/reconciler/neighbor.go).
//   - A peer's advertisements: for each family of its CiliumBGPPeerConfig (afi ipv4/ipv6,
//     safi unicast), the CiliumBGPAdvertisements whose labels the family's `advertisements`
//     selector matches (no selector: none); a peer without peerConfigRef gets nothing
//     (reconciler/peer_advertisements.go).
//   - advertisementType Service with service.addresses LoadBalancerIP: a Service the
//     advertisement's `selector` matches, evaluated on its labels plus the pseudo-labels
//     io.kubernetes.service.name and io.kubernetes.service.namespace (serviceLabelSet in
//     reconciler/service.go); no selector or no service: nothing. Its LoadBalancer IPs
//     (status.loadBalancer.ingress) are advertised when its loadBalancerClass is unset or
//     io.cilium/bgp-control-plane (v2.BGPLoadBalancerClass); with externalTrafficPolicy
//     Local only from a node with a local ready endpoint (EndpointSlice nodeName), and then
//     always as a host route; otherwise as a host route, or aggregationLengthIPv4/IPv6. A
//     Service without any endpoint is advertised too (enable-no-service-endpoints-routable
//     defaults to true, pkg/svcrouteconfig).
//   - attributes: standard and wellKnown communities, large communities and localPreference
//     are set per peer by an export policy statement matching the peer and exactly the
//     prefix; several advertisements selecting the same path merge (communities unioned,
//     the higher local preference) (reconciler/policies.go, mergeRoutePolicyStatements).
//     LOCAL_PREF travels only on iBGP sessions, as with GoBGP in Cilium.
//   - Any change that deselects withdraws the path: the state is recomputed from scratch on
//     every event.
//
// Not played: ClusterIP/ExternalIP/PodCIDR/Interface advertisements, autoDiscovery, auth,
// graceful restart, timers, CiliumBGPNodeConfigOverride, status conditions, and the
// CiliumBGPNodeConfig objects the operator writes (the stand-in derives them in memory).

var (
	ciliumBGPClusterConfigGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumBGPClusterConfig"}
	ciliumBGPPeerConfigGVK    = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumBGPPeerConfig"}
	ciliumBGPAdvertisementGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumBGPAdvertisement"}
)

// CiliumBGPOptions say which host node the stand-in plays.
type CiliumBGPOptions struct {
	// NodeName is the host Node (one of HostNodes, or a new one, which is created ready).
	NodeName string
	// Address is the node's address: its InternalIP, the source of its BGP sessions and so
	// the next hop of its paths. Must be local in the lab namespace (10.244.0.0/16), e.g.
	// 10.244.0.181.
	Address string
	// NodeLabels are merged into the Node's labels (what CiliumBGPClusterConfig nodeSelectors
	// match).
	NodeLabels map[string]string
}

// CiliumBGPStandIn plays one host node's Cilium BGP speaker. Stop it with Stop (or the lab).
type CiliumBGPStandIn struct {
	*standIn
	r *ciliumBGPReconciler
}

// StartCiliumBGPStandIn labels the host Node, gives it Address as InternalIP and starts the
// node's played BGP control plane; it logs to <lab>/cilium-bgp-<node>.log and each BGP
// instance's speaker to <lab>/cilium-bgp-<node>-<instance>.log.
func (l *Lab) StartCiliumBGPStandIn(ctx context.Context, opts CiliumBGPOptions) (*CiliumBGPStandIn, error) {
	addr, err := netip.ParseAddr(opts.Address)
	if err != nil || !addr.Is4() || !netip.MustParsePrefix("10.244.0.0/16").Contains(addr) {
		return nil, fmt.Errorf("CiliumBGPOptions.Address %q: want an IPv4 address in 10.244.0.0/16", opts.Address)
	}
	if err := createReadyNode(ctx, l.Host.Client, opts.NodeName, opts.Address); err != nil {
		return nil, err
	}
	if len(opts.NodeLabels) > 0 {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": opts.NodeLabels}})
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: opts.NodeName}}
		if err := l.Host.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return nil, fmt.Errorf("labelling node %s: %w", opts.NodeName, err)
		}
	}
	r := &ciliumBGPReconciler{l: l, node: opts.NodeName, address: opts.Address, instances: map[string]*bgpInstance{}}
	s, err := startStandIn(ctx, l, "cilium-bgp-"+opts.NodeName, l.Host.Config, func(mgr ctrl.Manager, logger logr.Logger) (func(), error) {
		r.c, r.log = mgr.GetClient(), logger
		always := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: opts.NodeName}}}
		})
		err := ctrl.NewControllerManagedBy(mgr).Named("cilium-bgp-"+opts.NodeName).
			For(&corev1.Node{}).
			Watches(&corev1.Service{}, always).
			Watches(&discoveryv1.EndpointSlice{}, always).
			Watches(newUnstructured(ciliumBGPClusterConfigGVK), always).
			Watches(newUnstructured(ciliumBGPPeerConfigGVK), always).
			Watches(newUnstructured(ciliumBGPAdvertisementGVK), always).
			Complete(r)
		return r.stopAll, err
	})
	if err != nil {
		return nil, err
	}
	st := &CiliumBGPStandIn{standIn: s, r: r}
	l.onStop(st.Stop)
	return st, nil
}

// Stop stops the node's speakers (their sessions go down, the router withdraws their paths)
// and the stand-in. Calling it twice is fine.
func (s *CiliumBGPStandIn) Stop() {
	s.stopOnce.Do(s.standIn.Stop)
}

// Peers returns the sessions of every BGP instance of the node.
func (s *CiliumBGPStandIn) Peers(ctx context.Context) ([]BGPPeer, error) {
	s.r.mu.Lock()
	instances := make([]*bgpInstance, 0, len(s.r.instances))
	for _, i := range s.r.instances {
		instances = append(instances, i)
	}
	s.r.mu.Unlock()
	var out []BGPPeer
	for _, i := range instances {
		var peers []BGPPeer
		if err := getJSON(ctx, i.api, "/peers", &peers); err != nil {
			return nil, err
		}
		out = append(out, peers...)
	}
	return out, nil
}

// bgpInstance is one bgpInstances[] entry running on the node: a lab-bgp speaker.
type bgpInstance struct {
	asn    uint32
	proc   *process
	api    *http.Client
	socket string
}

type ciliumBGPReconciler struct {
	l       *Lab
	c       client.Client
	log     logr.Logger
	node    string
	address string

	mu        sync.Mutex
	instances map[string]*bgpInstance
}

// The parts of Cilium's v2 BGP types the stand-in reads (pkg/k8s/apis/cilium.io/v2
// bgp_cluster_types.go, bgp_peer_types.go, bgp_advert_types.go).
type (
	bgpClusterConfigSpec struct {
		NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
		BGPInstances []struct {
			Name     string `json:"name"`
			LocalASN *int64 `json:"localASN,omitempty"`
			Peers    []struct {
				Name          string  `json:"name"`
				PeerAddress   *string `json:"peerAddress,omitempty"`
				PeerASN       *int64  `json:"peerASN,omitempty"`
				PeerConfigRef *struct {
					Name string `json:"name"`
				} `json:"peerConfigRef,omitempty"`
			} `json:"peers,omitempty"`
		} `json:"bgpInstances"`
	}
	bgpPeerConfigSpec struct {
		Transport *struct {
			PeerPort *int32 `json:"peerPort,omitempty"`
		} `json:"transport,omitempty"`
		Families []struct {
			Afi            string                `json:"afi"`
			Safi           string                `json:"safi"`
			Advertisements *metav1.LabelSelector `json:"advertisements,omitempty"`
		} `json:"families,omitempty"`
	}
	bgpAdvertisementSpec struct {
		Advertisements []struct {
			AdvertisementType string `json:"advertisementType"`
			Service           *struct {
				Addresses             []string `json:"addresses,omitempty"`
				AggregationLengthIPv4 *int16   `json:"aggregationLengthIPv4,omitempty"`
				AggregationLengthIPv6 *int16   `json:"aggregationLengthIPv6,omitempty"`
			} `json:"service,omitempty"`
			Selector   *metav1.LabelSelector `json:"selector,omitempty"`
			Attributes *struct {
				Communities *struct {
					Standard  []string `json:"standard,omitempty"`
					WellKnown []string `json:"wellKnown,omitempty"`
					Large     []string `json:"large,omitempty"`
				} `json:"communities,omitempty"`
				LocalPreference *int64 `json:"localPreference,omitempty"`
			} `json:"attributes,omitempty"`
		} `json:"advertisements"`
	}
)

func specOf(u *unstructured.Unstructured, out any) error {
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	return runtime.DefaultUnstructuredConverter.FromUnstructured(spec, out)
}

// speakerState is lab-bgp speaker's PUT /state (hack/tools/labbgp/speaker.go).
type speakerState struct {
	Peers []speakerPeer `json:"peers"`
	Paths []peerPath    `json:"paths"`
}

type speakerPeer struct {
	Address string `json:"address"`
	Port    int    `json:"port,omitempty"`
	ASN     uint32 `json:"asn"`
}

type peerPath struct {
	Peer             string   `json:"peer"`
	Prefix           string   `json:"prefix"`
	Communities      []string `json:"communities,omitempty"`
	LargeCommunities []string `json:"largeCommunities,omitempty"`
	LocalPreference  *uint32  `json:"localPreference,omitempty"`
}

func (r *ciliumBGPReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.Name != r.node {
		return reconcile.Result{}, nil
	}
	desired, err := r.desired(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, inst := range r.instances {
		if d, ok := desired[name]; !ok || d.asn != inst.asn {
			inst.proc.stop()
			_ = os.RemoveAll(inst.socket)
			delete(r.instances, name)
			r.log.Info("Stopped BGP instance", "instance", name)
		}
	}
	for name, d := range desired {
		inst, ok := r.instances[name]
		if !ok {
			args := []string{"speaker", "--address=" + r.address, "--asn=" + strconv.FormatUint(uint64(d.asn), 10)}
			proc, api, socket, err := r.l.startLabBGP(ctx, "cilium-bgp-"+r.node+"-"+name, args)
			if err != nil {
				return reconcile.Result{}, err
			}
			inst = &bgpInstance{asn: d.asn, proc: proc, api: api, socket: socket}
			r.instances[name] = inst
			r.log.Info("Started BGP instance", "instance", name, "asn", d.asn)
		}
		body, _ := json.Marshal(d.state)
		if err := doJSON(ctx, inst.api, http.MethodPut, "/state", bytes.NewReader(body), nil); err != nil {
			return reconcile.Result{}, err
		}
		r.log.Info("Reconciled BGP instance", "instance", name, "state", string(body))
	}
	return reconcile.Result{}, nil
}

func (r *ciliumBGPReconciler) stopAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, inst := range r.instances {
		inst.proc.stop()
		_ = os.RemoveAll(inst.socket)
		delete(r.instances, name)
	}
}

type desiredInstance struct {
	asn   uint32
	state speakerState
}

// desired computes, for each BGP instance the node runs, its peers and what it announces to
// each, from the cluster's objects (the operator's and the agent's parts together).
func (r *ciliumBGPReconciler) desired(ctx context.Context) (map[string]desiredInstance, error) {
	node := &corev1.Node{}
	if err := r.c.Get(ctx, client.ObjectKey{Name: r.node}, node); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	clusterConfigs := newUnstructuredList(ciliumBGPClusterConfigGVK)
	peerConfigs := newUnstructuredList(ciliumBGPPeerConfigGVK)
	adverts := newUnstructuredList(ciliumBGPAdvertisementGVK)
	services := &corev1.ServiceList{}
	for _, list := range []client.ObjectList{clusterConfigs, peerConfigs, adverts, services} {
		if err := r.c.List(ctx, list); err != nil {
			return nil, err
		}
	}
	peerConfigByName := map[string]*unstructured.Unstructured{}
	for i := range peerConfigs.Items {
		peerConfigByName[peerConfigs.Items[i].GetName()] = &peerConfigs.Items[i]
	}

	out := map[string]desiredInstance{}
	for i := range clusterConfigs.Items {
		var cc bgpClusterConfigSpec
		if err := specOf(&clusterConfigs.Items[i], &cc); err != nil {
			return nil, err
		}
		if cc.NodeSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(cc.NodeSelector)
			if err != nil || !sel.Matches(labels.Set(node.Labels)) {
				continue
			}
		}
		for _, inst := range cc.BGPInstances {
			if inst.LocalASN == nil {
				continue
			}
			d := desiredInstance{asn: uint32(*inst.LocalASN), state: speakerState{Peers: []speakerPeer{}, Paths: []peerPath{}}}
			paths := map[[2]string]*peerPath{} // by peer, prefix
			for _, peer := range inst.Peers {
				if peer.PeerAddress == nil || peer.PeerASN == nil {
					continue // autoDiscovery is not played
				}
				sp := speakerPeer{Address: *peer.PeerAddress, ASN: uint32(*peer.PeerASN), Port: 179}
				var pc *bgpPeerConfigSpec
				if peer.PeerConfigRef != nil && peerConfigByName[peer.PeerConfigRef.Name] != nil {
					pc = &bgpPeerConfigSpec{}
					if err := specOf(peerConfigByName[peer.PeerConfigRef.Name], pc); err != nil {
						return nil, err
					}
					if pc.Transport != nil && pc.Transport.PeerPort != nil {
						sp.Port = int(*pc.Transport.PeerPort)
					}
				}
				d.state.Peers = append(d.state.Peers, sp)
				if pc == nil {
					continue
				}
				for _, fam := range pc.Families {
					if fam.Safi != "unicast" || (fam.Afi != "ipv4" && fam.Afi != "ipv6") || fam.Advertisements == nil {
						continue
					}
					advSel, err := metav1.LabelSelectorAsSelector(fam.Advertisements)
					if err != nil {
						continue
					}
					for j := range adverts.Items {
						if !advSel.Matches(labels.Set(adverts.Items[j].GetLabels())) {
							continue
						}
						if err := r.addServicePaths(ctx, paths, sp.Address, fam.Afi, &adverts.Items[j], services.Items); err != nil {
							return nil, err
						}
					}
				}
			}
			keys := make([][2]string, 0, len(paths))
			for k := range paths {
				keys = append(keys, k)
			}
			sort.Slice(keys, func(a, b int) bool { return keys[a][0]+" "+keys[a][1] < keys[b][0]+" "+keys[b][1] })
			for _, k := range keys {
				d.state.Paths = append(d.state.Paths, *paths[k])
			}
			out[inst.Name] = d
		}
	}
	return out, nil
}

// addServicePaths adds what one CiliumBGPAdvertisement announces to peer in family afi.
func (r *ciliumBGPReconciler) addServicePaths(ctx context.Context, paths map[[2]string]*peerPath, peer, afi string, advert *unstructured.Unstructured, services []corev1.Service) error {
	var spec bgpAdvertisementSpec
	if err := specOf(advert, &spec); err != nil {
		return err
	}
	for _, a := range spec.Advertisements {
		if a.AdvertisementType != "Service" || a.Selector == nil || a.Service == nil || !slices.Contains(a.Service.Addresses, "LoadBalancerIP") {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(a.Selector)
		if err != nil {
			continue
		}
		for i := range services {
			svc := &services[i]
			if !sel.Matches(ciliumServiceLabels(svc)) || svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
				continue
			}
			if class := svc.Spec.LoadBalancerClass; class != nil && *class != ciliumBGPControlPlaneClass {
				continue
			}
			local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
			if local {
				ok, err := r.hasLocalReadyEndpoint(ctx, svc)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
			}
			for _, in := range svc.Status.LoadBalancer.Ingress {
				ip, err := netip.ParseAddr(in.IP)
				if err != nil || (afi == "ipv4") != ip.Is4() {
					continue
				}
				bits := ip.BitLen()
				if !local && ip.Is4() && a.Service.AggregationLengthIPv4 != nil {
					bits = int(*a.Service.AggregationLengthIPv4)
				}
				if !local && ip.Is6() && a.Service.AggregationLengthIPv6 != nil {
					bits = int(*a.Service.AggregationLengthIPv6)
				}
				prefix, err := ip.Prefix(bits)
				if err != nil {
					continue
				}
				key := [2]string{peer, prefix.String()}
				p := paths[key]
				if p == nil {
					p = &peerPath{Peer: peer, Prefix: prefix.String()}
					paths[key] = p
				}
				if at := a.Attributes; at != nil {
					if at.Communities != nil {
						p.Communities = unionSorted(p.Communities, at.Communities.Standard, at.Communities.WellKnown)
						p.LargeCommunities = unionSorted(p.LargeCommunities, at.Communities.Large)
					}
					if lp := at.LocalPreference; lp != nil && (p.LocalPreference == nil || uint32(*lp) > *p.LocalPreference) {
						p.LocalPreference = ptr.To(uint32(*lp))
					}
				}
			}
		}
	}
	return nil
}

// hasLocalReadyEndpoint reports whether one of the Service's ready endpoints runs on the node
// (EndpointSlice endpoints' nodeName), as Cilium's active local backends.
func (r *ciliumBGPReconciler) hasLocalReadyEndpoint(ctx context.Context, svc *corev1.Service) (bool, error) {
	list := &discoveryv1.EndpointSliceList{}
	if err := r.c.List(ctx, list, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return false, err
	}
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if ptr.Deref(e.NodeName, "") == r.node && ptr.Deref(e.Conditions.Ready, true) && !ptr.Deref(e.Conditions.Terminating, false) {
				return true, nil
			}
		}
	}
	return false, nil
}

func unionSorted(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, v := range l {
			if !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	slices.Sort(out)
	return out
}
