package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// An upstream that asks for a credential (401) of a service configured
// with none: the runner is told what is wrong and that retrying will not
// mend it (no credential was sent to be refused; not retryable).
func TestUpstreamAskingForACredentialOfAServiceWithNone(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		w.Header().Set("WWW-Authenticate", `Bearer realm="upstream"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return true
	})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if len(msgs) != 1 {
		t.Fatalf("initialize: %s", msgs)
	}
	e := gjson.GetBytes(msgs[0], "error")
	if !strings.Contains(e.Get("message").String(), "(auth none)") || e.Get("data.retryable").Bool() {
		t.Errorf("initialize against an upstream asking for a credential, service with auth none: %s (want the missing auth named, not retryable)", msgs[0])
	}
}

// The connection test of a personal credential the upstream refuses (401)
// says to connect again, with where, as a call refused so is told
// (needs_sign_in), rather than a bare error.
func TestConnectionTestOfARefusedPersonalTokenSaysConnectAgain(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer"})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return true
	})
	if r := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, []byte(`{"token":"alice-stale-token"}`)); r.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT the token: %d %s", r.StatusCode, r.Body)
	}
	r := g.api(t, http.MethodPost, "/v1/connections/svc/test", aliceKey, nil)
	if gjson.GetBytes(r.Body, "ok").Bool() || !gjson.GetBytes(r.Body, "needs_sign_in").Bool() || gjson.GetBytes(r.Body, "connect_url").String() == "" {
		t.Errorf("the connection test of a token the upstream refuses: %d %s, want ok false, needs_sign_in and a connect_url", r.StatusCode, r.Body)
	}
}
