package integration

import (
	"net/http"
	"strings"
	"testing"
)

// answers3Stateless sends a stateless (2026-07-28) tools/call declaring
// caps and returns the runner's answer as JSON.
func answers3Stateless(t *testing.T, g *gateway, session string, id int, caps string) string {
	t.Helper()
	status, msg := saSend(t, g, "/v1/mcp/svc", aliceKey, session, "tools/call", "echo", saCall(id, "echo", `{"text":"x"}`, caps, ""), nil)
	if status != http.StatusOK {
		t.Fatalf("premise: call %d: %d %s", id, status, aaJSON(msg))
	}
	return aaJSON(msg)
}

// Attack (fixed): a stateless (2026-07-28) runner's calls share toolgate's implied
// MCP session only while they declare the same clientCapabilities
// (mcp2026.Runtime.Session, internal/mcp2026/runtime.go:141-142, keys it by
// a hash of them), and the refused secrets live on that session only
// (mcpsession.Session.AddRefused). In 2026-07-28 capabilities are sent per
// request, and a runner declares elicitation on the calls that may need
// it and not on the others: its first call (declaring elicitation) is
// refused by the upstream (401), toolgate refreshes alice's grant and
// sends it again; its next call (declaring nothing) gets a new implied
// session whose Refused is empty, and the upstream's answer quoting the
// refused token reaches the runner unredacted — the token the provider
// still honours. README: an OAuth token an upstream refused is replaced by
// [REDACTED:credential] "in any later answer of the MCP session, on the
// replica that sent it"; for a stateless runner there is no other session
// than the implied one, and the same runner, upstream and replica are
// involved.
// Fixed: the user's connection keeps the tokens it sent before
// (gateway.Connection.Retired), not the MCP session.
func TestAnswers3AttackStatelessRefusedTokenOtherCapabilities(t *testing.T) {
	g, session, tokens := refusedThenQuoted(t, 3)
	first := answers3Stateless(t, g, session, 1, `{"elicitation":{}}`)
	old, fresh := tokens()
	if old == "" || fresh == "" || old == fresh {
		t.Fatalf("premise: the call was not refused and retried with a refreshed token (%q, %q): %s", old, fresh, first)
	}
	ans := answers3Stateless(t, g, session, 2, `{}`)
	t.Logf("runner got: %s", ans)
	if strings.Contains(ans, old) {
		t.Errorf("the stateless runner got alice's access token the upstream refused on its previous call: %s", ans)
	}
}

// Holds: the same stateless runner declaring the same capabilities on
// both calls: the second answer's quote of the refused token is redacted.
func TestAnswers3HoldsStatelessRefusedTokenSameCapabilities(t *testing.T) {
	g, session, tokens := refusedThenQuoted(t, 3)
	first := answers3Stateless(t, g, session, 1, `{}`)
	old, fresh := tokens()
	if old == "" || fresh == "" || old == fresh {
		t.Fatalf("premise: the call was not refused and retried with a refreshed token (%q, %q): %s", old, fresh, first)
	}
	ans := answers3Stateless(t, g, session, 2, `{}`)
	t.Logf("runner got: %s", ans)
	if strings.Contains(ans, old) {
		t.Errorf("the stateless runner got the refused token: %s", ans)
	}
	if !strings.Contains(ans, "REDACTED") {
		t.Errorf("premise: the quote was not redacted: %s", ans)
	}
}
