package mcpproxy

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A large answer searched for the credential while it is parsed is left as
// one searched after its parse: with the credential as it is, escaped,
// broken up, in base64, split across text items, or absent; with a
// credential of two secrets (HTTP Basic: the header's token and the
// password it encodes), where the first one's redaction makes new bytes
// that the second is looked for in.
func TestParseRedactedLargeAnswerAsSearchedAfterItsParse(t *testing.T) {
	h := testHandler()
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:pw-Secret/4567"))
	calls := map[string]*gateway.Call{
		"bearer": {Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
			Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer tok-ABCdef/123"}},
		"basic": {Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
			Credential: &gateway.Credential{Header: "Authorization", Value: basic}},
	}
	filler := strings.Repeat(`lorem ipsum dolor sit amet\n`, prescanMin/16)
	texts := []string{
		`"` + filler + `"`,
		`"` + filler + `tok-ABCdef/123` + filler + `"`,
		`"` + filler + `tok-ABCdef\/123 \u0074ok-ABCdef/123"`,
		"\"" + filler + "tok-ABC\u200bdef/123 é\"",
		`"` + filler + base64.StdEncoding.EncodeToString([]byte("key tok-ABCdef/123")) + `"`,
		`"` + filler + `pw-Secret/4567 and ` + strings.TrimPrefix(basic, "Basic ") + `"`,
		`"` + filler + `key tok-ABC"},{"type":"text","text":"def/123 end"`,
	}
	for name, call := range calls {
		for i, text := range texts {
			raw := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":` + text + `}]}}`)
			msg, err := mcpmsg.Parse(raw, mcpmsg.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			want, wantErr := h.redactCredential(call, msg)
			got, err := h.parseRedacted(call, raw)
			if (err == nil) != (wantErr == nil) || string(got.Raw) != string(want.Raw) {
				t.Errorf("%s, text %d: searched while parsed: %.80q…, %v; searched after: %.80q…, %v", name, i, got.Raw, err, want.Raw, wantErr)
			}
			if len(raw) < prescanMin {
				t.Fatalf("text %d is %d bytes, under prescanMin", i, len(raw))
			}
		}
	}
}

// Facts read of other bytes are not used: a message redacted since (new
// bytes), or a secret the prescan did not read for.
func TestPrescanFactsOnlyForTheirBytes(t *testing.T) {
	c := &gateway.Credential{Header: "Authorization", Value: "Bearer tok-ABCdef/123"}
	raw := []byte(`{"t":"tok-ABCdef/123"}`)
	pre := startPrescan(c, raw)
	<-pre.done
	if f := pre.of("tok-ABCdef/123", raw); f == nil || f.found == 0 {
		t.Fatalf("facts of the bytes read: %+v", f)
	}
	if f := pre.of("tok-ABCdef/123", append([]byte(nil), raw...)); f != nil {
		t.Error("facts used for a copy of the bytes")
	}
	if f := pre.of("tok-ABCdef/123", raw[:len(raw)-1]); f != nil {
		t.Error("facts used for a part of the bytes")
	}
	if f := pre.of("other-secret-value", raw); f != nil {
		t.Error("facts used for a secret not read for")
	}
	var none *prescan
	if none.of("tok-ABCdef/123", raw) != nil {
		t.Error("a nil prescan has facts")
	}
}
