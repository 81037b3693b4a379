package integration

import (
	"encoding/base64"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The shipped result policy, end to end (the upstream's answer parsed as
// toolgate parses it): a UTF-16 blob holding an AWS key reaches the runner
// unchanged when it has no mimeType and starts with a byte-order mark, or
// when its mimeType (naming UTF-16) is spelled in another case.
func TestR5Review2UTF16BlobsReachTheRunner(t *testing.T) {
	shipped, err := filepath.Abs("../policies")
	if err != nil {
		t.Fatal(err)
	}
	utf16 := func(s string, bom bool) string {
		var b []byte
		if bom {
			b = append(b, 0xFF, 0xFE)
		}
		for i := 0; i < len(s); i++ {
			b = append(b, s[i], 0)
		}
		return base64.StdEncoding.EncodeToString(b)
	}
	const secret = "aws key AKIAIOSFODNN7EXAMPLE"
	up, _, m := aliceSession(t, gatewayConfig{RequestPolicy: r5Policies(t), ResultPolicy: shipped})
	cases := []struct{ name, contents, blob string }{
		{"BOM, no mimeType", `{"uri":"file:///a.txt","blob":"%s"}`, utf16(secret, true)},
		{"MimeType", `{"uri":"file:///a.txt","MimeType":"text/plain; charset=utf-16le","blob":"%s"}`, utf16(secret, false)},
		{"held: duplicate mimeType", `{"uri":"file:///a.txt","mimeType":"text/plain; charset=utf-16le","mimeType":"text/plain","blob":"%s"}`, utf16(secret, false)},
		{"held: both spellings", `{"uri":"file:///a.txt","mimeType":"text/plain","MIMETYPE":"text/plain; charset=utf-16le","blob":"%s"}`, utf16(secret, false)},
		{"held: mimeType", `{"uri":"file:///a.txt","mimeType":"text/plain; charset=utf-16le","blob":"%s"}`, utf16(secret, false)},
	}
	for i, tc := range cases {
		contents := strings.Replace(tc.contents, "%s", tc.blob, 1)
		r5Script(up, "resources/read", func(id string) []string {
			return []string{`{"jsonrpc":"2.0","id":` + id + `,"result":{"contents":[` + contents + `]}}`}
		}, false)
		status, body := r5Raw(t, m, `{"jsonrpc":"2.0","id":`+strconv.Itoa(i+50)+`,"method":"resources/read","params":{"uri":"file:///a.txt"}}`)
		if strings.Contains(body, tc.blob) {
			t.Errorf("%s: the UTF-16 blob holding %q reached the runner unchanged (%d): %.400s", tc.name, secret, status, body)
		} else {
			t.Logf("%s: %d %.300s", tc.name, status, body)
		}
	}
}
