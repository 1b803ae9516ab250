package bridge

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ProbeTimeout bounds one probe: the guest apiserver's own webhook timeout is 10 s by
// default, and a probe that takes longer says as much as one that fails.
const ProbeTimeout = 5 * time.Second

// ProbeResult is what a probe of a bridged target found, from the host network (where the
// controller runs, like the guest apiserver).
type ProbeResult struct {
	// Answered: a TLS handshake completed.
	Answered bool
	// Verified: the certificate verifies against the caBundle for the server name.
	Verified bool
	// Insecure: the target does not verify certificates (APIService insecureSkipTLSVerify),
	// so only Answered counts.
	Insecure bool
	// NameMissing: the certificate verifies against the caBundle but does not carry the
	// server name; DNSNames and IPs are the names it carries.
	NameMissing bool
	DNSNames    []string
	IPs         []string
	// Detail is the error of a failed probe.
	Detail string
}

// OK reports whether the guest apiserver can call the target through the bridge.
func (r ProbeResult) OK() bool { return r.Answered && (r.Verified || r.Insecure) }

// Probe dials addr (the host Service's ClusterIP and port) and checks the TLS certificate the
// guest apiserver will get: against caBundle, for serverName (the name it dials). With
// insecure, only the handshake counts, as for the aggregator.
func Probe(ctx context.Context, addr, serverName string, caBundle []byte, insecure bool) ProbeResult {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	dialer := &tls.Dialer{Config: &tls.Config{
		ServerName: serverName,
		// Verified below, so that a name mismatch can be told from an untrusted certificate.
		InsecureSkipVerify: true, //nolint:gosec // verification is done by hand right after the handshake
		MinVersion:         tls.VersionTLS12,
		// HTTP/2 and HTTP/1.1, as the apiserver's client offers.
		NextProtos: []string{"h2", "http/1.1"},
	}}
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return ProbeResult{Detail: dialError(err)}
	}
	defer conn.Close()
	state := conn.(*tls.Conn).ConnectionState()
	result := ProbeResult{Answered: true, Insecure: insecure}
	if len(state.PeerCertificates) == 0 {
		result.Detail = "the server sent no certificate"
		return result
	}
	leaf := state.PeerCertificates[0]
	result.DNSNames = leaf.DNSNames
	for _, ip := range leaf.IPAddresses {
		result.IPs = append(result.IPs, ip.String())
	}
	if insecure {
		return result
	}
	roots := x509.NewCertPool()
	if len(caBundle) == 0 || !roots.AppendCertsFromPEM(caBundle) {
		result.Detail = "the caBundle is empty or holds no PEM certificate: nothing to verify the server against (is it injected yet?)"
		return result
	}
	intermediates := x509.NewCertPool()
	for _, c := range state.PeerCertificates[1:] {
		intermediates.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: intermediates}
	if _, err := leaf.Verify(opts); err != nil {
		result.Detail = "certificate does not verify against the caBundle: " + verifyError(err, leaf)
		return result
	}
	if err := leaf.VerifyHostname(serverName); err != nil {
		result.NameMissing = true
		result.Detail = err.Error()
		return result
	}
	result.Verified = true
	return result
}

// dialError shortens a dial error to what it says about the path.
func dialError(err error) string {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Err != nil {
		return fmt.Sprintf("%s %s: %v", opErr.Op, opErr.Addr, opErr.Err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("no answer within %s", ProbeTimeout)
	}
	return strings.TrimSpace(err.Error())
}

// verifyError says why a certificate does not verify, in words that stay the same from one
// probe to the next: Go's message for an expired certificate carries the current time, which
// would change the status at every probe.
func verifyError(err error, leaf *x509.Certificate) string {
	var invalid x509.CertificateInvalidError
	if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
		return fmt.Sprintf("x509: certificate expired at %s or is not valid before %s; renew it",
			leaf.NotAfter.UTC().Format(time.RFC3339), leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return err.Error()
}

// ProbeInputs is everything a probe's answer depends on that guestnet can see: where it
// dials, the name and CA it verifies with, and the endpoints behind the host Service. A probe
// is repeated when they change; otherwise only after a long safety interval (the server
// behind them can change without guestnet seeing it, e.g. a certificate renewed in place),
// or when the bridge's recheck annotation changes.
type ProbeInputs struct {
	Addr       string
	ServerName string
	CABundle   []byte
	Insecure   bool
	// Endpoints are the ready endpoints of the host Service ("<address>:<port>"), in any order.
	Endpoints []string
	// Recheck is the value of the bridge's recheck annotation.
	Recheck string
}

// Key is a digest of the inputs: equal keys, equal inputs.
func (in ProbeInputs) Key() string {
	endpoints := slices.Clone(in.Endpoints)
	slices.Sort(endpoints)
	h := sha256.New()
	for _, part := range []string{in.Addr, in.ServerName, string(in.CABundle), strconv.FormatBool(in.Insecure), strings.Join(endpoints, ","), in.Recheck} {
		fmt.Fprintf(h, "%d:%s;", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))
}
