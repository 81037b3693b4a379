package integration

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// attackStalledRefusals opens n streams on rt, each an unauthenticated
// POST announcing 1 MiB, sending 2 KiB and stalling; while they are
// open, alice's call on rt is served. Each stalled stream gets its 401
// and its end; afterwards the gateway holds no goroutine for them.
func attackStalledRefusals(t *testing.T, m *rawMCP, rt http.RoundTripper, closeAll func(), n int) {
	callEcho(t, m, rt, 60, "warm")
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	before := goroutineKinds()
	var wg sync.WaitGroup
	var stopMu sync.Mutex
	var stops []func()
	errs := make(chan string, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			head := `{"jsonrpc":"2.0","id":1,"method":"tools/call"` + strings.Repeat(" ", 2048)
			body, stop := stalledBodyStop(head)
			stopMu.Lock()
			stops = append(stops, stop)
			stopMu.Unlock()
			req := m.mcpRequest(ctx, http.MethodPost, body, 1<<20)
			req.Header.Set("Authorization", "Bearer not-a-key")
			resp, err := rt.RoundTrip(req)
			if err != nil {
				errs <- fmt.Sprintf("stream %d: %v", i, err)
				return
			}
			b, err := readAllWithin(resp.Body, 20*time.Second)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusUnauthorized {
				errs <- fmt.Sprintf("stream %d: %d %v %.100s", i, resp.StatusCode, err, b)
			}
		}()
	}
	// Alice's call on the same connection, while they stall.
	time.Sleep(300 * time.Millisecond)
	callEcho(t, m, rt, 61, "beside-the-stalled")
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for _, stop := range stops { // the client's own writers end
		stop()
	}
	closeAll()
	if got := settleGoroutines(base + 10); got > base+10 {
		t.Errorf("%d goroutines after %d stalled refusals ended, %d before them; more of: %s", got, n, base, newGoroutines(before))
	}
}

// Attack (held): 90 stalled unauthenticated uploads multiplexed on one
// HTTP/2 connection (TLS): each gets its 401 and its end within the
// bounded drain, alice's call beside them on that connection is served,
// and no goroutine is held afterwards.
func TestH2AttackStalledRefusalsOnOneConnection(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "max_request_size 1MiB")
	c := g.dialH2(t)
	attackStalledRefusals(t, m, c, func() {}, 90)
}

// Attack (held): the same on one HTTP/3 connection (90 of its 100
// streams).
func TestH2AttackStalledRefusalsOnOneH3Connection(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "max_request_size 1MiB")
	tr := g.h3Transport(t)
	attackStalledRefusals(t, m, tr, func() {}, 90)
}
