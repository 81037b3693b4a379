package policy

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// shippedMarkers are the default policy's secret_markers, of both kinds
// (exact and ignoring case), sharing anchors ('K' anchors "AKIA" exactly
// and "accesskey" in either case).
func shippedMarkers(t testing.TB) markerIndex {
	t.Helper()
	c := defaultScan(t.(*testing.T))
	if c.scanner == nil {
		t.Fatal("the default policy gives the scan no settings")
	}
	return c.scanner.markers
}

// oneSearchPerGroup is the plain search the index must agree with: each
// group's anchor, in each of its cases, looked for in the whole text in
// turn, and the group's first marker that matches there reported.
func oneSearchPerGroup(ix *markerIndex, s, folded string) []int {
	var at []int
	for _, g := range ix.groups {
		in := s
		if g.fold {
			in = folded
		}
		for _, anchor := range g.cases() {
			for i := 0; i < len(in); i++ {
				j := strings.IndexByte(in[i:], anchor)
				if j < 0 {
					break
				}
				i += j
				for _, m := range g.markers {
					start := i - m.offset
					if start >= 0 && (g.fold && hasPrefixFold(in[start:], m.text) || !g.fold && strings.HasPrefix(in[start:], m.text)) {
						at = append(at, start)
						break
					}
				}
			}
		}
	}
	slices.Sort(at)
	return at
}

func everyMarker(ix *markerIndex, s, folded string) []int {
	var at []int
	ix.eachMarker(s, folded, func(p int) bool {
		at = append(at, p)
		return true
	})
	slices.Sort(at)
	return at
}

// TestMarkerIndexAgreesWithOneSearchPerGroup compares the index's chunked,
// merged passes with the plain search: markers across the chunks'
// boundaries at every offset, in both cases, near their neighbours'
// look-alikes ("ticket" beside "accesskey", "bob" beside "bearer"), and
// in texts whose folded form differs.
func TestMarkerIndexAgreesWithOneSearchPerGroup(t *testing.T) {
	ix := shippedMarkers(t)
	var all []string
	for _, g := range ix.groups {
		for _, m := range g.markers {
			all = append(all, m.text)
		}
	}
	check := func(s, folded string) {
		t.Helper()
		got, want := everyMarker(&ix, s, folded), oneSearchPerGroup(&ix, s, folded)
		if !slices.Equal(got, want) {
			t.Fatalf("a text of %d bytes (folded %d): markers at %v, want %v", len(s), len(folded), got, want)
		}
		found := false
		ix.eachMarker(s, folded, func(int) bool {
			found = true
			return false
		})
		if found != (len(want) > 0) {
			t.Fatalf("a text of %d bytes: found %v, want %v", len(s), found, len(want) > 0)
		}
	}
	filler := strings.Repeat("ticket by bob: ok. ", markerChunk/19+1)[:markerChunk]
	for _, m := range all {
		for _, variant := range []string{m, strings.ToUpper(m), strings.ToUpper(m[:1]) + m[1:]} {
			for cut := 0; cut <= len(variant); cut++ {
				s := filler[:markerChunk-cut] + variant + filler
				check(s, s)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := append(all, "ticket", "bob", "by", "k", "K", "_", "z", "=", "\u212a", "é", " ", "acce", "ss", "_to", "ken", "AK", "IA")
	for range 400 {
		var b strings.Builder
		for b.Len() < rng.IntN(3*markerChunk) {
			p := pieces[rng.IntN(len(pieces))]
			if rng.IntN(4) == 0 {
				p = strings.ToUpper(p)
			}
			b.WriteString(p)
		}
		s := b.String()
		check(s, s)
		if folded := foldToASCII.Replace(s); folded != s {
			check(s, folded)
		}
	}
}

// BenchmarkMarkers looks for the shipped markers in a megabyte: prose
// (the side-by-side harness's large result), a log whose every line holds
// anchors of the markers ("ticket", "by bob"), and JSON.
func BenchmarkMarkers(b *testing.B) {
	t := &testing.T{}
	ix := shippedMarkers(t)
	for _, c := range []struct{ name, s string }{
		{"prose", bigText(1 << 20)},
		{"log", logText(1 << 20)},
		{"json", structuredResult(1 << 20)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.s)))
			for b.Loop() {
				ix.eachMarker(c.s, c.s, func(int) bool { return true })
			}
		})
		b.Run(c.name+"_one_search_per_group", func(b *testing.B) {
			b.SetBytes(int64(len(c.s)))
			for b.Loop() {
				oneSearchPerGroup(&ix, c.s, c.s)
			}
		})
	}
}
