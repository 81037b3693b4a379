package mcpproxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// TestRoundsRedactEveryCredentialTheCallSent: a call held between rounds
// sends the runner's input upstream with the credential of the retry that
// continues it (continueHeld adds it to the response's sent), which may
// have been refreshed since the first round (an OAuth access token); the
// stream it reads on was opened with the first round's. What the upstream
// answers is searched for both. (A resumed stream is read the same way,
// with the original request's credential in sent.)
func TestRoundsRedactEveryCredentialTheCallSent(t *testing.T) {
	const first, refreshed = "gho_first16C7e42F292c6912E7710c838347", "gho_second9aB3d7E1f0c4A8b2D6e5F9a1C3b"
	for _, echoed := range []string{first, refreshed} {
		h := testHandler()
		call := func(id, token string) *gateway.Call {
			return &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
				Message:    mcpmsg.Message{Kind: mcpmsg.Request, ID: []byte(id), Method: "tools/call"},
				Session:    &gateway.Session{ID: "s"},
				Stateless:  &gateway.Stateless{Capabilities: []byte(`{"elicitation":{}}`)},
				Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer " + token}}
		}
		firstRound, retry := call("1", first), call("2", refreshed)
		answer := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"you are ` + echoed + `"}]}}`
		hc := &heldCall{call: firstRound, cancel: func() {},
			rs: &response{h: h, ctx: context.Background(), call: firstRound, body: []byte(answer), sent: []*gateway.Credential{retry.Credential}}}
		w := httptest.NewRecorder()
		h.rounds(w, httptest.NewRequest(http.MethodPost, "/v1/mcp/svc", nil), retry, hc)
		if got := w.Body.String(); strings.Contains(got, echoed) || !strings.Contains(got, `"id":2`) {
			t.Errorf("the answer to the retry, the upstream having echoed %q: %s", echoed, got)
		}
	}
}
