package bridge

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// The probes below dial only servers this test starts on 127.0.0.1.

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// newCA makes a self-signed CA, or one signed by parent.
func newCA(t *testing.T, name string, parent *testCA) *testCA {
	t.Helper()
	serial++
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serving is a serving certificate signed by ca; chain is sent after it.
func (ca *testCA) serving(t *testing.T, dnsNames []string, ips []net.IP, notAfter time.Time, chain ...*testCA) tls.Certificate {
	t.Helper()
	serial++
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "webhook"},
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	for _, link := range chain {
		c.Certificate = append(c.Certificate, link.cert.Raw)
	}
	return c
}

// serveTLS serves cert on 127.0.0.1 until the test ends, and returns the address.
func serveTLS(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				_ = conn.(*tls.Conn).Handshake()
				_, _ = conn.Read(make([]byte, 1)) // until the client hangs up
			}()
		}
	}()
	return l.Addr().String()
}

// serveTCP serves plain HTTP on 127.0.0.1: no TLS.
func serveTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = conn.Read(make([]byte, 4096))
				_, _ = conn.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			}()
		}
	}()
	return l.Addr().String()
}

// closedPort is an address on 127.0.0.1 nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestProbe(t *testing.T) {
	const bridgeName = cmHostService + ".k0smotron.svc"
	chartNames := []string{"cert-manager-webhook", "cert-manager-webhook.cert-manager", "cert-manager-webhook.cert-manager.svc"}
	later := time.Now().Add(time.Hour)
	ca := newCA(t, "cert-manager-webhook-ca", nil)
	otherCA := newCA(t, "someone-else", nil)
	intermediate := newCA(t, "intermediate", ca)

	tests := []struct {
		name       string
		addr       func(t *testing.T) string
		serverName string
		caBundle   []byte
		insecure   bool

		want       ProbeResult // Detail is checked with wantDetail
		wantDetail string
	}{
		{
			name: "the bridge's name in the certificate, verified",
			addr: func(t *testing.T) string {
				return serveTLS(t, ca.serving(t, append(chartNames, bridgeName), nil, later))
			},
			serverName: bridgeName, caBundle: ca.pem,
			want: ProbeResult{Answered: true, Verified: true, DNSNames: append(chartNames, bridgeName)},
		},
		{
			name: "chain through an intermediate the server sends",
			addr: func(t *testing.T) string {
				return serveTLS(t, intermediate.serving(t, []string{bridgeName}, nil, later, intermediate))
			},
			serverName: bridgeName, caBundle: ca.pem,
			want: ProbeResult{Answered: true, Verified: true, DNSNames: []string{bridgeName}},
		},
		{
			name:       "cert-manager's certificate without the bridge's name",
			addr:       func(t *testing.T) string { return serveTLS(t, ca.serving(t, chartNames, nil, later)) },
			serverName: bridgeName, caBundle: ca.pem,
			want:       ProbeResult{Answered: true, NameMissing: true, DNSNames: chartNames},
			wantDetail: "certificate is valid for cert-manager-webhook, cert-manager-webhook.cert-manager, cert-manager-webhook.cert-manager.svc, not " + bridgeName,
		},
		{
			// The field report's workaround: url at a worker IP, DNS SANs only.
			name:       "an IP against DNS names only",
			addr:       func(t *testing.T) string { return serveTLS(t, ca.serving(t, chartNames, nil, later)) },
			serverName: "127.0.0.1", caBundle: ca.pem,
			want:       ProbeResult{Answered: true, NameMissing: true, DNSNames: chartNames},
			wantDetail: "doesn't contain any IP SANs",
		},
		{
			name: "IP SANs are listed",
			addr: func(t *testing.T) string {
				return serveTLS(t, ca.serving(t, nil, []net.IP{net.ParseIP("10.0.2.2")}, later))
			},
			serverName: bridgeName, caBundle: ca.pem,
			want:       ProbeResult{Answered: true, NameMissing: true, IPs: []string{"10.0.2.2"}},
			wantDetail: "not valid for any names, but wanted to match " + bridgeName,
		},
		{
			name:       "signed by another CA",
			addr:       func(t *testing.T) string { return serveTLS(t, otherCA.serving(t, []string{bridgeName}, nil, later)) },
			serverName: bridgeName, caBundle: ca.pem,
			want:       ProbeResult{Answered: true, DNSNames: []string{bridgeName}},
			wantDetail: "certificate does not verify against the caBundle: x509: certificate signed by unknown authority",
		},
		{
			name:       "signed by another CA and without the name: the CA is the problem",
			addr:       func(t *testing.T) string { return serveTLS(t, otherCA.serving(t, chartNames, nil, later)) },
			serverName: bridgeName, caBundle: ca.pem,
			want:       ProbeResult{Answered: true, DNSNames: chartNames},
			wantDetail: "unknown authority",
		},
		{
			name: "expired",
			addr: func(t *testing.T) string {
				return serveTLS(t, ca.serving(t, []string{bridgeName}, nil, time.Now().Add(-time.Hour)))
			},
			serverName: bridgeName, caBundle: ca.pem,
			want:       ProbeResult{Answered: true, DNSNames: []string{bridgeName}},
			wantDetail: "certificate expired at ",
		},
		{
			name:       "empty caBundle (not injected yet)",
			addr:       func(t *testing.T) string { return serveTLS(t, ca.serving(t, []string{bridgeName}, nil, later)) },
			serverName: bridgeName,
			want:       ProbeResult{Answered: true, DNSNames: []string{bridgeName}},
			wantDetail: "the caBundle is empty or holds no PEM certificate",
		},
		{
			name:       "caBundle without a PEM certificate",
			addr:       func(t *testing.T) string { return serveTLS(t, ca.serving(t, []string{bridgeName}, nil, later)) },
			serverName: bridgeName, caBundle: []byte("Cg=="),
			want:       ProbeResult{Answered: true, DNSNames: []string{bridgeName}},
			wantDetail: "the caBundle is empty or holds no PEM certificate",
		},
		{
			name:       "insecureSkipTLSVerify: any certificate answers",
			addr:       func(t *testing.T) string { return serveTLS(t, otherCA.serving(t, []string{"localhost"}, nil, later)) },
			serverName: "metrics-server-guestnet.kube-system.svc", insecure: true,
			want: ProbeResult{Answered: true, Insecure: true, DNSNames: []string{"localhost"}},
		},
		{
			name:       "nothing listening",
			addr:       closedPort,
			serverName: bridgeName, caBundle: ca.pem,
			wantDetail: "connection refused",
		},
		{
			name:       "nothing listening, insecure",
			addr:       closedPort,
			serverName: bridgeName, insecure: true,
			wantDetail: "connection refused",
		},
		{
			name:       "no TLS on the port",
			addr:       serveTCP,
			serverName: bridgeName, caBundle: ca.pem,
			wantDetail: "does not look like a TLS handshake",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			addr := tt.addr(t)
			host, _, err := net.SplitHostPort(addr)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(net.ParseIP(host).IsLoopback()).To(BeTrue(), "dial 127.x only")

			got := Probe(context.Background(), addr, tt.serverName, tt.caBundle, tt.insecure)
			g.Expect(got.Detail).To(ContainSubstring(tt.wantDetail))
			// Details go into status: the time of the probe must not (Go's own message for an
			// expired certificate carries it).
			g.Expect(got.Detail).NotTo(ContainSubstring("current time"))
			if tt.wantDetail == "" {
				g.Expect(got.Detail).To(BeEmpty())
			}
			got.Detail = ""
			g.Expect(got).To(Equal(tt.want))
			g.Expect(got.OK()).To(Equal(tt.want.Verified || tt.want.Answered && tt.want.Insecure))
		})
	}
}

func TestProbeCancelled(t *testing.T) {
	g := NewWithT(t)
	ca := newCA(t, "ca", nil)
	addr := serveTLS(t, ca.serving(t, []string{"x.svc"}, nil, time.Now().Add(time.Hour)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got := Probe(ctx, addr, "x.svc", ca.pem, false)
	g.Expect(got.Answered).To(BeFalse())
	g.Expect(got.Detail).NotTo(BeEmpty())
}
