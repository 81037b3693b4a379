package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// More streams than the gateway allows: each open stream holds buffers, a
// goroutine and an upstream connection, so streams past
// max_streams_per_caller or max_streams are refused with 503 before
// anything is opened upstream, and the open ones go on unaffected.

// heldStreams makes the upstream hold every standalone GET stream open
// until the test ends, and write a notification on each when send is
// called.
type heldStreams struct {
	mu     sync.Mutex
	open   int
	notify chan struct{}
}

func holdStreams(t *testing.T, up *upstream) *heldStreams {
	h := &heldStreams{notify: make(chan struct{})}
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet {
			return false
		}
		sseStart(w)
		h.mu.Lock()
		h.open++
		notify := h.notify
		h.mu.Unlock()
		defer func() { h.mu.Lock(); h.open--; h.mu.Unlock() }()
		for {
			select {
			case <-notify:
				fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/resources/updated\",\"params\":{\"uri\":\"test://watched\"}}\n\n")
				flush(w)
				h.mu.Lock()
				notify = h.notify
				h.mu.Unlock()
			case <-r.Context().Done():
				return true
			case <-done:
				return true
			}
		}
	})
	return h
}

// send writes one notification on every held stream.
func (h *heldStreams) send() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.notify)
	h.notify = make(chan struct{})
}

func (h *heldStreams) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open
}

// openStream opens the runner's standalone stream and returns its status,
// body (open when 200) and answer.
func (m *rawMCP) openStream(t *testing.T, ctx context.Context) (*http.Response, string) {
	t.Helper()
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// inUse is the heap and the goroutine stacks in use, after collecting
// garbage.
func inUse() (bytes uint64, goroutines int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse, runtime.NumGoroutine()
}

func TestAdversarialManyStreams(t *testing.T) {
	up, g, alice := aliceSession(t, gatewayConfig{Extra: "max_streams 30\nmax_streams_per_caller 20"})
	held := holdStreams(t, up)
	bob := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bob.initialize()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	memBefore, _ := inUse()
	var streams []*http.Response
	for i := range 20 {
		resp, answer := alice.openStream(t, ctx)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("alice's stream %d: %d %s", i, resp.StatusCode, answer)
		}
		streams = append(streams, resp)
	}
	for i := range 10 {
		resp, answer := bob.openStream(t, ctx)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("bob's stream %d: %d %s", i, resp.StatusCode, answer)
		}
		streams = append(streams, resp)
	}
	waitFor(t, "30 streams upstream", func() bool { return held.count() == 30 })
	closeIdle := func() { alice.transport.(*http.Transport).CloseIdleConnections() }
	closeIdle()
	memOpen, goroutinesOpen := inUse()
	t.Logf("30 open streams: %d KiB each (runner, gateway and upstream together)", (int64(memOpen)-int64(memBefore))/30>>10)

	// Past the limits: 503, nothing upstream, nothing kept.
	before := snapshot(t, up, g)
	for i := range 100 {
		m, option := alice, "max_streams_per_caller"
		if i%2 == 1 {
			m, option = bob, "max_streams "
		}
		resp, answer := m.openStream(t, ctx)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(answer, option) || !strings.Contains(answer, `"retryable":true`) {
			t.Fatalf("stream past the limit: %d %v %s; want 503 naming %s", resp.StatusCode, resp.Header, answer, option)
		}
		if i == 0 {
			// A call is a stream too: it waits for its answer.
			status, _, answer := alice.rawRequest(http.MethodPost, nil, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}`))
			if status != http.StatusServiceUnavailable || !strings.Contains(answer, "max_streams_per_caller") {
				t.Errorf("a call past the limit: %d %s", status, answer)
			}
		}
	}
	before.check(t)
	// The runner's pool may hold a connection or two more than before
	// (one dialled while an answered one was on its way back to the
	// pool), each with goroutines at both ends: they are closed, and the
	// count is given a moment to settle. A leak per refused stream would
	// be a hundred goroutines and never settle.
	closeIdle()
	var goroutines int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, goroutines = inUse(); goroutines <= goroutinesOpen+5 || time.Now().After(deadline) {
			break
		}
	}
	if goroutines > goroutinesOpen+5 {
		t.Errorf("100 refused streams left %d goroutines more", goroutines-goroutinesOpen)
	}

	// The open streams are unaffected: each gets the next notification.
	held.send()
	for i, s := range streams {
		br := bufio.NewReader(s.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
			if strings.Contains(line, "notifications/resources/updated") {
				break
			}
		}
	}
	// Ending one makes room for another.
	streams[0].Body.Close()
	waitFor(t, "a stream to end upstream", func() bool { return held.count() == 29 })
	waitFor(t, "room for another stream", func() bool {
		resp, _ := alice.openStream(t, ctx)
		return resp.StatusCode == http.StatusOK
	})
}
