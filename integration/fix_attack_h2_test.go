package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// fixPostH2 opens stream id on r with a POST of path carrying body whole
// (its DATA frame ends the stream), announced by Content-Length.
func fixPostH2(t testing.TB, r *rawH2, authority string, id uint32, path string, headers map[string]string, body string) {
	t.Helper()
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.buf.Reset()
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", authority}, {":path", path},
		{"content-type", "application/json"}, {"accept", "application/json, text/event-stream"}, {"content-length", fmt.Sprint(len(body))}} {
		_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	for k, v := range headers {
		_ = r.enc.WriteField(hpack.HeaderField{Name: strings.ToLower(k), Value: v})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.buf.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteData(id, true, []byte(body)); err != nil {
		t.Fatal(err)
	}
}

// Attack (fixed): a successful answer toolgate writes itself (here the answer to
// initialize, which creates the MCP session) to an HTTP/2 runner that
// reads it slowly. The runner announces a small stream window
// (SETTINGS_INITIAL_WINDOW_SIZE 16) and opens it 3 s after the answer's
// head arrived (a busy runner applying backpressure: legitimate HTTP/2).
// Expected: the answer arrives whole once the runner reads (before the fix
// nothing bounded this write; over HTTP/1 the socket's buffer holds it).
// What happened: the stream is reset (RST_STREAM INTERNAL_ERROR) 2 s after
// the handler ended, the answer cut: EarlyAnswer.Finish runs after every
// HTTP/2 request whose body was read by Content-Length (io.ReadFull never
// sees the body's EOF, so a.ended stays false), and its flush of the
// buffered answer now carries the refusal's 2 s write deadline.
// Fixed: EarlyAnswer counts what is read of a body of known length; one
// read to its length has ended, and its answer gets no refusal's deadline.
func TestFixAttackH2SlowReaderAnswerReset(t *testing.T) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL}, "h1 h2 h3")
	sess := g.createSession(t, aliceKey, "svc")
	r := g.dialRawH2(t, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 16})
	body := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	fixPostH2(t, r, g.Addr, 1, "/v1/mcp/svc", map[string]string{"authorization": "Bearer " + aliceKey, "x-toolgate-session": sess}, body)
	for i := 0; ; i++ {
		r.mu.Lock()
		status, readErr := r.status[1], r.readErr
		r.mu.Unlock()
		if status != "" {
			if status != "200" {
				t.Fatalf("initialize answered %s", status)
			}
			break
		}
		if i == 200 || readErr != nil {
			t.Fatalf("no answer's head within 10 s (%v)", readErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // the runner is busy; then it reads
	r.wmu.Lock()
	err := r.fr.WriteWindowUpdate(1, 1<<20)
	r.wmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	var ended bool
	var reset http2.ErrCode
	var wasReset bool
	for i := 0; i < 200; i++ {
		r.mu.Lock()
		ended = r.ended[1]
		reset, wasReset = r.resets[1]
		r.mu.Unlock()
		if ended || wasReset {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if wasReset || !ended {
		t.Errorf("the initialize answer to a runner that opened its window 3 s after the head: reset %v (%v), ended %v; want it whole", wasReset, reset, ended)
	}
}
