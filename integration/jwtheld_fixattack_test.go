package integration

import (
	"testing"
	"time"
)

// Attack: a runner authenticated with a short-lived JWT (as MCP clients
// are: minutes) makes a call held for its approval (approval_wait); the
// token expires while a person decides. Without a reload the approved
// call runs (the caller was authenticated when it called). With any reload
// in between — here one that changes nothing — StillAuthorized
// re-authenticates the original request's expired token and refuses the
// approved call, wasting the approval; for the same reason every open
// stream of a JWT caller whose token has expired since it opened is cut by
// the first reload (WhileAuthorized). An unrelated reload should not
// change what happens to a call: the caller's identity should be judged as
// without a reload (the user the call was authenticated as, still known to
// the configuration in force), not by the expiry of a token the runner
// has long since refreshed on its other requests.
func TestFixAttackHeldJWTCallRefusedAfterUnrelatedReload(t *testing.T) {
	key := newJWTKey(t, "k1")
	keys := jwksFile(t, key)
	for _, reload := range []bool{false, true} {
		up := startUpstream(t)
		port := freePort(t)
		cfg := gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), PolicyOptions: "approval_wait 30s",
			AuthExtra: `jwt {
				issuer ` + jwtIssuer + `
				audience toolgate-test
				key_file ` + keys + `
				leeway 1ms
			}`}
		g := startGatewayOnPort(t, port, cfg)
		exp := time.Now().Add(4 * time.Second)
		tok := key.sign(t, map[string]any{"iss": jwtIssuer, "aud": "toolgate-test", "sub": alice, "exp": exp.Unix()})
		m := g.raw(t, tok, g.createSession(t, tok, "svc"), "svc")
		m.initialize()
		text := "jwt held, reload " + map[bool]string{false: "no", true: "yes"}[reload]
		stream := m.sseCall(1, "gated_tool", `{"text":"`+text+`"}`)
		id := pendingApprovalID(t, g, aliceKey, text)
		time.Sleep(time.Until(exp) + 1500*time.Millisecond) // the token has expired
		if reload {
			cfg.DataDir = g.DataDir
			g = startGatewayOnPort(t, port, cfg) // the same configuration
		}
		if r := g.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != 200 {
			t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
		}
		msgs := idattackDrain(t, stream)
		n := up.upstreamCalls("gated_tool")
		switch {
		case !reload && n != 1:
			t.Fatalf("control: without a reload the approved call of a caller whose JWT expired meanwhile ran %d times; last answer: %s", n, idattackLast(msgs))
		case reload:
			// The reload ended the hold with the pending answer; the
			// runner's retry, with the token it refreshed, runs the call.
			endedPendingAtReload(t, msgs, id)
			fresh := key.sign(t, map[string]any{"iss": jwtIssuer, "aud": "toolgate-test", "sub": alice, "exp": time.Now().Add(time.Hour).Unix()})
			m.headers["Authorization"] = "Bearer " + fresh
			m.transport = g.transport()
			retry := m.call(2, "gated_tool", `{"text":"`+text+`"}`)
			if n := up.upstreamCalls("gated_tool"); n != 1 {
				t.Errorf("with a reload that changed nothing, the approved retry of a call held while its JWT expired ran %d times, want 1; answer: %s", n, retry)
			}
		}
	}
}
