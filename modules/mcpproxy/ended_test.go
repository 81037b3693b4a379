package mcpproxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpsession"
	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/modules/gateway"
)

// An upstream message that arrives once its MCP session was ended is not
// relayed, even before the cancellation of the exchange (which runs on a
// goroutine of its own) has stopped the read: a call of an account the
// caller connected away from delivered its result in that window.
func TestNoMessageOfAnEndedSession(t *testing.T) {
	m, ms := localSession(t)
	result := `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done as one"}]}}`
	read := func() (string, error) {
		rs := &response{h: &Handler{maxMessage: 1 << 20, logger: zap.NewNop()}, ctx: context.Background(),
			call: &gateway.Call{MCPSession: ms, Service: &gateway.Service{ID: "svc"}},
			resp: &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(result)), ContentLength: -1}}
		msg, err := rs.next()
		return string(msg.Raw), err
	}
	if got, err := read(); err != nil || got != result {
		t.Fatalf("control, the session open: %q, %v", got, err)
	}
	if _, _, err := m.End(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
	got, err := read()
	if !errors.Is(err, errSessionEnded) || got != "" {
		t.Fatalf("the session ended: %q, %v; want nothing and errSessionEnded", got, err)
	}
	if code, _, _ := streamFailure(err, "x"); code != gateway.CodeSessionNotFound {
		t.Errorf("the runner is told %d, want %d (initialize again)", code, gateway.CodeSessionNotFound)
	}
}

// A request with no credential of the caller's never reaches a server of
// a service of per-user credentials: the credentials step lets a DELETE
// of a disconnected caller's session go on without one (a transport
// module ends its own session), and a session recorded without a grant
// (an older record) must not carry its id there unauthenticated.
func TestNoUncredentialedRequestToAPerUserServer(t *testing.T) {
	svc := &gateway.Service{ID: "svc", URL: "http://127.0.0.1:1/mcp", Auth: &gateway.UpstreamAuth{Kind: gateway.AuthOAuth}}
	call := &gateway.Call{Caller: &gateway.Caller{User: "alice"}, Service: svc}
	for _, method := range []string{http.MethodDelete, http.MethodPost, http.MethodGet} {
		resp, err := (&Handler{}).attempt(context.Background(), call, gateway.Upstream{SessionID: "s-1"}, method, nil, "")
		if err == nil {
			resp.Body.Close()
		}
		if !isKind(err, kindUnavailable) || mayHaveRun(err) {
			t.Errorf("%s without a credential: %v, want refused before it is sent", method, err)
		}
	}
}

// localSession is a local MCP session of alice's, and the sessions it is
// one of.
func localSession(t *testing.T) (*mcpsession.Sessions, *gateway.MCPSession) {
	t.Helper()
	keys, err := seal.New(mcpstate.Purpose, []byte("test-state-secret-0123456789-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	m := mcpsession.New()
	c := &mcpsession.Config{State: mcpstate.New(&certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 12*time.Hour, time.Now),
		Keys: keys, Max: 10, PerCaller: 10, CacheTTL: time.Second, Idle: time.Hour, Logger: zap.NewNop()}
	if err := m.Attach(c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Detach(c); _ = m.Destruct() })
	ms, err := m.CreateLocal(context.Background(), "alice", "ts", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	return m, ms
}
