package policy

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// A secret split across two consecutive text items of a tool result is
// redacted by the policy piece by piece, at the seam (result.rego's
// seam_secrets). One that runs through a whole text item into the next —
// split across three items or more, or across two with empty ones between
// them — has no seam that holds it, yet runners join the items and read
// it. The gateway looks for such secrets in the joined text, with the
// policy's own patterns, and withholds the result (a Refusal) before the
// policy sees it.

// Refusal is a payload the gateway withholds before the policy sees it,
// with the reason the runner is told.
type Refusal struct{ Why string }

func (e *Refusal) Error() string { return e.Why }

// How much of the joined text around a marker is matched against the
// patterns: a match of a built-in pattern begins a few characters before
// its marker and ends with a token (a window is stretched to the end of
// a longer token, see spanWindows); a longer match of other characters
// (a private key: result.rego withholds those whose BEGIN and END lines
// are in items that are not consecutive) is not looked for here.
const (
	spanBefore = 128
	spanAfter  = 4096
	// spanMarkers is how many marker positions are matched around one by
	// one; beyond, the whole joined text is matched.
	spanMarkers = 256
)

// loadPatterns compiles the policy's patterns (its all_patterns: an object
// of RE2 expressions; order is its secret_kinds) into one expression; nil
// when there are none or one does not compile (the policy itself withholds
// every result then). site reports kinds without markers, which are
// matched over the whole text.
func loadPatterns(patterns, order any, markers map[string]any) (re *regexp.Regexp, site bool) {
	kinds, ok := patterns.(map[string]any)
	if !ok || len(kinds) == 0 {
		return nil, false
	}
	// The policy's order of kinds (secret_kinds: where two match at one
	// place, the first), then the others by name.
	var names []string
	if list, ok := order.([]any); ok {
		for _, k := range list {
			if name, ok := k.(string); ok && kinds[name] != nil && !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	var rest []string
	for k := range kinds {
		if !slices.Contains(names, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	names = append(names, rest...)
	var alt []string
	for _, k := range names {
		p, ok := kinds[k].(string)
		if !ok {
			return nil, false
		}
		if _, err := regexp.Compile(p); err != nil {
			return nil, false
		}
		alt = append(alt, "(?:"+p+")")
		if _, known := markers[k]; !known {
			site = true
		}
	}
	re, err := regexp.Compile(strings.Join(alt, "|"))
	if err != nil {
		return nil, false
	}
	return re, site
}

// acrossItems refuses a tool result whose joined text items hold a match
// of the policy's patterns that runs across two boundaries between them.
func (sc *scanner) acrossItems(result *ast.Term) error {
	if sc.secrets == nil {
		return nil
	}
	content := contentOf(result)
	n := 0
	eachTextItem(content, func(int, string) { n++ })
	if n < 3 {
		return nil // the commonest case: no allocation
	}
	index, texts := make([]int, 0, n), make([]string, 0, n)
	eachTextItem(content, func(i int, text string) {
		index, texts = append(index, i), append(texts, text)
	})
	// The text as runners read it once the policy removed the invisible
	// characters.
	visible := make([]string, len(texts))
	for k, t := range texts {
		visible[k] = sc.visible(t)
	}
	if span := sc.crossing(visible, false); span != nil {
		return &Refusal{Why: fmt.Sprintf("a secret may run across three text items or more (content[%d] to content[%d]), "+
			"which toolgate cannot redact piece by piece; the result was withheld", index[span[0]], index[span[1]])}
	}
	return nil
}

// crossing is the first and last of texts that a match of the policy's
// patterns in their joined text touches when it crosses two boundaries
// between them, nil when none does; redacted says texts are already
// without their own matches (see crossesOnceRedacted).
func (sc *scanner) crossing(visible []string, redacted bool) []int {
	// Nothing to look for without a marker (unless the policy has kinds
	// without markers).
	if !sc.site && !sc.markerIn(visible) {
		return nil
	}
	var b strings.Builder
	starts := make([]int, len(visible))
	for k, t := range visible {
		starts[k] = b.Len()
		b.WriteString(t)
	}
	joined := b.String()
	for _, w := range sc.spanWindows(joined) {
		for _, m := range sc.secrets.FindAllStringIndex(joined[w[0]:w[1]], -1) {
			s, e := w[0]+m[0], w[0]+m[1]
			// The boundaries strictly inside the match: starts[lo:hi].
			lo := sort.SearchInts(starts, s+1)
			hi := sort.SearchInts(starts, e)
			if hi-lo >= 2 && (redacted || sc.crossesOnceRedacted(visible)) {
				return []int{lo - 1, hi - 1}
			}
		}
	}
	return nil
}

// crossesOnceRedacted reports whether texts still hold a match across
// two boundaries once each text's own matches are replaced, as the policy
// replaces them: a token that runs on into the next item's first word, or
// a BEGIN line quoted in a log, is the policy's to redact where it is.
func (sc *scanner) crossesOnceRedacted(texts []string) bool {
	// What the policy replaces: each text's own matches, and the parts of
	// the matches across the seam of two consecutive texts.
	masks := make([][]bool, len(texts))
	for k, t := range texts {
		masks[k] = make([]bool, len(t))
		for _, m := range sc.secrets.FindAllStringIndex(t, -1) {
			for i := m[0]; i < m[1]; i++ {
				masks[k][i] = true
			}
		}
	}
	for k := 0; k+1 < len(texts); k++ {
		a := len(texts[k])
		for _, m := range sc.secrets.FindAllStringIndex(texts[k]+texts[k+1], -1) {
			if m[0] < a && m[1] > a {
				for i := m[0]; i < m[1]; i++ {
					if i < a {
						masks[k][i] = true
					} else {
						masks[k+1][i-a] = true
					}
				}
			}
		}
	}
	left := make([]string, len(texts))
	for k, t := range texts {
		var b strings.Builder
		for i := 0; i < len(t); i++ {
			switch {
			case !masks[k][i]:
				b.WriteByte(t[i])
			case i == 0 || !masks[k][i-1]:
				b.WriteByte(0)
			}
		}
		left[k] = b.String()
	}
	return sc.crossing(left, true) != nil
}

// markerIn reports whether the joined texts hold a marker: in one of
// them, or across the boundaries between them (the last bytes before a
// boundary, however many texts they come from, and the first after it).
func (sc *scanner) markerIn(texts []string) bool {
	// A marker's part on either side of a boundary is at most longest-1
	// letters, each at most 3 bytes as sent (the Kelvin sign, which the
	// fold writes k).
	reach := 3 * (sc.markers.longest - 1)
	tail := ""
	for _, t := range texts {
		if sc.hasMarker(t) || tail != "" && sc.hasMarker(tail+t[:min(len(t), reach)]) {
			return true
		}
		tail += t
		tail = tail[max(0, len(tail)-reach):]
	}
	return false
}

// visible is s without the policy's invisible characters.
func (sc *scanner) visible(s string) string {
	if isASCII(s) && !sc.asciiInvisible {
		return s
	}
	return strings.Map(func(r rune) rune {
		if sc.isInvisible(r) {
			return -1
		}
		return r
	}, s)
}

// spanWindows are the stretches of s to match the patterns in: around
// each marker, or all of s when the policy has kinds without markers, s
// folds outside ASCII, or it holds too many markers. A window that would
// end (or begin) inside a run of token characters is stretched to the
// run's end: a token longer than spanAfter (a JWT with a large payload)
// is matched whole.
func (sc *scanner) spanWindows(s string) [][2]int {
	whole := [][2]int{{0, len(s)}}
	if sc.site {
		return whole
	}
	if !isASCII(s) && holdsFoldedLetter(s) {
		return whole
	}
	at := sc.markerPositions(s, spanMarkers+1)
	if len(at) > spanMarkers {
		return whole
	}
	sort.Ints(at)
	var out [][2]int
	for _, p := range at {
		from, to := max(0, p-spanBefore), min(len(s), p+spanAfter)
		for from > 0 && tokenByte(s[from-1]) {
			from--
		}
		for to < len(s) && tokenByte(s[to]) {
			to++
		}
		if n := len(out); n > 0 && from <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], to)
			continue
		}
		out = append(out, [2]int{from, to})
	}
	return out
}

// markerPositions lists where s holds a marker (as hasMarker finds them in
// text it does not fold), at most limit of them.
func (sc *scanner) markerPositions(s string, limit int) []int {
	var at []int
	sc.markers.eachMarker(s, s, func(p int) bool {
		at = append(at, p)
		return len(at) < limit
	})
	return at
}

// tokenByte reports whether c may be part of a token (base64, base64url,
// hexadecimal, a JWT's dots).
func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("+/=_-.", c) >= 0
}
