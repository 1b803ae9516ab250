package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// Families every session of the lab negotiates: IPv4 and IPv6 unicast.
var unicastFamilies = []*api.Family{
	{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST},
	{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST},
}

func afiSafis() []*api.AfiSafi {
	var out []*api.AfiSafi
	for _, f := range unicastFamilies {
		out = append(out, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: f, Enabled: true}})
	}
	return out
}

// Peer is a BGP session as the lab reports it.
type Peer struct {
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	// State is the session's FSM state in lower case: "established", "active", "idle", ...
	State string `json:"state"`
}

func listPeers(ctx context.Context, s *server.BgpServer) ([]Peer, error) {
	var out []Peer
	err := s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		out = append(out, Peer{
			Address: p.GetState().GetNeighborAddress(),
			ASN:     p.GetState().GetPeerAsn(),
			State:   strings.ToLower(p.GetState().GetSessionState().String()),
		})
	})
	return out, err
}

// newServer starts a GoBGP server whose log goes to stderr (the lab's log file).
func newServer(ctx context.Context, global *api.Global) (*server.BgpServer, error) {
	s := server.NewBgpServer(server.LoggerOption(&slogLogger{l: slog.New(slog.NewTextHandler(os.Stderr, nil))}))
	go s.Serve()
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		return nil, err
	}
	return s, nil
}

// serveUntilSignal serves mux on a unix socket at path until SIGTERM or SIGINT, then stops s.
func serveUntilSignal(path string, mux *http.ServeMux, s *server.BgpServer) error {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		_ = s.StopBgp(context.Background(), &api.StopBgpRequest{})
		_ = srv.Close()
	}()
	slog.Info("serving the API", "socket", path)
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// hostPort joins an address and a port.
func hostPort(addr string, port int) string { return net.JoinHostPort(addr, strconv.Itoa(port)) }

// slogLogger routes GoBGP's log through slog.
type slogLogger struct {
	l     *slog.Logger
	level log.LogLevel
}

func (s *slogLogger) attrs(f log.Fields) []any {
	var out []any
	for k, v := range f {
		out = append(out, k, v)
	}
	return out
}

func (s *slogLogger) Panic(msg string, f log.Fields) { s.l.Error(msg, s.attrs(f)...); panic(msg) }
func (s *slogLogger) Fatal(msg string, f log.Fields) { s.l.Error(msg, s.attrs(f)...); os.Exit(1) }
func (s *slogLogger) Error(msg string, f log.Fields) { s.l.Error(msg, s.attrs(f)...) }
func (s *slogLogger) Warn(msg string, f log.Fields)  { s.l.Warn(msg, s.attrs(f)...) }
func (s *slogLogger) Info(msg string, f log.Fields)  { s.l.Info(msg, s.attrs(f)...) }
func (s *slogLogger) Debug(msg string, f log.Fields) {
	if s.level >= log.DebugLevel {
		s.l.Debug(msg, s.attrs(f)...)
	}
}
func (s *slogLogger) SetLevel(level log.LogLevel) { s.level = level }
func (s *slogLogger) GetLevel() log.LogLevel      { return s.level }

// checkIdentity checks the flags both subcommands share: a specific --address, an --asn and
// an --api-socket; an empty --router-id (routerID) becomes the address when it is IPv4.
func checkIdentity(address string, asn uint, socket string, routerID *string) (netip.Addr, error) {
	addr, err := netip.ParseAddr(address)
	if err != nil || addr.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("--address must be a specific address, got %q", address)
	}
	if asn == 0 || socket == "" {
		return netip.Addr{}, fmt.Errorf("--asn and --api-socket are required")
	}
	if *routerID == "" {
		if !addr.Is4() {
			return netip.Addr{}, fmt.Errorf("--router-id is required with an IPv6 --address")
		}
		*routerID = addr.String()
	}
	return addr, nil
}
