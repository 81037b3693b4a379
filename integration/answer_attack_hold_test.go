package integration

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Attack (held): slowloris against the refusal's drain. Forty
// unauthenticated clients each announce a 1 MiB body, send a few bytes of
// it and stall (half of them trickling a byte every 100 ms instead). Each
// gets its 401 at once, and the gateway closes each connection after its
// bounded wait (2 s, not read_body_idle's minute): no handler goroutine is
// held beyond it.
func TestAnswerAttackStalledRefusalsHoldNothing(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_request_size 1MiB"})
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	const n = 40
	conns := make([]*attackConn, n)
	for i := range conns {
		c := dialAttack(t, g)
		conns[i] = c
		head := "POST /v1/mcp/svc HTTP/1.1\r\nHost: " + c.host + "\r\nAuthorization: Bearer not-a-key\r\nContent-Type: application/json\r\n" +
			"Accept: application/json, text/event-stream\r\nContent-Length: " + fmt.Sprint(1<<20) + "\r\n\r\n"
		if err := c.write(head + `{"jsonrpc":"2.0","id":1,"method":"tools/call"` + strings.Repeat(" ", 100)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan string, 2*n)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop := make(chan struct{})
			defer close(stop)
			if i%2 == 1 { // a trickle: a byte every 100 ms, for at most 10 s
				go func() {
					for range 100 {
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
						}
						if c.write(" ") != nil {
							return
						}
					}
				}()
			}
			resp, _, err := c.read(10 * time.Second)
			if err != nil || resp.StatusCode != 401 {
				errs <- fmt.Sprintf("conn %d: %v %v", i, resp, err)
				return
			}
			if got := c.next(10 * time.Second); got != "closed" {
				errs <- fmt.Sprintf("conn %d after its 401: %s", i, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+10 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := runtime.NumGoroutine(); got > base+10 {
		t.Errorf("%d goroutines after the stalled refusals ended, %d before them", got, base)
	}
}
