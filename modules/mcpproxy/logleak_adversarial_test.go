package mcpproxy

// Adversarial review: no secret reaches toolgate's logs. The attacker is
// a malicious upstream, which controls every byte it answers and may
// write back the credential toolgate attached to the call's upstream
// requests (an Authorization header it was sent).

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/logtest"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

const leakSecret = "gho_LogLeak7e42F292c6912E7710c838347Ae17"

// leakHandler is a Handler whose log lines are kept, at every level.
func leakHandler() (*Handler, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return &Handler{maxMessage: 1 << 20, logger: zap.New(core)}, logs
}

// leakCall is a tools/call of alice's whose upstream requests carry
// "Authorization: Bearer <leakSecret>".
func leakCall() *gateway.Call {
	return &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Method:     "tools/call",
		Message:    mcpmsg.Message{Kind: mcpmsg.Request, ID: []byte("1"), Method: "tools/call"},
		Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer " + leakSecret}}
}

// leakRead reads one upstream message with body as the JSON body of the
// upstream's answer, as the relay does (response.next).
func leakRead(h *Handler, call *gateway.Call, body string) (mcpmsg.Message, error) {
	rs := &response{h: h, ctx: context.Background(), call: call,
		resp: &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(body)), ContentLength: -1}}
	return rs.next()
}

// Attack (fixed): the upstream sends a notification (or a server→client request)
// whose method holds the credential toolgate sent it:
// {"method":"notifications/<token>"}. redactCredential redacts it from
// the message the runner gets, then logs "an upstream sent back the
// credential ...; it is redacted" with zap.String("method", msg.Method)
// of the message as the upstream sent it, before the redaction: the
// token is in Caddy's log (redact.go:256-257).
// Fixed: the line carries the method as redacted.
func TestLogLeakAttackRedactionLogQuotesTheUpstreamMethod(t *testing.T) {
	for _, body := range []string{
		`{"jsonrpc":"2.0","method":"notifications/` + leakSecret + `","params":{}}`,
		`{"jsonrpc":"2.0","id":"s-1","method":"sampling/` + leakSecret + `","params":{}}`,
	} {
		h, logs := leakHandler()
		msg, err := leakRead(h, leakCall(), body)
		if err != nil {
			t.Fatalf("control: the upstream's message was refused: %v", err)
		}
		if strings.Contains(string(msg.Raw), leakSecret) || strings.Contains(msg.Method, leakSecret) {
			t.Fatalf("control: the runner's message holds the credential: %s", msg.Raw)
		}
		if leaked := logtest.Leaked(t, logs, leakSecret); len(leaked) > 0 {
			t.Errorf("the log holds the credential the upstream wrote back in a method name:\n%s", strings.Join(leaked, "\n"))
		}
	}
}

// Holds: the upstream writes the credential back in a JSON-RPC error's
// message and data, in a result, escaped (\u0067 for 'g', \/), and in a
// message toolgate refuses as malformed: a duplicate key spelled as the
// credential, and two keys that differ only in case, both the credential
// (the parser's error quotes a key; the log gets SyntaxError.Redacted).
// Nothing the log gets holds it.
func TestLogLeakHoldsReflectedCredentialInAnswers(t *testing.T) {
	escaped := `\u0067` + leakSecret[1:]
	upper := strings.ToUpper(leakSecret)
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"bad Authorization: Bearer ` + leakSecret + `","data":{"auth":"` + leakSecret + `"}}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + escaped + `"}]}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"` + leakSecret + `":1,"` + leakSecret + `":2}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"` + upper + `":1,"` + leakSecret + `":2}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"` + leakSecret + `":1,"` + upper + `":2}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"x":"` + leakSecret + `"}} trailing ` + leakSecret,
		`{"jsonrpc":"2.0","id":1,"result":{"Jsonrpc":"` + leakSecret + `"},"` + leakSecret + `":1}`,
	} {
		h, logs := leakHandler()
		msg, err := leakRead(h, leakCall(), body)
		if err == nil && strings.Contains(string(msg.Raw), leakSecret) {
			t.Errorf("control: the runner's message holds the credential: %s", msg.Raw)
		}
		if err != nil && strings.Contains(err.Error(), leakSecret) {
			t.Errorf("the error (the runner's message, and the relay's log) holds the credential: %v", err)
		}
		if leaked := logtest.Leaked(t, logs, leakSecret); len(leaked) > 0 {
			t.Errorf("%s:\nthe log holds the credential:\n%s", body, strings.Join(leaked, "\n"))
		}
	}
}

// Holds: an upstream's 4xx JSON answer (rejectedResponse) that quotes the
// Authorization header it was sent is redacted before anything reads it,
// and answerError logs nothing of it.
func TestLogLeakHoldsRejectedAnswer(t *testing.T) {
	h, logs := leakHandler()
	call := leakCall()
	body := []byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"401: Authorization: Bearer ` + leakSecret + `"}}`)
	_, msg, ok := h.rejectedResponse(context.Background(), call, gateway.Upstream{},
		&upstreamError{kind: kindRejected, status: http.StatusBadRequest, body: body, msg: "the upstream rejected the request (HTTP 400)"}, []byte("1"))
	if !ok || strings.Contains(string(msg.Raw), leakSecret) {
		t.Fatalf("control: %v %s", ok, msg.Raw)
	}
	if leaked := logtest.Leaked(t, logs, leakSecret); len(leaked) > 0 {
		t.Errorf("the log holds the credential:\n%s", strings.Join(leaked, "\n"))
	}
}

// Holds: the message hooks (the result policy's channels, which write the
// audit entry with LogPayloads) and the result hooks are given the
// upstream's words with the credential redacted: the audit entry's
// payload cannot carry it when the upstream reflects it.
func TestLogLeakHoldsHooksSeeTheRedactedMessage(t *testing.T) {
	h, logs := leakHandler()
	call := leakCall()
	var seen []string
	call.OnMessage(func(_ context.Context, _ *gateway.Call, m gateway.UpstreamMessage) ([]byte, bool, error) {
		seen = append(seen, m.Method+" "+string(m.Payload))
		return nil, false, nil
	})
	call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
		seen = append(seen, string(result))
		return nil, nil
	})
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"Bearer ` + leakSecret + `","data":"` + leakSecret + `"}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"Bearer ` + leakSecret + `"}]}}`,
		`{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"` + leakSecret + `"}}`,
	} {
		msg, err := leakRead(h, call, body)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Kind == mcpmsg.Response {
			h.finish(context.Background(), call, msg)
		} else {
			h.inspect(context.Background(), call, msg, gateway.ChannelNotification)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("control: the hooks ran %d times, want 3: %q", len(seen), seen)
	}
	for _, s := range seen {
		if strings.Contains(s, leakSecret) {
			t.Errorf("a hook (the audit entry's payload) was given the credential: %s", s)
		}
	}
	if leaked := logtest.Leaked(t, logs, leakSecret); len(leaked) > 0 {
		t.Errorf("the log holds the credential:\n%s", strings.Join(leaked, "\n"))
	}
}
