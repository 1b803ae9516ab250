package ingress

import (
	"net/netip"
	"strconv"
)

// Address keys index address space so that the claims that may collide with one are found
// without reading every claim of the host: a fleet of N GuestIngresses would otherwise cost
// O(N) per reconcile and O(N²) to converge (docs/performance.md).
//
// Address space is cut in levels: every 4 bits for IPv4 (/4, /8 … /32), every 16 for IPv6
// (/16 … /128). A prefix of p bits lives at its level L, the longest level no longer than p.
// It is filed under
//   - "own" at L, the L-block it lies in: found by the narrower prefixes inside that block;
//   - "in" at every level up to L, the block at that level it lies in: found by the prefixes
//     of that level or wider;
//   - "wide" when it is wider than the first level: found by every query of its family.
//
// A query for a prefix q at level Lq asks "in" at Lq (every prefix at least as narrow as Lq in
// q's Lq-block: those inside q and those around it down to Lq), "own" at every level before Lq
// (the wider prefixes around q) and "wide". Two prefixes overlap only when one holds the other,
// so every prefix that overlaps q is under one of these keys; some that do not are too (a
// /30 query finds every claim inside its /28), and the caller checks each candidate. A
// hosting provider hands out single IPs of a few /24s: a level of its own for single
// addresses keeps a reconcile from reading every claim of its /24.

// levelOf is the family of p ("4" or "6"), the width of its levels and the level p lives at;
// level is -1 when p is wider than the first level.
func levelOf(p netip.Prefix) (family string, step, level int) {
	step, last, family := 16, 128, "6"
	if p.Addr().Is4() {
		step, last, family = 4, 32, "4"
	}
	if p.Bits() < step {
		return family, step, -1
	}
	return family, step, min(p.Bits()/step*step, last)
}

func addressKey(family, kind string, level int, p netip.Prefix) string {
	block := netip.PrefixFrom(p.Addr(), level).Masked().Addr()
	return family + "/" + kind + "/" + strconv.Itoa(level) + "/" + block.String()
}

// AddressKeys are the index keys of address space (see above): what the index files a claim
// of these prefixes under.
func AddressKeys(prefixes []netip.Prefix) []string {
	var keys []string
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		family, step, level := levelOf(p)
		if level < 0 {
			keys = appendNew(keys, family+"/wide")
			continue
		}
		keys = appendNew(keys, addressKey(family, "own", level, p))
		for l := step; l <= level; l += step {
			keys = appendNew(keys, addressKey(family, "in", l, p))
		}
	}
	return keys
}

// AddressQuery are the index keys under which every claim that overlaps one of prefixes is
// filed (AddressKeys). all says that one of them is wider than the first level: the index
// cannot narrow it down, and every claim must be read.
func AddressQuery(prefixes []netip.Prefix) (keys []string, all bool) {
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		family, step, level := levelOf(p)
		if level < 0 {
			return nil, true
		}
		keys = appendNew(keys, addressKey(family, "in", level, p))
		for l := step; l < level; l += step {
			keys = appendNew(keys, addressKey(family, "own", l, p))
		}
		keys = appendNew(keys, family+"/wide")
	}
	return keys, false
}

// Addresses is the claim's address space as prefixes: its ranges, and its IP as a one-address
// range.
func (c Claim) Addresses() []netip.Prefix { return c.withIP() }

func appendNew(keys []string, key string) []string {
	for _, k := range keys {
		if k == key {
			return keys
		}
	}
	return append(keys, key)
}
