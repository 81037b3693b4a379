//go:build open_findings

package integration

import (
	"fmt"
	"net/http"
	"testing"
)

// Attack: a legacy server answers a call with an event that is not JSON
// (its answer cut off), naming the call's id.
// Expected: as with a program over stdio (mcpbridge.Link.malformedAnswer)
// and a Streamable HTTP upstream, the call fails at once with a retryable
// error saying the upstream sent a malformed answer — the behaviour
// TestLegacyAttackReflectedTokenInMalformedAnswer asks of an answer that
// is JSON but malformed.
// Reproduced: the MCP Go SDK's SSE connection decodes each event itself,
// and one it cannot decode reaches the bridge as an error without its
// text (mcpbridge.ConnLink skips it as a heartbeat), so nothing names the
// call: it waits out the service's whole timeout and gets "did not answer
// in time" instead. Every call a broken server answers so holds the
// runner (and a slot of the caller's) for the timeout, up to 300 s.
// Severity: low (availability; no data crosses).
// Suggested fix: read the 2024-11-05 stream with toolgate's own SSE
// reader (the transport is a GET whose first event names the POST
// endpoint), handing each event's data to Link.Receive as the stdio
// transport does, so that malformedAnswer sees it; or ask the SDK for the
// event's data on a decoding error.
func TestLegacyAttackUndecodableAnswerWaitsOutTimeout(t *testing.T) {
	l := startLegacy(t, legacyHooks{post: func(s *legacyStream, m legacyMsg, w http.ResponseWriter) bool {
		if m.Method != "tools/call" {
			return false
		}
		s.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"x"`, m.ID))
		w.WriteHeader(http.StatusAccepted)
		return true
	}})
	g := legacyGateway(t, l, gatewayConfig{}, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "legacy"), "legacy")
	m.initialize()
	_, _, msgs := m.post(fmt.Sprintf(legacyEcho, 1, "hi"))
	if !retryableError(msgs) || !bytesContain(msgs, "malformed answer") {
		t.Errorf("the call's answer to an undecodable answer: %s, want a retryable error saying so (not its timeout)", msgs)
	}
}
