package mcpproxy

import (
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// An upstream that writes back the credential toolgate attached, however
// it escapes it, hands the runner a message without it; one that does not
// is left as it is.
func TestRedactCredential(t *testing.T) {
	h := &Handler{logger: zap.NewNop()}
	call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer tok-ABCdef/123"}}
	for _, c := range []struct{ text, want string }{
		{`"plain text"`, `"plain text"`},
		{`"carried Bearer tok-ABCdef/123"`, `"carried Bearer [REDACTED:credential]"`},
		{`"key tok-ABCdef\/123 is valid"`, `"key [REDACTED:credential] is valid"`},
		{`"\u0074ok-ABCdef/123"`, `"[REDACTED:credential]"`},
		{`"line\nbreak"`, `"line\nbreak"`},
	} {
		raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":` + c.text + `}]}}`
		msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.redactCredential(call, msg)
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.Replace(raw, c.text, c.want, 1); string(got.Raw) != want {
			t.Errorf("%s: got %s, want %s", c.text, got.Raw, want)
		}
	}
	// Too short a value is not looked for (it would be found in ordinary text).
	short := &gateway.Call{Credential: &gateway.Credential{Header: "X-Key", Value: "abc"}}
	msg, _ := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":{"t":"abc"}}`), mcpmsg.Limits{})
	if got, _ := h.redactCredential(short, msg); string(got.Raw) != string(msg.Raw) {
		t.Errorf("a short value was redacted: %s", got.Raw)
	}
}
