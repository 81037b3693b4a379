package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The budget holds each policy evaluation of a small call to a p99 of
// 50 µs. toolgate measures every evaluation it makes, from the moment the
// call asks for a decision to the decision (for a policy on OPA's own
// evaluator, waiting for a free evaluator goroutine counts), in the histogram toolgate_policy_evaluation_seconds of
// its admin metrics, by stage. A run's evaluations are the difference of
// the histogram before and after it. The histogram has a bucket bound at
// 50 µs, so whether the p99 is within the budget is exact; the p99 itself
// is known only as the bucket it falls in, reported as that bucket's upper
// bound.

// policyMetric is the histogram's name in the metrics text.
const policyMetric = "toolgate_policy_evaluation_seconds"

// budgetPolicySeconds is the budget of one evaluation's p99.
const budgetPolicySeconds = 50e-6

// histogram is one stage's cumulative bucket counts, by upper bound in
// seconds (+Inf last), and its total count.
type histogram struct {
	Bounds []float64
	Counts []float64
	Count  float64
}

// readPolicyHistograms reads the policy evaluation histograms, by stage,
// from the admin endpoint's /metrics.
func readPolicyHistograms(ctx context.Context, client *http.Client, admin string) (map[string]histogram, error) {
	data, err := getBytes(ctx, client, admin+"/metrics", 10*time.Second)
	if err != nil {
		return nil, err
	}
	return parsePolicyHistograms(bytes.NewReader(data))
}

// parsePolicyHistograms reads the histograms from the Prometheus text
// format: lines `<policyMetric>_bucket{stage="request",le="5e-05"} 12` and
// `<policyMetric>_count{stage="request"} 40`.
func parsePolicyHistograms(r io.Reader) (map[string]histogram, error) {
	out := map[string]histogram{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, policyMetric) {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %q: %v", policyMetric, value, err)
		}
		name, labels, _ := strings.Cut(series, "{")
		stage, le := label(labels, "stage"), label(labels, "le")
		if stage == "" {
			continue
		}
		h := out[stage]
		switch name {
		case policyMetric + "_bucket":
			bound, err := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
			if err != nil {
				return nil, fmt.Errorf("%s: bucket bound %q: %v", policyMetric, le, err)
			}
			h.Bounds = append(h.Bounds, bound)
			h.Counts = append(h.Counts, v)
		case policyMetric + "_count":
			h.Count = v
		}
		out[stage] = h
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for stage, h := range out {
		if !slices.IsSorted(h.Bounds) {
			return nil, fmt.Errorf("%s{stage=%q}: buckets out of order", policyMetric, stage)
		}
	}
	return out, nil
}

// label returns the value of the label name in `a="x",b="y"}`.
func label(labels, name string) string {
	for part := range strings.SplitSeq(strings.TrimSuffix(labels, "}"), ",") {
		k, v, ok := strings.Cut(part, "=")
		if ok && k == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// policyLatency is what one run's evaluations of one stage were: how many,
// the share within the budget, and the upper bound of the bucket holding
// their p99. (-1 stands for what JSON cannot hold: no bucket bound at the
// budget, a p99 over the last finite bound.)
type policyLatency struct {
	Evaluations float64
	Within      float64 // share of evaluations within budgetPolicySeconds, or -1
	P50Bound    float64 // seconds, or -1
	P99Bound    float64 // seconds, or -1
}

// since is what happened between the histograms before and h: nothing
// (ok false) when no evaluation of the stage was made, or when the buckets
// changed (a reload between the readings).
func (h histogram) since(before histogram) (policyLatency, bool) {
	n := h.Count - before.Count
	if n <= 0 || len(before.Bounds) > 0 && !slices.Equal(h.Bounds, before.Bounds) {
		return policyLatency{}, false
	}
	delta := func(i int) float64 {
		if len(before.Counts) == 0 {
			return h.Counts[i]
		}
		return h.Counts[i] - before.Counts[i]
	}
	l := policyLatency{Evaluations: n, Within: -1, P50Bound: -1, P99Bound: -1}
	for i, bound := range h.Bounds {
		share := delta(i) / n
		if bound == budgetPolicySeconds {
			l.Within = share
		}
		if math.IsInf(bound, 1) {
			break
		}
		if l.P50Bound < 0 && share >= 0.5 {
			l.P50Bound = bound
		}
		if l.P99Bound < 0 && share >= 0.99 {
			l.P99Bound = bound
		}
	}
	return l, true
}
