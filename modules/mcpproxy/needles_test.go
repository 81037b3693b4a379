package mcpproxy

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// naiveGroups is needleSet.groupsIn the long way: one bytes.Contains per
// needle.
func naiveGroups(b []byte, groups ...[]string) uint8 {
	var found uint8
	for g, needles := range groups {
		for _, s := range needles {
			if len(s) >= gramLen && bytes.Contains(b, []byte(s)) {
				found |= 1 << g
			}
		}
	}
	return found
}

// A needleSet finds what one bytes.Contains per needle finds: needles of
// the credential's lengths (pieces of four and of eight bytes, base64
// pieces of eight) anywhere in texts of every length, at their start and
// end, overlapping, and in texts made of the needles' own letters, where
// grams repeat.
func TestNeedleSetFindsWhatContainsFinds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	letters := []byte("abcAB12/+=-_ \n\"\\é")
	word := func(n int, from []byte) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = from[rng.IntN(len(from))]
		}
		return string(b)
	}
	for trial := range 3000 {
		secret := word(8+rng.IntN(40), letters[:12])
		pieces := inBase64(secret)
		groups := [][]string{chunks(secret), pieces.eights}
		set := newNeedleSet(groups...)
		text := []byte(word(rng.IntN(200), letters))
		for range rng.IntN(3) {
			g := groups[rng.IntN(2)]
			s := g[rng.IntN(len(g))]
			if rng.IntN(3) == 0 { // a part only: no needle, or one across the cut
				s = s[:rng.IntN(len(s))]
			}
			at := rng.IntN(len(text) + 1)
			text = append(text[:at:at], append([]byte(s), text[at:]...)...)
		}
		if got, want := set.groupsIn(text), naiveGroups(text, groups...); got != want {
			t.Fatalf("trial %d: secret %q in %q: groups %b, want %b", trial, secret, text, got, want)
		}
	}
}

// A set without needles of gramLen bytes finds nothing, and texts shorter
// than a gram hold nothing.
func TestNeedleSetEdges(t *testing.T) {
	if got := newNeedleSet([]string{"abc"}).groupsIn([]byte("xxabcxx")); got != 0 {
		t.Errorf("needles shorter than a gram: %b", got)
	}
	set := newNeedleSet([]string{"abcd"}, []string{"wxyz1234"})
	for text, want := range map[string]uint8{"": 0, "abc": 0, "abcd": 1, "wxyz1234": 2, "xwxyz1234abcd": 3, "wxyz123": 0} {
		if got := set.groupsIn([]byte(text)); got != want {
			t.Errorf("%q: %b, want %b", text, got, want)
		}
	}
}

// The cache keeps what it made, and starts again empty past its bound.
func TestNeedleCacheIsBounded(t *testing.T) {
	var c needleCache
	a := c.of("secret-number-one")
	if c.of("secret-number-one") != a {
		t.Fatal("not kept")
	}
	for i := range maxCachedNeedles + 10 {
		c.of(string(rune('a'+i%26)) + "-secret-" + string(rune(0x100+i)))
	}
	if n := c.n.Load(); n > maxCachedNeedles {
		t.Errorf("%d needles kept, more than %d", n, maxCachedNeedles)
	}
	if _, ok := c.m.Load("secret-number-one"); ok {
		t.Error("the first secret's needles were kept past the bound")
	}
}
