package mcpproxy

// Adversarial review of 633c76c (needles.go: the sampled 4-gram
// needleSet, the needle cache; redact.go: decodedHolds, mayBreak's and
// isASCII's rewrites) against the search it replaced (99fdecf).
//
// Attack: the old redactCredential (99fdecf), copied here verbatim
//   (old3Redact), against the new one on random
//   upstream messages of every kind (tool results with one to three text
//   items, structured content, resource blobs, errors, notifications,
//   server requests), credentials of 8 to 40 bytes (8–15: pieces of four)
//   with '/', quotes, backslashes, control characters and characters
//   outside ASCII, written as they are, \u-escaped (every character or
//   some, surrogate pairs included), with \/, broken up by ignorable
//   characters (as they are or escaped, tags as surrogate pairs), in
//   base64 (standard and URL-safe, padded or not, at every offset, in
//   lines of 12 to 76 characters, inside a longer text), split across text
//   items, near misses: TestRedaction3NewSearchDecidesAsTheOld.
// Attack: needleSet.groupsIn with a needle, or a needle cut short, at the
//   very end of texts of every length, for every credential length from 8
//   to 40 (a gram read past the end, a sampled position that skips the
//   last occurrence): TestRedaction3GroupsInAtTheEnd.
// Attack: the needle cache past its bound and under concurrent use by 16
//   goroutines (needles of one credential returned for another, a
//   credential's needles cleared while in use):
//   TestRedaction3NeedleCacheUnderLoad.
// Attack: nextNonASCII/isASCII and mayBreak at every alignment of the
//   eight-byte words (a byte outside ASCII, an ignorable character or a
//   truncated UTF-8 sequence in the last bytes, or straddling a word):
//   TestRedaction3ASCIIWordsAtEveryAlignment.
// Attack (finding, pre-existing: 99fdecf behaves the same): the credential
//   split across two text items, each part \u-escaped, or broken up by
//   zero-width characters, so that no piece of it is in the message's
//   bytes as it is: the check of text items (acrossTextItems) runs only
//   when a piece is, so the runner, which decodes and joins the items,
//   reads the credential. TestRedaction3EscapedAcrossTwoTextItems.
// Attack (finding, pre-existing): the credential split across three text
//   items so that each of its pieces (chunks) is cut, with no escape at
//   all: no piece is in the bytes as it is, nothing is refused.
//   TestRedaction3AcrossThreeTextItems.
// Attack (finding, pre-existing): the credential's base64 split across two
//   text items (no item holds it whole): redactBase64 looks at each string
//   alone, acrossTextItems only at the credential as it is.
//   TestRedaction3Base64AcrossTwoTextItems.
// The three findings are fixed: acrossTextItems runs on every tool result
//   with two text items or more, and reads the ends of each, decoded and
//   without ignorable characters (mcpmsg.StringEnds), for the credential
//   and its base64.
//
// Holds: the new search redacts and refuses exactly what the old one did
//   (byte for byte, error for error) on 20000 random messages, and
//   mayHoldCredential answers the same; no panic.
// Holds: groupsIn finds what bytes.Contains finds at the end of every text
//   and never reads past it.
// Holds: the cache only ever returns the needles of the credential asked
//   for (it is keyed by the credential itself), stays bounded and
//   concurrent use is safe. (Note: it keeps up to 4096 credentials in the
//   process's memory after their calls ended; no leak to a runner.)
// Holds: isASCII and mayBreak agree with the byte-by-byte versions at every
//   alignment.

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// --- the search of 99fdecf, verbatim but for the names

func old3ContainsAnyOf(b []byte, subs []string) bool {
	for _, sub := range subs {
		if bytes.Contains(b, []byte(sub)) {
			return true
		}
	}
	return false
}

func old3IsASCII(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func old3MayHide(raw []byte, secret string) bool {
	if strings.ContainsAny(secret, "\"\\") || strings.ContainsFunc(secret, func(r rune) bool { return r < 0x20 }) {
		return true
	}
	return bytes.Contains(raw, []byte(`\u`)) || bytes.Contains(raw, []byte(`\/`)) || !old3IsASCII(raw)
}

func old3MayBreak(raw []byte) bool {
	if !old3IsASCII(raw) && bytes.ContainsFunc(raw, ignorable) {
		return true
	}
	for i := 0; ; {
		j := bytes.Index(raw[i:], []byte(`\u`))
		if j < 0 {
			return false
		}
		i += j + 2
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

func old3Redact(h *Handler, call *gateway.Call, msg mcpmsg.Message) (mcpmsg.Message, error) {
	secret := secretOf(call.Credential)
	if secret == "" {
		return msg, nil
	}
	// The check of text items is today's (it once ran only when a piece
	// of the credential was in the bytes as it is; the findings below):
	// the comparison is of the search.
	if err := acrossTextItems(msg, secret, inBase64(secret).whole); err != nil {
		return msg, err
	}
	pieces := inBase64(secret)
	if !bytes.Contains(msg.Raw, []byte(secret)) && !old3MayHide(msg.Raw, secret) && !old3ContainsAnyOf(msg.Raw, pieces.eights) {
		return msg, nil
	}
	if !mcpmsg.ContainsString(msg.Raw, secret) && !old3MayBreak(msg.Raw) && !old3ContainsAnyOf(msg.Raw, pieces.eights) && !pieces.inStrings(msg.Raw) {
		return msg, nil
	}
	raw, changed := mcpmsg.ReplaceStrings(msg.Raw, func(s string) (string, bool) {
		if pieces.inString(s) {
			if out, ok := redactBase64(s, secret, inBase64(secret).whole); ok {
				return out, true
			}
		}
		return redactIn(s, secret)
	})
	if !changed {
		return msg, nil
	}
	return mcpmsg.Parse(raw, h.limits)
}

// --- helpers

func call3(value string) *gateway.Call {
	return &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Credential: &gateway.Credential{Header: "Authorization", Value: value}}
}

// escapeAll is s as the inside of a JSON string with every character
// written \uXXXX (surrogate pairs beyond the BMP).
func escapeAll(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r > 0xFFFF {
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04X`, hi, lo)
			continue
		}
		fmt.Fprintf(&b, `\u%04x`, r)
	}
	return b.String()
}

// quoteInside is s as the inside of a JSON string, each character escaped
// with probability p (\uXXXX, or \/ for a slash), the others as Quote
// writes them.
func quoteInside(rng *rand.Rand, s string, p float64) string {
	var b strings.Builder
	for _, r := range s {
		if rng.Float64() < p {
			if r == '/' && rng.IntN(2) == 0 {
				b.WriteString(`\/`)
			} else {
				b.WriteString(escapeAll(string(r)))
			}
			continue
		}
		q := mcpmsg.Quote(string(r))
		b.Write(q[1 : len(q)-1])
	}
	return b.String()
}

var ignorables3 = []rune{0x200B, 0x00AD, 0x2062, 0xFEFF, 0xFE0F, 0x180E, 0x034F, 0xE0020, 0xE0101, 0x1D173, 0x2066}

// --- holds

func TestRedaction3NewSearchDecidesAsTheOld(t *testing.T) {
	h := testHandler()
	rng := rand.New(rand.NewPCG(3, 633))
	alphabets := []string{
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
		"ab12-._~+/=",
		"aA/+",
		"abc\"\\/x\x01é€",
		"ab",
	}
	word := func(n int, from string) string {
		rs := []rune(from)
		var b strings.Builder
		for range n {
			b.WriteRune(rs[rng.IntN(len(rs))])
		}
		return b.String()
	}
	filler := func() string { return word(rng.IntN(40), "lorem ipsum dolor, sit amet é 日本 \n\t") }
	// variant is text that holds the secret (or nearly) in one of the
	// shapes an upstream may write it in.
	variant := func(secret string) string {
		switch rng.IntN(9) {
		case 0, 1:
			return filler() + secret + filler()
		case 2: // broken up by ignorable characters
			var b strings.Builder
			for i, r := range secret {
				if i > 0 && rng.IntN(3) == 0 {
					b.WriteRune(ignorables3[rng.IntN(len(ignorables3))])
				}
				b.WriteRune(r)
			}
			return filler() + b.String()
		case 3, 4: // base64 at an offset, in lines or not, in a text or not
			encs := []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding}
			e := encs[rng.IntN(len(encs))].EncodeToString([]byte(word(rng.IntN(5), "xyz:") + secret + word(rng.IntN(5), " \n")))
			if rng.IntN(2) == 0 {
				w := 12 + rng.IntN(65)
				var lines []string
				for len(e) > w {
					lines, e = append(lines, e[:w]), e[w:]
				}
				e = strings.Join(append(lines, e), []string{"\n", "\r\n", " "}[rng.IntN(3)])
			}
			if rng.IntN(2) == 0 {
				return "Authorization: Basic " + e + " (line 2)"
			}
			return e
		case 5: // a near miss
			b := []byte(secret)
			b[rng.IntN(len(b))] ^= 1
			return filler() + string(b)
		case 6: // a part
			return filler() + secret[:rng.IntN(len(secret))]
		case 7: // the base64 of a part
			return base64.StdEncoding.EncodeToString([]byte(secret[:len(secret)/2+rng.IntN(len(secret)/2)]))
		}
		return filler()
	}
	str := func(s string) string {
		switch rng.IntN(4) {
		case 0:
			return `"` + quoteInside(rng, s, 0.3) + `"`
		case 1:
			return `"` + quoteInside(rng, s, 1) + `"`
		}
		return string(mcpmsg.Quote(s))
	}
	messages, changed, refused := 0, 0, 0
	for trial := range 20000 {
		secret := word(8+rng.IntN(33), alphabets[rng.IntN(len(alphabets))])
		value := "Bearer " + secret
		if rng.IntN(3) == 0 {
			value = secret
		}
		call := call3(value)
		secret = secretOf(call.Credential)
		if secret == "" {
			continue
		}
		var raw string
		switch rng.IntN(7) {
		case 0, 1: // text items, the secret perhaps split across them
			text := variant(secret)
			n := 1 + rng.IntN(3)
			var items []string
			for k := range n {
				cut := len(text)
				if k < n-1 {
					cut = rng.IntN(len(text) + 1)
				}
				items = append(items, `{"type":"text","text":`+str(text[:cut])+`}`)
				text = text[cut:]
			}
			raw = `{"jsonrpc":"2.0","id":1,"result":{"content":[` + strings.Join(items, ",") + `]}}`
		case 2:
			raw = `{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"k":` + str(variant(secret)) + `,` + str(variant(secret)) + `:1}}}`
		case 3:
			raw = `{"jsonrpc":"2.0","id":1,"result":{"contents":[{"uri":"file:///a","blob":"` + base64.StdEncoding.EncodeToString([]byte(variant(secret))) + `"}]}}`
		case 4:
			raw = `{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":` + str(variant(secret)) + `,"data":{"d":` + str(variant(secret)) + `}}}`
		case 5:
			raw = `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":` + str(variant(secret)) + `}}`
		case 6:
			raw = `{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":` + str(variant(secret)) + `}}],"maxTokens":5}}`
		}
		msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{})
		if err != nil {
			continue
		}
		messages++
		oldMsg, oldErr := old3Redact(h, call, msg)
		newMsg, newErr := h.redactCredential(call, msg)
		if (oldErr != nil) != (newErr != nil) || !bytes.Equal(oldMsg.Raw, newMsg.Raw) {
			t.Fatalf("trial %d: secret %q in %s:\nold %s (%v)\nnew %s (%v)", trial, secret, raw, oldMsg.Raw, oldErr, newMsg.Raw, newErr)
		}
		switch {
		case newErr != nil:
			refused++
		case !bytes.Equal(newMsg.Raw, msg.Raw):
			changed++
		}
	}
	if messages < 15000 || changed < 2000 || refused < 50 {
		t.Fatalf("%d messages parsed, %d redacted, %d refused: the generator is wrong", messages, changed, refused)
	}
	t.Logf("%d messages: %d redacted, %d refused, the same by both", messages, changed, refused)
}

func TestRedaction3GroupsInAtTheEnd(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 15))
	const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for n := 8; n <= 40; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = letters[rng.IntN(len(letters))]
		}
		secret := string(b)
		pieces := inBase64(secret)
		groups := [][]string{chunks(secret), pieces.eights}
		set := needlesOf(secret).set
		for _, needle := range append(append([]string{secret}, chunks(secret)...), pieces.eights...) {
			for cut := 0; cut <= len(needle); cut++ {
				for pad := 0; pad < 12; pad++ {
					text := []byte(strings.Repeat("~", pad) + needle[:cut])
					// A text whose capacity ends where it does: a read past
					// its end panics.
					text = text[:len(text):len(text)]
					if got, want := set.groupsIn(text), naiveGroups(text, groups...); got != want {
						t.Fatalf("secret %q, text %q: groups %b, want %b", secret, text, got, want)
					}
				}
			}
		}
	}
}

func TestRedaction3NeedleCacheUnderLoad(t *testing.T) {
	var c needleCache
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 700 {
				// Shared and own credentials, some asked for again.
				secret := fmt.Sprintf("cred-%02d-%05d-tail", g%8, i)
				cn := c.of(secret)
				if !reflect.DeepEqual(cn.pieces, inBase64(secret)) {
					errs <- fmt.Sprintf("%q: the base64 pieces of another credential", secret)
					return
				}
				if cn.set.groupsIn([]byte("x"+secret+"x"))&inPieces == 0 {
					errs <- fmt.Sprintf("%q: its own pieces are not found", secret)
					return
				}
				if cn.set.groupsIn([]byte(base64.StdEncoding.EncodeToString([]byte(secret))))&inBase64Pieces == 0 {
					errs <- fmt.Sprintf("%q: its own base64 is not found", secret)
					return
				}
				other := fmt.Sprintf("zzzz-%02d-%05d-QQQQ", g, i)
				if cn.set.groupsIn([]byte(other)) != 0 {
					errs <- fmt.Sprintf("%q: the needles find %q", secret, other)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := c.n.Load(); n > maxCachedNeedles+16 {
		t.Errorf("%d credentials counted, bound %d", n, maxCachedNeedles)
	}
	// Past the bound, sequentially, each credential still gets its own.
	for i := range maxCachedNeedles + 100 {
		secret := fmt.Sprintf("seq-credential-%06d", i)
		if cn := c.of(secret); cn.set.groupsIn([]byte(secret))&inPieces == 0 {
			t.Fatalf("%q: the needles of another credential", secret)
		}
	}
	size := 0
	c.m.Range(func(_, _ any) bool { size++; return true })
	if size > maxCachedNeedles {
		t.Errorf("%d credentials cached, bound %d", size, maxCachedNeedles)
	}
}

func TestRedaction3ASCIIWordsAtEveryAlignment(t *testing.T) {
	for _, odd := range []string{"é", "\u200b", "\xe2\x80", "\xff", "\U000E0020", "\u00ad", "日"} {
		for n := 0; n < 40; n++ {
			for at := 0; at <= n; at++ {
				b := []byte(strings.Repeat("a", at) + odd + strings.Repeat("b", n-at))
				b = b[:len(b):len(b)]
				if got, want := isASCII(b), old3IsASCII(b); got != want {
					t.Fatalf("isASCII(%q) = %v", b, got)
				}
				if got, want := nextNonASCII(b), bytes.IndexFunc(b, func(r rune) bool { return r >= utf8.RuneSelf }); got != want {
					t.Fatalf("nextNonASCII(%q) = %d, want %d", b, got, want)
				}
				if got, want := mayBreak(b), old3MayBreak(b); got != want {
					t.Fatalf("mayBreak(%q) = %v, want %v", b, got, want)
				}
			}
			b := []byte(strings.Repeat("a", n))
			if !isASCII(b) || nextNonASCII(b) != n || mayBreak(b) {
				t.Fatalf("%d bytes of ASCII", n)
			}
		}
	}
}

// --- findings

// runnerText is what a runner reads of a tool result's text items: each
// decoded, joined, without the characters the result policy removes.
func runnerText(raw []byte) string {
	var b strings.Builder
	gjson.GetBytes(raw, "result.content").ForEach(func(_, item gjson.Result) bool {
		if item.Get("type").String() == "text" {
			b.WriteString(strings.Map(func(r rune) rune {
				if ignorable(r) {
					return -1
				}
				return r
			}, item.Get("text").String()))
		}
		return true
	})
	return b.String()
}

// leaksAcross reports whether the runner, joining the text items of what
// redactCredential passes on, reads secret.
func leaksAcross(t *testing.T, h *Handler, call *gateway.Call, raw string) bool {
	t.Helper()
	msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.redactCredential(call, msg)
	if err != nil {
		return false // refused: the runner gets toolgate's error
	}
	return strings.Contains(runnerText(got.Raw), secretOf(call.Credential))
}

func TestRedaction3EscapedAcrossTwoTextItems(t *testing.T) {
	h := testHandler()
	for _, secret := range []string{"tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T", "s3cr3t-Tok9"} {
		call := call3("Bearer " + secret)
		k := len(secret) / 2
		// Every character \u-escaped: plain JSON, no policy needed.
		raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"key ` + escapeAll(secret[:k]) +
			`"},{"type":"text","text":"` + escapeAll(secret[k:]) + ` is valid"}]}}`
		if leaksAcross(t, h, call, raw) {
			t.Errorf("the credential %q, \\u-escaped and split across two text items, reaches the runner: %s", secret, raw)
		}
		// A zero-width space in each piece of it (the result policy
		// removes them; runners join the items).
		var broken strings.Builder
		cut := 0 // where the k-th byte of the secret is written
		for i := range len(secret) {
			if i%2 == 1 {
				broken.WriteString("\u200b")
			}
			if i == k {
				cut = broken.Len()
			}
			broken.WriteByte(secret[i])
		}
		b := broken.String()
		raw = `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":` + string(mcpmsg.Quote("key "+b[:cut])) +
			`},{"type":"text","text":` + string(mcpmsg.Quote(b[cut:]+" is valid")) + `}]}}`
		if leaksAcross(t, h, call, raw) {
			t.Errorf("the credential %q, broken up by zero-width spaces and split across two text items, reaches the runner: %s", secret, raw)
		}
	}
}

func TestRedaction3AcrossThreeTextItems(t *testing.T) {
	h := testHandler()
	for _, secret := range []string{"tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T", "s3cr3t-Tok9", "0123456789abcdefXYZ"} {
		call := call3("Bearer " + secret)
		n := 8
		if len(secret) < 16 {
			n = 4
		}
		// Cut in the middle of every piece of n bytes.
		var items []string
		last := 0
		for at := n / 2; at < len(secret); at += n {
			items = append(items, secret[last:at])
			last = at
		}
		items = append(items, secret[last:])
		var content []string
		for _, it := range items {
			content = append(content, `{"type":"text","text":`+string(mcpmsg.Quote(it))+`}`)
		}
		raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[` + strings.Join(content, ",") + `]}}`
		if leaksAcross(t, h, call, raw) {
			t.Errorf("the credential %q, split across %d text items, reaches the runner: %s", secret, len(items), raw)
		}
	}
}

func TestRedaction3Base64AcrossTwoTextItems(t *testing.T) {
	h := testHandler()
	secret := "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"
	call := call3("Bearer " + secret)
	e := base64.StdEncoding.EncodeToString([]byte("Authorization: Bearer " + secret + "\n"))
	k := len(e) / 2
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"header dump: ` + e[:k] +
		`"},{"type":"text","text":"` + e[k:] + ` (end)"}]}}`
	msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.redactCredential(call, msg)
	if err != nil {
		return // refused
	}
	joined := runnerText(got.Raw)
	for _, w := range inBase64(secret).whole {
		if strings.Contains(joined, w) {
			t.Errorf("the credential's base64, split across two text items, reaches the runner (%q in the joined text %q)", w, joined)
			break
		}
	}
}

// mayBreak is what the search asks of raw (redactedSecret): a character
// that ignorable reports, as it is or escaped.
func mayBreak(raw []byte) bool { return wideBreak(raw) || escapedBreak(raw) }

// inStrings is what the search asks of raw's strings (redactedSecret):
// the base64 pieces in them, decoded, when raw has escapes.
func (p base64Pieces) inStrings(raw []byte) bool {
	return hidingEscapes(raw) && p.inEscapedStrings(raw)
}
