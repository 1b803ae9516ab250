package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// SpeakerState is what PUT /state sets: the speaker's sessions and what it announces to each.
type SpeakerState struct {
	Peers []SpeakerPeer `json:"peers"`
	Paths []PeerPath    `json:"paths"`
}

// SpeakerPeer is a neighbor the speaker connects to.
type SpeakerPeer struct {
	Address string `json:"address"`
	Port    int    `json:"port,omitempty"`
	ASN     uint32 `json:"asn"`
}

// PeerPath is one prefix announced to one peer with the attributes that peer gets, as
// Cilium's agent exports a path through a per-neighbor export policy statement.
type PeerPath struct {
	Peer             string   `json:"peer"`
	Prefix           string   `json:"prefix"`
	Communities      []string `json:"communities,omitempty"`
	LargeCommunities []string `json:"largeCommunities,omitempty"`
	LocalPreference  *uint32  `json:"localPreference,omitempty"`
}

type speaker struct {
	s       *server.BgpServer
	address string

	mu    sync.Mutex
	peers map[string]SpeakerPeer
	paths map[netip.Prefix]bool // in the global RIB
}

func runSpeaker(args []string) error {
	fs := flag.NewFlagSet("speaker", flag.ContinueOnError)
	address := fs.String("address", "", "local address of the sessions (the node's address; required)")
	asn := fs.Uint("asn", 0, "local AS number (required)")
	routerID := fs.String("router-id", "", "router ID (default: --address when IPv4)")
	socket := fs.String("api-socket", "", "unix socket serving PUT /state and GET /peers (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addr, err := checkIdentity(*address, *asn, *socket, routerID)
	if err != nil {
		return err
	}
	// ListenPort -1: the speaker only connects out, as Cilium's agent by default (its
	// CiliumBGPNodeConfig localPort unset).
	s, err := newServer(context.Background(), &api.Global{Asn: uint32(*asn), RouterId: *routerID, ListenPort: -1})
	if err != nil {
		return err
	}
	sp := &speaker{s: s, address: addr.String(), peers: map[string]SpeakerPeer{}, paths: map[netip.Prefix]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /state", func(w http.ResponseWriter, r *http.Request) {
		var st SpeakerState
		if err := json.NewDecoder(r.Body).Decode(&st); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, struct{}{}, sp.apply(r.Context(), st))
	})
	mux.HandleFunc("GET /peers", func(w http.ResponseWriter, r *http.Request) {
		peers, err := listPeers(r.Context(), s)
		writeJSON(w, peers, err)
	})
	return serveUntilSignal(*socket, mux, s)
}

// apply makes the speaker's sessions, RIB and export policy those of st.
func (sp *speaker) apply(ctx context.Context, st SpeakerState) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()

	want := map[string]SpeakerPeer{}
	for _, p := range st.Peers {
		if p.Port == 0 {
			p.Port = 179
		}
		want[p.Address] = p
	}
	for a, p := range sp.peers {
		if w, ok := want[a]; !ok || w != p {
			if err := sp.s.DeletePeer(ctx, &api.DeletePeerRequest{Address: a}); err != nil {
				return fmt.Errorf("deleting peer %s: %w", a, err)
			}
			delete(sp.peers, a)
		}
	}

	// The export policy first, so that a new session never sees a path it must not get.
	policies, assignment := exportPolicy(st.Paths)
	if err := sp.s.SetPolicies(ctx, policies); err != nil {
		return fmt.Errorf("setting the export policy: %w", err)
	}
	if err := sp.s.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: assignment}); err != nil {
		return fmt.Errorf("assigning the export policy: %w", err)
	}

	prefixes := map[netip.Prefix]bool{}
	for _, p := range st.Paths {
		prefix, err := netip.ParsePrefix(p.Prefix)
		if err != nil {
			return err
		}
		prefixes[prefix.Masked()] = true
	}
	for prefix := range prefixes {
		if sp.paths[prefix] {
			continue
		}
		path, err := newPath(prefix)
		if err != nil {
			return err
		}
		if _, err := sp.s.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path}); err != nil {
			return fmt.Errorf("announcing %s: %w", prefix, err)
		}
		sp.paths[prefix] = true
		slog.Info("announcing", "prefix", prefix)
	}
	for prefix := range sp.paths {
		if prefixes[prefix] {
			continue
		}
		path, err := newPath(prefix)
		if err != nil {
			return err
		}
		if err := sp.s.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Family: path.Family, Path: path}); err != nil {
			return fmt.Errorf("withdrawing %s: %w", prefix, err)
		}
		delete(sp.paths, prefix)
		slog.Info("withdrawing", "prefix", prefix)
	}

	// Existing sessions get the new policy's verdicts (Cilium's agent soft-resets its peers
	// out after changing route policies, too).
	for a := range sp.peers {
		if err := sp.s.ResetPeer(ctx, &api.ResetPeerRequest{Address: a, Soft: true, Direction: api.ResetPeerRequest_OUT}); err != nil {
			return fmt.Errorf("soft reset of %s: %w", a, err)
		}
	}
	for a, p := range want {
		if _, ok := sp.peers[a]; ok {
			continue
		}
		if err := sp.s.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
			Conf:      &api.PeerConf{NeighborAddress: a, PeerAsn: p.ASN},
			Transport: &api.Transport{LocalAddress: sp.address, RemotePort: uint32(p.Port)},
			Timers:    &api.Timers{Config: &api.TimersConfig{ConnectRetry: 1, HoldTime: 9, KeepaliveInterval: 3}},
			AfiSafis:  afiSafis(),
		}}); err != nil {
			return fmt.Errorf("adding peer %s: %w", a, err)
		}
		sp.peers[a] = p
	}
	return nil
}

// newPath is a locally originated path for prefix with an unspecified next hop, which GoBGP
// replaces with the session's local address, as for Cilium's agent (pkg/bgp/types
// NewPathForPrefix: NEXT_HOP 0.0.0.0, MP_REACH next hop ::).
func newPath(prefix netip.Prefix) (*api.Path, error) {
	origin := bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)
	if prefix.Addr().Is4() {
		nlri := bgp.NewIPAddrPrefix(uint8(prefix.Bits()), prefix.Addr().String())
		return apiutil.NewPath(nlri, false, []bgp.PathAttributeInterface{origin, bgp.NewPathAttributeNextHop("0.0.0.0")}, time.Now())
	}
	nlri := bgp.NewIPv6AddrPrefix(uint8(prefix.Bits()), prefix.Addr().String())
	return apiutil.NewPath(nlri, false, []bgp.PathAttributeInterface{origin, bgp.NewPathAttributeMpReachNLRI("::", []bgp.AddrPrefixInterface{nlri})}, time.Now())
}

// exportPolicy is one statement per (peer, prefix): match the neighbor and exactly the
// prefix, add the communities, set the local preference, accept; everything else is
// rejected (the default export action of Cilium's agent, pkg/bgp/gobgp). SetPolicies
// keeps the assignments, so the global export assignment is returned apart.
func exportPolicy(paths []PeerPath) (*api.SetPoliciesRequest, *api.PolicyAssignment) {
	req := &api.SetPoliciesRequest{}
	policy := &api.Policy{Name: "lab-export"}
	for i, p := range paths {
		prefix, err := netip.ParsePrefix(p.Prefix)
		if err != nil {
			continue
		}
		peer, err := netip.ParseAddr(p.Peer)
		if err != nil {
			continue
		}
		n := strconv.Itoa(i)
		req.DefinedSets = append(req.DefinedSets,
			&api.DefinedSet{DefinedType: api.DefinedType_NEIGHBOR, Name: "peer-" + n, List: []string{netip.PrefixFrom(peer, peer.BitLen()).String()}},
			&api.DefinedSet{DefinedType: api.DefinedType_PREFIX, Name: "prefix-" + n, Prefixes: []*api.Prefix{{
				IpPrefix: prefix.Masked().String(), MaskLengthMin: uint32(prefix.Bits()), MaskLengthMax: uint32(prefix.Bits()),
			}}})
		actions := &api.Actions{RouteAction: api.RouteAction_ACCEPT}
		if len(p.Communities) > 0 {
			actions.Community = &api.CommunityAction{Type: api.CommunityAction_ADD, Communities: slices.Clone(p.Communities)}
		}
		if len(p.LargeCommunities) > 0 {
			actions.LargeCommunity = &api.CommunityAction{Type: api.CommunityAction_ADD, Communities: slices.Clone(p.LargeCommunities)}
		}
		if p.LocalPreference != nil {
			actions.LocalPref = &api.LocalPrefAction{Value: *p.LocalPreference}
		}
		policy.Statements = append(policy.Statements, &api.Statement{
			Name: "announce-" + n,
			Conditions: &api.Conditions{
				NeighborSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: "peer-" + n},
				PrefixSet:   &api.MatchSet{Type: api.MatchSet_ANY, Name: "prefix-" + n},
			},
			Actions: actions,
		})
	}
	req.Policies = []*api.Policy{policy}
	return req, &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_EXPORT, DefaultAction: api.RouteAction_REJECT,
		Policies: []*api.Policy{{Name: policy.Name}},
	}
}
