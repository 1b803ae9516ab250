package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// Route is one path the router learned, as GET /routes reports it.
type Route struct {
	Prefix  string   `json:"prefix"`
	NextHop string   `json:"nextHop"`
	ASPath  []uint32 `json:"asPath"`
	// Communities are standard communities, "65000:100", or the well-known ones by name as
	// Cilium's CiliumBGPAdvertisement spells them ("no-export", "no-advertise", ...).
	Communities []string `json:"communities,omitempty"`
	// LargeCommunities are "global:local1:local2".
	LargeCommunities []string `json:"largeCommunities,omitempty"`
	// LocalPreference is the LOCAL_PREF attribute; only iBGP sessions carry it.
	LocalPreference *uint32 `json:"localPreference,omitempty"`
	// Peer is the address of the neighbor the path came from.
	Peer string `json:"peer"`
	Best bool   `json:"best"`
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runRouter(args []string) error {
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	address := fs.String("address", "", "address to listen on (required; never 0.0.0.0 or ::)")
	port := fs.Int("port", 179, "BGP port")
	asn := fs.Uint("asn", 0, "local AS number (required)")
	routerID := fs.String("router-id", "", "router ID (default: --address when IPv4)")
	socket := fs.String("api-socket", "", "unix socket serving GET /routes and GET /peers (required)")
	var neighbors, dynamic multiFlag
	fs.Var(&neighbors, "neighbor", "ADDRESS=ASN of a neighbor the router accepts (repeatable)")
	fs.Var(&dynamic, "dynamic-neighbors", "PREFIX=ASN: accept any neighbor in PREFIX with that AS (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addr, err := checkIdentity(*address, *asn, *socket, routerID)
	if err != nil {
		return err
	}

	ctx := context.Background()
	s, err := newServer(ctx, &api.Global{
		Asn: uint32(*asn), RouterId: *routerID, ListenPort: int32(*port), ListenAddresses: []string{addr.String()},
	})
	if err != nil {
		return err
	}
	for _, n := range neighbors {
		a, peerASN, err := splitASN(n)
		if err != nil {
			return fmt.Errorf("--neighbor %q: %w", n, err)
		}
		// Passive: the router waits for the speakers (a speaker, like Cilium's agent, may not
		// listen on port 179 at all).
		if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
			Conf:      &api.PeerConf{NeighborAddress: a, PeerAsn: peerASN},
			Transport: &api.Transport{LocalAddress: addr.String(), PassiveMode: true},
			AfiSafis:  afiSafis(),
		}}); err != nil {
			return fmt.Errorf("adding neighbor %s: %w", a, err)
		}
	}
	for i, d := range dynamic {
		prefix, peerASN, err := splitASN(d)
		if err != nil {
			return fmt.Errorf("--dynamic-neighbors %q: %w", d, err)
		}
		group := "dynamic-" + strconv.Itoa(i)
		if err := s.AddPeerGroup(ctx, &api.AddPeerGroupRequest{PeerGroup: &api.PeerGroup{
			Conf:      &api.PeerGroupConf{PeerGroupName: group, PeerAsn: peerASN},
			Transport: &api.Transport{LocalAddress: addr.String(), PassiveMode: true},
			AfiSafis:  afiSafis(),
		}}); err != nil {
			return err
		}
		if err := s.AddDynamicNeighbor(ctx, &api.AddDynamicNeighborRequest{DynamicNeighbor: &api.DynamicNeighbor{Prefix: prefix, PeerGroup: group}}); err != nil {
			return err
		}
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /routes", func(w http.ResponseWriter, r *http.Request) {
		routes, err := listRoutes(r.Context(), s)
		writeJSON(w, routes, err)
	})
	mux.HandleFunc("GET /peers", func(w http.ResponseWriter, r *http.Request) {
		peers, err := listPeers(r.Context(), s)
		writeJSON(w, peers, err)
	})
	return serveUntilSignal(*socket, mux, s)
}

func splitASN(s string) (string, uint32, error) {
	left, right, ok := strings.Cut(s, "=")
	if !ok {
		return "", 0, fmt.Errorf("want X=ASN")
	}
	asn, err := strconv.ParseUint(right, 10, 32)
	if err != nil || asn == 0 {
		return "", 0, fmt.Errorf("bad AS number %q", right)
	}
	return left, uint32(asn), nil
}

// listRoutes returns every path of the global RIB (all peers' paths, not only the best), in
// a stable order.
func listRoutes(ctx context.Context, s *server.BgpServer) ([]Route, error) {
	out := []Route{}
	for _, family := range unicastFamilies {
		var convErr error
		err := s.ListPath(ctx, &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: family}, func(d *api.Destination) {
			for _, p := range d.Paths {
				r, err := toRoute(d.Prefix, p)
				if err != nil {
					convErr = err
					return
				}
				out = append(out, r)
			}
		})
		if err != nil {
			return nil, err
		}
		if convErr != nil {
			return nil, convErr
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Prefix != out[j].Prefix {
			return out[i].Prefix < out[j].Prefix
		}
		return out[i].Peer < out[j].Peer
	})
	return out, nil
}

func toRoute(prefix string, p *api.Path) (Route, error) {
	r := Route{Prefix: prefix, Peer: p.NeighborIp, Best: p.Best, ASPath: []uint32{}}
	attrs, err := apiutil.GetNativePathAttributes(p)
	if err != nil {
		return r, err
	}
	for _, a := range attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			r.NextHop = a.Value.String()
		case *bgp.PathAttributeMpReachNLRI:
			r.NextHop = a.Nexthop.String()
		case *bgp.PathAttributeAsPath:
			for _, seg := range a.Value {
				r.ASPath = append(r.ASPath, seg.GetAS()...)
			}
		case *bgp.PathAttributeCommunities:
			for _, v := range a.Value {
				if name, ok := bgp.WellKnownCommunityNameMap[bgp.WellKnownCommunity(v)]; ok {
					r.Communities = append(r.Communities, name)
				} else {
					r.Communities = append(r.Communities, fmt.Sprintf("%d:%d", v>>16, v&0xffff))
				}
			}
		case *bgp.PathAttributeLargeCommunities:
			for _, v := range a.Values {
				r.LargeCommunities = append(r.LargeCommunities, v.String())
			}
		case *bgp.PathAttributeLocalPref:
			lp := a.Value
			r.LocalPreference = &lp
		}
	}
	return r, nil
}
