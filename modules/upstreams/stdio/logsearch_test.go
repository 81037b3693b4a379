//go:build unix

package stdio

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
)

// A word of a log line holding a secret in another form than the plain
// one — base64 (standard, URL-safe, padded or not, at any offset in a
// longer run), every character JSON-escaped, broken up by invisible
// characters — is redacted whole; the rest of the line is kept, and a
// word that only looks like base64 is left alone.
func TestRedactLineEncodedForms(t *testing.T) {
	secret := "tok-0123456789abcdef"
	var escaped strings.Builder
	for _, c := range secret {
		fmt.Fprintf(&escaped, `\u%04x`, c)
	}
	for _, word := range []string{
		base64.StdEncoding.EncodeToString([]byte(secret)),
		base64.RawURLEncoding.EncodeToString([]byte(secret)),
		base64.StdEncoding.EncodeToString([]byte("Bearer " + secret)),
		base64.StdEncoding.EncodeToString([]byte("xy" + secret + "tail")),
		`{"token":"` + escaped.String() + `"}`,
		`"` + strings.ReplaceAll(secret, "-", `\u002d`) + `"`,
		"tok\u200b-0123456789abcdef",
	} {
		line := "before " + word + " after"
		got := redactLine([]byte(line), []string{secret}, 2048)
		if got != "before [redacted] after" {
			t.Errorf("redactLine(%q) = %q", line, got)
		}
	}
	// Control: a line without the secret is kept as it is, base64 and
	// escapes included.
	plain := "ok " + base64.StdEncoding.EncodeToString([]byte("another value entirely")) + ` {"a":"\u0041"}`
	if got := redactLine([]byte(plain), []string{secret}, 2048); got != plain {
		t.Errorf("redactLine(%q) = %q", plain, got)
	}
}
