package sse

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/mcpbridge"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A stream whose first event is not an endpoint event (a server of another
// transport at the url) is refused, saying so, not as an unreachable
// server.
func TestStreamWithoutEndpointEventIsRefusedSayingWhy(t *testing.T) {
	for name, first := range map[string]string{
		"a message first":                "data: " + r16Answer(r16Msg{ID: []byte("1"), Method: "initialize"}) + "\n\n",
		"an event of another type first": "event: ping\ndata: {}\n\n",
		"the stream ends":                "-",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := reviewOpen(t, reviewRuntime(t, startR16ServerBeginning(t, first, nil).port))
			var down *mcpbridge.Unavailable
			if !errors.As(err, &down) || !strings.Contains(down.Reason, "endpoint event") {
				t.Fatalf("opening: %v, want unavailable naming the missing endpoint event", err)
			}
		})
	}
}

// Events of other types than message (a heartbeat) are skipped; the
// message event after one is relayed.
func TestStreamSkipsEventsThatAreNotMessages(t *testing.T) {
	l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "initialize" {
			return false
		}
		s.out <- "event: heartbeat\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"skipped\"}}\n\n: comment\n\n"
		s.out <- "event: message\ndata: " + r16Answer(m) + "\n\n"
		w.WriteHeader(http.StatusAccepted)
		return true
	})
	rt := reviewRuntime(t, l.port)
	init, err := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(gateway.WithUpstreamUser(context.Background(), "alice"), 3*time.Second)
	defer cancel()
	s, answer, err := rt.Open(httptest.NewRequestWithContext(ctx, http.MethodPost, "http://toolgate/mcp/legacy", nil), init)
	if err != nil || s == nil {
		t.Fatalf("opening past a heartbeat event: %v", err)
	}
	if !strings.Contains(string(answer), "serverInfo") {
		t.Errorf("initialize answered %s, want the message event's answer", answer)
	}
}
