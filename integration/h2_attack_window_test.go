package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawH2 is an HTTP/2 client written frame by frame, to misbehave.
type rawH2 struct {
	conn *tls.Conn
	fr   *http2.Framer
	wmu  sync.Mutex
	enc  *hpack.Encoder
	buf  bytes.Buffer

	mu      sync.Mutex
	status  map[uint32]string // :status of each stream's answer
	resets  map[uint32]http2.ErrCode
	ended   map[uint32]bool
	goaway  bool
	readErr error
}

// dialRawH2 opens a TLS connection with ALPN h2, sends the preface and
// settings, and reads the gateway's frames in the background (settings
// and pings acknowledged; no WINDOW_UPDATE is ever sent).
func (h *h2Gateway) dialRawH2(t testing.TB, settings ...http2.Setting) *rawH2 {
	t.Helper()
	c, err := tls.Dial("tcp", h.Addr, h.tlsConfig("h2"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	r := &rawH2{conn: c, fr: http2.NewFramer(c, c), status: map[uint32]string{}, resets: map[uint32]http2.ErrCode{}, ended: map[uint32]bool{}}
	r.enc = hpack.NewEncoder(&r.buf)
	r.fr.ReadMetaHeaders = hpack.NewDecoder(65536, nil)
	if err := r.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	go r.readLoop()
	return r
}

func (r *rawH2) readLoop() {
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.mu.Lock()
			r.readErr = err
			r.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				r.wmu.Lock()
				_ = r.fr.WriteSettingsAck()
				r.wmu.Unlock()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				r.wmu.Lock()
				_ = r.fr.WritePing(true, f.Data)
				r.wmu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			r.mu.Lock()
			if s := f.PseudoValue("status"); s != "" && r.status[f.StreamID] == "" {
				r.status[f.StreamID] = s
			}
			if f.StreamEnded() {
				r.ended[f.StreamID] = true
			}
			r.mu.Unlock()
		case *http2.DataFrame:
			if f.StreamEnded() {
				r.mu.Lock()
				r.ended[f.StreamID] = true
				r.mu.Unlock()
			}
		case *http2.RSTStreamFrame:
			r.mu.Lock()
			r.resets[f.StreamID] = f.ErrCode
			r.mu.Unlock()
		case *http2.GoAwayFrame:
			r.mu.Lock()
			r.goaway = true
			r.mu.Unlock()
		}
	}
}

// post opens stream id with a POST of /v1/mcp/svc announcing length
// bytes, with headers, and sends first of its body.
func (r *rawH2) post(t testing.TB, authority string, id uint32, headers map[string]string, length int, first string) {
	t.Helper()
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.buf.Reset()
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", authority}, {":path", "/v1/mcp/svc"},
		{"content-type", "application/json"}, {"accept", "application/json, text/event-stream"}, {"content-length", fmt.Sprint(length)}} {
		_ = r.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	for k, v := range headers {
		_ = r.enc.WriteField(hpack.HeaderField{Name: strings.ToLower(k), Value: v})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.buf.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if first != "" {
		if err := r.fr.WriteData(id, false, []byte(first)); err != nil {
			t.Fatal(err)
		}
	}
}

// Attack (fixed): unauthenticated uploads whose runner grants no flow-control
// window for the answer (SETTINGS_INITIAL_WINDOW_SIZE 0, never a
// WINDOW_UPDATE), 50 streams on one HTTP/2 connection. The refusal's
// HEADERS (401) are not flow controlled and arrive; its body cannot be
// sent. Expected: as over HTTP/1 (where the small refusal fits the
// socket's buffer), each refused request's handler ends after the
// bounded drain (2 s, README: "read and dropped — up to
// max_request_size and for 2 s"), holding nothing after, so that an
// unauthenticated runner cannot hold the gateway's goroutines and
// streams longer. What happened: EarlyAnswer.Finish flushes the refusal
// before it drains, and on HTTP/2 that flush waits for window the runner
// never grants: every handler is held until write_idle (1 minute by
// default), far past the 2 s bound. Fixed: EarlyAnswer.Finish bounds its
// flush by the same 2 s, with a write deadline it lifts once the answer is
// out.
func TestH2AttackZeroWindowHoldsRefusedHandlers(t *testing.T) {
	_, g, _ := h2AliceSession(t, "h1 h2 h3", "max_request_size 1MiB")
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	before := goroutineKinds()
	r := g.dialRawH2(t, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	const n = 50
	for i := range n {
		r.post(t, g.Addr, uint32(1+2*i), map[string]string{"authorization": "Bearer not-a-key"}, 1<<20,
			`{"jsonrpc":"2.0","id":1,"method":"tools/call"`+strings.Repeat(" ", 1024))
	}
	// Every refusal's head arrives (the test's own check).
	for i := 0; ; i++ {
		r.mu.Lock()
		got := 0
		for _, s := range r.status {
			if s == "401" {
				got++
			}
		}
		readErr := r.readErr
		r.mu.Unlock()
		if got == n {
			break
		}
		if i == 200 || readErr != nil {
			t.Fatalf("%d of %d refusals' heads arrived (%v)", got, n, readErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The handlers end within the bounded drain (waited for at most
	// 10 s, five times the bound), the runner still connected.
	if got := settleGoroutines(base + 15); got > base+15 {
		t.Errorf("%d goroutines 10 s after %d refused uploads whose runner grants no window (%d before): their handlers are held past the 2 s drain; more of: %s",
			got, n, base, newGoroutines(before))
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, st := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(st, "EarlyAnswer") {
				t.Logf("one of them:\n%s", st)
				break
			}
		}
	}
}

// stacksWith counts the goroutines whose stack holds s.
func stacksWith(s string) int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, s) {
			n++
		}
	}
	return n
}

// Attack (held): the same over HTTP/3: 50 unauthenticated uploads on one QUIC
// connection whose runner grants 1 byte of stream window for answers
// (InitialStreamReceiveWindow 1) and never reads: each refused handler
// ends after the bounded drain (quic-go queues a small refusal without
// waiting for window, so Finish's flush does not block there).
func TestH2AttackZeroWindowHoldsRefusedHandlersH3(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "max_request_size 1MiB")
	tr := &http3.Transport{TLSClientConfig: g.tlsConfig(http3.NextProtoH3),
		QUICConfig: &quic.Config{InitialStreamReceiveWindow: 1, MaxStreamReceiveWindow: 1}}
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 50
	for range n {
		body, stop := stalledBodyStop(`{"jsonrpc":"2.0","id":1,"method":"tools/call"` + strings.Repeat(" ", 1024))
		defer stop()
		req := m.mcpRequest(ctx, http.MethodPost, body, 1<<20)
		req.Header.Set("Authorization", "Bearer not-a-key")
		go func() {
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	// The refusals are under way (the test's own check), then the
	// handlers end within the bounded drain (at most 10 s, five times
	// the bound).
	started := 0
	for i := 0; i < 200 && started < n; i++ {
		time.Sleep(50 * time.Millisecond)
		started = stacksWith("modules/session.(*Handler).ServeHTTP")
	}
	if started == 0 {
		t.Fatal("no refused request reached the gateway")
	}
	held := started
	for i := 0; i < 200 && held > 0; i++ {
		time.Sleep(50 * time.Millisecond)
		held = stacksWith("modules/session.(*Handler).ServeHTTP")
	}
	if held > 0 {
		t.Errorf("%d of %d refused handlers still run 10 s after the refusals began, their runner granting no window: held past the 2 s drain (%d in EarlyAnswer.Finish)",
			held, started, stacksWith("gateway.(*EarlyAnswer).Finish"))
	}
}
