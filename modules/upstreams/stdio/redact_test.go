package stdio

import (
	"strings"
	"testing"
)

// A line is cut where the program wrote it and every secret that begins in
// what is kept is redacted whole, however redactions shorten the text.
func TestRedactLine(t *testing.T) {
	secret := "s3cr3t-ABCDEFGHIJKLMNOPQRSTUVWXYZ-01234"
	long := secret + secret + strings.Repeat("x", 2049-2*len(secret)) + secret
	for _, c := range []struct {
		line    string
		secrets []string
		cut     int
		want    string
	}{
		{"plain", []string{secret}, 2048, "plain"},
		{"a " + secret + " b", []string{secret}, 2048, "a [redacted] b"},
		{long, []string{secret}, 2048, "[redacted]" + strings.Repeat("x", 2049-2*len(secret)-1) + " […]"},
		{"key abcdef-more", []string{"abc", "abcdef-more"}, 2048, "key [redacted]"},
		{"0123456789" + secret, []string{secret}, 12, "0123456789[redacted] […]"},
	} {
		if got := redactLine([]byte(c.line), c.secrets, c.cut); got != c.want {
			t.Errorf("redactLine(%.40q…) = %.80q…, want %.80q…", c.line, got, c.want)
		}
		if strings.Contains(redactLine([]byte(c.line), c.secrets, c.cut), "ABCDEFGH") {
			t.Errorf("redactLine(%.40q…) keeps part of the secret", c.line)
		}
	}
}
