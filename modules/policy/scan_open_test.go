//go:build open_findings

// A finding reproduced and not fixed yet (README, "Adversarial tests"):
// out of make test; go test -tags open_findings -run Attack
// ./modules/policy/ shows it failing. policies/README.md ("Redaction
// catches …") documents the limit.

package policy

import (
	"strings"
	"testing"
)

// Attack: the same 5 KiB JWT split across two text items only, the
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
// (a policy gap, not the scan's; older than 159cbe1).
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
