package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// startTestUpstream serves the harness's go-sdk upstream in this process.
func startTestUpstream(t *testing.T, jsonResponse bool) *route {
	t.Helper()
	server := newUpstreamServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{JSONResponse: jsonResponse, SessionTimeout: time.Minute})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	r := &route{party: direct, kind: "sse", url: srv.URL + "/mcp", client: newClient(time.Minute)} // generous: the test is about counting, on a loaded machine under -race
	if jsonResponse {
		r.kind = "json"
	}
	t.Cleanup(r.client.CloseIdleConnections)
	return r
}

// The generator sends every scheduled call, checks each answer, and counts
// latencies for all of them, over SSE and JSON answers alike.
func TestOpenLoopAgainstTheUpstream(t *testing.T) {
	for _, jsonResponse := range []bool{false, true} {
		r := startTestUpstream(t, jsonResponse)
		t.Run(r.kind, func(t *testing.T) {
			ctx := context.Background()
			var err error
			if r.sessions, err = r.openSessions(ctx, 2, 2); err != nil {
				t.Fatal(err)
			}
			if r.sessions[0] == "" || r.sessions[0] == r.sessions[1] {
				t.Fatalf("sessions %q", r.sessions)
			}
			for _, c := range []struct {
				call call
				rate int
			}{{smallCall, 20}, {bigCall, 3}} { // rates any machine sustains: the test checks the counting, not speed
				res := openLoop(ctx, r, c.call, c.rate, time.Second)
				if res.Calls != c.rate || res.Errors != 0 || len(res.latencies) != c.rate {
					t.Fatalf("%s: %d calls, %d errors (%s), %d latencies; want %d calls, no error",
						c.call.name, res.Calls, res.Errors, res.FirstError, len(res.latencies), c.rate)
				}
				if res.latencies[0] <= 0 {
					t.Fatalf("%s: a latency of %s", c.call.name, res.latencies[0])
				}
			}
		})
	}
}

// Failed calls are counted, with the first failure's reason.
func TestOpenLoopCountsFailures(t *testing.T) {
	r := startTestUpstream(t, false)
	ctx := context.Background()
	var err error
	if r.sessions, err = r.openSessions(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	// A tool the upstream does not have: a JSON-RPC error, not the echo.
	missing := call{name: "missing", tool: "nope", args: `{}`, check: smallCall.check}
	res := openLoop(ctx, r, missing, 50, time.Second)
	if res.Calls != 50 || res.Errors != 50 || !strings.Contains(res.FirstError, "nope") {
		t.Fatalf("%d calls, %d errors, first %q; want 50 failed calls naming the tool", res.Calls, res.Errors, res.FirstError)
	}
	// A session the upstream does not know: HTTP 404.
	r.sessions = []string{"unknown-session"}
	res = openLoop(ctx, r, smallCall, 20, time.Second)
	if res.Errors != 20 || !strings.HasPrefix(res.FirstError, "HTTP 404") {
		t.Fatalf("%d errors, first %q; want 20 failed calls with HTTP 404", res.Errors, res.FirstError)
	}
}

// Calls are due on a fixed schedule from the run's start, however long
// earlier calls take.
func TestScheduleOffset(t *testing.T) {
	for _, tc := range []struct {
		i, rate int
		want    time.Duration
	}{
		{0, 400, 0},
		{1, 400, 2500 * time.Microsecond},
		{399, 400, 997500 * time.Microsecond},
		{3, 1000, 3 * time.Millisecond},
		{1, 3, 333333333},
		{9999, 1000, 9999 * time.Millisecond},
	} {
		if got := scheduleOffset(tc.i, tc.rate); got != tc.want {
			t.Errorf("scheduleOffset(%d, %d) = %s, want %s", tc.i, tc.rate, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var v []time.Duration
	for i := 1; i <= 200; i++ {
		v = append(v, time.Duration(i))
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 100}, {0.9, 180}, {0.99, 198}, {1, 200}, {0.001, 1}} {
		if got := percentile(v, tc.q); got != tc.want {
			t.Errorf("percentile(1..200, %v) = %d, want %d", tc.q, got, tc.want)
		}
	}
	if got := percentile([]time.Duration(nil), 0.5); got != 0 {
		t.Errorf("percentile of nothing = %d", got)
	}
}

func TestHasID(t *testing.T) {
	for _, tc := range []struct {
		data string
		id   int64
		want bool
	}{
		{`{"jsonrpc":"2.0","id":12,"result":{}}`, 12, true},
		{`{"jsonrpc":"2.0","id":123,"result":{}}`, 12, false},
		{"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7}\n\n", 7, true},
		{`{"id":71,"x":{"id":7}}`, 7, true},
		{`{"id":"7"}`, 7, false},
	} {
		if got := hasID([]byte(tc.data), tc.id); got != tc.want {
			t.Errorf("hasID(%s, %d) = %v", tc.data, tc.id, got)
		}
	}
}
