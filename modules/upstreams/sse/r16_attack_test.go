package sse

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Attack (fixed): a legacy server answers a call on its stream at once,
// then answers the POST that carried it with 202 and a body it keeps open
// (a byte, then nothing: a broken framework's chunked answer, or a server
// that wants calls to hang). The MCP Go SDK's client closed the POST's
// body unread once its status arrived; toolgate read up to 4 KiB of it to
// reuse the connection, with no bound in time, so the call waited for the
// body — the whole of the caller's time — though its answer was there.
// Expected: the answer reaches the runner at once. Reproduced: the call
// came back only when its context ended (3 s here; the service's timeout
// in toolgate, after which toolgate_proxy reports a timeout instead of
// the answer). Severity: low (availability; a server can stall its own
// calls, but here even a server that answered them).
func TestR16PostBodyKeptOpenHoldsTheAnswer(t *testing.T) {
	l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "tools/call" {
			return false
		}
		s.send(r16Answer(m))
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, "A")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return true
	})
	rt := reviewRuntime(t, l.port)
	sid := r16Open(t, rt, "alice")
	start := time.Now()
	msgs, err := r16Call(t, rt, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}}`, 3*time.Second)
	took := time.Since(start)
	if err != nil || len(msgs) != 1 || !strings.Contains(msgs[0], "answered") {
		t.Errorf("the call got %q, %v; want its answer", msgs, err)
	}
	if took > time.Second {
		t.Errorf("the call took %v: it waited for the POST's body, not for its answer", took)
	}
}
