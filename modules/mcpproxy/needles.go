package mcpproxy

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
)

// The search for a call's credential runs on every message an upstream
// sends for a call that has one, megabytes of results included. It looks
// for some twenty pieces of the credential (its own in eight bytes, its
// base64 at three offsets in two alphabets): one bytes.Index each would
// read a megabyte twenty times over (2.5 ms). A needleSet reads it once,
// and only every fifth position of it.

// gramLen is how many bytes of the text a needleSet looks up at once.
const gramLen = 4

// A needleSet reports which groups of needles (strings of gramLen bytes
// or more) a text holds. It looks up the gram at every step-th position of
// the text (step is the shortest needle's length less gramLen, plus one,
// so that one such position falls within every occurrence of a needle at
// one of its first step offsets), first in a bit filter of the grams of
// every needle at every offset, then in a map of them.
type needleSet struct {
	step   int
	all    uint8 // every group that has a needle
	filter [1 << 16 / 64]uint64
	grams  map[uint32][]needleAt
}

// needleAt is a needle whose gram at offset off was looked up.
type needleAt struct {
	needle string
	off    int
	group  uint8
}

// newNeedleSet is the set of the needles of each group: groups[g] are the
// needles of group 1<<g. Needles shorter than gramLen are left out.
func newNeedleSet(groups ...[]string) *needleSet {
	n := &needleSet{grams: map[uint32][]needleAt{}}
	shortest := 0
	for _, needles := range groups {
		for _, s := range needles {
			if len(s) >= gramLen && (shortest == 0 || len(s) < shortest) {
				shortest = len(s)
			}
		}
	}
	if shortest == 0 {
		return n
	}
	n.step = shortest - gramLen + 1
	for g, needles := range groups {
		for _, s := range needles {
			if len(s) < gramLen {
				continue
			}
			n.all |= 1 << g
			for off := 0; off+gramLen <= len(s); off++ {
				gram := binary.LittleEndian.Uint32([]byte(s[off:]))
				h := gramHash(gram)
				n.filter[h/64] |= 1 << (h % 64)
				n.grams[gram] = append(n.grams[gram], needleAt{needle: s, off: off, group: 1 << g})
			}
		}
	}
	return n
}

func gramHash(gram uint32) uint32 { return gram * 0x9E3779B1 >> 16 }

// groupsIn is the groups of which b holds a needle.
func (n *needleSet) groupsIn(b []byte) uint8 {
	var found uint8
	if n.all == 0 {
		return 0
	}
	for i := 0; i+gramLen <= len(b); i += n.step {
		gram := binary.LittleEndian.Uint32(b[i:])
		h := gramHash(gram)
		if n.filter[h/64]&(1<<(h%64)) == 0 {
			continue
		}
		for _, at := range n.grams[gram] {
			if found&at.group != 0 {
				continue
			}
			if p := i - at.off; p >= 0 && p+len(at.needle) <= len(b) && string(b[p:p+len(at.needle)]) == at.needle {
				if found |= at.group; found == n.all {
					return found
				}
			}
		}
	}
	return found
}

// The groups of a credential's needles.
const (
	inPieces       uint8 = 1 << iota // a piece of the credential (chunks)
	inBase64Pieces                   // a piece of its base64 (base64Pieces.eights)
)

// credentialNeedles is what the search for one credential needs, made
// once for it.
type credentialNeedles struct {
	pieces base64Pieces
	set    *needleSet
}

// needleCache keeps the needles of the credentials in use. It is bounded:
// past maxCachedNeedles credentials (refreshed tokens replace their
// predecessors) it starts again empty.
type needleCache struct {
	m sync.Map // secret → *credentialNeedles
	n atomic.Int64
}

const maxCachedNeedles = 4096

// needles is the process's needleCache: credentials outlive a
// configuration.
var needles needleCache

// needlesOf is the needles of secret.
func needlesOf(secret string) *credentialNeedles { return needles.of(secret) }

// of is the needles of secret.
func (c *needleCache) of(secret string) *credentialNeedles {
	if v, ok := c.m.Load(secret); ok {
		return v.(*credentialNeedles)
	}
	pieces := inBase64(secret)
	cn := &credentialNeedles{pieces: pieces, set: newNeedleSet(chunks(secret), pieces.eights)}
	if c.n.Add(1) > maxCachedNeedles {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(secret, cn)
	return cn
}
