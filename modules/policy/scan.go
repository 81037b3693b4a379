package policy

import (
	"context"
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
)

// The result scan (input.scan, see policies/README.md) is the gateway's
// quick pass over a tools/call result, made while the result is converted
// for the policy. It lists the inspected strings the result policy has to
// look at: those longer than scanThreshold bytes, and those holding an
// invisible character or a secret marker. Everything else needs no
// cleaning, so the policy never visits it: ten thousand strings of
// structured content that need nothing cost it no more than one, and of a
// megabyte of text it reads only what it keeps.
//
// What counts as a marker or an invisible character is the policy's own
// business: the scan uses its secret_markers and invisible_ranges rules
// (read once, when the policy is loaded), so the gateway and `opa test`
// agree, and a policy without them simply gets no scan.

// scanThreshold is the size in bytes above which every inspected string is
// listed, so the policy knows which strings may be over its limit. (It
// uses the scan only when its limit is at least this.)
const scanThreshold = 4096

// thresholdItem is input.scan.threshold, the same for every scan (OPA
// interns only small numbers: built per call, it cost two allocations).
var thresholdItem = ast.Item(keyThreshold, ast.IntNumberTerm(scanThreshold))

var (
	keyThreshold = ast.StringTerm("threshold")
	keyStrings   = ast.StringTerm("strings")
	keyPath      = ast.StringTerm("path")
	keyBytes     = ast.StringTerm("bytes")
	keyASCII     = ast.StringTerm("ascii")
	keyInvisible = ast.StringTerm("invisible")
	keyMarkers   = ast.StringTerm("markers")
	keyContent   = ast.StringTerm("content")
	keyType      = ast.StringTerm("type")
	keyText      = ast.StringTerm("text")
	keyResource  = ast.StringTerm("resource")
	keyKey       = ast.StringTerm("key")
	keyKeyBytes  = ast.StringTerm("key_bytes")
	keySeams     = ast.StringTerm("seams")
	keyData      = ast.StringTerm("data")
	keyBlob      = ast.StringTerm("blob")
	keyURI       = ast.StringTerm("uri")
	keyClean     = ast.StringTerm("clean")
	keyMessages  = ast.StringTerm("messages")
	keyContents  = ast.StringTerm("contents")
	keyMimeType  = ast.StringTerm("mimeType")
	// keyInputRequests and keyResultType: an input_required result
	// (2026-07-28).
	keyInputRequests = ast.StringTerm("inputRequests")
	keyResultType    = ast.StringTerm("resultType")
)

// scanner holds what the scan looks for.
type scanner struct {
	markers   markerIndex // of every kind
	invisible []runeRange // sorted
	// asciiInvisible: some invisible character is ASCII (else a string of
	// ASCII holds none).
	asciiInvisible bool
	leads          []byte    // the first UTF-8 bytes of the invisible characters
	interesting    [256]bool // the leads and the anchors
	// secrets is the policy's patterns as one expression, for secrets
	// across text items (acrossItems); site: some have no markers.
	secrets *regexp.Regexp
	site    bool
}

type runeRange struct{ lo, hi rune }

// loadScanner reads the scan's settings from the package of the decision
// rule: secret_markers ({"kind": ["marker", …]}) and invisible_ranges
// ([["200B", "200F"], …], hexadecimal code points). It returns nil (no
// scan) unless the package defines both, and an error when they are
// malformed. note says why a policy that defines both gets no scan.
func loadScanner(ctx context.Context, compiler *ast.Compiler, store storage.Store, decision string) (sc *scanner, note string, err error) {
	ref, err := ast.ParseRef(decision)
	if err != nil || len(ref) < 2 {
		return nil, "", nil
	}
	pkg := ref[:len(ref)-1].String()
	markers, err := evalConstant(ctx, compiler, store, pkg+".secret_markers")
	if err != nil {
		return nil, "", err
	}
	ranges, err := evalConstant(ctx, compiler, store, pkg+".invisible_ranges")
	if err != nil {
		return nil, "", err
	}
	if markers == nil || ranges == nil {
		return nil, "", nil
	}
	patterns, err := evalConstant(ctx, compiler, store, pkg+".all_patterns")
	if err != nil {
		return nil, "", err
	}
	order, err := evalConstant(ctx, compiler, store, pkg+".secret_kinds")
	if err != nil {
		return nil, "", err
	}
	sc = &scanner{}
	var all []string
	kinds, ok := markers.(map[string]any)
	if !ok {
		return nil, "", fmt.Errorf("%s.secret_markers must be an object of arrays of strings", pkg)
	}
	for kind, list := range kinds {
		ms, ok := list.([]any)
		if !ok {
			return nil, "", fmt.Errorf("%s.secret_markers[%q] must be an array of strings", pkg, kind)
		}
		for _, m := range ms {
			s, ok := m.(string)
			if !ok || s == "" {
				return nil, "", fmt.Errorf("%s.secret_markers[%q] must hold non-empty strings", pkg, kind)
			}
			all = append(all, s)
		}
	}
	if slices.ContainsFunc(all, func(m string) bool { return !isASCII(m) }) {
		// The scan compares markers byte by byte, ignoring ASCII case
		// only; the policy lower-cases all of Unicode. Such a policy does
		// without the scan rather than be told a string is clean.
		return nil, "a secret marker is not ASCII: the scan compares markers ignoring ASCII case only", nil
	}
	slices.Sort(all)
	sc.markers = newMarkerIndex(slices.Compact(all))
	sc.secrets, sc.site = loadPatterns(patterns, order, kinds)
	list, ok := ranges.([]any)
	if !ok {
		return nil, "", fmt.Errorf("%s.invisible_ranges must be an array of [first, last] pairs", pkg)
	}
	for _, r := range list {
		pair, ok := r.([]any)
		if !ok || len(pair) != 2 {
			return nil, "", fmt.Errorf("%s.invisible_ranges must be an array of [first, last] pairs", pkg)
		}
		lo, okLo := codePoint(pair[0])
		hi, okHi := codePoint(pair[1])
		if !okLo || !okHi || hi < lo {
			return nil, "", fmt.Errorf("%s.invisible_ranges: %v is not a range of hexadecimal code points", pkg, pair)
		}
		sc.invisible = append(sc.invisible, runeRange{lo, hi})
	}
	slices.SortFunc(sc.invisible, func(a, b runeRange) int { return int(a.lo - b.lo) })
	sc.asciiInvisible = len(sc.invisible) > 0 && sc.invisible[0].lo < utf8.RuneSelf
	var leads [256]bool
	var buf [utf8.UTFMax]byte
	for _, r := range sc.invisible {
		for c := r.lo; c <= r.hi; c++ {
			utf8.EncodeRune(buf[:], c)
			leads[buf[0]] = true
		}
	}
	for b, ok := range leads {
		if ok {
			sc.leads = append(sc.leads, byte(b))
			sc.interesting[b] = true
		}
	}
	for _, p := range sc.markers.passes {
		sc.interesting[p.anchor] = true
	}
	if slices.ContainsFunc(sc.markers.groups, func(g anchorGroup) bool { return g.fold }) {
		// The first bytes of foldedLetters: one may be an anchor, folded.
		for _, f := range foldedLetters {
			sc.interesting[f.char[0]] = true
		}
	}
	return sc, "", nil
}

func codePoint(v any) (rune, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 16, 32)
	if err != nil || n > utf8.MaxRune {
		return 0, false
	}
	return rune(n), true
}

// shortString is the length up to which a string is first read byte by
// byte (mayHold): cheaper than a dozen IndexByte calls, each with its own
// setup, for the many short strings of structured content.
const shortString = 64

// mayHold reports whether s holds a byte that starts an invisible
// character or is a marker's anchor.
func (sc *scanner) mayHold(s string) bool {
	for i := 0; i < len(s); i++ {
		if sc.interesting[s[i]] {
			return true
		}
	}
	return false
}

// hasInvisible reports whether s holds an invisible character.
func (sc *scanner) hasInvisible(s string) bool {
	for _, lead := range sc.leads {
		for i := 0; ; {
			j := strings.IndexByte(s[i:], lead)
			if j < 0 {
				break
			}
			i += j
			r, size := utf8.DecodeRuneInString(s[i:])
			if sc.isInvisible(r) {
				return true
			}
			i += size
		}
	}
	return false
}

func (sc *scanner) isInvisible(r rune) bool {
	_, found := slices.BinarySearchFunc(sc.invisible, r, func(rr runeRange, r rune) int {
		switch {
		case r < rr.lo:
			return 1
		case r > rr.hi:
			return -1
		}
		return 0
	})
	return found
}

// isASCII reports whether every byte of s is ASCII, 32 at a time.
func isASCII(s string) bool {
	const high = 0x8080808080808080
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	for len(b) >= 32 {
		le := binary.LittleEndian
		if (le.Uint64(b[0:8])|le.Uint64(b[8:16])|le.Uint64(b[16:24])|le.Uint64(b[24:32]))&high != 0 {
			return false
		}
		b = b[32:]
	}
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// scanEntries collects the scan's list and sizes.
type scanEntries struct {
	sc       *scanner
	shape    shape
	entries  []*ast.Term
	bytes    int  // of every inspected string and key
	keyBytes int  // of every inspected key
	flagged  bool // some string or key holds an invisible character or a marker
	// pending holds the strings that are inspected unless they are the
	// binary data or the blob of a content block (see shape), known only
	// once the block is read.
	pending []pendingString
	// variant is the path of the first string that would be a block's
	// data or blob if its members were read ignoring case (variantRefusal).
	variant []pathStep
}

type pendingString struct {
	path  []pathStep
	s     string
	leaf  leafKind
	block int // the length of the block's path
	// outer is the length of the path of the tool_result block whose
	// content holds the block, 0 when it is not in one (see leafBy).
	outer int
	input bool // a leaf of an input request's blocks (see shapeInputRequests)
}

// look takes note of the string or key s at path.
func (l *scanEntries) look(path []pathStep, s string, key bool) {
	if !key {
		if leaf, block, outer := l.shape.leaf(path); leaf != notLeaf {
			l.pending = append(l.pending, pendingString{path: slices.Clone(path), s: s, leaf: leaf, block: block, outer: outer})
			return
		}
		if l.shape.result() {
			if leaf, block, outer := shapeInputRequests.leaf(path); leaf != notLeaf {
				l.pending = append(l.pending, pendingString{path: slices.Clone(path), s: s, leaf: leaf, block: block, outer: outer, input: true})
				return
			}
		}
		if l.variant == nil {
			if leaf, _, _ := l.shape.leafBy(path, isKeyFold); leaf != notLeaf {
				l.variant = slices.Clone(path)
			} else if leaf, _, _ := shapeInputRequests.leafBy(path, isKeyFold); leaf != notLeaf && l.shape.result() {
				l.variant = slices.Clone(path)
			}
		}
	}
	l.add(path, s, key)
}

// withoutIgnorable is s without the characters that render as nothing
// (format characters, default-ignorable code points, variation selectors:
// a superset of what the policy removes from keys).
func withoutIgnorable(s string) string {
	if isASCII(s) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector) {
			return -1
		}
		return r
	}, s)
}

// variantRefusal refuses a payload in which a member that makes a string
// a block's binary data or blob is spelled in another case: the policy
// would inspect the string as text, and a runner that ignores case in
// member names would decode it. The reason names the place without the
// upstream's keys (see placeOf).
func variantRefusal(path []pathStep) *Refusal {
	return &Refusal{Why: "the upstream's message holds a member of MCP's spelled in another case, or with an invisible character, at " + placeOf(path) +
		" (clients that ignore case read it as that member, so toolgate cannot inspect it as they would read it); it was withheld"}
}

// placeOf writes path for a reason without text the upstream chose (the
// policy's place): array indexes, and the member names of MCP's in
// placeMembers, as they are; any other key as <key>. A reason reaches the
// runner as it is, and an upstream's key may hold a secret or invisible
// characters.
func placeOf(path []pathStep) string {
	if len(path) == 0 {
		return "the top level"
	}
	var b strings.Builder
	for i, step := range path {
		if step.key == nil {
			b.WriteString("[" + strconv.Itoa(step.index) + "]")
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		if s, ok := step.key.Value.(ast.String); ok && slices.Contains(placeMembers, string(s)) {
			b.WriteString(string(s))
		} else {
			b.WriteString("<key>")
		}
	}
	return b.String()
}

// placeMembers are the member names a reason may quote (the policy's
// place_members).
var placeMembers = []string{
	"content", "structuredContent", "contents", "messages", "resource", "blob", "data", "text", "type",
	"uri", "mimeType", "inputRequests", "params", "_meta", "tools", "prompts", "resources",
	"resourceTemplates", "inputSchema", "outputSchema", "properties", "annotations", "task",
}

// add counts s and lists it when the policy has to look at it.
func (l *scanEntries) add(path []pathStep, s string, key bool) {
	l.bytes += len(s)
	if key {
		l.keyBytes += len(s)
	}
	long := len(s) > scanThreshold
	if !long && len(s) <= shortString && !l.sc.mayHold(s) {
		return
	}
	ascii := isASCII(s)
	invisible := (!ascii || l.sc.asciiInvisible) && l.sc.hasInvisible(s)
	markers := l.sc.hasMarkerIn(s, ascii)
	l.flagged = l.flagged || invisible || markers
	if !long && !invisible && !markers {
		return
	}
	l.entries = append(l.entries, ast.ObjectTerm(
		ast.Item(keyPath, pathTerm(path)),
		ast.Item(keyKey, ast.InternedTerm(key)),
		ast.Item(keyBytes, ast.InternedTerm(len(s))),
		ast.Item(keyASCII, ast.InternedTerm(ascii)),
		ast.Item(keyInvisible, ast.InternedTerm(invisible)),
		ast.Item(keyMarkers, ast.InternedTerm(markers)),
	))
}

// seamWindow is how many characters on each side of the seam between two
// text items are looked at for a secret split across them, stretched on
// each side through the run of token characters that goes on beyond it by
// at most seamStretch more (the policy's seam_window, seam_stretch,
// seam_left and seam_right).
const (
	seamWindow  = 1024
	seamStretch = 4096
)

// isTokenChar reports whether c belongs to a token run: every character
// that a token of a built-in kind may hold (the policy's token_chars and
// token_cutset), all ASCII.
func isTokenChar(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		strings.IndexByte("-._~+/%=", c) >= 0
}

// seamLeft is the window before a seam: the last seamWindow characters of
// s, with the token run before them.
func seamLeft(s string) string {
	i := len(s) - len(lastRunes(s, seamWindow))
	for n := 0; i > 0 && n < seamStretch && isTokenChar(s[i-1]); n++ {
		i--
	}
	return s[i:]
}

// seamRight is the window after a seam: the first seamWindow characters of
// s, with the token run after them.
func seamRight(s string) string {
	i := len(firstRunes(s, seamWindow))
	for n := 0; i < len(s) && n < seamStretch && isTokenChar(s[i]); n++ {
		i++
	}
	return s[:i]
}

// resultTerms converts a payload of the given shape (JSON text) to
// input.result and, with a scanner, input.scan (else scan is nil). With
// spans, it records the text of the result's larger values in it (see
// appendJSON).
//
// The strings of the terms share raw's memory instead of a copy (for a
// result of a megabyte, the copy and the garbage collection it causes cost
// more than the rest of the policy step). That is sound because raw does not
// change while the result hook runs and nothing built from the input
// outlives the hook: decideWith copies what it keeps of a decision (the
// action is a constant, the reason a copy), and a replacement result is
// encoded into new bytes before the hook returns.
func resultTerms(raw []byte, sh shape, sc *scanner, spans map[*ast.Term]string) (result, scan *ast.Term, err error) {
	p := jsonParser{src: unsafe.String(unsafe.SliceData(raw), len(raw)), spans: spans}
	l := scanEntries{sc: sc, shape: sh}
	if sc != nil {
		p.visit = l.look
	}
	result, err = p.parse()
	if err != nil || sc == nil {
		return result, nil, err
	}
	// The blocks' binary data is left out, their blobs are checked. An
	// input_required result has the blocks of its input requests besides
	// those of its method's result (which a runner of an earlier revision
	// reads as the answer).
	inputRequired := sh.result() && stringOf(termAt(result, []pathStep{{key: keyResultType}})) == "input_required"
	blobsPlain, blobText := true, 0
	for _, ps := range l.pending {
		if ps.input && (!inputRequired || stringOf(termAt(result, append(ps.path[:2:2], pathStep{key: keyMethod}))) != "sampling/createMessage") {
			l.add(ps.path, ps.s, false) // not a block of this payload
			continue
		}
		if ps.outer > 0 {
			// A block of a block's content: only a tool_result's holds blocks.
			outer := stringOf(termAt(result, append(ps.path[:ps.outer:ps.outer], pathStep{key: keyType})))
			if outer == "" && l.variant == nil && hasKeyFold(termAt(result, ps.path[:ps.outer]), keyType) {
				l.variant = append(ps.path[:ps.outer:ps.outer], pathStep{key: keyType})
			}
			if outer != "tool_result" {
				l.add(ps.path, ps.s, false)
				continue
			}
		}
		typ := stringOf(termAt(result, append(ps.path[:ps.block:ps.block], pathStep{key: keyType})))
		if typ == "" && l.variant == nil && hasKeyFold(termAt(result, ps.path[:ps.block]), keyType) {
			l.variant = append(ps.path[:ps.block:ps.block], pathStep{key: keyType})
		}
		switch typ {
		case "image", "audio":
			if ps.leaf == leafData {
				continue
			}
		case "resource":
			if ps.leaf == leafBlob {
				l.mimeVariant(result, ps.path)
				plain, n := sc.plainBlob(ps.s, mimeAt(result, ps.path))
				blobsPlain, blobText = blobsPlain && plain, blobText+n
				continue
			}
		}
		if ps.leaf == leafContents {
			l.mimeVariant(result, ps.path)
			plain, n := sc.plainBlob(ps.s, mimeAt(result, ps.path))
			blobsPlain, blobText = blobsPlain && plain, blobText+n
			continue
		}
		l.add(ps.path, ps.s, false)
	}
	if l.variant != nil {
		return nil, nil, variantRefusal(l.variant)
	}
	clean := !l.flagged && blobsPlain && blobText <= longBlob
	var seams []*ast.Term
	if sh == shapeToolResult && (!inputRequired || termAt(result, []pathStep{{key: keyContent}}) != nil) {
		if err := sc.acrossItems(result); err != nil {
			return nil, nil, err
		}
		var content *ast.Array
		seams, content = sc.seams(result)
		clean = clean && content != nil && len(seams) == 0
		for i := range contentLen(content) {
			clean = clean && sc.plainItem(content.Elem(i).Value)
		}
	}
	scan = ast.ObjectTerm(
		ast.Item(keyClean, ast.InternedTerm(clean)),
		thresholdItem,
		ast.Item(keyBytes, ast.InternedTerm(l.bytes)),
		ast.Item(keyKeyBytes, ast.InternedTerm(l.keyBytes)),
		ast.Item(keyStrings, ast.ArrayTerm(l.entries...)),
		ast.Item(keySeams, ast.ArrayTerm(seams...)),
	)
	return result, scan, nil
}

// mimeVariant takes note of a member beside the blob at path that is
// mimeType spelled in another case (variantRefusal): the policy reads no
// mimeType, and a runner that ignores case reads that one (a charset,
// say). The policy withholds such a blob too (its unreadable_blobs).
func (l *scanEntries) mimeVariant(result *ast.Term, path []pathStep) {
	if parent := path[: len(path)-1 : len(path)-1]; l.variant == nil && hasKeyFold(termAt(result, parent), keyMimeType) {
		l.variant = append(parent, pathStep{key: keyMimeType})
	}
}

// hasKeyFold reports whether t is an object with a member named key in
// another case.
func hasKeyFold(t *ast.Term, key *ast.Term) bool {
	obj, ok := termValue(t).(ast.Object)
	if !ok {
		return false
	}
	found := false
	obj.Foreach(func(k, _ *ast.Term) {
		found = found || isKeyFold(pathStep{key: k}, key) && !isKey(pathStep{key: k}, key)
	})
	return found
}

// termAt is the value at path in result, nil when there is none.
func termAt(result *ast.Term, path []pathStep) *ast.Term {
	t := result
	for _, step := range path {
		switch v := t.Value.(type) {
		case ast.Object:
			if step.key == nil {
				return nil
			}
			t = v.Get(step.key)
		case *ast.Array:
			if step.key != nil || step.index >= v.Len() {
				return nil
			}
			t = v.Elem(step.index)
		default:
			return nil
		}
		if t == nil {
			return nil
		}
	}
	return t
}

// stringOf is the string t holds, "" when it holds none.
func stringOf(t *ast.Term) string {
	if t == nil {
		return ""
	}
	s, _ := t.Value.(ast.String)
	return string(s)
}

// seams lists the consecutive text items of a tool result's content whose
// meeting point may hide a secret; content is the content array, if the
// result has one.
func (sc *scanner) seams(result *ast.Term) (seams []*ast.Term, content *ast.Array) {
	content = contentOf(result)
	prev, prevText := -1, ""
	eachTextItem(content, func(i int, text string) {
		if prev >= 0 {
			// An invisible character anywhere in either item lists the
			// seam: the windows are stretched on the text as it is, where
			// one ends a token run that the policy's cleaned text continues.
			w := seamLeft(prevText) + seamRight(text)
			if sc.hasMarker(w) || sc.hasInvisible(prevText) || sc.hasInvisible(text) {
				seams = append(seams, ast.ArrayTerm(ast.InternedTerm(prev), ast.InternedTerm(i)))
			}
		}
		prev, prevText = i, text
	})
	return seams, content
}

// contentOf is a tool result's content array, nil when it has none.
func contentOf(result *ast.Term) *ast.Array {
	obj, ok := result.Value.(ast.Object)
	if !ok {
		return nil
	}
	content, _ := termValue(obj.Get(keyContent)).(*ast.Array)
	return content
}

// eachTextItem calls f with the index and text of each text item of
// content, in order.
func eachTextItem(content *ast.Array, f func(i int, text string)) {
	for i := range contentLen(content) {
		item, ok := content.Elem(i).Value.(ast.Object)
		if !ok {
			continue
		}
		if typ, _ := stringAt(item, keyType); typ != "text" {
			continue
		}
		if text, ok := stringAt(item, keyText); ok {
			f(i, text)
		}
	}
}

// plainItem reports whether a content item is of a type of MCP's with the
// fields the policy inspects (its well_formed rule) and, for an embedded
// resource's blob, valid base64 whose decoded bytes hold no marker.
func (sc *scanner) plainItem(v ast.Value) bool {
	item, ok := v.(ast.Object)
	if !ok {
		return false
	}
	typ, _ := stringAt(item, keyType)
	switch typ {
	case "text":
		_, ok = stringAt(item, keyText)
	case "image", "audio":
		_, ok = stringAt(item, keyData)
	case "resource_link":
		_, ok = stringAt(item, keyURI)
	case "resource":
		res, isObj := termValue(item.Get(keyResource)).(ast.Object)
		if !isObj {
			return false
		}
		_, hasText := stringAt(res, keyText)
		blob, hasBlob := stringAt(res, keyBlob)
		if !hasBlob {
			return hasText
		}
		plain, _ := sc.plainBlob(blob, res.Get(keyMimeType))
		return plain
	default:
		return false
	}
	return ok
}

func termValue(t *ast.Term) ast.Value {
	if t == nil {
		return nil
	}
	return t.Value
}

func lastRunes(s string, n int) string {
	i := len(s)
	for ; n > 0 && i > 0; n-- {
		_, size := utf8.DecodeLastRuneInString(s[:i])
		i -= size
	}
	return s[i:]
}

func firstRunes(s string, n int) string {
	i := 0
	for ; n > 0 && i < len(s); n-- {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i]
}

func contentLen(a *ast.Array) int {
	if a == nil {
		return 0
	}
	return a.Len()
}

func stringAt(obj ast.Object, key *ast.Term) (string, bool) {
	t := obj.Get(key)
	if t == nil {
		return "", false
	}
	s, ok := t.Value.(ast.String)
	return string(s), ok
}
