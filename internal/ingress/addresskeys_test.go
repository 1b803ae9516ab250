package ingress

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
)

// Every prefix that overlaps a query's is filed under one of the query's keys: the index
// never hides a colliding claim. Random pairs in a small space, so that most overlap.
func TestAddressQueryFindsEveryOverlappingPrefix(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(1, 21)) //nolint:gosec // a fixed sequence of test prefixes, no secret
	random := func() netip.Prefix {
		if rnd.IntN(4) == 0 {
			a := netip.MustParseAddr("fd00:10::")
			b := a.As16()
			b[6], b[7], b[8], b[15] = byte(rnd.IntN(3)), byte(rnd.IntN(3)), byte(rnd.IntN(3)), byte(rnd.IntN(4))
			return netip.PrefixFrom(netip.AddrFrom16(b), rnd.IntN(129)).Masked()
		}
		a := netip.AddrFrom4([4]byte{10, byte(rnd.IntN(3)), byte(rnd.IntN(3)), byte(rnd.IntN(4))})
		return netip.PrefixFrom(a, rnd.IntN(33)).Masked()
	}
	overlaps, found := 0, 0
	for range 20000 {
		e, q := random(), random()
		if !e.Overlaps(q) {
			continue
		}
		overlaps++
		keys, all := AddressQuery([]netip.Prefix{q})
		if all || slices.ContainsFunc(AddressKeys([]netip.Prefix{e}), func(k string) bool { return slices.Contains(keys, k) }) {
			found++
			continue
		}
		t.Errorf("%s overlaps %s but is filed under %v, and the query asks %v", e, q, AddressKeys([]netip.Prefix{e}), keys)
	}
	g.Expect(overlaps).To(BeNumerically(">", 1000))
	g.Expect(found).To(Equal(overlaps))
}

// A narrow query asks a handful of keys, and finds only what lies in its block and around it.
func TestAddressQueryOfANarrowClaimIsNarrow(t *testing.T) {
	g := NewWithT(t)
	ip := []netip.Prefix{netip.MustParsePrefix("10.2.6.220/32")}
	keys, all := AddressQuery(ip)
	g.Expect(all).To(BeFalse())
	g.Expect(keys).To(HaveLen(9))
	g.Expect(keys).To(ContainElements("4/in/32/10.2.6.220", "4/own/24/10.2.6.0", "4/wide"))

	g.Expect(AddressKeys([]netip.Prefix{netip.MustParsePrefix("10.2.6.221/32")})).NotTo(ContainElement(BeElementOf(keys)),
		"another single IP of the same /24 is not a candidate")
	g.Expect(AddressKeys([]netip.Prefix{netip.MustParsePrefix("10.2.7.1/32")})).NotTo(ContainElement(BeElementOf(keys)))
	g.Expect(AddressKeys([]netip.Prefix{netip.MustParsePrefix("10.2.6.216/29")})).To(ContainElement(BeElementOf(keys)), "a pool around it is")
	g.Expect(AddressKeys([]netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")})).To(ContainElement(BeElementOf(keys)), "the /16 around it is")

	_, all = AddressQuery([]netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")})
	g.Expect(all).To(BeTrue(), "a query wider than the first level reads everything")
	g.Expect(AddressKeys([]netip.Prefix{netip.MustParsePrefix("8.0.0.0/3")})).To(Equal([]string{"4/wide"}))
}
