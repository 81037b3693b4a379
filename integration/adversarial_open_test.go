//go:build open_findings

package integration

import (
	"encoding/base64"
	"os"
	"strings"
	"testing"
	"time"
)

// Findings reproduced and not fixed yet: each test fails today. They are
// kept out of `make test` (build tag open_findings) and listed in the
// README's adversarial suite; run them with
// `go test -tags open_findings -run 'Test.*Attack' ./integration/`.
// Open now: what a stdio program writes to its log is searched for the
// credential it was started with, byte for byte (README, "Programs and
// legacy SSE servers").

// Attack: a program's stderr goes to the log with "the credential … replaced
// by `[redacted]` wherever it begins" — as it is, byte for byte
// (stdio.redactLine: bytes.Index of each secret). A program that writes the
// credential toolgate handed it (credential_env) in another form — base64,
// as JSON text with its characters escaped (`\u0041…`), what a program
// logging its request headers or its config as JSON writes — has it kept
// in the log in the clear, to be read later by whoever reads the log. The
// relay searches every upstream message for exactly these forms ("however
// escaped, broken up by invisible characters, or in base64"); the log of
// the same program gets only the plain search. Breaks DESIGN.md:
// "Credentials … never appear in logs, errors, metrics, the catalog, or
// responses". Fix: search each logged line of a program's stderr and
// stdout for the secrets as the relay searches a message's strings (its
// escapes decoded, base64 runs decoded, invisible characters removed:
// mcpproxy's redactIn and redactBase64, moved where stdio can use them),
// or log only a digest and length of a line that holds a base64 or
// escaped run decoding to a secret.
func TestRetired5AttackProgramStderrKeepsEncodedCredential(t *testing.T) {
	g, logPath := rt5Program(t, "")
	const t1 = "rt5-personal-token-ONE-0123456789abcdef"
	logged := rt5ProgramCall(t, g, logPath, aliceKey, t1, "rt5 escaped")
	waitWithin(t, 10*time.Second, "the program's stdout line in the log", func() bool {
		data, _ := os.ReadFile(logPath)
		logged = string(data)
		return strings.Contains(logged, "rt5 stdout")
	})
	if strings.Contains(logged, t1) {
		t.Fatalf("premise: the plain credential is in the log (the plain search failed): %s", logged)
	}
	decoded := rdLogDecoded(logged)
	for _, form := range []struct{ name, text string }{
		{"base64", "rt5 b64 " + base64.StdEncoding.EncodeToString([]byte(t1))},
		{"URL-safe base64 (a line of stdout)", "rt5 stdout b64 " + base64.RawURLEncoding.EncodeToString([]byte(t1))},
		{"escaped JSON (decoded as any JSON reader of the log decodes it)", t1},
	} {
		if strings.Contains(logged, form.text) || strings.Contains(decoded, form.text) {
			where := rt5Around(logged, form.text)
			if where == "" {
				where = rt5Around(decoded, form.text)
			}
			t.Errorf("the log holds alice's personal token in %s: %s", form.name, where)
		}
	}
}
