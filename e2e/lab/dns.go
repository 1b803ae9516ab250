package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// HostDNSAddress is where the host cluster's DNS stand-in answers (UDP port 53), and the only
// nameserver of the guest kube-apiserver.
const HostDNSAddress = "127.0.10.53"

// hostDNS stands in for the host cluster's DNS (CoreDNS's kubernetes plugin), which the
// hosted guest apiserver uses in production: its pod lives on the host network with the
// host's ClusterFirst DNS, so it resolves host Service names, and only those matter here.
//
// It answers A queries for <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local with the host
// Service's ClusterIP, read live from the host apiserver on every query (no cache: a Service
// guestnet has just created resolves at once, as CoreDNS's watch makes it resolve within a
// moment). A Service that exists but has no ClusterIP (headless, ExternalName) and AAAA
// queries get an empty answer (NODATA); every other name is NXDOMAIN, since nothing outside
// the lab exists. UDP only: answers are far below 512 bytes.
type hostDNS struct {
	conn   net.PacketConn
	host   atomic.Pointer[client.Client]
	wg     sync.WaitGroup
	closed atomic.Bool
}

// startHostDNS listens on HostDNSAddress:53. Until setHost is called it answers SERVFAIL.
func startHostDNS() (*hostDNS, error) {
	conn, err := net.ListenPacket("udp", net.JoinHostPort(HostDNSAddress, "53"))
	if err != nil {
		return nil, fmt.Errorf("host DNS stand-in: %w", err)
	}
	d := &hostDNS{conn: conn}
	d.wg.Go(d.serve)
	return d, nil
}

func (d *hostDNS) setHost(c client.Client) { d.host.Store(&c) }

func (d *hostDNS) stop() {
	if d == nil {
		return
	}
	d.closed.Store(true)
	_ = d.conn.Close()
	d.wg.Wait()
}

func (d *hostDNS) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := d.conn.ReadFrom(buf)
		if err != nil {
			if d.closed.Load() {
				return
			}
			continue
		}
		query := append([]byte(nil), buf[:n]...)
		d.wg.Go(func() {
			if resp, err := d.answer(query); err == nil {
				_, _ = d.conn.WriteTo(resp, from)
			}
		})
	}
}

func (d *hostDNS) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	hdr, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	rcode, ip := d.resolve(q)
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: hdr.ID, Response: true, Authoritative: true, RecursionDesired: hdr.RecursionDesired, RCode: rcode,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if ip.IsValid() {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5}
		if err := b.AResource(rh, dnsmessage.AResource{A: ip.As4()}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// resolve maps a question to an answer: NXDOMAIN, or success with an address or none (NODATA).
func (d *hostDNS) resolve(q dnsmessage.Question) (dnsmessage.RCode, netip.Addr) {
	key, ok := hostServiceName(q.Name.String())
	if !ok || q.Class != dnsmessage.ClassINET {
		return dnsmessage.RCodeNameError, netip.Addr{}
	}
	host := d.host.Load()
	if host == nil {
		return dnsmessage.RCodeServerFailure, netip.Addr{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	svc := &corev1.Service{}
	if err := (*host).Get(ctx, key, svc); err != nil {
		if apierrors.IsNotFound(err) {
			return dnsmessage.RCodeNameError, netip.Addr{}
		}
		return dnsmessage.RCodeServerFailure, netip.Addr{}
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if q.Type != dnsmessage.TypeA || err != nil || !ip.Is4() {
		return dnsmessage.RCodeSuccess, netip.Addr{}
	}
	return dnsmessage.RCodeSuccess, ip
}

// hostServiceName parses <svc>.<ns>.svc[.cluster.local][.] into the Service's key.
func hostServiceName(name string) (types.NamespacedName, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, suffix := range []string{".svc.cluster.local", ".svc"} {
		if rest, ok := strings.CutSuffix(name, suffix); ok {
			svc, ns, ok := strings.Cut(rest, ".")
			if !ok || svc == "" || ns == "" || strings.Contains(ns, ".") {
				return types.NamespacedName{}, false
			}
			return types.NamespacedName{Namespace: ns, Name: svc}, true
		}
	}
	return types.NamespacedName{}, false
}

// writeGuestResolvConf writes the resolv.conf the guest kube-apiserver sees (bind-mounted over
// /etc/resolv.conf for that process only, see ControlPlaneOptions.ResolvConf): the host DNS
// stand-in, with the search list and ndots of a ClusterFirst pod, as the hosted control
// plane's pod has in production.
func writeGuestResolvConf(path string) error {
	conf := "# Written by the guestnet lab: the host cluster's DNS, as a hosted control plane pod sees it.\n" +
		"nameserver " + HostDNSAddress + "\n" +
		"search svc.cluster.local cluster.local\n" +
		"options ndots:5 timeout:1 attempts:2\n"
	return os.WriteFile(path, []byte(conf), 0o644)
}
