package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// startEchoRoutes serves, for each party, an MCP stand-in that answers
// every tools/call with the echo, and records on one list which party
// each call reached, in the order they arrived, with its session.
func startEchoRoutes(t *testing.T, parties []string, sessions []string) ([]*route, func() []string) {
	t.Helper()
	var (
		mu      sync.Mutex
		arrived []string // "<party> <session>"
	)
	id := regexp.MustCompile(`"id":(\d+)`)
	var routes []*route
	for _, p := range parties {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			m := id.FindSubmatch(body)
			if m == nil {
				http.Error(w, "no id", http.StatusBadRequest)
				return
			}
			mu.Lock()
			arrived = append(arrived, p+" "+req.Header.Get("Mcp-Session-Id"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"hello"}]}}`, m[1])
		}))
		t.Cleanup(srv.Close)
		r := &route{party: p, kind: "sse", url: srv.URL + "/mcp", sessions: sessions, client: newClient(time.Minute)}
		t.Cleanup(r.client.CloseIdleConnections)
		routes = append(routes, r)
	}
	return routes, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(arrived)
	}
}

// The calls of a run in turns go to the routes in turn, call i to route
// i mod n, each route taking its own sessions in turn, and each route's
// result counts its own calls only.
func TestOpenLoopTurns(t *testing.T) {
	order := []string{caddy, direct, toolgate}
	sessions := []string{"s0", "s1", "s2"}
	routes, arrived := startEchoRoutes(t, order, sessions)
	// 30 calls 50 ms apart: far enough apart for them to arrive in order
	// on a loaded machine.
	res := openLoopTurns(context.Background(), routes, smallCall, 20, 1500*time.Millisecond)
	if len(res) != len(routes) {
		t.Fatalf("%d results for %d routes", len(res), len(routes))
	}
	for k, r := range res {
		if r.Calls != 10 || r.Errors != 0 || len(r.latencies) != 10 {
			t.Fatalf("%s: %d calls, %d errors (%s), %d latencies; want 10 calls, no error",
				order[k], r.Calls, r.Errors, r.FirstError, len(r.latencies))
		}
		if len(r.Timeline) != 2 || r.Timeline[0] <= 0 || r.Timeline[1] <= 0 {
			t.Errorf("%s: timeline %v, want the slowest call of each of the run's 2 seconds", order[k], r.Timeline)
		}
		if !slices.IsSorted(r.latencies) || r.latencies[0] <= 0 {
			t.Errorf("%s: latencies %v", order[k], r.latencies)
		}
	}
	got := arrived()
	if len(got) != 30 {
		t.Fatalf("%d calls arrived, want 30", len(got))
	}
	for i, a := range got {
		// Call i is route i mod 3's call i/3, on its session (i/3) mod 3.
		if want := order[i%3] + " " + sessions[i/3%3]; a != want {
			t.Fatalf("call %d reached %q, want %q; all: %q", i, a, want, got)
		}
	}
}

// The first n calls in turns are shared out as evenly as they can be,
// the earlier routes in the order taking the rest.
func TestTurnsOf(t *testing.T) {
	for _, tc := range []struct {
		n, routes int
		want      []int
	}{
		{10, 3, []int{4, 3, 3}},
		{30, 3, []int{10, 10, 10}},
		{2, 3, []int{1, 1, 0}},
		{0, 4, []int{0, 0, 0, 0}},
		{7, 1, []int{7}},
	} {
		var got []int
		for k := range tc.routes {
			got = append(got, turnsOf(tc.n, tc.routes, k))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("turnsOf(%d, %d, k) = %v, want %v", tc.n, tc.routes, got, tc.want)
		}
	}
}

// Every round's turns take each party once, and over two rounds each
// party's calls follow each other party's.
func TestInTurns(t *testing.T) {
	follows := map[[2]string]bool{} // {party, the party whose call came before}
	for round := 1; round <= 2; round++ {
		order := inTurns(round)
		if len(order) != len(parties) {
			t.Fatalf("round %d takes turns %q", round, order)
		}
		for _, p := range parties {
			if !slices.Contains(order, p) {
				t.Fatalf("round %d takes turns %q, without %s", round, order, p)
			}
		}
		for i, p := range order {
			follows[[2]string{p, order[(i+len(order)-1)%len(order)]}] = true
		}
	}
	for _, p := range parties {
		for _, q := range parties {
			if p != q && !follows[[2]string{p, q}] {
				t.Errorf("%s's calls never follow %s's in rounds 1 and 2 (%q, %q)", p, q, inTurns(1), inTurns(2))
			}
		}
	}
}

// In a run in turns, a proxy's CPU is per call of its own, another proxy
// of the run is left out, and the upstream, the generator and a proxy not
// in the run are per call of all routes; a run of one route divides
// everything by its calls, as before runs in turns.
func TestCPUPerCall(t *testing.T) {
	cpu0 := map[string]float64{"upstream-sse": 10, caddy: 1, toolgate: 2, baseline: 3, "generator": 4}
	cpu1 := map[string]float64{"upstream-sse": 11.5, caddy: 1.1, toolgate: 2.4, baseline: 3.06, "generator": 4.3}
	turns := []string{direct, caddy, toolgate}
	calls := []int{10, 10, 10}
	for k, want := range []map[string]float64{
		{"upstream-sse": 50, baseline: 2, "generator": 10},
		{"upstream-sse": 50, baseline: 2, "generator": 10, caddy: 10},
		{"upstream-sse": 50, baseline: 2, "generator": 10, toolgate: 40},
	} {
		if got := cpuPerCall(cpu0, cpu1, turns, k, calls); !closeMaps(got, want) {
			t.Errorf("%s: %v, want %v", turns[k], got, want)
		}
	}
	want := map[string]float64{"upstream-sse": 15, caddy: 1, toolgate: 4, baseline: 0.6, "generator": 3}
	if got := cpuPerCall(cpu0, cpu1, []string{toolgate}, 0, []int{100}); !closeMaps(got, want) {
		t.Errorf("one route: %v, want %v", got, want)
	}
}

func closeMaps(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || v-w > 1e-9 || w-v > 1e-9 {
			return false
		}
	}
	return true
}

// samples draws rounds × n latencies in ms around median (normal, with
// the given spread), each round shifted by shift ms more than the one
// before, as the machine may differ from round to round; each round's
// sorted, as runs keep them.
func samples(rng *rand.Rand, rounds, n int, median, sd, shift float64) [][]float64 {
	out := make([][]float64, rounds)
	for r := range out {
		for range n {
			out[r] = append(out[r], median+float64(r)*shift+sd*rng.NormFloat64())
		}
		slices.Sort(out[r])
	}
	return out
}

// The bootstrap interval of the difference of two p50 holds the true
// difference, is narrower than the noise, and is the same for the same
// samples and seed.
func TestP50Difference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	// Latencies like the 1 MiB result's: 40 ms, a spread of 10 ms,
	// rounds 5 ms apart; toolgate 3 ms slower than Caddy.
	caddyMs := samples(rng, 3, 200, 40, 10, 5)
	toolgateMs := samples(rng, 3, 200, 43, 10, 5)
	d, ok := p50Difference(toolgateMs, caddyMs, bootstrapResamples, bootstrapSeed)
	if !ok {
		t.Fatal("no difference")
	}
	t.Logf("toolgate − caddy: %+.2f, 95 %% interval %+.2f to %+.2f", d.Point, d.Low, d.High)
	if !(d.Low <= d.Point && d.Point <= d.High) {
		t.Fatalf("%+v: the point estimate is outside its interval", d)
	}
	if !(d.Low < 3 && 3 < d.High) || d.Low <= 0 || d.High-d.Low > 5 {
		t.Fatalf("%+v: want an interval holding the true difference, 3 ms, not 0, and narrower than 5 ms", d)
	}
	if again, _ := p50Difference(toolgateMs, caddyMs, bootstrapResamples, bootstrapSeed); again != d {
		t.Fatalf("the same samples and seed gave %+v, then %+v", d, again)
	}
	// The other way round, the difference and its interval change sign.
	if r, _ := p50Difference(caddyMs, toolgateMs, bootstrapResamples, bootstrapSeed); !(r.Point == -d.Point && r.High < 0 && r.Low < -3 && -3 < r.High) {
		t.Fatalf("caddy − toolgate: %+v (toolgate − caddy: %+v)", r, d)
	}
	if _, ok := p50Difference(toolgateMs, [][]float64{nil, nil, nil}, bootstrapResamples, bootstrapSeed); ok {
		t.Fatal("a difference from no latencies")
	}
}

// Over many samples, the 95 % interval holds the true difference nearly
// always (a check of the method, not of one draw).
func TestP50DifferenceCoverage(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	const trials, truth = 60, 2.0
	held := 0
	for range trials {
		a := samples(rng, 2, 50, 40+truth, 10, 8)
		b := samples(rng, 2, 50, 40, 10, 8)
		d, _ := p50Difference(a, b, 1000, bootstrapSeed)
		if d.Low <= truth && truth <= d.High {
			held++
		}
	}
	t.Logf("held in %d of %d trials", held, trials)
	// Expected 57 of 60; fewer than 51 (85 %) means the interval is too
	// narrow (or off center).
	if held < 51 {
		t.Fatalf("the interval held the true difference in %d of %d trials", held, trials)
	}
}

// turnRuns makes one round of a run in turns of the 1 MiB result: each
// party's latencies are base + its offset.
func turnRuns(round int, base []float64, offsets map[string]float64) []run {
	var out []run
	for _, p := range inTurns(round) {
		var l []float64
		for _, v := range base {
			l = append(l, v+offsets[p])
		}
		slices.Sort(l)
		out = append(out, run{Phase: "rounds", Round: round, Kind: "sse", Call: bigCall.name, Rate: 10, Party: p,
			Calls: len(l), P50: percentile(l, 0.5), P90: percentile(l, 0.9), P99: percentile(l, 0.99), Max: l[len(l)-1],
			CPU: map[string]float64{p: 1, "upstream-sse": 40}, Turns: inTurns(round), Latencies: l})
	}
	return out
}

// The report gives the 1 MiB result's differences with their intervals,
// in its table and the budget's row, judged on the point estimate.
func TestReportTurns(t *testing.T) {
	res := &results{Date: time.Unix(0, 0).UTC(), Options: options{Rounds: 2, Duration: 5 * time.Second, Kinds: []string{"sse"}, BigRate: 10}}
	base := []float64{44.9, 44.95, 45, 45.05, 45.1, 44.98, 45.02, 45, 45.01, 44.99}
	res.Runs = append(res.Runs, turnRuns(1, base, map[string]float64{direct: 0, caddy: 0.5, toolgate: 2})...)
	res.Runs = append(res.Runs, turnRuns(2, base, map[string]float64{direct: 0.1, caddy: 0.6, toolgate: 2.2})...)
	var b bytes.Buffer
	report(&b, res)
	out := b.String()
	// Pooled p50 (the 10th of 20): Caddy 45.55 (round 2's 45.05 + 0.5),
	// toolgate 47.10 (round 1's 45.1 + 2 and round 2's 44.9 + 2.2): +1.55;
	// per round (the 5th of 10, 45.0) +1.50 and +1.60.
	for _, want := range []string{
		"### upstream answering over SSE, tools/call with a 1 MiB result, 10 calls/s in all, the routes taking turns",
		"| toolgate − plain Caddy | +1.55 | +1.",
		" | +1.55 [+1.50–+1.60] | ",
		"call i went to route i mod 3 (direct, plain Caddy, toolgate in the first round;",
		"10 calls/s in all, 3.33 per route, for 3 × 5s",
		"| sse, 1 MiB result at 10/s, the routes taking turns: toolgate p50 − plain Caddy p50 (ms), all rounds' calls | +1.55 (95 %: +1.",
		" | ≤ +2 ms | yes |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "baseline") {
		t.Errorf("a run without -baseline reports the baseline:\n%s", out)
	}
}

func TestBigVerdict(t *testing.T) {
	for _, tc := range []struct {
		d    difference
		want string
	}{
		{difference{1, 0.5, 1.5}, "yes"},
		{difference{1.8, 0.9, 2.6}, "yes (the interval reaches past it)"},
		{difference{2.4, 1.5, 3.2}, "**no** (the interval reaches below it)"},
		{difference{3, 2.5, 3.5}, "**no**"},
	} {
		if got := bigVerdict(comparison{p50: tc.d, ok: true}); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.d, got, tc.want)
		}
	}
	if got := bigVerdict(comparison{}); got != "n/a" {
		t.Errorf("no difference: %q", got)
	}
}
