package sse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/mcpbridge"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// scriptedLegacy is a server whose stream begins with first (raw SSE
// text, %s its own port; "": the stream ends at once) and, when
// initialize is POSTed, sends onInit.
func scriptedLegacy(t *testing.T, first, onInit string) (port string) {
	t.Helper()
	ch := make(chan string, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if first == "" {
			return
		}
		fmt.Fprint(w, strings.ReplaceAll(first, "%s", port))
		w.(http.Flusher).Flush()
		select {
		case msg := <-ch:
			fmt.Fprint(w, msg)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("POST /message", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"initialize"`) {
			ch <- onInit
		}
		w.WriteHeader(http.StatusAccepted)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return port
}

const scriptedInitAnswer = `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"legacy","version":"1"}}}`

// A stream whose first event is not an endpoint event (a server of another
// transport at the url) is refused, saying so, not as an unreachable
// server.
func TestStreamWithoutEndpointEventIsRefusedSayingWhy(t *testing.T) {
	for name, first := range map[string]string{
		"a message first":                "data: " + scriptedInitAnswer + "\n\n",
		"an event of another type first": "event: ping\ndata: {}\n\n",
		"the stream ends":                "",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := reviewOpen(t, reviewRuntime(t, scriptedLegacy(t, first, "")))
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
	port := scriptedLegacy(t, "event: endpoint\ndata: /message\n\n",
		"event: heartbeat\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"skipped\"}}\n\n: comment\n\nevent: message\ndata: "+scriptedInitAnswer+"\n\n")
	rt := reviewRuntime(t, port)
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
