package integration

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Hostile or broken upstreams: refused connections, stalls, streams that
// break mid-message, endless or malformed event streams, oversized or
// compressed bodies, redirects, HTML error pages and answers to requests
// never sent. The runner gets a clear JSON-RPC error (retryable where a
// retry may help); nothing the upstream sent that toolgate could not read
// strictly reaches the runner; storage does not change; and the session
// keeps working. Also covered elsewhere: TestAmbiguousUpstreamResultIsWithheld
// (duplicate keys), TestUpstreamErrorBodiesPassTheSameFilters (4xx JSON
// bodies), TestUpstreamSSEWithBareCRAndBOM, TestBareCRCannotHideAResultFromThePolicy,
// TestServiceTimeoutIsRetryable, TestDeadlineBeforeHeadersCancelsUpstream,
// TestResumptionWithoutProgressGivesUp, TestUpstreamRestartIsReinitializedTransparently.
func TestAdversarialUpstreams(t *testing.T) {
	// Another host, to which a redirect points: it must never be asked.
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"from elsewhere"}]}}`)
	}))
	defer other.Close()
	bomb := gzipBomb(t, 16<<20)

	up, g, m := aliceSession(t, gatewayConfig{Timeout: "2s", Extra: "max_response_size 1MiB"})
	// The case a call is for is the echo's text.
	var wrote atomic.Int64 // bytes an endless upstream managed to write
	behave := map[string]func(w http.ResponseWriter, r *http.Request){
		"stall before headers": func(w http.ResponseWriter, r *http.Request) {
			waitDone(r, 5*time.Second)
		},
		"stall mid-stream": func(w http.ResponseWriter, r *http.Request) {
			sseStart(w)
			fmt.Fprint(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"working\"}}\n\n")
			flush(w)
			waitDone(r, 5*time.Second)
		},
		"close mid-message (SSE)": func(w http.ResponseWriter, r *http.Request) {
			sseStart(w)
			fmt.Fprint(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"SECRET")
			flush(w)
			closeConn(w)
		},
		"close mid-message (JSON)": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "1000")
			fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"SECRET`)
			flush(w)
			closeConn(w)
		},
		"endless SSE line": func(w http.ResponseWriter, r *http.Request) {
			sseStart(w)
			fmt.Fprint(w, "data: ")
			endless(w, r, &wrote, []byte(strings.Repeat("x", 32<<10)))
		},
		"endless SSE event": func(w http.ResponseWriter, r *http.Request) {
			sseStart(w)
			endless(w, r, &wrote, []byte(strings.Repeat("data: "+strings.Repeat("x", 1000)+"\n", 32)))
		},
		"endless SSE comment lines": func(w http.ResponseWriter, r *http.Request) {
			sseStart(w)
			endless(w, r, &wrote, []byte(strings.Repeat(": "+strings.Repeat("x", 1000)+"\n", 32)))
		},
		"malformed SSE data": func(w http.ResponseWriter, r *http.Request) {
			sseStart(w)
			fmt.Fprint(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":SECRET}\n\n")
		},
		"invalid UTF-8 in SSE": func(w http.ResponseWriter, r *http.Request) {
			sseStart(w)
			fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"SECRET\xff\"}]}}\n\n")
		},
		"huge JSON body": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", fmt.Sprint(4<<20))
			endless(w, r, &wrote, []byte(strings.Repeat(" ", 32<<10)))
		},
		"huge chunked JSON body": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			endless(w, r, &wrote, []byte(strings.Repeat(" ", 32<<10)))
		},
		"gzip bomb": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(bomb)
		},
		"unrequested encoding": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "br")
			w.Write([]byte{0x1b, 0x2f, 0x00, 0xf8, 0xa5, 0x40, 0x02, 0x03})
		},
		"redirect": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/mcp", http.StatusTemporaryRedirect)
		},
		"HTML 500": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, "<html><body>Traceback: SECRET</body></html>")
		},
		"HTML 200": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<html><body>SECRET</body></html>")
		},
		"HTML 400": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, "<html><body>SECRET</body></html>")
		},
		"answer to another id (JSON)": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"jsonrpc":"2.0","id":99,"result":{"content":[{"type":"text","text":"SECRET"}]}}`)
		},
		"answers to other ids (SSE)": func(w http.ResponseWriter, r *http.Request) {
			sseStart(w)
			for _, id := range []string{`99`, `"1"`, `"toolgate-1"`} {
				fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"SECRET\"}]}}\n\n", id)
			}
		},
		"empty 200": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
		},
		"202 to a request": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
		},
	}
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		for name, f := range behave {
			if bytes.Contains(body, []byte(`"text":"`+name+`"`)) {
				f(w, r)
				return true
			}
		}
		return false
	})
	want := map[string]string{
		"stall before headers":        "did not answer in time",
		"stall mid-stream":            "did not answer in time",
		"close mid-message (SSE)":     "the upstream stream broke",
		"close mid-message (JSON)":    "reading the upstream response failed",
		"endless SSE line":            "exceeds max_response_size",
		"endless SSE event":           "exceeds max_response_size",
		"endless SSE comment lines":   "exceeds max_response_size",
		"malformed SSE data":          "malformed message",
		"invalid UTF-8 in SSE":        "malformed message",
		"huge JSON body":              "exceeds max_response_size",
		"huge chunked JSON body":      "exceeds max_response_size",
		"gzip bomb":                   "exceeds max_response_size",
		"unrequested encoding":        "malformed message",
		"redirect":                    "does not follow redirects",
		"HTML 500":                    "the upstream failed (HTTP 500)",
		"HTML 200":                    `a Content-Type that is neither application/json nor text/event-stream`,
		"HTML 400":                    "the upstream rejected the request (HTTP 400)",
		"answer to another id (JSON)": "ended its stream without answering",
		"answers to other ids (SSE)":  "ended its stream without answering",
		"empty 200":                   "malformed message",
		"202 to a request":            "ended its stream without answering",
	}
	for name, says := range want {
		t.Run(name, func(t *testing.T) {
			wrote.Store(0)
			before := snapshot(t, up, g)
			_, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + name + `"}}}`)
			last := lastMessage(t, msgs)
			answer := string(last)
			for _, msg := range msgs {
				if strings.Contains(string(msg), "SECRET") {
					t.Errorf("the runner got what toolgate could not check: %s", msg)
				}
			}
			code, message := rpcError(t, last)
			if !strings.Contains(message, strings.ReplaceAll(says, `\"`, `"`)) {
				t.Errorf("answer %s; want an error saying %q", answer, says)
			}
			if name != "HTML 400" && (code != -32011 || !strings.Contains(answer, `"retryable":true`)) {
				t.Errorf("answer %s; want -32011 with retryable", answer)
			}
			if n := wrote.Load(); n > 8<<20 {
				t.Errorf("the upstream wrote %d MiB before toolgate stopped reading; max_response_size is 1 MiB", n>>20)
			}
			// Only the upstream's own requests happened (the call, and
			// perhaps a cancellation, which toolgate sends in the
			// background and which may reach the upstream at any time after
			// the answer, even during the next case): storage is as it was.
			before.checkStorage(t)
			// The session still works.
			if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"fine"}}}`); !strings.Contains(string(lastMessage(t, msgs)), `\"text\":\"fine\"`) {
				t.Fatalf("the next call: %s", msgs)
			}
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("toolgate followed a redirect: the other host got %d requests", n)
	}
	// An upstream that refuses connections: the runner's initialize fails
	// retryably (not with 404, which tells a client its session ended and
	// to initialize again at once), and no MCP session is left behind.
	t.Run("refused connection", func(t *testing.T) {
		refused := freePort(t) // nothing listens there
		g := startGateway(t, gatewayConfig{Upstream: fmt.Sprintf("http://127.0.0.1:%d/mcp", refused)})
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
		before := storageFiles(t, g.DataDir)
		status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		answer := string(lastMessage(t, msgs))
		if code, message := rpcError(t, lastMessage(t, msgs)); status != http.StatusOK || code != -32011 ||
			message != "the upstream is unreachable" || hdr.Get("Mcp-Session-Id") != "" {
			t.Errorf("%d %v %s; want -32011 saying the upstream is unreachable, and no session", status, hdr, answer)
		}
		if strings.Contains(answer, fmt.Sprint(refused)) {
			t.Errorf("the answer names the upstream's address: %s", answer)
		}
		if after := storageFiles(t, g.DataDir); len(after) != len(before) {
			t.Errorf("storage changed: %d files, then %d", len(before), len(after))
		}
	})
}

func sseStart(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flush(w)
}

func flush(w http.ResponseWriter) { _ = http.NewResponseController(w).Flush() }

// waitDone waits until the request is given up (toolgate closes it) or at
// most d.
func waitDone(r *http.Request, d time.Duration) {
	select {
	case <-r.Context().Done():
	case <-time.After(d):
	}
}

// closeConn drops the connection without ending the response.
func closeConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

// endless writes chunk over and over until toolgate stops reading (or 64
// MiB were written), counting what it wrote.
func endless(w http.ResponseWriter, r *http.Request, wrote *atomic.Int64, chunk []byte) {
	for wrote.Load() < 64<<20 && r.Context().Err() == nil {
		n, err := w.Write(chunk)
		wrote.Add(int64(n))
		if err != nil {
			return
		}
		flush(w)
	}
}

// gzipBomb is a gzip stream that inflates to n bytes of spaces (valid JSON
// whitespace, so only its size can stop it).
func gzipBomb(t testing.TB, n int) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	chunk := bytes.Repeat([]byte(" "), 1<<20)
	for range n >> 20 {
		if _, err := zw.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	zw.Close()
	return buf.Bytes()
}
