package mcpmsg

import "testing"

// An upstream's method is logged only when MCP defines it: a program or a
// legacy SSE server holds secrets toolgate cannot redact, and may write
// one as a method (integration's TestUpstreamTextAttackServerRequestMethodLogged).
func TestLoggedMethodNamesOnlyMCPMethods(t *testing.T) {
	for method, want := range map[string]string{
		"sampling/createMessage":       "sampling/createMessage",
		"notifications/message":        "notifications/message",
		"sk-live-0123456789abcdef":     "a method MCP does not define",
		"notifications/sk-live-012345": "a method MCP does not define",
		"Sampling/createMessage":       "a method MCP does not define",
	} {
		if got := LoggedMethod(method); got != want {
			t.Errorf("LoggedMethod(%q) = %q, want %q", method, got, want)
		}
	}
}

// A protocol version is logged only when it is written as MCP names its
// revisions: an upstream may write a secret of its own there.
func TestLoggedRevisionOnlyDates(t *testing.T) {
	for v, want := range map[string]bool{
		"2025-11-25": true, "2026-07-28": true, "2099-01-01": true,
		"sk-live-01": false, "2025-11-2x": false, "2025/11/25": false, "": false, "2025-11-250": false,
	} {
		if got := LoggedRevision(v); got != want {
			t.Errorf("LoggedRevision(%q) = %v, want %v", v, got, want)
		}
	}
}
