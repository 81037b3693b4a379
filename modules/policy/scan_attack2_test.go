package policy

// Second round of attacks on the result scan after 159cbe1 and 3228a28
// (scan.go loadScanner and interesting, spans.go markerIn and
// spanWindows, markers.go): the scan must never call a string clean, or
// leave one out, where the policy's own long way cleans something, and
// the gateway's refusal of a secret across three text items
// (acrossItems) must find what the policy's patterns find in the joined
// text. Helpers from markers_attack_test.go (maEngine, maScanner,
// maTextResult) and redaction2_adversarial_test.go (rd2Engine,
// rd2Decide).
//
// Fixed: TestScan2AttackLongJWTAcrossThreeItemsPastSpanAfter
// Fixed: TestScan2AttackLongJWTAcrossTwoItemsPastSeamWindow
// Held:  TestScan2AttackHasMarkerAgreesWithPolicyFold
// Held:  TestScan2AttackMarkerInAgreesWithJoinedFold
// Held:  TestScan2AttackFoldedMarkersDecideAsLongWay

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// s2PolicyHasMarker is the policy's any_marker (result.rego:573-597) over
// markers, written in Go: a marker in lower case is looked for in
// folded(s) = replace(lower(s), "ſ", "s") (OPA's lower is
// strings.ToLower), any other in s as it is.
func s2PolicyHasMarker(markers []string, s string) bool {
	ls := strings.ReplaceAll(strings.ToLower(s), "\u017f", "s")
	for _, m := range markers {
		if m == strings.ToLower(m) && strings.Contains(ls, m) || m != strings.ToLower(m) && strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// s2Markers are the shipped result.rego's markers.
var s2Markers = []string{"PRIVATE KEY", "PuTTY-User-Key-File", "LS0tLS1CRUdJTi", "access_token", "refresh_token", "id_token",
	"client_secret", "hooks.slack.com", "accountkey", "sharedaccesskey", "sig=", "authorization", "bearer", "accesskey",
	"access_key", "access-key", "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox", "xapp-",
	"sk_live_", "rk_live_", "sk_test_", "rk_test_", "AIza", "eyJ"}

// s2Variant writes m with some of its letters changed the ways an
// upstream may write them: another case, or the character outside ASCII
// that the policy's fold (and RE2's (?i)) reads as the letter.
func s2Variant(rng *rand.Rand, m string) string {
	var b strings.Builder
	for _, r := range m {
		switch {
		case (r == 's' || r == 'S') && rng.IntN(3) == 0:
			b.WriteString("\u017f")
		case (r == 'k' || r == 'K') && rng.IntN(3) == 0:
			b.WriteString("\u212a")
		case (r == 'i' || r == 'I') && rng.IntN(3) == 0:
			b.WriteString("\u0130")
		case r >= 'a' && r <= 'z' && rng.IntN(4) == 0:
			b.WriteRune(r - 'a' + 'A')
		case r >= 'A' && r <= 'Z' && rng.IntN(4) == 0:
			b.WriteRune(r - 'A' + 'a')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Attack (fixed): a JWT whose payload is 5 KiB (an ID token with many group
// claims: common) is split by the upstream across three text items, the
// first boundary in its header, the second near the end of its payload:
// "eyJhbGciOiJIUzI1NiJ9" | ".eyJ<5 KiB>" | "<last 50>.<signature>".
// Runners join the items and read the token. No item and no pair of
// consecutive items holds a match of the jwt pattern (it needs two dots
// after "eyJ"; each pair holds one), so the policy passes it untouched,
// long way or not; the gateway promises to withhold a secret that runs
// through a whole item (spans.go:13-19, acrossItems). Expected:
// resultTerms refuses it, as it refuses the same split of a token with a
// 600-byte payload (control). Happens: crossing matches the patterns
// only in spanWindows (spans.go:231-256), from spanBefore before a
// marker to spanAfter = 4096 bytes after it (spans.go:34-35): the window
// holds one dot, the pattern matches nothing there, and the result
// passes with the whole token. (spans.go:27-29: "a match … ends with a
// token; one longer than this (a private key …) is not looked for
// here": the policy handles private keys itself, nothing handles a long
// token. Older than 159cbe1: 9ecc432.) Fixed: a window that would end
// inside a run of token characters is stretched to the run's end.
func TestScan2AttackLongJWTAcrossThreeItemsPastSpanAfter(t *testing.T) {
	e := rd2Engine(t)
	sc := maScanner(t, e)
	header := "eyJhbGciOiJIUzI1NiJ9"
	sig := "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	for _, n := range []int{600, 5000} {
		payload := "eyJ" + strings.Repeat("Z3JvdXBz", n/8)
		items := []string{header, "." + payload[:len(payload)-50], payload[len(payload)-50:] + "." + sig}
		joined := strings.Join(items, "")
		m := sc.secrets.FindStringIndex(joined)
		if m == nil || m[0] != 0 || m[1] != len(joined) {
			t.Fatalf("control: the policy's patterns match %v of the joined token (%d bytes)", m, len(joined))
		}
		for _, pair := range []string{items[0] + items[1], items[1] + items[2]} {
			if sc.secrets.MatchString(pair) {
				t.Fatalf("control: a pair of consecutive items holds a match")
			}
		}
		_, _, err := resultTerms([]byte(maTextResult(items...)), shapeToolResult, sc, nil)
		if err != nil {
			continue
		}
		fast, _, _ := rd2Decide(t, e, channelResult, "tools/call", maTextResult(items...))
		t.Errorf("a JWT with a payload of %d bytes across three text items (joined, the policy's jwt pattern matches all %d bytes) is not withheld; "+
			"the gateway's decision: %.200s", len(payload), len(joined), fast)
	}
}

// Attack (held): every shipped marker, and a custom set mixing exact and
// ignore-case markers that share anchors ("K" of "AKIA", "k" of
// "accesskey"; "SKey", "skey"), written with capitals, long s, Kelvin
// signs and dotted capital I, at random places in texts that straddle
// the 16 KiB chunks and the 64-byte short-string bound, among multi-byte
// characters and the characters' lead bytes alone. Expected: hasMarker
// is the policy's any_marker (result.rego:573-597). Happens: they agree
// (hasMarkerIn, markers.go:199; eachMarker split mode, :147).
func TestScan2AttackHasMarkerAgreesWithPolicyFold(t *testing.T) {
	custom := []string{"AKIA", "accesskey", "SKey", "skey", "kk", "K", "ss", "si", "is", "Is"}
	for _, markers := range [][]string{s2Markers, custom} {
		sc := &scanner{markers: newMarkerIndex(sortedUnique(markers))}
		rng := rand.New(rand.NewPCG(31, uint64(len(markers))))
		pieces := []string{"q", " ", "é", "日本", "\u017f", "\u212a", "\u0130", "\u0131", "\xc4", "\xc5", "\xe2\x84", "K", "k", "s", "S", "i"}
		for iter := range 400 {
			var b strings.Builder
			n := rng.IntN(80)
			if iter%8 == 0 {
				n = markerChunk - 40 + rng.IntN(80)
			}
			if iter%40 == 0 {
				n = 2*markerChunk + rng.IntN(80)
			}
			for b.Len() < n {
				if rng.IntN(8) == 0 {
					b.WriteString(s2Variant(rng, markers[rng.IntN(len(markers))]))
					continue
				}
				if rng.IntN(4) == 0 {
					b.WriteString(pieces[rng.IntN(len(pieces))])
					continue
				}
				b.WriteString("abcdefghijklmnopqrstuvwxyz_-=."[rng.IntN(30):][:1])
			}
			s := b.String()
			if got, want := sc.hasMarker(s), s2PolicyHasMarker(markers, s); got != want {
				t.Fatalf("markers %q, a text of %d bytes: hasMarker %v, the policy %v (%.120q)", markers, len(s), got, want, s)
			}
		}
	}
}

func sortedUnique(ms []string) []string {
	out := append([]string(nil), ms...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	k := 0
	for i, m := range out {
		if i == 0 || m != out[k-1] {
			out[k] = m
			k++
		}
	}
	return out[:k]
}

// Attack (held): a marker written with long s, Kelvin signs and dotted
// capital I is split across three to six text items, some empty and
// some only invisible characters (which the policy removes before the
// runner reads them), at every cut of its characters. Expected: markerIn
// over the visible items finds it whenever the policy finds a marker in
// the joined visible text. Happens: it does (markerIn keeps three bytes
// per marker letter, spans.go:199-213; visible :216).
func TestScan2AttackMarkerInAgreesWithJoinedFold(t *testing.T) {
	e := rd2Engine(t)
	sc := maScanner(t, e)
	rng := rand.New(rand.NewPCG(5, 9))
	invisible := []string{"", "\u200b", "\u200b\u200d", "\ufeff"}
	for range 300 {
		m := s2Variant(rng, s2Markers[rng.IntN(len(s2Markers))])
		rs := []rune(m)
		var items []string
		last := 0
		for k := 0; k < rng.IntN(4)+2 && last < len(rs); k++ {
			cut := last + 1 + rng.IntN(len(rs)-last)
			items = append(items, string(rs[last:min(cut, len(rs))]))
			last = min(cut, len(rs))
			if rng.IntN(2) == 0 {
				items = append(items, invisible[rng.IntN(len(invisible))])
			}
		}
		if last < len(rs) {
			items = append(items, string(rs[last:]))
		}
		items[0] = strings.Repeat("x", rng.IntN(70)) + items[0]
		items[len(items)-1] += strings.Repeat("y", rng.IntN(70))
		visible := make([]string, len(items))
		for k, s := range items {
			visible[k] = sc.visible(s)
		}
		if got, want := sc.markerIn(visible), s2PolicyHasMarker(s2Markers, strings.Join(visible, "")); got != want {
			t.Fatalf("items %q: markerIn %v, the policy finds a marker in the joined text: %v", items, got, want)
		}
	}
}

// Attack (held): the shipped policy and a copy with a kind whose marker
// mixes with the built-in ones' anchors ("skey", anchor k like
// "accesskey"'s, and exact "AKIA"'s K): short and long texts whose
// secrets' labels are written with long s, Kelvin signs and dotted
// capital I, split across two text items, with invisible characters at
// the seam. Expected: the gateway's decision with the scan is the
// policy's long way. Happens: they agree.
func TestScan2AttackFoldedMarkersDecideAsLongWay(t *testing.T) {
	copyEngine := maEngine(t, "skey", `((?i:skey)[ \t]*[:=][ \t]*)[0-9a-f]{16,}`, "skey")
	rng := rand.New(rand.NewPCG(13, 17))
	labels := []struct{ label, value string }{
		{"access_token=", "ya29.a0AfH6SMBx0123"},
		{"AccountKey=", "abcdefghijklmnopqrstuvwxyz0123"},
		{"secret_access_key=", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
		{"authorization: ", "Basic dXNlcjpwYXNzd29yZA=="},
		{"skey: ", "0123456789abcdef0123"},
	}
	for range 40 {
		l := labels[rng.IntN(len(labels))]
		secret := s2Variant(rng, l.label) + l.value
		var payload string
		switch rng.IntN(3) {
		case 0:
			payload = maTextResult(secret)
		case 1:
			payload = maTextResult(strings.Repeat("lorem ipsum ", 400) + secret + strings.Repeat(" dolor", 50))
		default:
			cut := rng.IntN(len(secret))
			for !isRuneStart(secret, cut) {
				cut--
			}
			payload = maTextResult("see "+secret[:cut], []string{"", "\u200b"}[rng.IntN(2)]+secret[cut:]+" ok")
		}
		fast, slow, ok := rd2Decide(t, copyEngine, channelResult, "tools/call", payload)
		if !ok {
			continue // withheld before the policy (a refusal): not a leak
		}
		if fast != slow {
			t.Fatalf("%.200s:\nwith the gateway's scan %.300s\nthe policy's long way   %.300s", payload, fast, slow)
		}
	}
}

func isRuneStart(s string, i int) bool { return i <= 0 || i >= len(s) || s[i]&0xC0 != 0x80 }

// Attack (fixed): the same 5 KiB JWT split across two text items only, the
// boundary in its header: "eyJhbGciOiJIUzI1NiJ9" | ".eyJ<5 KiB>.<sig>".
// Runners join them. Expected: the token redacted (the policy redacts a
// secret split across two consecutive text items piece by piece,
// result.rego:878-931), or the result withheld. Happens: the policy
// looks for it in seam_window = 1024 characters on each side of the seam
// (result.rego:503, seam_secrets :906-909), which hold one of the two
// dots; the second item alone has no "eyJ" with two dots after it; the
// gateway's acrossItems does not look at two items (spans.go:99-101),
// and for three it assumes the policy redacts whatever the pattern
// matches across a pair's seam, at any length (crossesOnceRedacted,
// spans.go:154-195). The whole token passes, with the scan and without
// (a policy gap, not the scan's; older than 159cbe1). Fixed: the windows
// around a seam stretch through the token run beyond them (seam_left,
// seam_right; seamLeft, seamRight), see seam_stretch_test.go.
func TestScan2AttackLongJWTAcrossTwoItemsPastSeamWindow(t *testing.T) {
	e := rd2Engine(t)
	sc := maScanner(t, e)
	header := "eyJhbGciOiJIUzI1NiJ9"
	sig := "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	payload := "eyJ" + strings.Repeat("Z3JvdXBz", 5000/8)
	items := []string{header, "." + payload + "." + sig}
	if !sc.secrets.MatchString(strings.Join(items, "")) {
		t.Fatal("control: the policy's patterns do not match the joined token")
	}
	fast, slow, ok := rd2Decide(t, e, channelResult, "tools/call", maTextResult(items...))
	if !ok {
		return // withheld
	}
	for _, d := range []string{fast, slow} {
		if strings.HasPrefix(d, "allow") && strings.Contains(d, sig) || d == "allow|||||" {
			t.Errorf("a JWT (payload %d bytes) across two text items, the boundary in its header, passes: with the scan %.150s; the long way %.150s",
				len(payload), fast, slow)
			break
		}
	}
}
