package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/sseref"
)

// A result of a megabyte that the shipped policies let through (with
// max_result_bytes raised) reaches the runner byte for byte as the
// upstream wrote it, with only the decision's _meta put first, whether the
// upstream answers over SSE or with a JSON body and whether the runner
// reads an SSE stream or a JSON body.
func TestLargeResultBytesUnchanged(t *testing.T) {
	policies := channelPolicies(t, `{"toolgate": {"settings": {"max_result_bytes": 2097152}}}`)
	const call = `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"big","arguments":{"bytes":1048576}}}`
	for _, kind := range upstreamKinds {
		t.Run(kind.name, func(t *testing.T) {
			up := startUpstreamWith(t, kind.configure)
			direct := &rawMCP{t: t, url: up.URL, headers: map[string]string{}}
			direct.initialize()
			_, _, msgs := direct.post(call)
			want := gjson.GetBytes(lastMessage(t, msgs), "result").Raw
			if len(want) < 1<<20 || !strings.HasPrefix(want, "{") || gjson.Get(want, "_meta").Exists() {
				t.Fatalf("the upstream's result: %.200s (%d bytes)", want, len(want))
			}
			g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: policies, ResultPolicy: policies})
			m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
			m.initialize()
			for _, accept := range []string{"application/json, text/event-stream", "application/json"} {
				answer := largeAnswer(t, m, accept, call)
				got := gjson.GetBytes(answer, "result").Raw
				id := gjson.Get(got, `_meta.toolgate/decision.id`).String()
				mark := `{"_meta":{"toolgate/decision":{"id":"` + id + `","action":"allow"}},`
				if id == "" || got != mark+want[1:] {
					t.Errorf("accept %q: the runner got %.200s… (%d bytes), want the upstream's %d bytes after %s",
						accept, got, len(got), len(want), mark)
				}
			}
		})
	}
}

// largeAnswer posts call with the Accept header given and returns the
// answer's message, read as a conforming client reads it.
func largeAnswer(t *testing.T, m *rawMCP, accept, call string) json.RawMessage {
	t.Helper()
	resp, err := m.send(context.Background(), http.MethodPost, accept, call, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %v", resp.StatusCode, err)
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return bytes.TrimSpace(data)
	}
	var last json.RawMessage
	for _, ev := range sseref.Parse(string(data)).Events {
		if ev.Type == "message" && ev.Data != "" {
			last = json.RawMessage(ev.Data)
		}
	}
	return last
}
