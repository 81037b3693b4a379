package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricsText is the request stage's policy histogram, with the given
// cumulative bucket counts, as Caddy's admin /metrics writes it among
// other series.
func metricsText(counts [12]float64) string {
	bounds := []string{"5e-06", "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.005", "0.025", "0.1", "+Inf"}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	var b strings.Builder
	b.WriteString("# HELP toolgate_policy_evaluation_seconds Time to evaluate a policy decision.\n")
	b.WriteString("# TYPE toolgate_policy_evaluation_seconds histogram\n")
	for i, le := range bounds {
		b.WriteString(`toolgate_policy_evaluation_seconds_bucket{stage="request",le="` + le + `"} ` + f(counts[i]) + "\n")
	}
	b.WriteString(`toolgate_policy_evaluation_seconds_sum{stage="request"} 0.5` + "\n")
	b.WriteString(`toolgate_policy_evaluation_seconds_count{stage="request"} ` + f(counts[11]) + "\n")
	b.WriteString(`toolgate_policy_decisions_total{action="allow",service="sse",stage="request"} 7` + "\n")
	b.WriteString("go_goroutines 42\n")
	return b.String()
}

// A run's evaluations are the difference of the histograms around it: the
// share within 50 µs is exact, the p99 is the bound of its bucket.
func TestPolicyLatencyOfARun(t *testing.T) {
	before, err := parsePolicyHistograms(strings.NewReader(metricsText([12]float64{0, 10, 50, 90, 100, 100, 100, 100, 100, 100, 100, 100})))
	if err != nil {
		t.Fatal(err)
	}
	// 1,000 evaluations: 970 within 50 µs, 995 within 100 µs, 5 slower.
	after, err := parsePolicyHistograms(strings.NewReader(metricsText([12]float64{0, 10, 550, 1060, 1095, 1097, 1100, 1100, 1100, 1100, 1100, 1100})))
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != 1 || len(after["request"].Bounds) != 12 {
		t.Fatalf("parsed %+v", after)
	}
	l, ok := after["request"].since(before["request"])
	if !ok || l.Evaluations != 1000 || l.Within != 0.97 || l.P50Bound != 25e-6 || l.P99Bound != 100e-6 {
		t.Fatalf("since = %+v, %v; want 1000 evaluations, 0.97 within, p50 ≤ 25 µs, p99 ≤ 100 µs", l, ok)
	}
	// A p99 in the +Inf bucket has no bound; no evaluation, no figure.
	slow, _ := parsePolicyHistograms(strings.NewReader(metricsText([12]float64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 90, 100})))
	if l, ok := slow["request"].since(histogram{}); !ok || l.P99Bound != -1 || l.Within != 0 {
		t.Fatalf("slow: %+v, %v", l, ok)
	}
	if _, ok := after["request"].since(after["request"]); ok {
		t.Fatal("a run without evaluations gave a figure")
	}
}

func TestPolicyHistogramsRefuseGarbage(t *testing.T) {
	for _, text := range []string{
		`toolgate_policy_evaluation_seconds_bucket{stage="request",le="x"} 1`,
		`toolgate_policy_evaluation_seconds_count{stage="request"} many`,
		"toolgate_policy_evaluation_seconds_bucket{stage=\"request\",le=\"0.1\"} 1\ntoolgate_policy_evaluation_seconds_bucket{stage=\"request\",le=\"0.01\"} 1",
	} {
		if _, err := parsePolicyHistograms(strings.NewReader(text)); err == nil {
			t.Errorf("%q: no error", text)
		}
	}
}

// The report holds the budget's policy rows at 400/s: met when at least
// 99 % of the evaluations took at most 50 µs.
func TestPolicyBudgetRows(t *testing.T) {
	res := &results{Date: time.Unix(0, 0).UTC(), Options: options{Rounds: 2, Duration: time.Second, Kinds: []string{"sse"}, Rates: []int{400}}}
	res.Runs = append(res.Runs, round(1, 400, [3]float64{0.5, 1, 1.1}, [3]float64{2, 4, 4.4}, [3]float64{0, 0.5, 0.6}, 0)...)
	res.Runs = append(res.Runs, round(2, 400, [3]float64{0.5, 1, 1.1}, [3]float64{2, 4, 4.4}, [3]float64{0, 0.5, 0.6}, 0)...)
	for i := range res.Runs {
		if res.Runs[i].Party == toolgate {
			res.Runs[i].Policy = map[string]policyLatency{
				"request": {Evaluations: 4000, Within: 0.995, P99Bound: 50e-6},
				"result":  {Evaluations: 4000, Within: 0.9 + 0.05*float64(res.Runs[i].Round-1), P99Bound: -1},
			}
		}
	}
	var b bytes.Buffer
	report(&b, res)
	for _, want := range []string{
		"| sse, 400/s: request policy evaluations within 50 µs, % | 99.5 [99.5–99.5] (p99 ≤ 50 [50–50] µs) | ≥ 99, i.e. p99 ≤ 50 µs | yes |",
		"| sse, 400/s: result policy evaluations within 50 µs, % | 92.5 [90.0–95.0] (p99 beyond the last bucket) | ≥ 99, i.e. p99 ≤ 50 µs | **no** |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
}
