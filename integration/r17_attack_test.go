package integration

// The seventeenth look: authentication, the HTTP API and the console as
// another user, resource exhaustion by an authenticated runner, secrets
// and logs. Each test names the attack, the contract it checks, and
// whether it was reproduced (and fixed) or held.

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Attack: a runner floods POST /v1/connections/{service}/test. Each test
// is an MCP initialize sent to the upstream (plus its DELETE), held until
// the upstream answers or 15 s pass: a goroutine, buffers up to
// max_response_size and an upstream connection, exactly what a call in
// progress holds. The MCP endpoint counts those against max_streams and
// max_streams_per_caller; the connection test counted nothing, so one
// caller could hold any number of upstream connections at once (and send
// the upstream as many initializes, with the service's own credential).
//
// Expected: README, max_streams_per_caller: "responses this gateway
// process relays at once …: calls waiting for their answer and open SSE
// streams (each holds a goroutine, buffers and an upstream connection);
// one more gets … a retryable … error naming the option". A connection
// test is such a response.
//
// Reproduced: with max_streams_per_caller 2, eight concurrent tests of
// one caller were all waiting at the upstream at once.
//
// Severity: medium (an authenticated runner holds unbounded goroutines,
// memory and upstream connections; an amplified flood of the upstream).
func TestR17ConnectionTestsBypassStreamLimits(t *testing.T) {
	up := startUpstream(t)
	release := make(chan struct{})
	var mu sync.Mutex
	waiting, most := 0, 0
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if !strings.Contains(string(body), "toolgate-connection-test") {
			return false
		}
		mu.Lock()
		waiting++
		most = max(most, waiting)
		mu.Unlock()
		defer func() {
			mu.Lock()
			waiting--
			mu.Unlock()
		}()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return false // then the real server answers
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_streams_per_caller 2"})

	const tests = 8
	var wg sync.WaitGroup
	answers := make(chan apiResponse, tests)
	for range tests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers <- g.api(t, http.MethodPost, "/v1/connections/svc/test", aliceKey, nil)
		}()
	}
	// Wait until every test either reached the upstream or was answered.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := waiting
		mu.Unlock()
		if n+len(answers) >= tests || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	seen := most
	mu.Unlock()
	close(release)
	wg.Wait()
	close(answers)

	if seen > 2 {
		t.Errorf("%d connection tests of one caller waited at the upstream at once; max_streams_per_caller is 2", seen)
	}
	refused := 0
	for a := range answers {
		var res struct {
			OK        bool   `json:"ok"`
			Error     string `json:"error"`
			Retryable bool   `json:"retryable"`
		}
		if err := json.Unmarshal(a.Body, &res); err != nil {
			t.Fatalf("test answer %d %s: %v", a.StatusCode, a.Body, err)
		}
		if !res.OK {
			if !res.Retryable || !strings.Contains(res.Error, "max_streams_per_caller") {
				t.Errorf("a refused test answered %d %s, want a retryable error naming max_streams_per_caller", a.StatusCode, a.Body)
			}
			refused++
		}
	}
	if refused != tests-seen {
		t.Logf("%d of %d tests refused, %d reached the upstream at once", refused, tests, seen)
	}
	if seen == 0 {
		t.Fatal("no connection test reached the upstream: the check could not fail")
	}
}
