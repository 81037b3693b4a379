package integration

// A third adversarial review of isolation, aimed at what 73d04c4 added:
// EndMoved at configuration start, Retire of a stateless runner's implied
// session when its caller connects again, and the per-user toolpin
// "shown" memory.
//
// Attack: Retire ends the upstream session of the replaced connection with
// the caller's NEW credential (mcpproxy expired uses CredentialFor as it
// stands): the upstream gets the session id issued to one account with
// the token of another, which is exactly the crossing the change meant to
// stop (TestIsolation3AttackRetireSendsOldSessionWithNewToken).
// Attack: Retire ends the old connection's session while a call of it is
// in flight (the idle sweep spares sessions in use, Retire does not): a
// token rotation kills the caller's running tool call at the upstream
// (TestIsolation3AttackRetireKillsCallInFlight).
// Attack: the Endpoint digest is taken over the transport's JSON before
// its placeholders are replaced (stdio replaces {env.*}/{file.*} in its
// command at provision): a reload (or restart with stored sessions) that
// points a program service at another program through a placeholder keeps
// the old program's MCP sessions and catalogs
// (TestIsolation3AttackPlaceholderCommandMoveKeepsSessions).
// Attack: the digest covers every transport option, not only what names
// the upstream: tuning a program's idle_timeout ends every MCP session of
// the service on reload, though the README promises sessions survive
// reloads that do not point the service elsewhere
// (TestIsolation3AttackTuningProgramOptionEndsSessions).
// Attack: shown was per replica while MCP sessions and pins are shared: a caller who listed again through one
// replica, as the refusal told them, is refused again on the other one,
// and behind a round-robin balancer may not get to call the pinned tool
// while the change waits
// (TestIsolation3AttackRelistOnOtherReplicaStillRefused).
//
// Holds: the digest of an HTTP service is stable across reloads of the
// same Caddyfile with a placeholder in its url, and its sessions survive
// (TestIsolation3HoldsSameConfigReloadKeepsSessions); Caddy re-marshals a
// JSON config (sorted keys), and the Caddyfile builds the transport JSON
// from a struct, so reordering transport options does not change it.
// Holds (read, not tested): an initialize in flight on an implied session
// Retire closes is discarded (setLocalUpstream refuses a closed session,
// discard DELETEs it); ending through OnEnd is asynchronous, so Retire
// under rt.mu does not hold other callers' requests; federated listings
// go through the per-service pipeline, so a listing counts the same from
// /v1/mcp and /v1/mcp/svc; tool_pins off returns before it counts.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// iso3StatelessEcho is a stateless tools/call of echo with text.
func iso3StatelessEcho(t *testing.T, g *gateway, session, text string) (int, map[string]any) {
	t.Helper()
	return statelessPost(t, g, aliceKey, session,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":`+aaJSON(text)+`},`+aaStatelessMeta(`{}`)+`}}`, nil)
}

// TestIsolation3AttackRetireSendsOldSessionWithNewToken: alice's stateless
// runner calls echo on an auth bearer service with a token of one account
// (an upstream session is initialized with it), then she stores a token of
// another account and calls again. What happens: the new call retires the
// old implied session, and its upstream session is ended with a DELETE
// that carries the old account's Mcp-Session-Id and the NEW account's
// token (Retire → OnEnd → mcpproxy expired → CredentialFor as it stands):
// the upstream is handed one account's session with another's credential
// (it links the two, and an upstream that binds sessions to accounts
// refuses the DELETE, so the session is left open after all). What should
// happen: the retired session's upstream session is ended with the
// credential it was initialized with, or not at all (left to the
// upstream's idle timeout, as EndMoved does) — never with another
// connection's credential (internal/mcp2026 Runtime.Session, mcpsession
// Retire: keep the credential with the implied session, or skip OnEnd).
func TestIsolation3AttackRetireSendsOldSessionWithNewToken(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Auth: "bearer"})
	session := g.createSession(t, aliceKey, "svc")
	lsPutToken(t, g, aliceKey, "account-one-token")
	if status, msg := iso3StatelessEcho(t, g, session, "one"); status != http.StatusOK || aaResult(msg) == nil {
		t.Fatalf("control: the first stateless call: %d %s", status, aaJSON(msg))
	}
	open := up.openSessions()
	if len(open) != 1 {
		t.Fatalf("%d upstream sessions after the first call, want 1", len(open))
	}
	old := open[0]
	lsPutToken(t, g, aliceKey, "account-two-token")
	if status, msg := iso3StatelessEcho(t, g, session, "two"); status != http.StatusOK || aaResult(msg) == nil {
		t.Fatalf("the call after the new token: %d %s", status, aaJSON(msg))
	}
	deleteOfOld := func() *upstreamRequest {
		for _, r := range up.requestLog() {
			if r.Method == http.MethodDelete && r.Header.Get("Mcp-Session-Id") == old {
				return &r
			}
		}
		return nil
	}
	deadline := time.Now().Add(3 * time.Second)
	for deleteOfOld() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if r := deleteOfOld(); r != nil && r.Header.Get("Authorization") != "Bearer account-one-token" {
		t.Errorf("the old connection's upstream session %q was ended with Authorization %q: another account's credential with its session id",
			old, r.Header.Get("Authorization"))
	}
	for _, r := range up.requestLog() {
		if r.Method != http.MethodDelete && r.Header.Get("Mcp-Session-Id") == old && r.Header.Get("Authorization") == "Bearer account-two-token" {
			t.Errorf("the new token was sent with the old session id (%s %s)", r.Method, r.Body)
		}
	}
}

// TestIsolation3AttackRetireKillsCallInFlight: alice's stateless runner
// has a tool call running on her implied session (the upstream is still
// working on it) when her token is rotated (an automation storing a fresh
// personal token) and another request of hers arrives. What happens: that
// request retires the old implied session at once — closed here and its
// upstream session DELETEd while the call runs in it — so the running call
// fails (the upstream no longer knows its session; a tool with side
// effects is cut off halfway, its result lost). What should happen: like
// the idle sweep, which never ends a session in use, Retire leaves the
// old connection's session until its calls in flight are answered (or
// marks it to end when they are), and only new requests go to the new
// connection's session (mcpsession Retire / mcp2026 Runtime.Session).
func TestIsolation3AttackRetireKillsCallInFlight(t *testing.T) {
	up := startUpstream(t)
	release := make(chan struct{})
	var released atomic.Bool
	t.Cleanup(func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if strings.Contains(string(body), "held in flight") {
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		return false // the upstream answers it, once released
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Auth: "bearer"})
	session := g.createSession(t, aliceKey, "svc")
	lsPutToken(t, g, aliceKey, "alice-token-1")
	if status, msg := iso3StatelessEcho(t, g, session, "first"); status != http.StatusOK || aaResult(msg) == nil {
		t.Fatalf("control: the first stateless call: %d %s", status, aaJSON(msg))
	}
	type answer struct {
		status int
		msg    map[string]any
	}
	done := make(chan answer, 1)
	go func() {
		status, msg := iso3StatelessEcho(t, g, session, "held in flight")
		done <- answer{status, msg}
	}()
	waitWithin(t, 5*time.Second, "the held call to reach the upstream", func() bool {
		for _, r := range up.requestLog() {
			if strings.Contains(r.Body, "held in flight") {
				return true
			}
		}
		return false
	})
	lsPutToken(t, g, aliceKey, "alice-token-2")
	if status, msg := iso3StatelessEcho(t, g, session, "after rotation"); status != http.StatusOK || aaResult(msg) == nil {
		t.Fatalf("the call after the rotation: %d %s", status, aaJSON(msg))
	}
	time.Sleep(500 * time.Millisecond) // Retire's DELETE, if any, is sent meanwhile
	released.Store(true)
	close(release)
	select {
	case a := <-done:
		if a.status != http.StatusOK || !strings.Contains(aaJSON(a.msg), "held in flight") || strings.Contains(aaJSON(a.msg), `"isError":true`) {
			t.Errorf("the call in flight when alice's token was rotated: %d %s, want its result", a.status, aaJSON(a.msg))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the call in flight never answered")
	}
}

// iso3ProgramSession starts a gateway with a program service "prog" (block
// made by svcBlock), alice's initialized MCP session on it with one echo
// call, reloads the gateway on the same port with the block reload makes,
// and returns the status and answer of her next echo call.
func iso3ProgramSession(t *testing.T, first, second string, between func()) (int, string) {
	t.Helper()
	port := freePort(t)
	cfg := gatewayConfig{Upstream: "http://127.0.0.1:9/unused", DataDir: t.TempDir(), Services: first}
	g := startGatewayOnPort(t, port, cfg)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "prog"), "prog")
	m.initialize()
	m.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if ans := m.call(2, "echo", `{"text":"before"}`); !strings.Contains(string(ans), "before") {
		t.Fatalf("control: echo before the reload: %s", ans)
	}
	if between != nil {
		between()
	}
	cfg.Services = second
	g2 := startGatewayOnPort(t, port, cfg)
	m2 := g2.raw(t, aliceKey, m.headers["X-Toolgate-Session"], "prog")
	m2.sessionID = m.sessionID
	status, _, msgs := m2.post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`)
	var last string
	if len(msgs) > 0 {
		last = string(msgs[len(msgs)-1])
	}
	return status, last
}

// iso3OtherProgram is another path to the adversarial program (another
// program, as far as the configuration says).
func iso3OtherProgram(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other-server")
	if err := os.Symlink(exe, other); err != nil {
		t.Fatal(err)
	}
	return other
}

// iso3ProgramBlock is service prog running command with the adversarial
// program's environment, and the extra lines.
func iso3ProgramBlock(command, extra string) string {
	return fmt.Sprintf(`service prog {
			command %s -test.run=^$
			env %s server
			tools echo
			timeout 20s
			stop_timeout 2s
			%s
		}`, command, advProgramEnv, extra)
}

// TestIsolation3AttackPlaceholderCommandMoveKeepsSessions: service prog
// runs `command {env.ISO3_PROGRAM}` (a placeholder the stdio transport
// replaces at provision, like {file.*}, which a plain reload re-reads).
// The operator points it at another program by changing what the
// placeholder names, and reloads (or restarts: the MCP sessions are in
// storage). What happens: the Endpoint digest is taken over the transport
// JSON as written — the placeholder, unchanged — so alice's MCP session of
// the old program lives on, its catalog (the old program's annotations)
// deciding calls that run on the new one; the same move written literally
// ends it (404, the control). What should happen: the digest is of what
// the service reaches — the transport after its placeholders are replaced
// (the transport module could report its endpoint, as the url is hashed
// after ReplaceKnown) — so both moves end the session (gateway
// Service.provision, the endpoint digest).
func TestIsolation3AttackPlaceholderCommandMoveKeepsSessions(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	other := iso3OtherProgram(t)
	if status, ans := iso3ProgramSession(t, iso3ProgramBlock(exe, ""), iso3ProgramBlock(other, ""), nil); status != http.StatusNotFound {
		t.Fatalf("control: a literal move of the command: %d %s, want 404", status, ans)
	}
	t.Setenv("ISO3_PROGRAM", exe)
	block := iso3ProgramBlock("{env.ISO3_PROGRAM}", "")
	status, ans := iso3ProgramSession(t, block, block, func() { t.Setenv("ISO3_PROGRAM", other) })
	if status != http.StatusNotFound {
		t.Errorf("after the placeholder pointed prog at another program, alice's MCP session of the old one goes on: %d %s, want 404", status, ans)
	}
}

// TestIsolation3AttackTuningProgramOptionEndsSessions: the operator raises
// a program service's idle_timeout (or its limits, max_processes,
// stop_timeout) and reloads: the service still runs the same command.
// What happens: the Endpoint digest covers the whole transport JSON, so
// every MCP session of the service is ended at the reload (EndMoved) and
// runners must initialize again (404), as if the service pointed
// elsewhere. What should happen: as the README says, MCP sessions survive
// a reload unless it points the service at another upstream (its url, or
// the transport's command/endpoint); the digest should cover what names
// the upstream (transport kind and command, args, env, working_dir,
// run_as, per_user; an sse transport's endpoint), not operational tuning
// (gateway Service.provision; a transport module method naming its
// endpoint).
func TestIsolation3AttackTuningProgramOptionEndsSessions(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	status, ans := iso3ProgramSession(t, iso3ProgramBlock(exe, "idle_timeout 10m"), iso3ProgramBlock(exe, "idle_timeout 20m"), nil)
	if status != http.StatusOK || !strings.Contains(ans, "after") {
		t.Errorf("after a reload that only raised the program's idle_timeout, alice's MCP session: %d %s, want it to go on", status, ans)
	}
}

// TestIsolation3HoldsSameConfigReloadKeepsSessions: the same Caddyfile,
// whose service url is a placeholder ({env.ISO3_URL}), loaded again: the
// service's Endpoint is unchanged, so alice's MCP session goes on (no
// 404, no initialize of another upstream session) and its upstream
// session id keeps going to the upstream that issued it.
func TestIsolation3HoldsSameConfigReloadKeepsSessions(t *testing.T) {
	up := startUpstream(t)
	t.Setenv("ISO3_URL", up.URL)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: "{env.ISO3_URL}", Tools: "echo", DataDir: t.TempDir()}
	g := startGatewayOnPort(t, port, cfg)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	for i := range 2 {
		g2 := startGatewayOnPort(t, port, cfg)
		m2 := g2.raw(t, aliceKey, m.headers["X-Toolgate-Session"], "svc")
		m2.sessionID = m.sessionID
		time.Sleep(200 * time.Millisecond) // EndMoved runs as the configuration starts
		if ans := m2.call(10+i, "echo", `{"text":"same config"}`); !strings.Contains(string(ans), "same config") {
			t.Fatalf("reload %d of the same configuration: alice's call: %s", i+1, ans)
		}
	}
	if n := len(up.openSessions()); n != 1 {
		t.Errorf("%d upstream sessions after reloads of the same configuration, want alice's one", n)
	}
}

// TestIsolation3AttackRelistOnOtherReplicaStillRefused: two replicas on
// one PostgreSQL database (MCP sessions, pins and their changes shared)
// in front of an auth bearer service whose upstream describes echo per
// account. Alice's session lists echo (pinned); bob's listing through
// replica b records his account's definition as a waiting change; alice's
// call is refused with "list them again", she lists again through replica
// a — her account shows the pinned definition — and calls through replica
// b (a round-robin balancer). What happens: b refuses her call with "list
// them again" anew: shown, which remembers her listing, is replica a's
// alone, so behind a balancer she may never call the tool while the change
// waits. What should happen: a listing since the change counts on every
// replica that serves the session — kept with the shared MCP session (its
// catalog's listing time against the change's) rather than in a
// per-replica map (internal/toolpin shown). Now the callers a listing
// showed the pinned definition are kept with the change
// (toolpin.Change.ShownTo), in the storage every replica reads.
func TestIsolation3AttackRelistOnOtherReplicaStillRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	data := t.TempDir()
	block := soBlock(postgresStorage(t), data, isoPerAccountUpstream(t), "echo", "auth bearer", "")
	a := startReplica(t, bin, block, data)
	b := startReplica(t, bin, block, data)
	lsPutToken(t, a.gateway, aliceKey, "token-alice")
	lsPutToken(t, a.gateway, bobKey, "token-bobs-own")

	session := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, session, "svc")
	ma.initialize()
	ma.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if ans := ma.call(2, "echo", `{}`); !strings.Contains(string(ans), "ok for ALICE") {
		t.Fatalf("control: alice's echo before bob listed: %s", ans)
	}
	mb := b.raw(t, bobKey, b.createSession(t, bobKey, "svc"), "svc")
	mb.initialize()
	mb.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)

	// Alice's same MCP session, through replica b.
	onB := b.raw(t, aliceKey, session, "svc")
	onB.sessionID = ma.sessionID
	waitWithin(t, 10*time.Second, "replica a to see the waiting change", func() bool {
		return strings.Contains(string(ma.call(3, "echo", `{}`)), "list them again")
	})
	// She lists again, as told, through replica a: her account shows the
	// pinned definition; control: a now lets her call.
	if ans := ma.rpc(`{"jsonrpc":"2.0","id":4,"method":"tools/list"}`); dig(ans, "result", "tools", "0", "name") != "echo" {
		t.Fatalf("alice's listing through a does not show her echo: %v", ans)
	}
	if ans := ma.call(5, "echo", `{}`); !strings.Contains(string(ans), "ok for ALICE") {
		t.Fatalf("control: alice's call through a after listing again: %s", ans)
	}
	if ans := onB.call(6, "echo", `{}`); !strings.Contains(string(ans), "ok for ALICE") {
		t.Errorf("alice listed again since the change (through replica a), and her call through replica b is refused: %s", ans)
	}
}
