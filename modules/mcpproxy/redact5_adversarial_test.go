package mcpproxy

// The credential search (redactCredential) on what an upstream answers, a
// fifth look: the credential in several forms within one string.

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
)

// Attack (fixed): the upstream writes back, in one string, the credential toolgate
// attached AND that credential in base64 ("token <secret> (base64 <b64>)",
// as a debugging echo of a request's headers would). redactedSecret
// (redact.go:286-293) hands each string holding a piece of the secret's
// base64 to redactBase64 first and returns its output as soon as that
// replaced the base64 run — redactIn, which replaces the secret itself,
// never runs on that string. The base64 is redacted; the plain credential
// next to it reaches the runner. README, "What runners see"/redact.go:
// "runners get results, never the caller's credential"; DESIGN.md:
// "Credentials … never appear in … responses". Fixed: both redactions run
// on every string.
func TestRedaction5AttackPlainCredentialBesideItsBase64(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString([]byte(answerLeakSecret))
	for name, text := range map[string]string{
		"plain then base64":       "token " + answerLeakSecret + " (base64 " + b64 + ")",
		"header echo, both forms": "X-Api-Key: " + answerLeakSecret + "\nAuthorization: Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+answerLeakSecret)),
	} {
		h, _ := leakHandler()
		call := answerLeakCall("X-Api-Key", answerLeakSecret)
		// Control: each form alone is redacted.
		for _, alone := range []string{"token " + answerLeakSecret, "base64 " + b64} {
			msg, err := leakRead(h, call, answerLeakResult(alone))
			if err != nil || strings.Contains(string(msg.Raw), answerLeakSecret) || strings.Contains(string(msg.Raw), b64) {
				t.Fatalf("control %q: not redacted (%v): %s", alone, err, msg.Raw)
			}
		}
		msg, err := leakRead(h, call, answerLeakResult(text))
		if err != nil {
			t.Errorf("%s: refused: %v", name, err)
			continue
		}
		if strings.Contains(string(msg.Raw), answerLeakSecret) {
			t.Errorf("%s: the service's credential reaches the runner: %s", name, msg.Raw)
		}
	}
}

// Holds: the credential written in several strings of one message, one of
// them its base64, each form in its own string, is redacted everywhere.
func TestRedaction5HoldsCredentialFormsInSeparateStrings(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString([]byte(answerLeakSecret))
	h, _ := leakHandler()
	call := answerLeakCall("X-Api-Key", answerLeakSecret)
	body := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + answerLeakSecret + `"},{"type":"text","text":"` + b64 +
		`"}],"structuredContent":{"k":"\u0051` + answerLeakSecret[1:] + `","b":"` + b64 + `"}}}`
	msg, err := leakRead(h, call, body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(msg.Raw), answerLeakSecret) || strings.Contains(string(msg.Raw), b64) || strings.Contains(string(msg.Raw), answerLeakSecret[1:]) {
		t.Errorf("the credential reaches the runner: %s", msg.Raw)
	}
}

// Every mix of the credential's forms within one string (plain, broken up
// by an invisible character, in standard and URL-safe base64, in the
// base64 of a Basic authorization, in base64 cut in lines), in every
// order, with and without blanks between them: none reaches the runner.
func TestRedaction5EveryMixOfFormsInOneString(t *testing.T) {
	secret := answerLeakSecret
	std := base64.StdEncoding.EncodeToString([]byte(secret))
	forms := map[string]string{
		"plain":     secret,
		"invisible": secret[:7] + `\u200b` + secret[7:],
		"base64":    std,
		"base64url": base64.URLEncoding.EncodeToString([]byte("x" + secret)),
		"basic":     base64.StdEncoding.EncodeToString([]byte("user:" + secret)),
		"lines":     std[:12] + `\n` + std[12:],
	}
	names := slices.Sorted(maps.Keys(forms))
	h, _ := leakHandler()
	call := answerLeakCall("X-Api-Key", secret)
	for _, a := range names {
		for _, b := range names {
			for _, sep := range []string{" ", "", ": "} {
				text := forms[a] + sep + forms[b]
				msg, err := leakRead(h, call, answerLeakResult(text))
				if err != nil {
					continue // withheld: nothing reaches the runner
				}
				if leak := holdsSecret(t, msg.Raw, secret); leak != "" {
					t.Errorf("%s %q %s: %s reaches the runner: %s", a, sep, b, leak, msg.Raw)
				}
			}
		}
	}
}

// holdsSecret says how a JSON text holds secret in one of its strings, as
// a runner that removes invisible characters and line breaks and decodes
// base64 reads it; "" when it does not.
func holdsSecret(t *testing.T, raw []byte, secret string) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	var found string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		case string:
			s := strings.NewReplacer("\u200b", "", "\n", "").Replace(v)
			if strings.Contains(s, secret) {
				found = "the secret"
			}
			for _, run := range strings.FieldsFunc(s, func(r rune) bool { return !strings.ContainsRune(base64Chars, r) }) {
				for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
					if d, err := enc.DecodeString(run); err == nil && strings.Contains(string(d), secret) {
						found = "its base64"
					}
				}
			}
		}
	}
	walk(v)
	return found
}

const base64Chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_="
