package mcpproxy

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// credentialRedaction replaces the credential toolgate attached to a
// call's upstream requests wherever the upstream writes it back.
const credentialRedaction = gateway.CredentialRedaction

// secretOf is the part of a credential that must never reach a runner
// (gateway.Credential.Secret): "" when too short to look for.
func secretOf(c *gateway.Credential) string { return c.Secret() }

// escapedOtherwise reports whether JSON escapes a character of secret
// with an escape other than \uXXXX and \/.
func escapedOtherwise(secret string) bool {
	return strings.ContainsAny(secret, "\"\\") || strings.ContainsFunc(secret, func(r rune) bool { return r < 0x20 })
}

// hidingEscapes reports whether raw holds a backslash followed by u or /
// (as bytes.Contains of `\u` or `\/` would, even after an escaped
// backslash): escapes that can hide a credential's characters. Text with
// a line break (\n) every few dozen bytes made a search for each escape
// stop at every backslash, twice: one search for backslashes is about
// three times as fast (BenchmarkRedactCredential/1MiB_short_lines).
func hidingEscapes(raw []byte) bool {
	for i := 0; ; {
		j := bytes.IndexByte(raw[i:], '\\')
		if j < 0 {
			return false
		}
		i += j + 1
		if i < len(raw) && (raw[i] == 'u' || raw[i] == '/') {
			return true
		}
	}
}

// decodedHolds reports whether a string of the JSON text raw holds secret
// once decoded. escapes is whether raw may hold secret escaped (it has
// hidingEscapes, or secret has a character JSON escapes otherwise
// (escapedOtherwise)); pieceFound, whether raw
// holds one of secret's pieces (chunks) as it is. Without escapes that
// may hide it, what the strings hold is in raw as it is, and holds the
// secret's pieces with it: a search of the whole secret would stop at
// every byte of text that is its first (a frequent letter).
func decodedHolds(raw []byte, secret string, escapes, pieceFound bool) bool {
	if !escapes {
		return pieceFound && bytes.Contains(raw, []byte(secret))
	}
	return mcpmsg.ContainsString(raw, secret)
}

// wideBreak reports whether raw may hold a character that ignorable
// reports as it is.
func wideBreak(raw []byte) bool {
	for i := nextNonASCII(raw); i < len(raw); {
		r, n := utf8.DecodeRune(raw[i:])
		if ignorable(r) {
			return true
		}
		i += n
		i += nextNonASCII(raw[i:])
	}
	return false
}

// escapedBreak is wideBreak for the characters raw holds escaped
// (\uXXXX, or a surrogate pair of them).
func escapedBreak(raw []byte) bool {
	for i := 0; ; {
		j := bytes.IndexByte(raw[i:], '\\')
		if j < 0 {
			return false
		}
		if i += j + 1; i >= len(raw) || raw[i] != 'u' {
			continue // not \u, or the end
		}
		i++
		r, ok := hex4(raw, i)
		if !ok {
			continue
		}
		if utf16.IsSurrogate(r) {
			if lo, ok := hex4(raw, i+6); ok && bytes.HasPrefix(raw[i+4:], []byte(`\u`)) {
				r = utf16.DecodeRune(r, lo)
			}
		}
		if ignorable(r) {
			return true
		}
	}
}

// hex4 is the code unit written in the four hexadecimal digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// isASCII reports whether b is ASCII, eight bytes at a time.
func isASCII(b []byte) bool {
	return nextNonASCII(b) == len(b)
}

// nextNonASCII is the index of b's first byte outside ASCII, len(b) when
// there is none.
func nextNonASCII(b []byte) int {
	// Four words at a time, the slice advanced rather than indexed: three
	// times as fast as a word at a time through an index.
	const highs = 0x8080808080808080
	rest := b
	for len(rest) >= 32 {
		le := binary.LittleEndian
		if (le.Uint64(rest[0:8])|le.Uint64(rest[8:16])|le.Uint64(rest[16:24])|le.Uint64(rest[24:32]))&highs != 0 {
			break
		}
		rest = rest[32:]
	}
	i := len(b) - len(rest)
	for ; i < len(b); i++ {
		if b[i] >= utf8.RuneSelf {
			return i
		}
	}
	return i
}

// ignorable reports whether r renders as nothing: a format character
// (Cf: zero-width spaces and joiners, bidirectional controls, tags …), a
// default-ignorable code point or a variation selector. The default
// result policy removes these (text.rego's invisible_ranges, a subset), so
// a credential broken up by them would be whole again by the time the
// runner reads it.
func ignorable(r rune) bool {
	return r >= 0x80 && unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// redactIn is s with every occurrence of secret replaced, also where
// ignorable characters break it up (the whole span goes then); false when
// s holds none.
func redactIn(s, secret string) (string, bool) {
	changed := false
	if strings.Contains(s, secret) {
		s, changed = strings.ReplaceAll(s, secret, credentialRedaction), true
	}
	if !strings.ContainsFunc(s, ignorable) {
		return s, changed
	}
	// The text without ignorable characters, and where each of its bytes
	// is in s (worked out only when it holds the secret).
	text := strings.Map(func(r rune) rune {
		if ignorable(r) {
			return -1
		}
		return r
	}, s)
	if !strings.Contains(text, secret) {
		return s, changed
	}
	at := make([]int32, 0, len(text))
	for i, r := range s {
		if !ignorable(r) {
			for range utf8.RuneLen(r) {
				at = append(at, int32(i))
			}
		}
	}
	var out strings.Builder
	last := 0
	for from := 0; ; {
		i := strings.Index(text[from:], secret)
		if i < 0 {
			break
		}
		start, end := from+i, from+i+len(secret)
		spanEnd := len(s)
		if end < len(text) {
			spanEnd = int(at[end])
		}
		out.WriteString(s[last:at[start]])
		out.WriteString(credentialRedaction)
		last, from = spanEnd, end
	}
	if last == 0 {
		return s, changed
	}
	out.WriteString(s[last:])
	return out.String(), true
}

// redactCredential is msg with the call's credential replaced in every
// string it appears in, however the upstream escaped it, broke it up with
// invisible characters or encoded it in base64: runners get results,
// never the caller's credential, whether or not the result policy knows
// its shape. A tool result whose text items hold it, or its base64, only
// once decoded and joined is refused (an error; see acrossTextItems). A
// message without it is returned as it is, at the cost of one pass over
// it for all the credential's pieces (needleSet) and a walk over the ends
// of its text items (and the decoding of its strings when they hold
// escapes or characters outside ASCII).
func (h *Handler) redactCredential(call *gateway.Call, msg mcpmsg.Message) (mcpmsg.Message, error) {
	out, changed, err := h.redacted(call, msg, nil)
	h.logRedacted(call, out, changed)
	return out, err
}

// redacted is redactCredential without its log line, and whether it
// changed msg: each of the credential's secrets (gateway.Credential.
// EachSecret) redacted in turn; pre, when not nil, has read msg's raw bytes
// already (parseRedacted).
// errSecretsUnread: the caller's connection could not be read, so what
// the upstream sent could not be searched for a token it may hold.
var errSecretsUnread = errors.New("toolgate could not read the caller's credential to look for it in what the upstream sent")

func (h *Handler) redacted(call *gateway.Call, msg mcpmsg.Message, pre *prescan) (mcpmsg.Message, bool, error) {
	changed := false
	var err error
	search := func(secret string) bool {
		var ch bool
		msg, ch, err = h.redactedSecret(secret, msg, pre.of(secret, msg.Raw))
		changed = changed || ch
		return err == nil
	}
	if h.app == nil {
		call.Credential.EachSecret(search)
		return msg, changed, err
	}
	if rerr := h.app.EachCallSecret(call, search); rerr != nil && err == nil {
		err = fmt.Errorf("%w: %w", errSecretsUnread, rerr)
	}
	return msg, changed, err
}

// redactedSecret is redacted for one secret; facts, when not nil, are of
// msg.Raw.
func (h *Handler) redactedSecret(secret string, msg mcpmsg.Message, facts *rawFacts) (mcpmsg.Message, bool, error) {
	needles := needlesOf(secret)
	if err := acrossTextItems(msg, secret, needles.pieces.whole); err != nil {
		return msg, false, err
	}
	if facts == nil {
		f := factsOf(needles, msg.Raw)
		facts = &f
	}
	found := facts.found
	// The whole secret holds its first piece; its base64, a base64 piece.
	inBase64 := found&inBase64Pieces != 0
	// Raw, holding none of the secret's pieces as they are, can still
	// hold it escaped or broken up by invisible characters. A secret
	// without control characters, quotes or backslashes (a header value
	// has none) can be hidden only by \uXXXX or \/ escapes, or by
	// characters outside ASCII that the result policy removes: without
	// those, the byte search said it all — and a megabyte of text with
	// line breaks (\n) is not decoded for nothing. Each of these passes
	// over raw runs once.
	rawEscapes := facts.rawEscapes
	escapes := rawEscapes || escapedOtherwise(secret)
	if found == 0 && !escapes && facts.isASCII(msg.Raw) {
		return msg, false, nil
	}
	pieces := needles.pieces
	if !inBase64 && !decodedHolds(msg.Raw, secret, escapes, found&inPieces != 0) && !wideBreak(msg.Raw) &&
		!(rawEscapes && (escapedBreak(msg.Raw) || pieces.inEscapedStrings(msg.Raw))) {
		return msg, false, nil
	}
	raw, changed := mcpmsg.ReplaceStrings(msg.Raw, func(s string) (string, bool) {
		// A string can hold the secret both ways (an echo of a request's
		// headers with its Basic authorization): each is redacted.
		inB64 := false
		if pieces.inString(s) {
			s, inB64 = redactBase64(s, secret, pieces.whole)
		}
		s, plain := redactIn(s, secret)
		return s, inB64 || plain
	})
	if !changed {
		return msg, false, nil
	}
	out, err := mcpmsg.Parse(raw, h.limits)
	return out, true, err
}

// chunks are the pieces of eight bytes (four for a secret shorter than
// sixteen) a secret is made of: a secret split in two keeps one of them
// whole.
func chunks(secret string) []string {
	n := 8
	if len(secret) < 16 {
		n = 4
	}
	var out []string
	for i := 0; i+n <= len(secret); i += n {
		out = append(out, secret[i:i+n])
	}
	return out
}

// acrossTextItems refuses a tool result whose text items, decoded and
// joined as runners join them (without the characters a policy removes),
// hold the credential, or its base64, across a boundary between two of
// them, which no one item holds: split in two or more, escaped, broken up
// by invisible characters. Only the ends of long items are looked at: a
// secret across a boundary lies within its own length of it, its base64
// within twice that (blanks and line breaks aside, which base64 decoders
// skip).
func acrossTextItems(msg mcpmsg.Message, secret string, wholes []string) error {
	var content []byte
	mcpmsg.Members(msg.Result, func(k, v []byte) {
		if isKey(k, "content") {
			content = v
		}
	})
	var few [4][]byte
	texts := few[:0] // each text item's text, as JSON
	mcpmsg.Elements(content, func(item []byte) bool {
		var typ, text []byte
		mcpmsg.Members(item, func(k, v []byte) {
			switch {
			case isKey(k, "type"):
				typ = v
			case isKey(k, "text"):
				text = v
			}
		})
		if isText(typ) && len(text) > 0 && text[0] == '"' {
			texts = append(texts, text)
		}
		return true
	})
	if len(texts) < 2 {
		return nil
	}
	w := 2*len(secret) + 8
	var plain, compact itemEnds
	for _, t := range texts {
		plain.add(mcpmsg.StringEnds(t, w, ignorable))
		// The window of the base64 is counted without the blanks and
		// line breaks a decoder skips: they could fill it.
		compact.add(mcpmsg.StringEnds(t, w, ignorableOrBlank))
	}
	if plain.crosses(secret) {
		return errors.New("the upstream wrote the credential toolgate attached across text items of its result")
	}
	for _, b64 := range wholes {
		if compact.crosses(b64) {
			return errors.New("the upstream wrote the credential toolgate attached, in base64, across text items of its result")
		}
	}
	return nil
}

// isKey reports whether k is the key name, or a spelling of it a
// decoder that ignores case (Go's encoding/json) reads as name: Parse
// refuses two keys of one object that fold together, so there is one.
func isKey(k []byte, name string) bool {
	return string(k) == name || len(k) <= 3*len(name) && mcpmsg.SameFold(string(k), name)
}

func ignorableOrBlank(r rune) bool { return isBlank(r) || ignorable(r) }

func isBlank(r rune) bool { return r == '\n' || r == '\r' || r == ' ' || r == '\t' }

// isText reports whether typ, the JSON text of an item's type, is "text",
// however it is escaped.
func isText(typ []byte) bool {
	if string(typ) == `"text"` {
		return true
	}
	t, ok := mcpmsg.String(typ)
	return ok && t == "text"
}

// itemEnds is the text items of a result joined, each whole or its ends
// only (with a NUL, which no credential holds, where its middle is), and
// where each item ends.
type itemEnds struct {
	b    strings.Builder
	ends []int
}

func (e *itemEnds) add(head, tail string, whole bool) {
	e.b.WriteString(head)
	if !whole {
		e.b.WriteByte(0)
		e.b.WriteString(tail)
	}
	e.ends = append(e.ends, e.b.Len())
}

// crosses reports whether s is in the joined text across the end of an
// item.
func (e *itemEnds) crosses(s string) bool {
	text := e.b.String()
	inner := e.ends[:len(e.ends)-1]
	for from := 0; ; {
		i := strings.Index(text[from:], s)
		if i < 0 {
			return false
		}
		start, end := from+i, from+i+len(s)
		// The first end past start (the ends are in order): a search,
		// since an upstream can write many items that hold s whole.
		if k, _ := slices.BinarySearch(inner, start+1); k < len(inner) && inner[k] < end {
			return true
		}
		from = start + 1
	}
}

// base64Pieces is what a secret looks like inside base64: for each
// alphabet (standard, URL-safe) and each of the three offsets it can have
// in the bytes encoded, the characters that encode its bytes alone. A
// blob (a resource's, or any base64 an upstream sends) holding the
// credential holds one of them, unless line breaks cut it: the start of
// each is also looked for in pieces of eight characters.
type base64Pieces struct{ whole, eights []string }

func inBase64(secret string) base64Pieces {
	var p base64Pieces
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for k := range 3 {
			e := enc.EncodeToString(append(make([]byte, k), secret...))
			first := (8*k + 5) / 6              // the first character whose bits are all the secret's
			last := (8*(k+len(secret)) - 6) / 6 // the last
			w := e[first : last+1]
			if slices.Contains(p.whole, w) {
				continue
			}
			p.whole = append(p.whole, w)
			// Three pieces (the first 24 characters): lines of twelve
			// characters or more leave one whole, and the search is bounded.
			for i := 0; i+8 <= len(w) && i < 24; i += 8 {
				if !slices.Contains(p.eights, w[i:i+8]) {
					p.eights = append(p.eights, w[i:i+8])
				}
			}
		}
	}
	return p
}

func (p base64Pieces) inString(s string) bool {
	for _, sub := range p.eights {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// inEscapedStrings is in for the strings of the JSON text raw, which has
// \u or \/ escapes, decoded (an escape can hide a character of the
// base64).
func (p base64Pieces) inEscapedStrings(raw []byte) bool {
	found := false
	mcpmsg.ReplaceStrings(raw, func(s string) (string, bool) {
		for _, sub := range p.eights {
			found = found || strings.Contains(s, sub)
		}
		return s, false
	})
	return found
}

// redactBase64 is s, base64 (standard or URL-safe, padded or not, perhaps
// in lines) that holds secret in what it encodes, encoded again with the
// secret replaced. In a longer text (a log line with an Authorization
// header, a MIME part), each run of base64 characters and line breaks that
// holds the secret's base64 is replaced so (the lines of it that decode),
// or by the redaction when none do (a runner decoding leniently could
// still read it). whole is the secret's base64 (inBase64(secret).whole).
// false: s holds no such run.
func redactBase64(s, secret string, whole []string) (string, bool) {
	if out, ok := decodedWithout(s, secret); ok {
		return out, true
	}
	var out strings.Builder
	last, changed := 0, false
	for i := 0; i < len(s); {
		if !isBase64Char(s[i]) {
			i++
			continue
		}
		j := base64RunEnd(s, i)
		if holdsBase64(s[i:j], whole) {
			out.WriteString(s[last:i])
			if a, b, enc, ok := decodedLines(s, i, j, secret, whole); ok && !holdsBase64(s[i:a], whole) && !holdsBase64(s[b:j], whole) {
				out.WriteString(s[i:a])
				out.WriteString(enc)
				out.WriteString(s[b:j])
			} else {
				out.WriteString(credentialRedaction)
			}
			last, changed = j, true
		}
		i = j
	}
	if !changed {
		return s, false
	}
	out.WriteString(s[last:])
	return out.String(), true
}

// holdsBase64 reports whether run, base64 perhaps in lines, holds one of
// the secret's base64 forms (whole).
func holdsBase64(run string, whole []string) bool {
	if strings.ContainsAny(run, "\r\n") {
		run = strings.NewReplacer("\r", "", "\n", "").Replace(run)
	}
	return slices.ContainsFunc(whole, func(w string) bool { return strings.Contains(run, w) })
}

// base64RunEnd is where the run of base64 characters at s[i] ends, line
// breaks between them included.
func base64RunEnd(s string, i int) int {
	j := i
	for {
		for j < len(s) && isBase64Char(s[j]) {
			j++
		}
		k := j
		for k < len(s) && (s[k] == '\r' || s[k] == '\n') {
			k++
		}
		if k == j || k == len(s) || !isBase64Char(s[k]) {
			return j
		}
		j = k
	}
}

// decodedLines finds, in the run s[i:j] of base64 in lines, the lines
// s[a:b] that decode to bytes holding secret (the run may begin and end
// with lines of other text: a MIME part's headers, a boundary, the next
// line of a log), and that base64 encoded again without it. It tries the
// first eight line starts, and from each the shortest spans holding one of
// the secret's base64 forms (whole) first, five of them: a longer span
// would take the next line of text into a lenient decoding.
func decodedLines(s string, i, j int, secret string, whole []string) (a, b int, enc string, ok bool) {
	var starts, ends []int
	starts = append(starts, i)
	for k := i; k < j; k++ {
		if s[k] != '\r' && s[k] != '\n' {
			continue
		}
		ends = append(ends, k)
		for k < j && (s[k] == '\r' || s[k] == '\n') {
			k++
		}
		starts = append(starts, k)
	}
	ends = append(ends, j)
	for _, a := range starts[:min(len(starts), 8)] {
		// The shortest span from a that holds a form (spans that hold one
		// only grow): a search, since a blob can have thousands of lines.
		first := sort.Search(len(ends), func(k int) bool { return ends[k] > a && holdsBase64(s[a:ends[k]], whole) })
		for _, b := range ends[first:min(len(ends), first+5)] {
			if enc, ok := decodedWithout(s[a:b], secret); ok {
				return a, b, enc, true
			}
		}
	}
	return 0, 0, "", false
}

// decodedWithout is s, base64 of one of the encodings (ignoring line
// breaks and blanks) whose bytes hold secret, encoded again with the
// secret replaced; false when it is not such base64.
func decodedWithout(s, secret string) (string, bool) {
	compact := strings.Map(func(r rune) rune {
		if isBlank(r) {
			return -1
		}
		return r
	}, s)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		b, err := enc.DecodeString(compact)
		if err == nil && bytes.Contains(b, []byte(secret)) {
			return enc.EncodeToString(bytes.ReplaceAll(b, []byte(secret), []byte(credentialRedaction))), true
		}
	}
	return "", false
}

func isBase64Char(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '-' || c == '_' || c == '='
}

// logRedacted says that an upstream sent back the call's credential.
func (h *Handler) logRedacted(call *gateway.Call, out mcpmsg.Message, changed bool) {
	if changed {
		// The method as redacted: the upstream's own may hold the secret.
		// An answer has none: the call's is what it answers.
		method := out.Method
		if method == "" {
			method = call.Method
		}
		h.logger.Warn("an upstream sent back the credential toolgate attached to the call; it is redacted",
			zap.String("service", call.Service.ID), zap.String("user", call.Caller.User), zap.String("method", method))
	}
}
