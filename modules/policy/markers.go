package policy

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// The secret markers (the policy's secret_markers, see scan.go) are looked
// for in every inspected string, and a megabyte of text is read for them
// on the way to the policy: this search is the costliest part of the
// scan.
//
// A marker is found by looking for its rarest byte (its anchor) with
// IndexByte, which skips text many bytes at a time, and comparing the
// marker where the anchor is. Markers sharing an anchor are looked for
// together, and each anchor byte is looked for once, for every group it
// anchors (the exact 'K' of "AKIA" and the 'K' of "accesskey" in another
// case). The text is read in chunks that stay in the processor's
// nearest cache while every anchor is looked for in them, and an anchor's
// neighbours are checked before its markers are compared: where "by bob"
// anchors "bearer" three times a line, only the bytes around each 'b'
// are read. On the 2-core development machine (BenchmarkMarkers) a
// megabyte of prose takes 0.16–0.18 ms (one pass per group and case over
// the whole text took 0.20–0.25), a log whose every line holds anchors
// 0.6–0.8 ms (0.85–1.3), and JSON with a long run of an anchor 0.9 ms
// (2.1).

// markerIndex is the markers grouped by anchor, and the passes that look
// for the anchors.
type markerIndex struct {
	groups []anchorGroup
	// passes look for each anchor byte once, for every group it anchors:
	// they read a text and its folded form as one (they are the same
	// string).
	passes []anchorPass
	// split are the passes for a folded form that differs from the text
	// (the text held one of the characters foldToASCII writes): the groups
	// compared ignoring case are looked for in the folded form, the others
	// in the text.
	split   []anchorPass
	longest int // the length of the longest marker
}

type anchorPass struct {
	anchor byte
	folded bool  // (split) it reads the folded form
	groups []int // in markerIndex.groups
}

type anchorGroup struct {
	anchor  byte
	fold    bool // the markers are compared ignoring case (see hasMarker)
	markers []anchoredMarker
	// before and after: the bytes a marker has next to the anchor (in
	// either case when fold); anyBefore, anyAfter: a marker begins or
	// ends with its anchor.
	before, after       byteSet
	anyBefore, anyAfter bool
}

type anchoredMarker struct {
	text   string
	offset int // of the anchor in text
}

// newMarkerIndex indexes markers (without repeats).
func newMarkerIndex(markers []string) markerIndex {
	var ix markerIndex
	for _, m := range markers {
		fold := !strings.ContainsFunc(m, func(r rune) bool { return r >= 'A' && r <= 'Z' })
		rank := byteRank
		if fold {
			rank = foldRank
		}
		off := 0
		for i := 1; i < len(m); i++ {
			if rank(m[i]) < rank(m[off]) {
				off = i
			}
		}
		anchor := m[off]
		if fold {
			anchor = lowerASCII(anchor)
		}
		k := slices.IndexFunc(ix.groups, func(g anchorGroup) bool { return g.anchor == anchor && g.fold == fold })
		if k < 0 {
			ix.groups = append(ix.groups, anchorGroup{anchor: anchor, fold: fold})
			k = len(ix.groups) - 1
		}
		g := &ix.groups[k]
		g.markers = append(g.markers, anchoredMarker{text: m, offset: off})
		if off == 0 {
			g.anyBefore = true
		} else {
			g.before.add(m[off-1], fold)
		}
		if off == len(m)-1 {
			g.anyAfter = true
		} else {
			g.after.add(m[off+1], fold)
		}
		ix.longest = max(ix.longest, len(m))
	}
	for k, g := range ix.groups {
		for _, c := range g.cases() {
			at := slices.IndexFunc(ix.passes, func(p anchorPass) bool { return p.anchor == c })
			if at < 0 {
				ix.passes = append(ix.passes, anchorPass{anchor: c})
				at = len(ix.passes) - 1
			}
			ix.passes[at].groups = append(ix.passes[at].groups, k)
			ix.split = append(ix.split, anchorPass{anchor: c, folded: g.fold, groups: []int{k}})
		}
	}
	return ix
}

type byteSet [256]bool

// add puts c in the set, in both cases when fold.
func (set *byteSet) add(c byte, fold bool) {
	set[c] = true
	if l := lowerASCII(c); fold && l >= 'a' && l <= 'z' {
		set[l], set[l-'a'+'A'] = true, true
	}
}

// cases is the anchor in both cases when its markers are compared
// ignoring case and it is a letter.
func (g *anchorGroup) cases() []byte {
	if l := lowerASCII(g.anchor); g.fold && l >= 'a' && l <= 'z' {
		return []byte{l, l - 'a' + 'A'}
	}
	return []byte{g.anchor}
}

// markerChunk is how much of a text every anchor is looked for in before
// the next: it stays in the nearest cache (32 KiB or more).
const markerChunk = 16 << 10

// eachMarker calls f with where each marker begins, until f returns false:
// markers compared exactly are looked for in s, those compared ignoring
// case in folded (s as hasMarker folds it; where it differs from s, the
// positions of the two kinds are not comparable). The order of the calls
// is not that of the positions.
func (ix *markerIndex) eachMarker(s, folded string, f func(at int) bool) {
	passes := ix.passes
	if folded != s {
		passes = ix.split
	}
	for lo := 0; lo < max(len(s), len(folded)); lo += markerChunk {
		for _, p := range passes {
			in := s
			if p.folded {
				in = folded
			}
			hi := min(lo+markerChunk, len(in))
			for i := lo; i < hi; i++ {
				// Anchors come in runs ("xxxx"): the byte after one is
				// looked at before IndexByte is called again.
				if in[i] != p.anchor {
					j := strings.IndexByte(in[i+1:hi], p.anchor)
					if j < 0 {
						break
					}
					i += 1 + j
				}
				for _, k := range p.groups {
					if !ix.groups[k].at(in, i, f) {
						return
					}
				}
			}
		}
	}
}

// at calls f with where a marker of the group begins in s around its
// anchor at i, if one does, and returns what f returns (true if none
// does).
func (g *anchorGroup) at(s string, i int, f func(at int) bool) bool {
	if !(g.anyBefore || i > 0 && g.before[s[i-1]]) || !(g.anyAfter || i+1 < len(s) && g.after[s[i+1]]) {
		return true
	}
	for _, m := range g.markers {
		start := i - m.offset
		if start < 0 {
			continue
		}
		if g.fold && hasPrefixFold(s[start:], m.text) || !g.fold && strings.HasPrefix(s[start:], m.text) {
			return f(start)
		}
	}
	return true
}

// hasMarker reports whether s holds a secret marker: one written in lower
// case ignoring case, any other exactly (as the policy's holds_marker,
// which looks for the first kind in folded(s)).
func (sc *scanner) hasMarker(s string) bool { return sc.hasMarkerIn(s, isASCII(s)) }

// hasMarkerIn is hasMarker for s, which is ASCII or not as ascii says.
func (sc *scanner) hasMarkerIn(s string, ascii bool) bool {
	folded := s
	if !ascii && holdsFoldedLetter(s) {
		folded = foldToASCII.Replace(s)
	}
	found := false
	sc.markers.eachMarker(s, folded, func(int) bool {
		found = true
		return false
	})
	return found
}

// foldedLetters are the three characters outside ASCII that fold to an
// ASCII letter (in Go's lower case, or in RE2's case-insensitive
// matching), each with that letter: the dotted capital I, the long s and
// the Kelvin sign. The policy's folded(s) does the same (its lower() maps
// the first and the last, and it replaces the long s), so that
// "acce\u017fs_token" or "access_to\u212aen", which a pattern matching in
// any case matches, count as holding a marker on both sides. Everything
// in the scan that must see them reads this list: foldToASCII,
// holdsFoldedLetter, and the scanner's interesting bytes.
var foldedLetters = [...]struct{ char, letter string }{{"\u0130", "i"}, {"\u017f", "s"}, {"\u212a", "k"}}

// foldToASCII writes each of foldedLetters as its letter.
var foldToASCII = func() *strings.Replacer {
	var pairs []string
	for _, f := range foldedLetters {
		pairs = append(pairs, f.char, f.letter)
	}
	return strings.NewReplacer(pairs...)
}()

// holdsFoldedLetter reports whether s, which is not ASCII, holds one of
// foldedLetters: its folded form differs from it.
func holdsFoldedLetter(s string) bool {
	for _, f := range foldedLetters {
		if strings.Contains(s, f.char) {
			return true
		}
	}
	return false
}

// hasPrefixFold reports whether s begins with prefix, ignoring ASCII case.
func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		if lowerASCII(s[i]) != lowerASCII(prefix[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// foldRank is how common c is in either case (a marker compared ignoring
// ASCII case has a letter anchor looked for in both).
func foldRank(c byte) int {
	l := lowerASCII(c)
	if l >= 'a' && l <= 'z' {
		return byteRank(l) + byteRank(l-'a'+'A')
	}
	return byteRank(c)
}

// byteRank estimates how common c is in the text of tool results (English
// prose, code, JSON): higher is more common.
func byteRank(c byte) int {
	const lower = "zqjxkvbpygfwmucldrhsnioate" // rarest first (English letter frequencies)
	switch {
	case c == ' ' || c == '\n' || c == '\t' || c == '\r':
		return 1000
	case c >= 'a' && c <= 'z':
		return 20 + 10*strings.IndexByte(lower, c)
	case c >= 'A' && c <= 'Z':
		return 2 + strings.IndexByte(lower, c+'a'-'A')
	case c >= '0' && c <= '9':
		return 100
	case c == '.' || c == ',' || c == '"' || c == ':' || c == '/' || c == '-':
		return 150
	case c >= utf8.RuneSelf:
		return 0
	}
	return 30
}
