//go:build open_findings

package sse

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// Attack (open): a broken legacy server labels its answers with an event
// type padded with a blank ("event: message "), or another type of its
// own ("event: response"). The MCP Go SDK's client trimmed event names
// and relayed every event's data, so such a server worked; toolgate
// relays only events typed exactly "message" (or untyped), as the
// standard reads them, and skips the rest after one log entry — so the
// answer, which names its call's id, is dropped and the call waits out
// the service's whole timeout (up to 300 s, holding the runner and a slot
// of the caller's), the very outcome the switch to toolgate's reader was
// to end for answers it cannot relay. Expected: the call ends at once —
// with its answer, or with a retryable error saying the server answered
// under another event type (link.Fail, as for a malformed answer).
// Reproduced: the call returned only when its context ended. Severity:
// low (availability with a nonconforming server; behaviour lost with the
// SDK's client). Open: whether to relay such events or only fail their
// call is a design choice.
func TestR16AnswerUnderAnotherEventTypeWaitsOutTheTimeout(t *testing.T) {
	for _, typ := range []string{"message ", "response"} {
		t.Run(typ, func(t *testing.T) {
			l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
				if m.Method != "tools/call" {
					return false
				}
				s.out <- fmt.Sprintf("event: %s\ndata: %s\n\n", typ, r16Answer(m))
				w.WriteHeader(http.StatusAccepted)
				return true
			})
			rt := reviewRuntime(t, l.port)
			sid := r16Open(t, rt, "alice")
			start := time.Now()
			msgs, err := r16Call(t, rt, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}}`, 3*time.Second)
			if took := time.Since(start); took > time.Second {
				t.Errorf("the call answered under event type %q took %v (got %q, %v): it waited out its time", typ, took, msgs, err)
			}
		})
	}
}
