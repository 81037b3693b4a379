package mcpproxy

// Adversarial review of 231891a (acrossTextItems on every tool result of
// two text items or more, reading only the ends of each item:
// mcpmsg.StringEnds, Elements, Members; itemEnds.crosses).
//
// Attack (finding): the credential's base64 across text items, with line
//   breaks (which Go's base64 decoder, and the check's own stripBlanks,
//   skip) where the window is measured: the window is 2*len(secret)+8
//   decoded bytes *before* the blanks are stripped, so a run of line breaks
//   at the start of the next item (or at the end of the previous one, or
//   in a cut middle item), or base64 in lines of one or two characters,
//   leaves the base64 out of the ends looked at. The runner joins the items
//   and decodes the base64 to the credential; nothing is redacted or
//   refused. TestRedaction4Base64AcrossItemsBehindLineBreaks.
// Attack (finding): case variants of the members acrossTextItems reads
//   ("Text", "Type", "Content"): Parse accepts them (case variants are
//   refused only among the keys of one object, and for the message's and
//   params' own members), Members matches keys exactly, but a runner that
//   decodes with Go's encoding/json (which the package's own docs name as
//   the reason case variants matter) reads {"type":"text","Text":"…"} as a
//   text item. The credential split across such items is neither redacted
//   nor refused. TestRedaction4CaseVariantKeysAcrossTextItems.
// Attack (finding, pre-existing, one item): the credential's base64 in
//   76-character lines (MIME) after a few lines of text, one line break
//   falling inside the credential's base64: redactBase64 cannot decode the
//   whole string (the text before it) and looks at runs of base64
//   characters, which the line breaks end, so no run holds the base64
//   whole; the pieces are found (needles) but nothing is redacted.
//   TestRedaction4Base64InLinesInOneItem.
// Attack (finding, cost): itemEnds.crosses is quadratic: for every
//   occurrence of the credential that does not cross a boundary (each item
//   holding it whole, as an upstream that knows the credential can write
//   it), it scans every item's end. Measured: text items of
//   {"type":"text","text":"<the credential>"}: 81 ms for 512 KiB, 1.07 s
//   for 2 MiB (13 times for 4 times the bytes; the same messages without
//   the credential 9 and 22 ms); 16 MiB, the default max_response_bytes,
//   about a minute of CPU per message. BenchmarkAcrossTextItemsHoldingTheCredential.
//
// The four findings are fixed: the base64's window is counted without
//   blanks and line breaks (StringEnds with ignorableOrBlank); members are
//   read as a case-insensitive decoder reads them (isKey); redactBase64
//   reads runs of base64 across line breaks and re-encodes the lines that
//   decode (decodedLines); crosses finds the first item end past each
//   occurrence by binary search. The cost findings are benchmarks
//   (tests do not measure time): BenchmarkAcrossTextItemsHoldingTheCredential
//   and BenchmarkAcrossTextItemsIgnorableHeavy.
//
// Holds: the plain credential across two text items, written as it is,
//   every character \u-escaped (surrogate pairs for characters beyond the
//   BMP), broken up by ignorable characters (as they are, or as escaped
//   surrogate pairs), after fillers of every length from 0 to 6w+40 units
//   (ASCII, two- and four-byte characters, escaped quotes and backslashes,
//   escaped line breaks, ignorable characters) — so that the tail window
//   and decodeStart's back-off land on every kind of character — and before
//   fillers that make the next item whole or cut: always refused, for
//   secrets with '/', '+', '=', '~' and characters outside ASCII.
//   TestRedaction4PlainAcrossItemsAtEveryWindowEdge.
// Holds: three or more items (each piece of the credential its own item),
//   empty items, items of ignorable characters only, non-text items
//   between, a type written "te\u0078t", a key written "te\u0078t": refused.
//   TestRedaction4AcrossItemsWithEmptyAndOtherItems.
// Holds: a "text" member twice in one item, in another case or escaped:
//   Parse refuses the message. TestRedaction4DuplicateTextMemberRefused.
// Holds: the base64 of the credential (standard, URL-safe and unpadded,
//   offsets 0 to 2, in one line or in CRLF lines of 76 or 12 characters)
//   split across two items at every point where one of its forms crosses
//   the cut: refused (lines of 12 and 76 characters leave the window
//   enough room; see the first finding for denser line breaks).
//   TestRedaction4Base64AcrossItemsAtEveryOffset.
// Holds: ordinary results (text split at random points over many items,
//   base64 of other data split across items, near misses of the
//   credential and of its base64) are neither refused nor changed.
//   TestRedaction4NoFalsePositives.
// Holds: cost of items made mostly of ignorable characters (StringEnds'
//   doubling back) and of many tiny text items: within a small factor of a
//   linear pass. BenchmarkAcrossTextItemsIgnorableHeavy. Measured:
//   1 MiB of ignorable characters in two items 5 ms; 40000 one-character
//   items (1 MiB) 11 ms, 26000 items of 14 bytes 18 ms — linear, but 20 to
//   30 times the 0.56 ms the commit measured on two items (an allocation
//   or more per item): 16 MiB of tiny items ~0.3 s per message.
//
// Holds: Elements, Members, StringEnds, decodeStart on everything Parse
//   and Validate accept: internal/mcpmsg/ends_adversarial_test.go.
//
// Not covered by the brief, noted: acrossTextItems looks at result.content
//   only; the same split in the text items of a sampling/createMessage
//   request's messages (or a prompts/get result's messages) reaches the
//   runner's model unchecked (pre-existing, by design so far).

import (
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// --- helpers

func r4Result(items ...string) string {
	return `{"jsonrpc":"2.0","id":1,"result":{"content":[` + strings.Join(items, ",") + `]}}`
}

// r4Text is a text item whose text is the JSON string inner (its inside,
// already escaped).
func r4Text(inner string) string { return `{"type":"text","text":"` + inner + `"}` }

// r4Q is s as the inside of a JSON string.
func r4Q(s string) string {
	q := mcpmsg.Quote(s)
	return string(q[1 : len(q)-1])
}

// r4Check is what redactCredential makes of raw (which Parse must accept,
// but for a result's member spelled in another case).
func r4Check(t *testing.T, h *Handler, call *gateway.Call, raw string) (mcpmsg.Message, error) {
	t.Helper()
	msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{})
	if err != nil {
		msg = resultSpelledOtherwise(t, raw, err)
	}
	return h.redactCredential(call, msg)
}

// r4RunnerBase64 reports whether the text items of raw, joined as a runner
// joins them (without ignorable characters) and without the blanks and
// line breaks base64 decoders skip, hold one of secret's base64 forms
// (inBase64(secret).whole): what a runner decodes back to the secret.
func r4RunnerBase64(raw []byte, secret string) bool {
	joined := stripBlanks(runnerText(raw))
	for _, w := range inBase64(secret).whole {
		if strings.Contains(joined, w) {
			return true
		}
	}
	return false
}

// stripBlanks is s without the blanks and line breaks base64 decoders
// skip.
func stripBlanks(s string) string {
	return strings.Map(func(r rune) rune {
		if isBlank(r) {
			return -1
		}
		return r
	}, s)
}

// --- findings

func TestRedaction4Base64AcrossItemsBehindLineBreaks(t *testing.T) {
	h := testHandler()
	secret := "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T" // 27 bytes: its base64 is 36 characters, no padding
	call := call3("Bearer " + secret)
	e := base64.StdEncoding.EncodeToString([]byte(secret))
	u := base64.URLEncoding.EncodeToString([]byte("~" + secret + "~~"))
	filler := r4Q(strings.Repeat("(end of the dump) ", 30))
	lines := func(s string, w int, sep string) string {
		var parts []string
		for len(s) > w {
			parts, s = append(parts, s[:w]), s[w:]
		}
		return strings.Join(append(parts, s), sep)
	}
	for _, c := range []struct {
		name  string
		items []string
	}{
		// Blank lines at the start of the second item: its head (62
		// decoded bytes) is all line breaks.
		{"blank lines at the head", []string{
			r4Text("Authorization (base64): " + e[:18]),
			r4Text(strings.Repeat(`\n`, 100) + e[18:] + `\n` + filler)}},
		// At the end of the first: its tail (4w+16 raw bytes, 132 decoded)
		// is all line breaks.
		{"blank lines at the tail", []string{
			r4Text("Authorization (base64): " + e[:18] + strings.Repeat(`\r\n`, 200)),
			r4Text(e[18:] + " " + filler)}},
		// In a middle item, cut: its head and tail are line breaks.
		{"blank lines in a cut middle item", []string{
			r4Text("Authorization (base64): " + e[:12]),
			r4Text(strings.Repeat(`\n`, 150) + e[12:24] + strings.Repeat(`\n`, 150)),
			r4Text(e[24:] + " " + filler)}},
		// Base64 in lines of one or two characters: the head holds 31 or
		// 41 of its characters, the base64 needs 35.
		{"lines of one character", []string{
			r4Text("Authorization (base64): " + e[:1]),
			r4Text(`\n` + lines(e[1:], 1, `\n`) + `\n` + filler)}},
		{"lines of two characters (CRLF)", []string{
			r4Text("Authorization (base64): " + e[:2]),
			r4Text(`\r\n` + lines(e[2:], 2, `\r\n`) + `\r\n` + filler)}},
		// URL-safe, the secret at offset 1.
		{"URL-safe, offset 1, blank lines at the head", []string{
			r4Text("cookie=" + u[:20]),
			r4Text(strings.Repeat(`\n`, 100) + u[20:] + `\n` + filler)}},
	} {
		raw := r4Result(c.items...)
		// What the runner reads: the items joined; Go's decoder skips the
		// line breaks and gives the credential back.
		var m struct {
			Result struct{ Content []struct{ Text string } }
		}
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatal(err)
		}
		var joined strings.Builder
		for _, it := range m.Result.Content {
			joined.WriteString(it.Text)
		}
		b64 := e
		if strings.Contains(c.name, "URL") {
			b64 = u
		}
		// Go's decoders skip line breaks: the runner's joined text, without
		// them, holds the base64, which decodes to the credential.
		flat := strings.NewReplacer("\r", "", "\n", "").Replace(joined.String())
		at := strings.Index(flat, b64)
		enc := base64.StdEncoding
		if b64 == u {
			enc = base64.URLEncoding
		}
		if at < 0 {
			t.Fatalf("%s: the test is wrong: the joined items do not hold the base64", c.name)
		}
		if d, err := enc.DecodeString(flat[at : at+len(b64)]); err != nil || !strings.Contains(string(d), secret) {
			t.Fatalf("%s: the test is wrong: the joined items do not decode to the credential (%q, %v)", c.name, d, err)
		}
		msg, err := r4Check(t, h, call, raw)
		if err != nil {
			continue // refused: the runner gets toolgate's error
		}
		if r4RunnerBase64(msg.Raw, secret) {
			t.Errorf("%s: the credential's base64, across text items with line breaks, reaches the runner (neither redacted nor refused):\n%s", c.name, msg.Raw)
		}
	}
}

// r4CaseInsensitiveRunner is what a runner that decodes with Go's
// encoding/json reads of a tool result's text items, joined.
func r4CaseInsensitiveRunner(t *testing.T, raw []byte) string {
	t.Helper()
	var m struct {
		Result struct {
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, it := range m.Result.Content {
		if it.Type == "text" {
			b.WriteString(it.Text)
		}
	}
	return b.String()
}

func TestRedaction4CaseVariantKeysAcrossTextItems(t *testing.T) {
	h := testHandler()
	secret := "tok-ABCdef/123"
	call := call3("Bearer " + secret)
	for _, raw := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","Text":"key tok-ABC"},{"type":"text","Text":"def/123 is valid"}]}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"key tok-ABC"},{"type":"text","TEXT":"def/123 is valid"}]}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"Type":"text","text":"key tok-ABC"},{"type":"text","text":"def/123 is valid"}]}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"Content":[{"type":"text","text":"key tok-ABC"},{"type":"text","text":"def/123 is valid"}]}}`,
	} {
		msg, err := r4Check(t, h, call, raw)
		if err != nil {
			continue // refused
		}
		if got := r4CaseInsensitiveRunner(t, msg.Raw); strings.Contains(got, secret) {
			t.Errorf("a runner decoding with encoding/json reads the credential (%q) in %s", got, msg.Raw)
		}
	}
}

// BenchmarkAcrossTextItemsHoldingTheCredential: text items that each hold
// the credential whole (an upstream that knows it can write them; nothing
// crosses), and near misses of it, of 512 KiB and 2 MiB. The check once
// compared every occurrence with every item's end: 1 s for 2 MiB.
func BenchmarkAcrossTextItemsHoldingTheCredential(b *testing.B) {
	secret := "tok-ABCdef/123"
	wholes := inBase64(secret).whole
	build := func(text string, size int) mcpmsg.Message {
		var sb strings.Builder
		sb.WriteString(`{"jsonrpc":"2.0","id":1,"result":{"content":[`)
		for i := 0; sb.Len() < size; i++ {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(r4Text(text))
		}
		sb.WriteString(`]}}`)
		msg, err := mcpmsg.Parse([]byte(sb.String()), mcpmsg.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		return msg
	}
	for _, c := range []struct {
		name, text string
		size       int
	}{
		{"near_miss/512KiB", "tok-ABCdef/12X", 512 << 10}, {"near_miss/2MiB", "tok-ABCdef/12X", 2 << 20},
		{"credential/512KiB", secret, 512 << 10}, {"credential/2MiB", secret, 2 << 20},
	} {
		msg := build(c.text, c.size)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(msg.Raw)))
			for b.Loop() {
				if err := acrossTextItems(msg, secret, wholes); err != nil {
					b.Fatalf("refused a result whose items each hold the credential whole, or none (nothing crosses): %v", err)
				}
			}
		})
	}
}

func TestRedaction4Base64InLinesInOneItem(t *testing.T) {
	h := testHandler()
	secret := "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"
	call := call3("Bearer " + secret)
	// A MIME part (an e-mail a tool read): headers, then base64 in lines
	// of 76 characters whose first line break falls inside the
	// credential's base64.
	body := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("-", 27) + "\nAuthorization: Bearer " + secret + "\n"))
	var lines []string
	for len(body) > 76 {
		lines, body = append(lines, body[:76]), body[76:]
	}
	for _, l := range append(lines, body) {
		for _, w := range inBase64(secret).whole {
			if strings.Contains(l, w) {
				t.Fatalf("the test is wrong: line %q holds the base64 whole", l)
			}
		}
	}
	mime := "Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n" + strings.Join(append(lines, body), "\r\n") + "\r\n"
	if d, err := base64.StdEncoding.DecodeString(mime[strings.Index(mime, "\r\n\r\n")+4:]); err != nil || !strings.Contains(string(d), secret) {
		t.Fatalf("the test is wrong: %q, %v", d, err)
	}
	raw := r4Result(r4Text(r4Q(mime)))
	msg, err := r4Check(t, h, call, raw)
	if err != nil {
		return // refused
	}
	if r4RunnerBase64(msg.Raw, secret) {
		t.Errorf("the credential's base64 in 76-character lines after a few header lines, in one text item, is neither redacted nor refused:\n%s", msg.Raw)
	}
}

// --- holds

func TestRedaction4PlainAcrossItemsAtEveryWindowEdge(t *testing.T) {
	h := testHandler()
	rng := rand.New(rand.NewPCG(4, 231))
	// Units a filler is made of (the inside of a JSON string).
	units := [][]string{
		{"x"},
		{"é", "中", "😀", `\ud83d\ude00`, `\u00e9`},
		{`\"`, `\\`, `\/`, `\n`, `\u0041`, `\\u0041`},
		{"\u200b", `\u200b`, `\udb40\udc20`, "\U000E0020", "\u00ad", `\ufe0f`},
		{"x", "é", `\ud83d\ude00`, `\\`, `\n`, "\u200b", `\udb40\udc20`, `\u00ad`},
	}
	filler := func(kind, n int) string {
		var b strings.Builder
		for range n {
			u := units[kind]
			b.WriteString(u[rng.IntN(len(u))])
		}
		return b.String()
	}
	// How the secret's part in an item is written.
	write := func(style int, s string) string {
		switch style {
		case 1:
			return escapeAll(s)
		case 2:
			var b strings.Builder
			for _, r := range s {
				b.WriteString(r4Q(string(r)))
				b.WriteString([]string{"\u200b", `\udb40\udc20`, `\u00ad`}[rng.IntN(3)])
			}
			return b.String()
		}
		return r4Q(s)
	}
	cases := 0
	for _, secret := range []string{"a/b+c=d~", "tok-ABCdef/123", "Zk+/=~ключ-€😀-x", "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"} {
		call := call3("Bearer " + secret)
		w := 2*len(secret) + 8
		var cuts []int // rune boundaries
		for i := range secret {
			if i > 0 {
				cuts = append(cuts, i)
			}
		}
		for fa := 0; fa <= 6*w+40; fa++ {
			kind := fa % len(units)
			k := cuts[rng.IntN(len(cuts))]
			style := rng.IntN(3)
			a := filler(kind, fa) + write(style, secret[:k])
			fb := []int{0, 1, w, 5*w + 20, 8 * w}[rng.IntN(5)]
			b := write(style, secret[k:]) + filler(rng.IntN(len(units)), fb)
			raw := r4Result(r4Text(a), r4Text(b))
			cases++
			if _, err := r4Check(t, h, call, raw); err == nil {
				t.Fatalf("secret %q split at %d after %d filler units not refused: %s", secret, k, fa, raw)
			}
		}
	}
	t.Logf("%d splits refused", cases)
}

func TestRedaction4AcrossItemsWithEmptyAndOtherItems(t *testing.T) {
	h := testHandler()
	secret := "tok-ABCdef/123"
	call := call3("Bearer " + secret)
	long := r4Q(strings.Repeat("lorem ipsum ", 40))
	var each []string
	for _, r := range secret {
		each = append(each, r4Text(r4Q(string(r))))
	}
	for _, raw := range []string{
		r4Result(each...),
		r4Result(r4Text(long+"tok-A"), r4Text(""), `{"type":"image","data":"AAAA","mimeType":"image/png"}`,
			r4Text("\u200b\u200b"), `{"type":"text","text":"BC"}`, `{"type":"te\u0078t","text":"def/1"}`,
			`{"type":"text","te\u0078t":"23 `+long+`"}`),
		r4Result(r4Text(long+"tok-ABCdef"), `{"type":"resource_link","uri":"file:///x","name":"x"}`, r4Text("/123"+long)),
		r4Result(r4Text(long+escapeAll("tok-ABC")), r4Text(`\u0064ef\/123`+long)),
	} {
		if _, err := r4Check(t, h, call, raw); err == nil {
			t.Errorf("not refused: %s", raw)
		}
	}
}

func TestRedaction4DuplicateTextMemberRefused(t *testing.T) {
	for _, raw := range []string{
		r4Result(`{"type":"text","text":"a","Text":"tok-ABC"}`, r4Text("def/123")),
		r4Result(`{"type":"text","text":"a","te\u0078t":"tok-ABC"}`, r4Text("def/123")),
		r4Result(`{"type":"text","Type":"image","text":"tok-ABC"}`, r4Text("def/123")),
	} {
		if _, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{}); err == nil {
			t.Errorf("Parse accepted %s", raw)
		}
	}
}

func TestRedaction4Base64AcrossItemsAtEveryOffset(t *testing.T) {
	h := testHandler()
	cases := 0
	for _, secret := range []string{"a/b+c=d~", "tok-ABCdef/123", "~~>>??ÿ-token-ключ", "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"} {
		call := call3("Bearer " + secret)
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
			for k := range 3 {
				e := enc.EncodeToString([]byte("xyz"[:k] + secret + "\n"))
				for _, width := range []int{0, 76, 12} {
					text := e
					if width > 0 {
						var parts []string
						for len(text) > width {
							parts, text = append(parts, text[:width]), text[width:]
						}
						text = strings.Join(append(parts, text), "\r\n")
					}
					pre := strings.Repeat("header dump ", 20)
					text = pre + text + " end " + strings.Repeat("lorem ", 30)
					for cut := len(pre) - 2; cut < len(text)-len(" end lorem"); cut++ {
						if !utf8.RuneStart(text[cut]) {
							continue
						}
						// Only splits where one of the base64 forms crosses
						// the cut (blanks aside): the rest is one item's
						// redaction (see TestRedaction4Base64InLinesInOneItem).
						left, right := stripBlanks(text[:cut]), stripBlanks(text[cut:])
						joined, crosses := left+right, false
						for _, w := range inBase64(secret).whole {
							for from := 0; ; {
								i := strings.Index(joined[from:], w)
								if i < 0 {
									break
								}
								if from+i < len(left) && from+i+len(w) > len(left) {
									crosses = true
								}
								from += i + 1
							}
						}
						if !crosses {
							continue
						}
						raw := r4Result(r4Text(r4Q(text[:cut])), r4Text(r4Q(text[cut:])))
						cases++
						if _, err := r4Check(t, h, call, raw); err == nil {
							t.Fatalf("the base64 of %q across two items not refused: %s", secret, raw)
						}
					}
				}
			}
		}
	}
	t.Logf("%d splits checked", cases)
}

func TestRedaction4NoFalsePositives(t *testing.T) {
	h := testHandler()
	rng := rand.New(rand.NewPCG(42, 4))
	secret := "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"
	call := call3("Bearer " + secret)
	words := strings.Fields("lorem ipsum dolor sit amet Bearer token Authorization: é 日本 \u200b tgcred- 9Kp4 Lr5T == +/ \n")
	for trial := range 1000 {
		var text strings.Builder
		for range rng.IntN(400) {
			text.WriteString(words[rng.IntN(len(words))])
			text.WriteString([]string{" ", "", "\n", "\r\n"}[rng.IntN(4)])
		}
		switch rng.IntN(4) {
		case 0: // base64 of other data
			other := make([]byte, rng.IntN(200))
			for i := range other {
				other[i] = byte(rng.IntN(256))
			}
			text.WriteString(base64.StdEncoding.EncodeToString(other))
		case 1: // near miss of the secret
			b := []byte(secret)
			b[rng.IntN(len(b))] ^= 1
			text.WriteString(string(b))
		case 2: // near miss of its base64
			b := []byte(base64.StdEncoding.EncodeToString([]byte(secret)))
			b[rng.IntN(len(b))] = '.'
			text.WriteString(string(b))
		}
		s := text.String()
		var items []string
		for len(s) > 0 {
			n := rng.IntN(len(s) + 1)
			for n < len(s) && !utf8.RuneStart(s[n]) {
				n++
			}
			items = append(items, r4Text(r4Q(s[:n])))
			s = s[n:]
		}
		items = append(items, r4Text(""))
		raw := r4Result(items...)
		msg, err := r4Check(t, h, call, raw)
		if err != nil {
			t.Fatalf("trial %d: an ordinary result refused (%v): %s", trial, err, raw)
		}
		if string(msg.Raw) != raw {
			t.Fatalf("trial %d: an ordinary result changed: %s\nto %s", trial, raw, msg.Raw)
		}
	}
}

// BenchmarkAcrossTextItemsIgnorableHeavy: items made mostly of ignorable
// characters (StringEnds doubles back over the whole item) and 40,000
// tiny items, each next to a linear pass over the same message (Parse, and
// the removal of its ignorable characters) for comparison.
func BenchmarkAcrossTextItemsIgnorableHeavy(b *testing.B) {
	secret := "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"
	wholes := inBase64(secret).whole
	mk := func(items []string) mcpmsg.Message {
		msg, err := mcpmsg.Parse([]byte(r4Result(items...)), mcpmsg.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		return msg
	}
	// A few items: a head, half a megabyte of ignorable characters (as
	// they are, or escaped), and an end shorter than the window (the tail
	// is doubled back over the whole item).
	heavy := func(zw string, n int) string {
		return r4Text("head of the item, long enough" + strings.Repeat(zw, n) + "end")
	}
	cases := []struct {
		name string
		msg  mcpmsg.Message
		text string // the same text, decoded, for the linear baseline
	}{
		{"ignorable as is", mk([]string{heavy("\u200b", 170000), heavy("\u200b", 170000)}), strings.Repeat("\u200b", 340000)},
		{"ignorable escaped", mk([]string{heavy(`\u200b`, 85000), heavy(`\udb40\udc20`, 42000)}), strings.Repeat("\u200b", 85000) + strings.Repeat("\U000E0020", 42000)},
	}
	var tiny []string
	for i := 0; len(tiny)*26 < 1<<20; i++ {
		tiny = append(tiny, r4Text("a"))
	}
	cases = append(cases, struct {
		name string
		msg  mcpmsg.Message
		text string
	}{"40000 tiny items", mk(tiny), strings.Repeat("a\u200b", 40000)})
	for _, c := range cases {
		b.Run(c.name+"/linear", func(b *testing.B) {
			for b.Loop() {
				if _, err := mcpmsg.Parse(c.msg.Raw, mcpmsg.Limits{}); err != nil {
					b.Fatal(err)
				}
				strings.Map(func(r rune) rune {
					if ignorable(r) {
						return -1
					}
					return r
				}, c.text)
			}
		})
		b.Run(c.name+"/check", func(b *testing.B) {
			for b.Loop() {
				if err := acrossTextItems(c.msg, secret, wholes); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
