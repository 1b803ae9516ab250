package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// The lab's BGP: lab-bgp (hack/tools/labbgp, GoBGP as a library, built by the Makefile) runs
// real BGP sessions over TCP inside the lab's network namespace. BGPRouterAddress and the
// speakers' node addresses are in 10.244.0.0/16, local to lo there (hack/labns).

const (
	// BGPRouterAddress is where the lab's upstream router listens by default (port 179).
	BGPRouterAddress = "10.244.0.179"
	// BGPRouterASN is the router's AS number by default.
	BGPRouterASN = 65000
)

// BGPRouterOptions configure the lab's upstream router (StartBGPRouter).
type BGPRouterOptions struct {
	// Address to listen on; BGPRouterAddress when empty. Must be local in the lab namespace.
	Address string
	// Port to listen on; 179 when 0.
	Port int
	// ASN is the router's AS number; BGPRouterASN when 0.
	ASN uint32
	// Neighbors are the speakers the router accepts, each from its own address (a speaker
	// must bind its node address as the session's source: in the lab namespace every address
	// is on lo, so the kernel would otherwise pick the router's own).
	Neighbors []BGPNeighbor
	// DynamicNeighbors accept any speaker whose address is in a prefix.
	DynamicNeighbors []BGPDynamicNeighbor
}

// BGPNeighbor is one speaker the router accepts.
type BGPNeighbor struct {
	Address string
	ASN     uint32
}

// BGPDynamicNeighbor accepts every speaker in Prefix, of AS ASN.
type BGPDynamicNeighbor struct {
	Prefix string
	ASN    uint32
}

// BGPRouter is the lab's upstream router: real BGP (GoBGP), passive, IPv4 and IPv6 unicast.
// It logs to <lab>/bgp-router-<address>.log.
type BGPRouter struct {
	Address string
	Port    int
	ASN     uint32

	proc   *process
	api    *http.Client
	socket string
}

// BGPRoute is one path the router learned from a peer.
type BGPRoute struct {
	// Prefix is "10.98.0.5/32" or "fd00::5/128".
	Prefix  string   `json:"prefix"`
	NextHop string   `json:"nextHop"`
	ASPath  []uint32 `json:"asPath"`
	// Communities: "65000:100", and well-known ones by the names Cilium's
	// CiliumBGPAdvertisement uses ("no-export", "no-advertise", "blackhole", ...).
	Communities []string `json:"communities,omitempty"`
	// LargeCommunities: "65000:1:2".
	LargeCommunities []string `json:"largeCommunities,omitempty"`
	// LocalPreference: only iBGP sessions carry LOCAL_PREF.
	LocalPreference *uint32 `json:"localPreference,omitempty"`
	// Peer is the neighbor's address the path came from.
	Peer string `json:"peer"`
	// Best is whether the router selected the path for the prefix.
	Best bool `json:"best"`
}

// BGPPeer is a BGP session and its state ("established", "active", "idle", ...).
type BGPPeer struct {
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	State   string `json:"state"`
}

// StartBGPRouter starts the lab's upstream router and waits until its API answers. It stops
// with the lab, or with Stop.
func (l *Lab) StartBGPRouter(ctx context.Context, opts BGPRouterOptions) (*BGPRouter, error) {
	r := &BGPRouter{Address: opts.Address, Port: opts.Port, ASN: opts.ASN}
	if r.Address == "" {
		r.Address = BGPRouterAddress
	}
	if r.Port == 0 {
		r.Port = 179
	}
	if r.ASN == 0 {
		r.ASN = BGPRouterASN
	}
	args := []string{"router", "--address=" + r.Address, "--port=" + strconv.Itoa(r.Port), "--asn=" + strconv.FormatUint(uint64(r.ASN), 10)}
	for _, n := range opts.Neighbors {
		args = append(args, fmt.Sprintf("--neighbor=%s=%d", n.Address, n.ASN))
	}
	for _, n := range opts.DynamicNeighbors {
		args = append(args, fmt.Sprintf("--dynamic-neighbors=%s=%d", n.Prefix, n.ASN))
	}
	proc, client, socket, err := l.startLabBGP(ctx, "bgp-router-"+r.Address, args)
	if err != nil {
		return nil, err
	}
	r.proc, r.api, r.socket = proc, client, socket
	l.onStop(r.Stop)
	return r, nil
}

// Routes returns every path the router holds (all peers' paths, best or not), sorted by
// prefix and peer.
func (r *BGPRouter) Routes(ctx context.Context) ([]BGPRoute, error) {
	var out []BGPRoute
	return out, getJSON(ctx, r.api, "/routes", &out)
}

// Peers returns the router's sessions.
func (r *BGPRouter) Peers(ctx context.Context) ([]BGPPeer, error) {
	var out []BGPPeer
	return out, getJSON(ctx, r.api, "/peers", &out)
}

// RoutesFor returns the router's paths for prefix.
func (r *BGPRouter) RoutesFor(ctx context.Context, prefix string) ([]BGPRoute, error) {
	all, err := r.Routes(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(rt BGPRoute) bool { return rt.Prefix != prefix }), nil
}

// WaitForRoutes polls the router's paths for prefix until ok accepts them or ctx ends; the
// error then shows the last paths seen.
func (r *BGPRouter) WaitForRoutes(ctx context.Context, prefix string, ok func([]BGPRoute) bool) ([]BGPRoute, error) {
	var last []BGPRoute
	var lastErr error
	for {
		last, lastErr = r.RoutesFor(ctx, prefix)
		if lastErr == nil && ok(last) {
			return last, nil
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("routes for %s: last seen %+v (last error: %s): %w", prefix, last, errorText(lastErr), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func errorText(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}

// Stop stops the router; its peers' sessions go down.
func (r *BGPRouter) Stop() {
	r.proc.stop()
	_ = os.RemoveAll(filepath.Dir(r.socket))
}

// startLabBGP runs lab-bgp with args and an API socket, logging to <lab>/<name>.log, and
// waits until GET /peers answers. The socket lives in a short temporary directory: a unix
// socket's path must stay under 108 bytes, and the lab directory of a long test name does not.
func (l *Lab) startLabBGP(ctx context.Context, name string, args []string) (*process, *http.Client, string, error) {
	bin, err := findFile(l.Assets.binDirs, "lab-bgp")
	if err != nil {
		return nil, nil, "", err
	}
	dir, err := os.MkdirTemp("", "lab-bgp-")
	if err != nil {
		return nil, nil, "", err
	}
	socket := filepath.Join(dir, "api.sock")
	p, err := startProcess(l.Dir, name, bin, append(args, "--api-socket="+socket)...)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, "", err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	readyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.waitReady(readyCtx, func(ctx context.Context) error {
		var peers []BGPPeer
		return getJSON(ctx, client, "/peers", &peers)
	}); err != nil {
		p.stop()
		_ = os.RemoveAll(dir)
		return nil, nil, "", err
	}
	return p, client, socket, nil
}

func getJSON(ctx context.Context, c *http.Client, path string, out any) error {
	return doJSON(ctx, c, http.MethodGet, path, nil, out)
}

func doJSON(ctx context.Context, c *http.Client, method, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://lab-bgp"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("lab-bgp %s %s: %s: %s", method, path, resp.Status, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}
