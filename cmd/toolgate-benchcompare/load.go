package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A route is how the generator reaches one upstream: directly, through
// the plain proxy or through toolgate.
type route struct {
	party    string      // "direct", "caddy" or "toolgate"
	kind     string      // the upstream kind, "sse" or "json"
	url      string      // where MCP messages are posted
	header   http.Header // fixed headers: toolgate's API key and session
	sessions []string    // initialized MCP sessions; calls take them in turn
	client   *http.Client
}

// newClient is the generator's HTTP client for one party: keep-alive
// connections without a pool limit (an open-loop generator opens as many
// as the calls in flight need), no compression (the three parties see the
// same bytes), and a per-call timeout.
func newClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			MaxIdleConnsPerHost: 4096,
			IdleConnTimeout:     5 * time.Minute,
			DisableCompression:  true,
		},
	}
}

// A call is one kind of tools/call the generator sends.
type call struct {
	name  string
	tool  string
	args  string // the arguments object
	check func(body []byte) error
}

var (
	smallCall = call{name: "small", tool: "echo", args: `{"text":"hello"}`, check: func(body []byte) error {
		if !bytes.Contains(body, []byte(`hello`)) {
			return fmt.Errorf("the echo is missing: %.300s", body)
		}
		return nil
	}}
	bigCall = call{name: "1MiB", tool: "big", args: `{"bytes":1048576}`, check: func(body []byte) error {
		if len(body) < 1<<20 || !bytes.Contains(body, []byte(bigLine[:11])) {
			return fmt.Errorf("a %d-byte answer, want the whole 1 MiB text", len(body))
		}
		return nil
	}}
)

// callIDs numbers every call this program sends: calls in flight on one
// MCP session need distinct ids.
var callIDs atomic.Int64

// send posts one tools/call on the route's session s and checks the answer:
// HTTP 200, the JSON-RPC response to this id (over JSON or SSE), no tool
// error, and c's own check.
func (r *route) send(ctx context.Context, c call, session string) error {
	id := callIDs.Add(1)
	body := `{"jsonrpc":"2.0","id":` + strconv.FormatInt(id, 10) + `,"method":"tools/call","params":{"name":"` + c.tool + `","arguments":` + c.args + `}}`
	resp, err := r.post(ctx, session, body)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %.300s", resp.StatusCode, data)
	}
	if !hasID(data, id) {
		return fmt.Errorf("no response to id %d: %.300s", id, data)
	}
	if bytes.Contains(data, []byte(`"isError":true`)) {
		return fmt.Errorf("a tool error: %.300s", data)
	}
	return c.check(data)
}

// post sends one MCP message on session (none for initialize).
func (r *route) post(ctx context.Context, session, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", protocolVersion)
	}
	return r.client.Do(req)
}

// hasID reports whether data holds "id":<id> not followed by another digit.
func hasID(data []byte, id int64) bool {
	needle := []byte(`"id":` + strconv.FormatInt(id, 10))
	for {
		i := bytes.Index(data, needle)
		if i < 0 {
			return false
		}
		data = data[i+len(needle):]
		if len(data) == 0 || data[0] < '0' || data[0] > '9' {
			return true
		}
	}
}

// loadResult is what one open-loop run measured on the caller's side.
type loadResult struct {
	Calls      int
	Errors     int
	FirstError string `json:",omitempty"`
	// Latencies, sorted, each counted from the call's scheduled start.
	latencies []time.Duration
	// MaxLag is the most the generator started a call after its scheduled
	// time: when it is large, the generator (not the party) was starved.
	MaxLag time.Duration
	// Timeline is the slowest latency of the calls scheduled in each
	// second of the run: a stall shows as one slow second, a periodic one
	// as a pattern.
	Timeline []time.Duration
}

// openLoop sends c on r at rate calls per second for d: call i starts at
// start + i/rate whether or not earlier calls have finished, and its latency
// counts from that scheduled instant, so a stall of the party shows in
// every call scheduled during it instead of delaying the schedule.
func openLoop(ctx context.Context, r *route, c call, rate int, d time.Duration) loadResult {
	return openLoopTurns(ctx, []*route{r}, c, rate, d)[0]
}

// openLoopTurns is openLoop with the calls taking turns across routes:
// call i, due at start + i/rate, goes to routes[i mod n]. rate is the
// calls per second of all routes together, so each route gets rate/n
// calls per second. Every route's calls are thus spread over the same
// stretch of time and meet the upstream (which all routes share) in the
// same conditions, whereas routes run one after another each meet the
// upstream of their own stretch. It returns each route's result, in the
// order of routes; a route's MaxLag and Timeline are of its own calls,
// the Timeline by the second of the whole run.
func openLoopTurns(ctx context.Context, routes []*route, c call, rate int, d time.Duration) []loadResult {
	n := int(d.Seconds() * float64(rate))
	seconds := (n + rate - 1) / rate
	res := make([]loadResult, len(routes))
	for k := range res {
		calls := turnsOf(n, len(routes), k)
		res[k] = loadResult{Calls: calls, latencies: make([]time.Duration, calls), Timeline: make([]time.Duration, seconds)}
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := time.Now().Add(5 * time.Millisecond)
	for i := range n {
		k, j := i%len(routes), i/len(routes) // the route and its own call's number
		r, rr := routes[k], &res[k]
		scheduled := start.Add(scheduleOffset(i, rate))
		if wait := time.Until(scheduled); wait > 0 {
			time.Sleep(wait)
		}
		if lag := time.Since(scheduled); lag > rr.MaxLag {
			rr.MaxLag = lag
		}
		if ctx.Err() != nil {
			for k := range res {
				res[k].Calls = turnsOf(i, len(routes), k)
				res[k].latencies = res[k].latencies[:res[k].Calls]
			}
			break
		}
		session, latencies := r.sessions[j%len(r.sessions)], rr.latencies // not rr's field: a cancelled run shortens it
		wg.Go(func() {
			err := r.send(ctx, c, session)
			latencies[j] = time.Since(scheduled)
			if err != nil {
				mu.Lock()
				rr.Errors++
				if rr.FirstError == "" {
					rr.FirstError = err.Error()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for k := range res {
		rr := &res[k]
		for j, l := range rr.latencies {
			s := (j*len(routes) + k) / rate
			rr.Timeline[s] = max(rr.Timeline[s], l)
		}
		slices.Sort(rr.latencies)
	}
	return res
}

// turnsOf is how many of the first n calls taking turns across routes go
// to the route at index k.
func turnsOf(n, routes, k int) int {
	return (n + routes - 1 - k) / routes
}

// scheduleOffset is when call i of a run at rate calls per second is due,
// from the run's start.
func scheduleOffset(i, rate int) time.Duration {
	return time.Duration(int64(i) * int64(time.Second) / int64(rate))
}

// percentile returns the q-quantile (0 < q ≤ 1) of sorted by the nearest-rank
// method: the smallest value with at least q of the values at or below it.
func percentile[T time.Duration | float64](sorted []T, q float64) T {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}
