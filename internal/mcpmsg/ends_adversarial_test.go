package mcpmsg

// Adversarial review of 231891a's walkers (ends.go: StringEnds,
// decodeStart, Elements, Members, skipValue, stringEnd), which run on the
// credential check of every tool result without validating again.
//
// Attack: random JSON values that Validate accepts (every escape, surrogate
//   pairs, escaped backslashes before a u, quotes, brackets and commas
//   inside strings, numbers with fractions and exponents, literals, every
//   kind of whitespace between tokens, nesting), walked with Elements and
//   Members at every level and compared with encoding/json (the elements'
//   exact text; the keys, decoded, in order, with their values' exact
//   text): TestEndsAdversarialWalkersMatchEncodingJSON.
// Attack: decodeStart from every position j back to every character
//   boundary lo of every string of those values: it must return a
//   character boundary in [lo, j], no further back than one character
//   (12 bytes); and StringEnds for n from 1 to past the string's length
//   with three skip functions (none, ignorable-like, and one that skips a
//   common letter, which makes the tail double back): the head a prefix,
//   the tail a suffix of the decoded text without the skipped characters,
//   each of n bytes or more, not overlapping, or the whole text:
//   TestEndsAdversarialDecodeStartAndStringEnds.
// Attack: the same checks as a native fuzz target over arbitrary bytes
//   that Validate accepts (and messages Parse accepts): FuzzEndsAdversarial
//   (run: go test -run xxx -fuzz FuzzEndsAdversarial -fuzztime 120s).
// Attack: long runs of backslashes and of escaped quotes (stringEnd's and
//   decodeStart's backslash counting) in a megabyte string: linear time.
//   BenchmarkEndsAdversarialBackslashRuns.
//
// Holds: all of the above. Elements and Members read what encoding/json
//   reads (elements' and values' exact text, keys decoded, in order) on
//   every value tried; decodeStart always lands on a character boundary
//   within one character; StringEnds' head and tail are a prefix and a
//   suffix of the decoded text, n bytes or more, never overlapping; no
//   panic or out-of-range read. FuzzEndsAdversarial ran 150 s (inputs up to
//   4096 bytes, 2.09 million executions) and 120 s (up to 1024 bytes, 1.99
//   million) without a failure. Backslash and escaped-quote runs in 2 MiB:
//   2 to 18 ms (Validate: 5 ms).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// --- a generator of valid JSON text

func endsGenString(rng *rand.Rand) string {
	pieces := []string{"a", "Z", "0", " ", ",", ":", "[", "]", "{", "}", "/", `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`,
		`\u0041`, `\u00e9`, `\u200b`, `\u005c`, `\u0022`, `\u005cu0041`, `\ud83d\ude00`, `\uDB40\uDC20`, `\udbff\udfff`,
		"é", "\u200b", "😀", "中", "\U000E0020", `\\u0041`, `\\\u0042`, `\\\\`, "u0041", "\u00ad"}
	var b strings.Builder
	b.WriteByte('"')
	n := rng.IntN(30)
	if rng.IntN(8) == 0 {
		n = rng.IntN(200)
	}
	for range n {
		b.WriteString(pieces[rng.IntN(len(pieces))])
	}
	b.WriteByte('"')
	return b.String()
}

func endsGenSpace(rng *rand.Rand) string {
	if rng.IntN(3) > 0 {
		return ""
	}
	return []string{" ", "\t", "\n", "\r\n", "  \t\n"}[rng.IntN(5)]
}

func endsGenValue(rng *rand.Rand, depth int) string {
	k := rng.IntN(10)
	if depth > 4 {
		k = rng.IntN(6)
	}
	switch k {
	case 0, 1:
		return endsGenString(rng)
	case 2:
		return []string{"0", "-0", "12", "-3.5", "1e5", "1E+2", "2.5e-3", "123456789012345678901234567890"}[rng.IntN(8)]
	case 3:
		return []string{"true", "false", "null"}[rng.IntN(3)]
	case 4, 5:
		if depth > 4 {
			return endsGenString(rng)
		}
		fallthrough
	case 6, 7:
		var b strings.Builder
		b.WriteString("[" + endsGenSpace(rng))
		for i := range rng.IntN(5) {
			if i > 0 {
				b.WriteString(endsGenSpace(rng) + "," + endsGenSpace(rng))
			}
			b.WriteString(endsGenValue(rng, depth+1))
		}
		b.WriteString(endsGenSpace(rng) + "]")
		return b.String()
	}
	var b strings.Builder
	b.WriteString("{" + endsGenSpace(rng))
	for i := range rng.IntN(5) {
		if i > 0 {
			b.WriteString(endsGenSpace(rng) + "," + endsGenSpace(rng))
		}
		b.WriteString(fmt.Sprintf(`"k%d`, i) + strings.Trim(endsGenString(rng), `"`) + `"`)
		b.WriteString(endsGenSpace(rng) + ":" + endsGenSpace(rng))
		b.WriteString(endsGenValue(rng, depth+1))
	}
	b.WriteString(endsGenSpace(rng) + "}")
	return b.String()
}

// --- checks

// endsCheckValue walks raw, a JSON value Validate accepted (no surrounding
// space), with Elements and Members, compares them with encoding/json, and
// checks the ends of its strings; recursively.
func endsCheckValue(t testing.TB, raw []byte, deep bool) {
	switch raw[0] {
	case '[':
		var got [][]byte
		Elements(raw, func(e []byte) bool {
			got = append(got, e)
			return true
		})
		var want []json.RawMessage
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("encoding/json: %v: %s", err, raw)
		}
		if len(got) != len(want) {
			t.Fatalf("Elements gave %d elements, encoding/json %d: %s", len(got), len(want), raw)
		}
		for i := range got {
			if !bytes.Equal(got[i], bytes.TrimSpace(want[i])) {
				t.Fatalf("element %d: Elements %s, encoding/json %s: %s", i, got[i], want[i], raw)
			}
			endsCheckValue(t, got[i], deep)
		}
		// Stopping early.
		n := 0
		Elements(raw, func([]byte) bool { n++; return false })
		if n != min(1, len(want)) {
			t.Fatalf("Elements went on after false: %s", raw)
		}
		Members(raw, func(_, _ []byte) { t.Fatalf("Members called on an array: %s", raw) })
	case '{':
		type member struct{ k, v []byte }
		var got []member
		Members(raw, func(k, v []byte) { got = append(got, member{bytes.Clone(k), v}) })
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if _, err := dec.Token(); err != nil {
			t.Fatal(err)
		}
		var want []member
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
			want = append(want, member{[]byte(tok.(string)), bytes.TrimSpace(v)})
		}
		if len(got) != len(want) {
			t.Fatalf("Members gave %d members, encoding/json %d: %s", len(got), len(want), raw)
		}
		for i := range got {
			if !bytes.Equal(got[i].k, want[i].k) || !bytes.Equal(got[i].v, want[i].v) {
				t.Fatalf("member %d: Members %q: %s, encoding/json %q: %s, in %s", i, got[i].k, got[i].v, want[i].k, want[i].v, raw)
			}
			endsCheckValue(t, got[i].v, deep)
		}
		Elements(raw, func([]byte) bool { t.Fatalf("Elements called on an object: %s", raw); return false })
	case '"':
		if end := stringEnd(raw, 0); end != len(raw) {
			t.Fatalf("stringEnd %d, want %d: %s", end, len(raw), raw)
		}
		if end := skipValue(raw, 0); end != len(raw) {
			t.Fatalf("skipValue %d, want %d: %s", end, len(raw), raw)
		}
		endsCheckString(t, raw, deep)
	default:
		if end := skipValue(raw, 0); end != len(raw) {
			t.Fatalf("skipValue %d, want %d: %s", end, len(raw), raw)
		}
	}
}

var endsSkips = []func(rune) bool{
	func(rune) bool { return false },
	func(r rune) bool { return r == 0x200B || r == 0xE0020 || r == 0xAD },
	func(r rune) bool { return r == 'a' || r == 0x200B || r == '"' },
}

// endsCheckString checks decodeStart and StringEnds on raw, a valid JSON
// string.
func endsCheckString(t testing.TB, raw []byte, deep bool) {
	full, ok := String(raw)
	if !ok {
		t.Fatalf("String refused %s", raw)
	}
	s := raw[1 : len(raw)-1]
	// The character boundaries, by decoding from the start.
	var bounds []int
	isBound := map[int]bool{}
	var dec []byte
	for i := 0; i < len(s); {
		bounds = append(bounds, i)
		isBound[i] = true
		r, size := decodeAt(s, i)
		dec = utf8.AppendRune(dec, r)
		i += size
	}
	isBound[len(s)] = true
	if string(dec) != full {
		t.Fatalf("decodeAt decodes %s to %q, String to %q", raw, dec, full)
	}
	if deep {
		for li, lo := range bounds {
			if li%3 != 0 && len(bounds) > 40 {
				continue
			}
			for j := lo; j < len(s); j++ {
				got := decodeStart(s, lo, j)
				if got < lo || got > j || !isBound[got] || j-got >= 12 {
					t.Fatalf("decodeStart(%s, lo %d, j %d) = %d (boundaries %v)", raw, lo, j, got, bounds)
				}
			}
		}
	}
	for si, skip := range endsSkips {
		clean := strings.Map(func(r rune) rune {
			if skip(r) {
				return -1
			}
			return r
		}, full)
		for n := 1; n <= len(s)+3; n++ {
			if !deep && n > 3 && n%7 != 0 {
				continue
			}
			head, tail, whole := StringEnds(raw, n, skip)
			switch {
			case whole && head != clean:
				t.Fatalf("skip %d: %s (n %d): whole %q, want %q", si, raw, n, head, clean)
			case whole && tail != "":
				t.Fatalf("skip %d: %s (n %d): whole with a tail %q", si, raw, n, tail)
			case !whole && (!strings.HasPrefix(clean, head) || !strings.HasSuffix(clean, tail) || len(head) < n || len(tail) < n):
				t.Fatalf("skip %d: %s (n %d): head %q, tail %q of %q", si, raw, n, head, tail, clean)
			case !whole && len(head)+len(tail) > len(clean):
				t.Fatalf("skip %d: %s (n %d): head %q and tail %q overlap in %q", si, raw, n, head, tail, clean)
			}
		}
	}
}

func TestEndsAdversarialWalkersMatchEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(231, 891))
	checked := 0
	for range 2500 {
		v := endsGenSpace(rng) + endsGenValue(rng, 0) + endsGenSpace(rng)
		if err := Validate([]byte(v), Limits{}); err != nil {
			continue
		}
		checked++
		raw := bytes.TrimSpace([]byte(v))
		endsCheckValue(t, raw, false)
		// With the surrounding space, as a member's value may not have it
		// but an element list does.
		if raw[0] == '[' || raw[0] == '{' {
			n := 0
			Elements([]byte(v), func([]byte) bool { n++; return true })
			Members([]byte(v), func(_, _ []byte) { n++ })
			var arr []json.RawMessage
			var obj map[string]json.RawMessage
			if json.Unmarshal([]byte(v), &arr) == nil && n != len(arr) || json.Unmarshal([]byte(v), &obj) == nil && n != len(obj) {
				t.Fatalf("with surrounding space: %d, want %d/%d: %q", n, len(arr), len(obj), v)
			}
		}
	}
	if checked < 1800 {
		t.Fatalf("only %d values valid: the generator is wrong", checked)
	}
}

func TestEndsAdversarialDecodeStartAndStringEnds(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 231))
	for range 900 {
		raw := []byte(endsGenString(rng))
		if Validate(raw, Limits{}) != nil {
			t.Fatalf("the generator wrote an invalid string: %s", raw)
		}
		endsCheckString(t, raw, true)
	}
}

func FuzzEndsAdversarial(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a\u200bb\ud83d\ude00"},{"type":"te\u0078t","text":"\\\"x"}]}}`,
		`["\\u0041\u005cu0041", {"a":[1,2,{"b":"]"}]}, -0.5e+3, true, null]`,
		`"\udb40\udc20\udb40\udc20abc\\\\\\\""`,
		`{"k":"v" , "l" : [ ] , "m":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1024 {
			return
		}
		if Validate(data, Limits{}) != nil {
			return
		}
		raw := bytes.TrimSpace(data)
		endsCheckValue(t, raw, true)
		if msg, err := Parse(data, Limits{}); err == nil && msg.Result != nil {
			endsCheckValue(t, msg.Result, true)
		}
	})
}

// BenchmarkEndsAdversarialBackslashRuns: the walkers and StringEnds on two
// strings of a megabyte of escapes each, next to Validate of the same.
func BenchmarkEndsAdversarialBackslashRuns(b *testing.B) {
	for _, c := range []struct{ name, unit string }{
		{"escaped_backslashes", `\\`},
		{"escaped_quotes", `\"`},
		{"backslash_runs_before_quotes", strings.Repeat(`\\`, 500) + `\"`},
		{"surrogate_pairs", `\ud83d\ude00`},
	} {
		body := strings.Repeat(c.unit, (1<<20)/len(c.unit))
		arr := []byte(`[{"text":"` + body + `"},{"text":"` + body + `"}]`)
		b.Run(c.name+"/walk", func(b *testing.B) {
			for b.Loop() {
				var texts [][]byte
				Elements(arr, func(e []byte) bool {
					Members(e, func(_, v []byte) { texts = append(texts, v) })
					return true
				})
				for _, s := range texts {
					StringEnds(s, 62, func(r rune) bool { return r == 0x200B })
				}
				if len(texts) != 2 {
					b.Fatalf("%d texts", len(texts))
				}
			}
		})
		b.Run(c.name+"/validate", func(b *testing.B) {
			for b.Loop() {
				if err := Validate(arr, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
