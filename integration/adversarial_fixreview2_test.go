package integration

import (
	"net/http"
	"strings"
	"testing"
)

// fr2DenySetLevel is a request policy that keeps svc's log level as it
// is: logging/setLevel is denied.
const fr2DenySetLevel = `decision := {"action": "deny", "reason": "svc's log level stays as it is"} if {
	input.method == "logging/setLevel"
}
`

// fr2UpstreamSaw returns the bodies of the requests the upstream got that
// contain s.
func fr2UpstreamSaw(u *upstream, s string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, r := range u.requests {
		if strings.Contains(r.Body, s) {
			out = append(out, r.Body)
		}
	}
	return out
}

// Attack (fixed): a stateless runner spells the revision's logLevel in another
// case, and it reaches an upstream that initializes past the rule on
// logging/setLevel. README ("Protocol 2026-07-28"): a logLevel "(the
// revision's per-request log level, in any case)" is decided as
// logging/setLevel, and "Any other upstream gets … the requests without
// the revision's _meta members". decideLogLevel (modules/policy/
// loglevel.go 39-43) decides nothing once the upstream is known to
// initialize, relying on mcp2026.StripMeta; but StripMeta
// (internal/mcp2026/mcp2026.go 295-297) removes only the exact spelling
// (mcpmsg.RemoveMember), so "io.modelcontextprotocol/LogLevel":"debug"
// goes upstream undecided — to a decoder that reads the key in any case
// (as loglevel.go's own comment assumes of upstreams), a debug level the
// policy denies. Fix: StripMeta removes the revision's members in any
// case (mcpmsg.RemoveMemberFold), or decideLogLevel decides the level
// whatever the upstream's revision.
//
// Fixed: mcp2026.StripMeta removes the revision's members in any case.
func TestFixReview2AttackStatelessLogLevelVariantReachesInitializingUpstream(t *testing.T) {
	up := startUpstreamServer(t, nil, nil) // go-sdk: initializes
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: aaPolicies(t, fr2DenySetLevel, "")})
	session := g.createSession(t, aliceKey, "svc")
	call := func(id int, key string) {
		t.Helper()
		status, msg := statelessPost(t, g, aliceKey, session, `{"jsonrpc":"2.0","id":`+aaItoa(id)+`,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},`+
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"`+key+`":"debug"}}}`, nil)
		if status != http.StatusOK || aaResult(msg) == nil {
			t.Fatalf("call %d: %d %s", id, status, aaJSON(msg))
		}
	}
	// Control: the exact spelling never reaches the upstream.
	call(1, "io.modelcontextprotocol/logLevel")
	if sent := fr2UpstreamSaw(up, `"debug"`); len(sent) != 0 {
		t.Fatalf("control: the exact spelling reached the upstream: %s", sent[0])
	}
	call(2, "io.modelcontextprotocol/LogLevel")
	if sent := fr2UpstreamSaw(up, `"debug"`); len(sent) != 0 {
		t.Fatalf("a logLevel spelled in another case reached an upstream that initializes, undecided (the policy denies logging/setLevel): %s", sent[0])
	}
}

// Attack (fixed): a runner of 2025-11-25 sets a dual-revision upstream's log level
// past the rule on logging/setLevel, by putting the stateless revision's
// _meta members into its own tools/call. README (policies/README.md "Log
// levels of protocol 2026-07-28"): the level is decided as
// logging/setLevel "so that a rule written for logging/setLevel holds
// whichever revision the runner speaks"; toward an upstream of 2026-07-28
// such a member is left out ("a logLevel no policy decided"), and
// inputResponses/requestState of such a runner are removed whatever the
// upstream's revision (TestRev2026AttackLegacyRunnerSmugglesAnswersToDualUpstream).
// But decideLogLevel (modules/policy/loglevel.go 32) returns for any call
// that is not stateless, and toolgate_proxy's request path
// (modules/mcpproxy/mcpproxy.go 202-214) strips only inputResponses and
// requestState: the go-sdk upstream, initialized at 2025-11-25, gets
// _meta protocolVersion 2026-07-28 with logLevel "debug", undecided (the
// go-sdk reads it, shared.go validateMeta, and here refuses the call only
// because the Mcp-Protocol-Version header says 2025-11-25; an upstream
// that does not cross-check serves it at that level). Fix: remove the
// revision's _meta members (mcp2026.StripMeta, in any case) from the
// requests of runners of earlier revisions whatever the upstream's
// revision, as translate does toward a 2026-07-28 upstream.
//
// Fixed: the request path removes the revision's _meta members from every request of a runner of an earlier revision.
func TestFixReview2AttackLegacyRunnerLogLevelReachesDualUpstream(t *testing.T) {
	up := startUpstreamServer(t, nil, nil)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: aaPolicies(t, fr2DenySetLevel, "")})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	// Control: the method itself is denied.
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}`)
	if got := trJoin(msgs); !strings.Contains(got, "log level stays") {
		t.Fatalf("control: logging/setLevel was not denied: %s", got)
	}
	_, _, msgs = m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/logLevel":"debug"}}}`)
	if sent := fr2UpstreamSaw(up, `"io.modelcontextprotocol/logLevel"`); len(sent) != 0 {
		t.Fatalf("a runner of 2025-11-25's logLevel debug reached the upstream undecided, past the rule on logging/setLevel (runner got %s): %s", trJoin(msgs), sent[0])
	}
}
