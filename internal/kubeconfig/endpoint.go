package kubeconfig

import (
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// hostPort is a normalised host and port: an IP address in its canonical form (IPv4-mapped
// IPv6 addresses as IPv4), or a lower-case DNS name without a trailing dot.
type hostPort struct {
	host string
	// addr is valid when host is an IP address.
	addr netip.Addr
	port uint16
}

func (h hostPort) String() string { return net.JoinHostPort(h.host, strconv.Itoa(int(h.port))) }

func (h hostPort) url() string { return "https://" + h.String() }

func (h hostPort) equal(o hostPort) bool { return h.host == o.host && h.port == o.port }

// parseServer parses a kubeconfig's server: https://<host>[:<port>][/], nothing else. why
// says what is wrong with it.
func parseServer(server string) (hostPort, string) {
	if server == "" {
		return hostPort{}, "is not set"
	}
	u, err := url.Parse(server)
	switch {
	case err != nil:
		return hostPort{}, quote(server) + " is not a URL"
	case u.Scheme != "https":
		return hostPort{}, quote(server) + " is not an https URL, and guestnet sends credentials over TLS only"
	case u.Opaque != "" || u.Host == "":
		return hostPort{}, quote(server) + " has no host"
	case u.User != nil:
		return hostPort{}, quote(server) + " holds a user name or password"
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return hostPort{}, quote(server) + " has a query or fragment"
	case u.Path != "" && u.Path != "/":
		return hostPort{}, quote(server) + " has a path, and the Cluster's spec.controlPlaneEndpoint has none"
	}
	port := uint64(443)
	if p := u.Port(); p != "" {
		if port, err = strconv.ParseUint(p, 10, 16); err != nil || port == 0 {
			return hostPort{}, quote(server) + " has no valid port"
		}
	}
	h, why := parseHost(u.Hostname())
	if why != "" {
		return hostPort{}, why
	}
	h.port = uint16(port)
	return h, ""
}

// parseHost parses an IP address or a DNS name. why says what is wrong with it.
func parseHost(s string) (hostPort, string) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return hostPort{}, quote(s) + " has an IPv6 zone"
		}
		a = a.Unmap()
		return hostPort{host: a.String(), addr: a}, ""
	}
	name := strings.TrimSuffix(strings.ToLower(s), ".")
	labels := strings.Split(name, ".")
	if len(validation.IsDNS1123Subdomain(name)) > 0 || numeric(labels[len(labels)-1]) {
		// A name whose last label is a number is an IPv4 address in a form that some
		// resolvers accept (inet_aton: 127.1, 0x7f.0.0.1, 2130706433), never a DNS name.
		return hostPort{}, quote(s) + " is not an IP address or a DNS name"
	}
	return hostPort{host: name}, ""
}

// numeric reports whether label is a decimal, octal or hexadecimal number as inet_aton reads
// one.
func numeric(label string) bool {
	digits := label
	if rest, ok := strings.CutPrefix(label, "0x"); ok {
		digits = rest
		for _, r := range digits {
			if !strings.ContainsRune("0123456789abcdef", r) {
				return false
			}
		}
		return true
	}
	for _, r := range digits {
		if r < '0' || r > '9' {
			return false
		}
	}
	return digits != ""
}

// Addresses of cloud metadata services outside the link-local range (the usual one,
// 169.254.169.254, is link-local): Alibaba Cloud's IPv4 and AWS's IPv6 instance metadata.
var metadataAddresses = []netip.Addr{
	netip.MustParseAddr("100.100.100.200"),
	netip.MustParseAddr("fd00:ec2::254"),
}

// nat64 is the well-known NAT64 prefix (RFC 6052): its addresses reach the IPv4 address
// they embed.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// specialPurpose says why guestnet never connects to h, or "" when it may: a name of the
// loopback interface (RFC 6761), or an address that is not a guest apiserver's
// (RFC 6890's special-purpose ranges that reach this host, its link, or many hosts; the
// cloud metadata services). Private ranges are allowed: guest apiservers live there.
func specialPurpose(h hostPort) string {
	if !h.addr.IsValid() {
		if h.host == "localhost" || strings.HasSuffix(h.host, ".localhost") {
			return quote(h.host) + " is a name of the loopback interface, and guestnet never connects there"
		}
		return ""
	}
	a := h.addr
	if a.Is6() && nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte(b[12:]))
	}
	what := ""
	switch {
	case a.IsUnspecified():
		what = "the unspecified address"
	case a.IsLoopback():
		what = "a loopback address"
	case a.IsLinkLocalUnicast():
		what = "a link-local address (the cloud metadata service answers at 169.254.169.254)"
	case a.IsMulticast():
		what = "a multicast address"
	case a.Is4() && a.As4()[0] == 0:
		what = "in 0.0.0.0/8 (this host)"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		what = "the broadcast address"
	case a.Is6() && [12]byte(a.AsSlice()[:12]) == [12]byte{}:
		what = "an IPv4-compatible IPv6 address (deprecated)"
	default:
		for _, m := range metadataAddresses {
			if a == m {
				what = "the address of a cloud metadata service"
			}
		}
	}
	if what == "" {
		return ""
	}
	return h.host + " is " + what + ", and guestnet never connects there"
}
