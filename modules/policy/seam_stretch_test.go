package policy

import (
	"strings"
	"testing"
)

// A long token split across two text items far from its middle — a JWT
// of 5 KiB cut in its header, at the start, middle or end of its payload,
// or in its signature, as an upstream that cuts its output into items of
// a fixed size does: the windows around the seam stretch through the
// token run (the policy's seam_left and seam_right, the scan's seamLeft
// and seamRight), so the policy sees the token whole and redacts both of
// its parts, with the gateway's scan and the long way alike.
func TestSeamWindowStretchesThroughLongTokens(t *testing.T) {
	e := rd2Engine(t)
	header := "eyJhbGciOiJIUzI1NiJ9"
	sig := "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	payload := "eyJ" + strings.Repeat("Z3JvdXBz", 5000/8)
	jwt := header + "." + payload + "." + sig
	probes := []string{payload[3:43], payload[len(payload)/2 : len(payload)/2+40], payload[len(payload)-40:], sig[:20], sig[len(sig)-20:]}
	for _, cut := range []int{len(header), len(header) + 1, len(header) + 200, len(header) + 1 + len(payload)/2,
		len(header) + 1 + len(payload) - 100, len(jwt) - 10} {
		items := []string{"the token: " + jwt[:cut], jwt[cut:] + " (end)"}
		fast, slow, ok := rd2Decide(t, e, channelResult, "tools/call", maTextResult(items...))
		if !ok {
			t.Errorf("cut at %d: the result was refused as unreadable", cut)
			continue
		}
		for _, d := range []struct{ how, text string }{{"with the scan", fast}, {"the long way", slow}} {
			if !strings.HasPrefix(d.text, "allow|") || !strings.Contains(d.text, "[REDACTED:") {
				t.Errorf("cut at %d, %s: not allowed with the token redacted: %.200s", cut, d.how, d.text)
				continue
			}
			for _, p := range probes {
				if strings.Contains(d.text, p) {
					t.Errorf("cut at %d, %s: %q of the token reaches the runner", cut, d.how, p)
				}
			}
		}
	}
}

// The stretched windows are the policy's: seamLeft and seamRight take the
// last and first seamWindow characters, and the token run beyond them up
// to seamStretch characters, stopping at any other character.
func TestSeamWindowsStopAtTheTokenRun(t *testing.T) {
	run := strings.Repeat("a", seamStretch+100)
	body := strings.Repeat("é", seamWindow) // characters, not bytes
	for _, c := range []struct {
		name, got, want string
	}{
		{"short left", seamLeft("abc"), "abc"},
		{"short right", seamRight("abc"), "abc"},
		{"left, run stopped by a space", seamLeft("x y " + strings.Repeat("b", 10) + body), strings.Repeat("b", 10) + body},
		{"right, run stopped by a space", seamRight(body + strings.Repeat("b", 10) + " y"), body + strings.Repeat("b", 10)},
		{"left, run capped", seamLeft(run + body), run[:seamStretch] + body},
		{"right, run capped", seamRight(body + run), body + run[:seamStretch]},
		{"left, no run", seamLeft("x " + body), body},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, len(c.got), len(c.want))
		}
	}
}
