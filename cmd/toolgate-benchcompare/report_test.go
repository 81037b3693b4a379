package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// round makes the three runs of one round at one rate: direct, Caddy and
// toolgate with the given p50, p99 and proxy CPU (ms per call).
func round(n, rate int, p50, p99, cpu [3]float64, gwErrors int) []run {
	var out []run
	for i, p := range parties {
		r := run{Phase: "rounds", Round: n, Kind: "sse", Call: smallCall.name, Rate: rate, Party: p, Calls: 1000,
			P50: p50[i], P99: p99[i], Max: p99[i], CPU: map[string]float64{p: cpu[i], "upstream-sse": 0.3}}
		if p == toolgate {
			r.Errors = gwErrors
		}
		out = append(out, r)
	}
	return out
}

func TestBudgetRatios(t *testing.T) {
	res := &results{Date: time.Unix(0, 0).UTC(), Options: options{Rounds: 2, Duration: time.Second, Kinds: []string{"sse"}, Rates: []int{400, 1000}}}
	// At 400/s Caddy adds 0.5 ms at p50 and 2 ms at p99; toolgate adds
	// 0.6 and 2.4 (ratios 1.2), then 0.65 and 3 (1.3, 1.5). CPU 1.2× and
	// 1.3×.
	res.Runs = append(res.Runs, round(1, 400, [3]float64{0.5, 1, 1.1}, [3]float64{2, 4, 4.4}, [3]float64{0, 0.5, 0.6}, 0)...)
	res.Runs = append(res.Runs, round(2, 400, [3]float64{0.5, 1, 1.15}, [3]float64{2, 4, 5}, [3]float64{0, 0.5, 0.65}, 0)...)
	// At 1,000/s: p99 ratios 3 and 1, one error, CPU 2×.
	res.Runs = append(res.Runs, round(1, 1000, [3]float64{0.5, 1, 2}, [3]float64{5, 10, 20}, [3]float64{0, 0.5, 1}, 1)...)
	res.Runs = append(res.Runs, round(2, 1000, [3]float64{0.5, 1, 2}, [3]float64{5, 10, 10}, [3]float64{0, 0.5, 1}, 0)...)
	var b bytes.Buffer
	report(&b, res)
	out := b.String()
	for _, want := range []string{
		"| sse, 400/s: added p50, toolgate ÷ Caddy | 1.25 [1.20–1.30] | ≤ 1.3 | yes |",
		"| sse, 400/s: added p99, toolgate ÷ Caddy | 1.35 [1.20–1.50] | ≤ 1.3 | **no** |",
		"| sse, 400/s: CPU per call, toolgate ÷ Caddy | 1.25 [1.20–1.30] | ≤ 1.3 | yes |",
		"| sse, 1000/s: toolgate errors | 1 | 0 | **no** |",
		"| sse, 1000/s: added p99, toolgate ÷ Caddy | 2.00 [1.00–3.00] | ≤ 2 | yes |",
		"| sse, 1000/s: CPU per call, toolgate ÷ Caddy | 2.00 [2.00–2.00] | ≤ 1.3 | **no** |",
		"| toolgate | 2.00 [2.00–2.00] | ",
		"| 1 of 2000 | 1.000 [1.000–1.000] |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
}

// A round in which Caddy added nothing measurable gives no ratio rather
// than a division by zero or a negative one.
func TestAddedRatioWithoutCaddyOverhead(t *testing.T) {
	rd := map[string]run{direct: {P50: 1}, caddy: {P50: 0.9}, toolgate: {P50: 1.5}}
	if v, ok := addedRatio(rd, func(r run) float64 { return r.P50 }); ok {
		t.Fatalf("a ratio of %v", v)
	}
}

func TestSpreadAndMedian(t *testing.T) {
	if got := spread([]float64{3, 1, 2}, "%.1f"); got != "2.0 [1.0–3.0]" {
		t.Errorf("spread = %q", got)
	}
	if got := spread([]float64{4}, "%.1f"); got != "4.0" {
		t.Errorf("spread of one = %q", got)
	}
	if got := spread(nil, "%.1f"); got != "n/a" {
		t.Errorf("spread of none = %q", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median = %v", got)
	}
}

func TestParseOptions(t *testing.T) {
	bin := t.TempDir() + "/toolgate"
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	o, err := parseOptions([]string{"-toolgate", bin, "-rates", "400, 1000", "-upstreams", "json"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Rates) != 2 || o.Rates[1] != 1000 || len(o.Kinds) != 1 || o.Kinds[0] != "json" || o.Rounds != 3 {
		t.Fatalf("options %+v", o)
	}
	for _, bad := range [][]string{
		{"-rates", "0"}, {"-rates", "400,x"}, {"-upstreams", "grpc"}, {"-upstreams", "sse,sse"},
		{"-rounds", "0"}, {"-duration", "10ms"}, {"-idle-sessions", "-1"}, {"extra"},
	} {
		if _, err := parseOptions(append([]string{"-toolgate", bin}, bad...)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
	if _, err := parseOptions([]string{"-toolgate", bin + "-missing"}); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("a missing binary: %v", err)
	}
}

// Every round runs each party once, no party runs first in two rounds in
// a row, each runs first in turn, and over a full cycle of rounds (n for
// an even number of parties, 2n for an odd one) every party runs right
// after every other one equally often — with and without a baseline.
func TestInRoundBalances(t *testing.T) {
	defer func(p []string) { parties = p }(parties)
	for _, ps := range [][]string{{direct, caddy, toolgate}, {direct, caddy, toolgate, baseline}} {
		parties = ps
		n := len(ps)
		cycle := n
		if n%2 == 1 {
			cycle = 2 * n
		}
		seen := map[string]bool{}
		follows := map[[2]string]int{}
		for round := 1; round <= cycle+1; round++ {
			order := inRound(round)
			if len(order) != n {
				t.Fatalf("%d parties, round %d runs %q", n, round, order)
			}
			for _, p := range ps {
				if !slices.Contains(order, p) {
					t.Fatalf("%d parties, round %d runs %q, without %s", n, round, order, p)
				}
			}
			if round > 1 && order[0] == inRound(round - 1)[0] {
				t.Errorf("%d parties: rounds %d and %d both start with %s", n, round-1, round, order[0])
			}
			if round > cycle {
				if !slices.Equal(order, inRound(1)) {
					t.Errorf("%d parties: round %d runs %q, not round 1's %q: the cycle is not %d rounds", n, round, order, inRound(1), cycle)
				}
				continue
			}
			seen[order[0]] = true
			for i := 1; i < n; i++ {
				follows[[2]string{order[i-1], order[i]}]++
			}
		}
		if len(seen) != n {
			t.Errorf("%d parties: only %v start a round", n, seen)
		}
		for _, a := range ps {
			for _, b := range ps {
				if a != b && follows[[2]string{a, b}] != cycle/n {
					t.Errorf("%d parties: %s runs right after %s %d times in %d rounds, want %d: %v", n, b, a, follows[[2]string{a, b}], cycle, cycle/n, follows)
				}
			}
		}
	}
}

// TestMachineNoise: the floor is four windows of computation, each timed
// noiseRuns times, and the report prints one row per window.
func TestMachineNoise(t *testing.T) {
	windows := machineNoise()
	if len(windows) != 4 {
		t.Fatalf("%d windows", len(windows))
	}
	for _, n := range windows {
		if n.P50 <= 0 || n.P99 < n.P50 || n.Over50 < 0 || n.Over50 > 1 {
			t.Fatalf("window %+v", n)
		}
	}
	var out bytes.Buffer
	report(&out, &results{Noise: []noiseWindow{{P50: 4.9, P99: 6, Over50: 0.0005}, {P50: 14.8, P99: 55.2, Over50: 0.018}}})
	for _, want := range []string{"| 4.9 µs | 6.0 µs | 0.05 % |", "| 14.8 µs | 55.2 µs | 1.80 % |"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("the report has no row %q:\n%s", want, out.String())
		}
	}
}

// TestFloorProbe: the probe times computations of floorProbeUs at
// floorProbeRate for its duration and writes them as one window, which
// the report sets beside the policy rows, for toolgate's and plain
// Caddy's runs.
func TestFloorProbe(t *testing.T) {
	if err := runFloorProbe([]string{"nonsense"}, io.Discard); err == nil {
		t.Fatal("a probe without a duration ran")
	}
	var out bytes.Buffer
	if err := runFloorProbe([]string{"100ms"}, &out); err != nil {
		t.Fatal(err)
	}
	var w noiseWindow
	if err := json.Unmarshal(out.Bytes(), &w); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if w.Runs == 0 || w.P50 <= 0 || w.P99 < w.P50 || w.Over50 < 0 || w.Over50 > 1 {
		t.Fatalf("window %+v", w)
	}
	runs := []run{
		{Round: 1, Party: toolgate, Floor: &noiseWindow{Over50: 0.08}},
		{Round: 2, Party: toolgate, Floor: &noiseWindow{Over50: 0.06}},
		{Round: 1, Party: caddy, Floor: &noiseWindow{Over50: 0.02}},
		{Round: 1, Party: direct, Floor: &noiseWindow{Over50: 0.5}},
	}
	var report bytes.Buffer
	floorRow(&report, "sse, 400/s", runs)
	if want := "| sse, 400/s: the machine during the runs: 15 µs computations, 800 a second, within 50 µs, % (under toolgate's load; plain Caddy's) | 93.0 [92.0–94.0]; 98.0 | — |  |"; !strings.Contains(report.String(), want) {
		t.Fatalf("got %q, want %q", report.String(), want)
	}
}
