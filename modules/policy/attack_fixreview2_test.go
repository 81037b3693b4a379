package policy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Attack (fixed): an upstream splits a JWT of 3 KiB at its middle into two text
// items and puts one zero-width space into the token 1100 characters
// before the seam. README (policies/README.md, redaction: a token split
// between two text items is looked for in the 1024 characters on each side
// and the token run beyond them, "a token of up to 10 KiB is seen whole
// wherever it is split"; invisible characters are removed) promises the
// token is redacted. But whether a seam is looked at is decided on the raw
// text (the scan's seams, modules/policy/scan.go 664-667, and the
// policy's seam_looks/seam_text, policies/result.rego 636-645): the
// stretch through the token run stops at the zero-width space
// (isTokenChar, token_cutset), so the window holds neither the JWT's
// "eyJ" marker (1500 characters back) nor the invisible character, and
// the seam is not listed; seam_secrets, which would have cleaned the text
// first (result.rego 935), never runs. The policy then cleans the left
// item (the invisible character is removed), putting the token together:
// the runner gets the whole JWT across the two items, unredacted, with
// the scan and the long way alike. Fix: decide the seam windows on the
// text as cleaned (text.clean in seam_text, the scan's seamLeft and
// seamRight stretching over invisible characters), or list every seam
// next to an item that holds an invisible character.
//
// Fixed: an invisible character anywhere in either item lists the seam
// (seam_looks; the scan's seams), and seam_secrets stretches the windows
// on the cleaned text.
func TestFixReview2AttackInvisibleCharacterStopsTheStretch(t *testing.T) {
	e := rd2Engine(t)
	header := "eyJhbGciOiJIUzI1NiJ9"
	sig := "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	payload := "eyJ" + strings.Repeat("Z3JvdXBz", 3000/8)
	jwt := header + "." + payload + "." + sig
	cut := len(jwt) / 2
	// Control: without the zero-width space the token is redacted.
	fast, slow, ok := rd2Decide(t, e, channelResult, "tools/call", maTextResult("the token: "+jwt[:cut], jwt[cut:]+" (end)"))
	if !ok || !strings.Contains(fast, "[REDACTED:jwt]") || !strings.Contains(slow, "[REDACTED:jwt]") {
		t.Fatalf("control: the token split at its middle was not redacted: %.120s / %.120s", fast, slow)
	}
	for _, back := range []int{1100, 1500} {
		left := jwt[:cut-back] + "\u200b" + jwt[cut-back:cut]
		fast, slow, ok := rd2Decide(t, e, channelResult, "tools/call", maTextResult("the token: "+left, jwt[cut:]+" (end)"))
		if !ok {
			continue // refused: nothing reaches the runner
		}
		for _, d := range []struct{ how, text string }{{"with the scan", fast}, {"the long way", slow}} {
			if strings.HasPrefix(d.text, "allow|") && !strings.Contains(d.text, "[REDACTED:") &&
				strings.Contains(d.text, header+"."+payload[:40]) && strings.Contains(d.text, sig) && !strings.Contains(d.text, "\\u200b") && !strings.Contains(d.text, "\u200b") {
				t.Errorf("a zero-width space %d characters before the seam, %s: the JWT reaches the runner whole and unredacted, cleaned of the space: %.110s", back, d.how, d.text)
			}
		}
	}
}

// Attack (fixed, measured here rather than asserted: tests never assert on time): an upstream answers with a megabyte of AWS access key ids, one
// after another with a dot between them (token characters: the run goes
// on), in text items of 5200 characters. README (policies/README.md: the
// seam windows stretch "up to 4096 more on each side"; 1a5146b: "with
// 16384, a megabyte of long tokens in 60 text items cost each decision
// twice what it did", so the stretch was cut to keep that cost) expects the
// stretch to cost about what the windows cost before it. But seam_secrets
// (policies/result.rego 933-951) works out each match's offset by summing
// the lengths of every match and piece before it (sum over
// numbers.range(0, i - 1)), for every match of the window: the square of
// the matches in a window. A stretched window holds five times the
// characters (and matches) it held at 95b3fab, so each seam costs some
// 25 times more: measured here, the decision takes four to six times as long
// as on the same result with a space instead of each dot (where the run,
// and so the stretch, stops: the windows of 95b3fab), where at 95b3fab
// the two cost about the same (3.3 s and 4.3 s; here 3.7 s and 23 s on
// two cores). Fix: find the one match that crosses the seam without
// summing over all the others (match in the window cut to start a
// pattern's maximum length before the seam, or a builtin returning match
// offsets), or bound the matches a seam window is searched for.
//
// Fixed: a seam whose stretched windows hold more than seam_max_matches
// matches is searched in its windows of seam_window characters alone
// (seam_cuts), as before the stretch. Run with
// go test -run XXX -bench SeamManyMatches ./modules/policy/.
func BenchmarkSeamManyMatchesInOneTokenRun(b *testing.B) {
	e := rd2Engine(b)
	payload := func(unit string) []byte {
		var items []string
		for total := 0; total < 1<<20; total += 5200 {
			items = append(items, strings.Repeat(unit, 5200/len(unit)+1)[:5200])
		}
		return []byte(maTextResult(items...))
	}
	call, err := callOf(`{"name":"read_ticket"}`, `{"id":1}`)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, unit string }{{"spaced", "AKIAIOSFODNN7EXAMPLE "}, {"one_run", "AKIAIOSFODNN7EXAMPLE."}} {
		b.Run(c.name, func(b *testing.B) {
			data := payload(c.unit)
			for b.Loop() {
				cur := e.current.Load()
				h := &ResultHandler{Config{engine: e}}
				in, err := h.input(cur, call, subject{channel: channelResult, method: "tools/call", view: call}, data, map[*ast.Term]string{})
				if err != nil {
					b.Fatalf("refused: %v", err)
				}
				if out := decisionText(e.decideWith(context.Background(), cur, in, 5*time.Minute, "result")); !strings.Contains(out, "redacted aws_access_key_id") {
					b.Fatalf("%.120s", out)
				}
			}
		})
	}
}
