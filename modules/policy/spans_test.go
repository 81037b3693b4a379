package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// A secret that runs through a whole text item into the next is refused
// before the policy: the joined text holds it, no seam does. One within an
// item, or across two consecutive items, is the policy's to redact.
func TestSecretsAcrossTextItems(t *testing.T) {
	c := defaultScan(t)
	if c.scanner.secrets == nil {
		t.Fatal("the shipped policy gives the scan no patterns")
	}
	prose := make([]string, 40)
	for i := range prose {
		prose[i] = "chunk of ordinary prose, by bob, bearing news; "
	}
	for _, tc := range []struct {
		texts   []string
		refused bool
	}{
		{[]string{"key AK", "IAIOSFODNN7E", "XAMPLE done"}, true},
		{[]string{"key AKIAIOSF", "", "ODNN7EXAMPLE done"}, true},
		{[]string{"key AK", "", "IAIOSFODNN7EXAMPLE done"}, true},
		{[]string{"key A", "K", "I", "A", "IOSFODNN7EXAMPLE done"}, true},
		{[]string{"key AKIA", "IOSF", "ODNN", "7EXAMPLE done"}, true},
		{[]string{"token: Bea", "", "rer abcdefghijklmnop0123456789"}, true},
		{[]string{"token gh", "p", "_0123456789abcdefghijklmnopqrstuvwxyzAB"}, true},
		{[]string{"key AK", "\u200b", "IAIOSFODNN7EXAMPLE done"}, true},
		{[]string{strings.Repeat("x", 9000) + " key AK", "IAIOSFODNN7E", "XAMPLE done"}, true},
		{[]string{"key AKIAIOSF", "ODNN7EXAMPLE done", "more"}, false},
		{[]string{"see AKIAIOSFODNN7EXAMPLE", "and", "more"}, false},
		{[]string{"Bearer", " of", " news"}, false},
		{prose, false},
	} {
		content := make([]string, len(tc.texts))
		for i, s := range tc.texts {
			content[i] = `{"type":"text","text":` + string(mcpmsg.Quote(s)) + `}`
		}
		payload := `{"content":[` + strings.Join(content, ",") + `]}`
		_, _, err := resultTerms([]byte(payload), shapeToolResult, c.scanner, nil)
		var refused *Refusal
		if got := errors.As(err, &refused); got != tc.refused {
			t.Errorf("%q: refused %v (%v), want %v", tc.texts, got, err, tc.refused)
		} else if got && !strings.Contains(refused.Why, "three text items or more") {
			t.Errorf("%q: %s", tc.texts, refused.Why)
		}
	}
}

// A private key within one text item, among others, is the policy's to
// redact there: it does not run across items.
func TestWholeKeyAmongTextItemsIsNotRefused(t *testing.T) {
	c := defaultScan(t)
	key := "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi\n-----END RSA PRIVATE KEY-----"
	for _, texts := range [][]string{
		{key, "x", "y"},
		{"a", key, "b", "c"},
		{"-----END RSA PRIVATE KEY----- -----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY----- -----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----"},
	} {
		content := make([]string, len(texts))
		for i, s := range texts {
			content[i] = `{"type":"text","text":` + string(mcpmsg.Quote(s)) + `}`
		}
		if _, _, err := resultTerms([]byte(`{"content":[`+strings.Join(content, ",")+`]}`), shapeToolResult, c.scanner, nil); err != nil {
			t.Errorf("%q: %v", texts, err)
		}
	}
}

// A secret within one item whose match, in the joined text, runs on into
// its neighbours (the character before it, the next item's first word)
// is the policy's to redact there; one split across items beside it is
// still refused.
func TestSecretInOneItemRunningOnIsNotRefused(t *testing.T) {
	c := defaultScan(t)
	jwt := "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	for _, tc := range []struct {
		texts   []string
		refused bool
	}{
		{[]string{"Your session token:", jwt, "Expires in 3600 seconds."}, false},
		{[]string{"access_token:", "ya29.a0AfH6SMBxExampleTokenValue", "expires_in:", "3599"}, false},
		{[]string{"Header:", "Bearer abcdefghijklmnop0123456789", "OK"}, false},
		{[]string{"log 1", "expected -----BEGIN RSA PRIVATE KEY-----, found a certificate", "log 3", "log 4"}, false},
		{[]string{"key AK", "IAIOSFODNN7E", "XAMPLE done, also AKIAIOSFODNN7EXAMPL2"}, true},
	} {
		content := make([]string, len(tc.texts))
		for i, s := range tc.texts {
			content[i] = `{"type":"text","text":` + string(mcpmsg.Quote(s)) + `}`
		}
		_, _, err := resultTerms([]byte(`{"content":[`+strings.Join(content, ",")+`]}`), shapeToolResult, c.scanner, nil)
		var refused *Refusal
		if got := errors.As(err, &refused); got != tc.refused {
			t.Errorf("%q: refused %v (%v), want %v", tc.texts, got, err, tc.refused)
		}
	}
}
