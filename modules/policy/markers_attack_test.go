package policy

// Attacks on the secret-marker search of the result scan (markers.go,
// 3228a28) and on the scan's use of it, with the shipped result policy and
// with copies of result.rego that add a kind of their own (policies/README:
// "if you change a built-in pattern in a copy of result.rego, keep its
// markers in step"): the scan must never leave out a string, or call a
// result clean, where the policy's own long way cleans something.
//
// Held:   TestMarkersAttackCustomIndexAgreesWithOneSearchPerGroup
// Held:   TestMarkersAttackHex4ReadsAsEncodingJSON
// Fixed:  TestMarkersAttackNonASCIIMarkerInAnotherCase
// Fixed:  TestMarkersAttackShortTextWithFoldedAnchor
// Fixed:  TestMarkersAttackMarkerInCountsFoldedBytes

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// maEngine is the shipped result policy (decision rule) with a copy of
// result.rego that adds the kind kind: its pattern (one capture group, the
// label kept, as the built-in patterns have) and its markers, in
// secret_patterns, secret_kinds and secret_markers.
func maEngine(t *testing.T, kind, pattern string, markers ...string) *engine {
	t.Helper()
	return maEngineLogged(t, zap.NewNop(), kind, pattern, markers...)
}

// maEngineLogged is maEngine logging to logger.
func maEngineLogged(t *testing.T, logger *zap.Logger, kind, pattern string, markers ...string) *engine {
	t.Helper()
	dir := shippedPolicies(t, map[string]string{"data.json": `{}`})
	path := filepath.Join(dir, "result.rego")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	q, _ := json.Marshal(markers)
	for _, r := range [][2]string{
		{"secret_patterns := {\n", "secret_patterns := {\n\t\"" + kind + "\": `" + pattern + "`,\n"},
		{"secret_kinds := [\n", "secret_kinds := [\n\t\"" + kind + "\",\n"},
		{"secret_markers := {\n", "secret_markers := {\n\t\"" + kind + "\": " + string(q) + ",\n"},
	} {
		if strings.Count(s, r[0]) != 1 {
			t.Fatalf("result.rego has %d of %q", strings.Count(s, r[0]), r[0])
		}
		s = strings.Replace(s, r[0], r[1], 1)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(newSource(dir), "data.toolgate.result.decision", stageResult, evaluatorPlan, 0, logger, policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	return e
}

// maScanner is e's scan settings, which it must have.
func maScanner(t *testing.T, e *engine) *scanner {
	t.Helper()
	sc := e.current.Load().scanner
	if sc == nil {
		t.Fatal("the copy of the policy gives the scan no settings")
	}
	return sc
}

// maTextResult is a tool result of the given text items.
func maTextResult(texts ...string) string {
	var items []string
	for _, s := range texts {
		items = append(items, `{"type":"text","text":`+string(mcpmsg.Quote(s))+`}`)
	}
	return `{"content":[` + strings.Join(items, ",") + `]}`
}

// Attack (held): custom secret_markers shaped to trip the index's merged,
// chunked passes and its neighbour checks: one-byte markers, markers that
// are one byte repeated ("xx", "xxx"), anchors first and last, uppercase
// (exact) and lowercase (ignoring case) markers sharing an anchor byte,
// non-ASCII markers, markers that differ only in case; texts of runs of
// anchors, markers straddling the 16 KiB chunk boundaries at every offset
// and at the very start and end, texts whose folded form (ſ, K, İ) is
// shorter (split mode). Expected: eachMarker reports exactly the
// positions the old search (oneSearchPerGroup) does, hasMarker agrees,
// and markerPositions with a limit stops at the limit. Happens: they
// agree (eachMarker markers.go:147, anchorGroup.at :182, newMarkerIndex
// :68).
func TestMarkersAttackCustomIndexAgreesWithOneSearchPerGroup(t *testing.T) {
	sets := [][]string{
		{"x"},
		{"x", "X"},
		{"xx"},
		{"xx", "xxx", "XX"},
		{"x", "xx", "xy", "yx"},
		{"ab", "ba", "b"},
		{"k", "K", "kk"},
		{"_x", "x_", "_X_", "__"},
		{"é", "xé", "éx", "É"},
		{"ss", "sk", "ks", "is"},
		{"accesskey", "AKIA", "K", "bearer", "b"},
		{"zz=", "=zz", "z"},
		{"aaaa", "aaab", "baaa", "Aaaa"},
		{"\u212a", "\u017f", "k\u017f"},
	}
	rng := rand.New(rand.NewPCG(7, 11))
	for _, set := range sets {
		set = slices.Clone(set)
		slices.Sort(set)
		set = slices.Compact(set)
		ix := newMarkerIndex(set)
		sc := &scanner{markers: ix}
		check := func(s, folded string) {
			t.Helper()
			got, want := everyMarker(&ix, s, folded), oneSearchPerGroup(&ix, s, folded)
			if !slices.Equal(got, want) {
				t.Fatalf("markers %q, a text of %d bytes (folded %d): at %v, the old search %v", set, len(s), len(folded), got, want)
			}
			if folded == foldToASCII.Replace(s) {
				if has := sc.hasMarker(s); has != (len(want) > 0) {
					t.Fatalf("markers %q, a text of %d bytes: hasMarker %v, want %v", set, len(s), has, len(want) > 0)
				}
			}
			if folded == s && len(want) > 3 {
				if at := sc.markerPositions(s, 3); len(at) != 3 {
					t.Fatalf("markers %q: markerPositions(limit 3) gave %d", set, len(at))
				}
			}
		}
		// Every marker, in each case, across each chunk boundary at every
		// offset, and at either end of the text.
		filler := strings.Repeat("q", 2*markerChunk)
		for _, m := range set {
			for _, v := range []string{m, strings.ToUpper(m), strings.ToLower(m)} {
				for cut := 0; cut <= len(v); cut++ {
					s := filler[:markerChunk-cut] + v + filler[:markerChunk+cut]
					check(s, s)
				}
				check(v, v)
				check(v+filler[:markerChunk-len(v)], v+filler[:markerChunk-len(v)])
				check(filler[:markerChunk-len(v)]+v, filler[:markerChunk-len(v)]+v)
				check(filler[:markerChunk]+v, filler[:markerChunk]+v)
			}
		}
		// Random texts of the markers' pieces, runs of their bytes, and the
		// characters the fold rewrites.
		pieces := append(slices.Clone(set), "q", " ", "x", "X", "k", "K", "s", "_", "é", "\u212a", "\u017f", "\u0130",
			strings.Repeat("x", 37), strings.Repeat("a", 40), strings.Repeat("_", 33))
		for range 60 {
			var b strings.Builder
			n := rng.IntN(3 * markerChunk)
			if rng.IntN(3) == 0 {
				n = rng.IntN(64)
			}
			for b.Len() < n {
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
}

// Attack (held): the new hex4 (json.go:360) reads a \u escape's four
// digits itself. Expected: every escape decodes as encoding/json decodes
// it, and one encoding/json refuses is refused: each of the four places
// tried with all 256 byte values (the others a valid digit), and
// surrogate pairs. Happens: they agree.
func TestMarkersAttackHex4ReadsAsEncodingJSON(t *testing.T) {
	decode := func(esc string) (string, bool) {
		var s string
		err := json.Unmarshal([]byte(`"`+esc+`"`), &s)
		return s, err == nil
	}
	for pos := range 4 {
		for c := range 256 {
			for _, base := range []string{"0000", "00e9", "d83d", "FFFF", "7f7F"} {
				d := []byte(base)
				d[pos] = byte(c)
				esc := `\u` + string(d)
				want, wantOK := decode(esc)
				if !wantOK {
					// encoding/json refuses it: hex4 must not read digits.
					if _, ok := hex4(esc, 2); ok && !strings.ContainsAny(string(d), "\"\\") {
						t.Errorf("hex4(%q) reads digits encoding/json refuses", esc)
					}
					continue
				}
				got, ok := unescape(esc)
				lone := want == "\ufffd" // encoding/json writes a lone surrogate as U+FFFD
				if lone {
					continue
				}
				if !ok || got != want {
					t.Errorf("%q: unescape %q %v, encoding/json %q", esc, got, ok, want)
				}
			}
		}
	}
	for _, esc := range []string{`\ud83d\ude00`, `\uD83D\uDE00`, `\udbff\udfff`, `\ud800\udc00`} {
		want, _ := decode(esc)
		if got, ok := unescape(esc); !ok || got != want {
			t.Errorf("%q: unescape %q %v, encoding/json %q", esc, got, ok, want)
		}
	}
}

// Attack (fixed): a copy of result.rego adds a kind whose marker is written in
// lower case outside ASCII ("пароль", Russian for password; the README:
// "one written in lower case … compared ignoring case"). The upstream
// writes it in capitals: "ПАРОЛЬ: …". Expected: the scan lists the
// string, as the policy's own long way finds the marker (folded(s) is
// lower(s), Unicode's lower case, result.rego:584) and redacts the
// secret. Happens: the scan folds ASCII letters only (hasPrefixFold,
// markers.go:227, called at :191, and the neighbour check of
// anchorGroup.at, :183) so it misses the marker, calls the result clean,
// and the gateway's decision passes the password that the long way
// redacts. (The old search had the same blind spot.) Fixed: a policy
// with a marker outside ASCII gets no scan (loadScanner), and the policy
// takes its own long way; the gateway says so in a warning as it loads it.
func TestMarkersAttackNonASCIIMarkerInAnotherCase(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	e := maEngineLogged(t, zap.New(core), "ru_password", `((?i:пароль)[ \t]*[:=][ \t]*)[A-Za-z0-9]{8,}`, "пароль")
	if e.current.Load().scanner != nil {
		t.Error("a policy with a marker outside ASCII gets the scan, which folds ASCII only")
	}
	if got := logs.FilterMessageSnippet("no result scan").FilterFieldKey("why").All(); len(got) != 1 {
		t.Errorf("loading a policy with a marker outside ASCII logged %d warnings that it gets no scan: %v", len(got), logs.All())
	}
	for _, text := range []string{"пароль: hunter2hunter2", "ПАРОЛЬ: hunter2hunter2", "Пароль: hunter2hunter2",
		"log line " + strings.Repeat("ok ", 30) + "ПАРОЛЬ=hunter2hunter2"} {
		fast, slow, ok := rd2Decide(t, e, channelResult, "tools/call", maTextResult(text))
		if !ok {
			t.Fatalf("%q: not decided", text)
		}
		if fast != slow {
			t.Errorf("%q:\nwith the gateway's scan %.300s\nthe policy's long way   %.300s", text, fast, slow)
		}
	}
}

// Attack (fixed): a copy of result.rego adds a kind with the marker "session"
// (its rarest byte, the anchor, is 's'). The upstream writes every s of
// it as the long s, which the policy folds to s and RE2's (?i) matches as
// s: "ſeſſion: 0123456789012345" (under 64 bytes). Expected: the scan
// lists it, as the long way finds the marker in folded(s) and redacts the
// token. Happens: a string of 64 bytes or fewer is first read for the
// anchors' bytes as sent (scan.go:455, mayHold :199, the passes' anchors
// put in sc.interesting at :175), and neither 's' nor 'S' is there (ſ is
// C5 BF, not the lead byte of an invisible character): the string is
// skipped before the fold, the result called clean, and the token
// passes. (A longer string is folded and caught.) Fixed: the first bytes
// of the characters the fold writes as letters are looked for too.
func TestMarkersAttackShortTextWithFoldedAnchor(t *testing.T) {
	e := maEngine(t, "session_token", `((?i:session)[ \t]*:[ \t]*)[0-9]{16,}`, "session")
	ix := maScanner(t, e).markers
	for _, g := range ix.groups {
		for _, m := range g.markers {
			if m.text == "session" {
				t.Logf("the anchor of %q is %q", m.text, g.anchor)
			}
		}
	}
	var interesting []byte
	for c, ok := range e.current.Load().scanner.interesting {
		if ok {
			interesting = append(interesting, byte(c))
		}
	}
	t.Logf("bytes mayHold looks for: %q", interesting)
	for _, text := range []string{"session: 0123456789012345", "SESSION: 0123456789012345", "\u017fe\u017f\u017fion: 0123456789012345",
		"\u017fe\u017f\u017fion: 0123456789012345" + strings.Repeat(" ", 60)} {
		fast, slow, ok := rd2Decide(t, e, channelResult, "tools/call", maTextResult(text))
		if !ok {
			t.Fatalf("%q: not decided", text)
		}
		if fast != slow {
			t.Errorf("%q:\nwith the gateway's scan %.300s\nthe policy's long way   %.300s", text, fast, slow)
		}
	}
}

// Attack (fixed): a copy of result.rego adds a kind with the marker
// "passkey_secrets" (15 bytes; the longest marker, "PuTTY-User-Key-File",
// is 19). The upstream splits a secret across three text items, which
// the policy cannot redact piece by piece and the gateway withholds
// (acrossItems, spans.go), and writes each s of the label as ſ and the k as the
// Kelvin sign: "paſſ" | "Key_ſecret" | "ſ: 0123456789abcdef0123".
// Runners join the items; RE2's (?i) matches the label. Expected: the
// result is withheld, as the same split in ASCII is. Happens: markerIn
// (spans.go:199, :203 and :207) keeps the last longest-1 = 18 bytes before a
// boundary, counted in the bytes of the text as sent, while the marker
// it looks for is counted folded: the label as sent is 21 bytes, its
// first 19 before the last boundary, so no window holds it whole; no
// marker, no refusal (spans.go:126), and the seams between two items
// hold no marker either: the policy passes the secret. Fixed: markerIn
// keeps three bytes as sent for each letter of a marker.
func TestMarkersAttackMarkerInCountsFoldedBytes(t *testing.T) {
	e := maEngine(t, "passkey", `((?i:passkey_secrets)[ \t]*:[ \t]*)[0-9a-f]{16,}`, "passkey_secrets")
	sc := maScanner(t, e)
	if sc.markers.longest != len("PuTTY-User-Key-File") {
		t.Logf("longest marker: %d bytes", sc.markers.longest)
	}
	for _, items := range [][]string{
		{"pass", "key_secret", "s: 0123456789abcdef0123"},
		{"pa\u017f\u017f", "\u212aey_\u017fecret", "\u017f: 0123456789abcdef0123"},
	} {
		joined := strings.Join(items, "")
		if !sc.secrets.MatchString(joined) {
			t.Fatalf("control: the pattern does not match the joined %q", joined)
		}
		_, _, err := resultTerms([]byte(maTextResult(items...)), shapeToolResult, sc, nil)
		if err == nil {
			fast, _, _ := rd2Decide(t, e, channelResult, "tools/call", maTextResult(items...))
			t.Errorf("a secret across three text items %q (joined %q, which the policy's pattern matches) is not withheld; the gateway decides %.300s",
				items, joined, fast)
		}
	}
}
