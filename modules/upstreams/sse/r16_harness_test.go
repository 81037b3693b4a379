package sse

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/modules/gateway"
)

// r16Server is a scripted 2024-11-05 server: its stream names
// /message?sid=… and writes what is queued for it; POSTed requests are
// answered on the stream unless post, when set, handled them (true).
type r16Server struct {
	srv  *httptest.Server
	port string
	quit chan struct{}
	post func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool

	mu      sync.Mutex
	streams []*r16Stream
	posts   []r16Msg
	openGET atomic.Int32
}

// r16Stream is one GET stream the server holds open.
type r16Stream struct {
	id  string
	out chan string // raw SSE text to write
}

func (s *r16Stream) send(msg string) { s.out <- "data: " + msg + "\n\n" }

// r16Msg is a message POSTed to the server.
type r16Msg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Raw    string          `json:"-"`
}

func startR16Server(t *testing.T, post func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool) *r16Server {
	t.Helper()
	return startR16ServerBeginning(t, "", post)
}

// startR16ServerBeginning starts a server whose streams begin with first
// (raw SSE text; "" for the endpoint event) instead; first "-" ends each
// stream at once.
func startR16ServerBeginning(t *testing.T, first string, post func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool) *r16Server {
	t.Helper()
	l := &r16Server{quit: make(chan struct{}), post: post}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sse", func(w http.ResponseWriter, r *http.Request) {
		l.openGET.Add(1)
		defer l.openGET.Add(-1)
		l.mu.Lock()
		s := &r16Stream{id: fmt.Sprint(len(l.streams)), out: make(chan string, 10000)}
		l.streams = append(l.streams, s)
		l.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		switch first {
		case "":
			fmt.Fprintf(w, "event: endpoint\ndata: /message?sid=%s\n\n", s.id)
		case "-":
			return
		default:
			io.WriteString(w, first)
		}
		w.(http.Flusher).Flush()
		for {
			select {
			case text := <-s.out:
				if _, err := io.WriteString(w, text); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			case <-l.quit:
				return
			}
		}
	})
	mux.HandleFunc("POST /message", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m r16Msg
		_ = json.Unmarshal(body, &m)
		m.Raw = string(body)
		l.mu.Lock()
		l.posts = append(l.posts, m)
		var s *r16Stream
		for _, c := range l.streams {
			if c.id == r.URL.Query().Get("sid") {
				s = c
			}
		}
		l.mu.Unlock()
		if s == nil {
			http.Error(w, "no such stream", http.StatusNotFound)
			return
		}
		if l.post != nil && l.post(s, m, w, r) {
			return
		}
		if answer := r16Answer(m); answer != "" {
			s.send(answer)
		}
		w.WriteHeader(http.StatusAccepted)
	})
	l.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		close(l.quit)
		l.srv.CloseClientConnections()
		l.srv.Close()
	})
	_, l.port, _ = net.SplitHostPort(l.srv.Listener.Addr().String())
	return l
}

// r16Answer is a well-behaved server's answer to a request ("" for a
// notification).
func r16Answer(m r16Msg) string {
	switch {
	case len(m.ID) == 0 || m.Method == "":
		return ""
	case m.Method == "initialize":
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"legacy","version":"1"}}}`, m.ID)
	case m.Method == "tools/call":
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"answered"}]}}`, m.ID)
	}
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{}}`, m.ID)
}

// r16Call sends one request of the runner's on session s and returns the
// messages of its answer, waiting at most within.
func r16Call(t *testing.T, rt *runtime, sid string, body string, within time.Duration) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(gateway.WithUpstreamUser(context.Background(), "alice"), within)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://toolgate/mcp/legacy", strings.NewReader(body))
	req.Header.Set("X-Api-Key", "alice-secret-key")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Content-Type", "application/json")
	resp, err := rt.bridge.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		return []string{fmt.Sprintf("HTTP %d %s", resp.StatusCode, b)}, nil
	}
	var msgs []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			msgs = append(msgs, data)
		}
	}
	return msgs, sc.Err()
}

// waitFor polls cond every 10 ms for at most d.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// r16Open initializes a runner's MCP session through the bridge, as
// toolgate_proxy does, and returns its id.
func r16Open(t *testing.T, rt *runtime, user string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(gateway.WithUpstreamUser(context.Background(), user), 3*time.Second)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://toolgate/mcp/legacy",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`))
	req.Header.Set("X-Api-Key", user+"-secret-key")
	req.Header.Set("Content-Type", "application/json")
	resp, err := rt.bridge.RoundTrip(req)
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	id := resp.Header.Get("Mcp-Session-Id")
	if id == "" {
		t.Fatalf("initialize: HTTP %d %s", resp.StatusCode, body)
	}
	return id
}
