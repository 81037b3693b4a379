package main

import (
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The budget of DESIGN.md "Performance budget", as ratios against the
// plain proxy measured in the same run.
const (
	budgetRate      = 400 // calls/s at which added p50 and p99 are held to budgetAdded
	budgetAdded     = 1.3 // toolgate's added latency ÷ Caddy's, at budgetRate
	budgetHighRate  = 1000
	budgetHighAdded = 2.0  // toolgate's added p99 ÷ Caddy's at budgetHighRate, with no errors
	budgetCPU       = 1.3  // toolgate's CPU per call ÷ Caddy's
	budgetBigMs     = 2.0  // a 1 MiB result: toolgate's p50 − Caddy's, ms
	budgetIdleKiB   = 16.0 // toolgate's memory per idle MCP session
)

var partyLabels = map[string]string{direct: "direct", caddy: "plain Caddy", toolgate: "toolgate", baseline: "toolgate (baseline)"}

var kindLabels = map[string]string{"sse": "upstream answering over SSE", "json": "upstream answering with JSON"}

// report prints the run's tables in Markdown: per upstream kind and load,
// the latency, errors, CPU and allocations of each route (median of the
// rounds, with their range), then the budget ratios, then the idle-session
// measure.
func report(w io.Writer, res *results) {
	o := res.Options
	fmt.Fprintf(w, "\n## toolgate-benchcompare, %s\n\n", res.Date.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "Machine: %s, %s; load average %s at the start, %s at the end, 1-minute load %s over the runs. Revision %s.\n",
		res.Machine, res.GoVersion, res.LoadBefore, res.LoadAfter, loadRange(res.Runs), res.Revision)
	fmt.Fprintf(w, "%d rounds of %s runs, interleaved (each load of small calls runs direct, plain Caddy and toolgate in each round, in an order that changes from round to round, so that every route runs right after every other one equally often over a full cycle of rounds; the 1 MiB result's calls take turns across them in one run), open loop; "+
		"%d MCP session(s) per route; toolgate audit log %s, console %s. Cells: median of the rounds [min–max]; "+
		"latency in ms from each call's scheduled start; CPU in ms per call (utime+stime); allocations are the proxy's own, per call; "+
		"late start is the most the generator started a call after its schedule (ms, worst round).\n",
		o.Rounds, o.Duration, o.MCPSessions, onOff(o.AuditLog), onOff(o.Console))

	rounds := filterRuns(res.Runs, func(r run) bool { return r.Phase == "rounds" })
	for _, kind := range o.Kinds {
		loads := loadsOf(rounds, kind)
		for _, l := range loads {
			runs := filterRuns(rounds, func(r run) bool { return r.Kind == kind && r.Call == l.call && r.Rate == l.rate })
			turns := len(runs[0].Turns)
			if turns == 0 {
				fmt.Fprintf(w, "\n### %s, %s, %d calls/s\n\n", kindLabels[kind], callLabel(l.call), l.rate)
				latencyTable(w, runs)
				continue
			}
			fmt.Fprintf(w, "\n### %s, %s, %d calls/s in all, the routes taking turns\n\n", kindLabels[kind], callLabel(l.call), l.rate)
			latencyTable(w, runs)
			turnsTable(w, runs, o.Duration)
		}
	}

	fmt.Fprintf(w, "\n### Budget (DESIGN.md), computed per round, median [min–max]\n\n")
	fmt.Fprintln(w, "| measure | value | budget | met |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, kind := range o.Kinds {
		for _, rate := range o.Rates {
			budgetRows(w, kind, rate, filterRuns(rounds, func(r run) bool { return r.Kind == kind && r.Call == smallCall.name && r.Rate == rate }))
		}
		bigRows(w, kind, filterRuns(rounds, func(r run) bool { return r.Kind == kind && r.Call == bigCall.name }))
	}
	if res.Idle != nil {
		i := res.Idle
		row(w, fmt.Sprintf("memory per idle MCP session, toolgate heap + stacks (%d sessions)", i.Sessions),
			fmt.Sprintf("%.1f KiB", i.KiBLive), "≤ 16 KiB", verdict(i.KiBLive <= budgetIdleKiB))
	}

	noiseTable(w, res.Noise)

	if res.Idle != nil {
		i := res.Idle
		fmt.Fprintf(w, "\n### %d idle MCP sessions through toolgate (%s)\n\n", i.Sessions, kindLabels[i.UpstreamKind])
		fmt.Fprintf(w, "Opened in %.1f s. toolgate, after a full collection: heap + goroutine stacks %s → %s (%.1f KiB per session), "+
			"goroutines %d → %d (%.2f per session), RSS %s → %s (%.1f KiB per session; RSS also moves with memory the Go runtime "+
			"returns to the system after the load rounds). The upstream's RSS %s → %s (%.1f KiB per session).\n\n",
			i.OpenSeconds, mib(int64(i.Before.live())), mib(int64(i.After.live())), i.KiBLive,
			i.Before.Goroutines, i.After.Goroutines, i.Goroutines, mib(i.Before.RSS), mib(i.After.RSS), i.KiBRSS,
			mib(i.Before.UpstreamRSS), mib(i.After.UpstreamRSS), i.UpstreamKiB)
		fmt.Fprintf(w, "Small calls while they are open (one run each):\n\n")
		latencyTable(w, i.Runs)
	}
}

// load is one (call, rate) pair of the runs.
type load struct {
	call string
	rate int
}

func loadsOf(runs []run, kind string) []load {
	var out []load
	for _, r := range runs {
		l := load{r.Call, r.Rate}
		if r.Kind == kind && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

func callLabel(name string) string {
	if name == bigCall.name {
		return "tools/call with a 1 MiB result"
	}
	return "small tools/call"
}

// latencyTable prints one row per party of runs (one load, several rounds).
func latencyTable(w io.Writer, runs []run) {
	fmt.Fprintln(w, "| route | p50 | p90 | p99 | max | errors | proxy CPU | upstream CPU | allocs | KiB alloc | late start |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, p := range parties {
		rs := filterRuns(runs, func(r run) bool { return r.Party == p })
		if len(rs) == 0 {
			continue
		}
		get := func(f func(run) float64) []float64 {
			var v []float64
			for _, r := range rs {
				v = append(v, f(r))
			}
			return v
		}
		errors, calls := 0, 0
		for _, r := range rs {
			errors += r.Errors
			calls += r.Calls
		}
		upstream := "upstream-" + rs[0].Kind
		proxyCPU, allocs, kib := "—", "—", "—"
		if p != direct {
			proxyCPU = spread(get(func(r run) float64 { return r.CPU[p] }), "%.3f")
			allocs = spread(get(func(r run) float64 { return r.Allocs }), "%.0f")
			kib = spread(get(func(r run) float64 { return r.AllocKiB }), "%.1f")
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d of %d | %s | %s | %s | %s | %.1f |\n", partyLabels[p],
			spread(get(func(r run) float64 { return r.P50 }), "%.2f"),
			spread(get(func(r run) float64 { return r.P90 }), "%.2f"),
			spread(get(func(r run) float64 { return r.P99 }), "%.2f"),
			spread(get(func(r run) float64 { return r.Max }), "%.1f"),
			errors, calls, proxyCPU,
			spread(get(func(r run) float64 { return r.CPU[upstream] }), "%.3f"),
			allocs, kib, slices.Max(get(func(r run) float64 { return r.MaxLag })))
	}
}

// byRound pairs the three parties' runs of each round.
func byRound(runs []run) map[int]map[string]run {
	out := map[int]map[string]run{}
	for _, r := range runs {
		if out[r.Round] == nil {
			out[r.Round] = map[string]run{}
		}
		out[r.Round][r.Party] = r
	}
	return out
}

// addedRatio is toolgate's added latency over Caddy's in one round, by the
// percentile pick chooses; false when Caddy added nothing measurable.
func addedRatio(rd map[string]run, pick func(run) float64) (float64, bool) {
	d, p, g := pick(rd[direct]), pick(rd[caddy]), pick(rd[toolgate])
	if p-d <= 0 {
		return 0, false
	}
	return (g - d) / (p - d), true
}

// budgetRows prints the ratios of one upstream kind at one rate.
func budgetRows(w io.Writer, kind string, rate int, runs []run) {
	var r50, r99, cpu []float64
	errors := 0
	for _, rd := range byRound(runs) {
		if len(rd) != len(parties) {
			continue
		}
		if v, ok := addedRatio(rd, func(r run) float64 { return r.P50 }); ok {
			r50 = append(r50, v)
		}
		if v, ok := addedRatio(rd, func(r run) float64 { return r.P99 }); ok {
			r99 = append(r99, v)
		}
		if c := rd[caddy].CPU[caddy]; c > 0 {
			cpu = append(cpu, rd[toolgate].CPU[toolgate]/c)
		}
		errors += rd[toolgate].Errors
	}
	label := fmt.Sprintf("%s, %d/s", kind, rate)
	switch rate {
	case budgetRate:
		row(w, label+": added p50, toolgate ÷ Caddy", spread(r50, "%.2f"), "≤ 1.3", verdictMedian(r50, budgetAdded))
		row(w, label+": added p99, toolgate ÷ Caddy", spread(r99, "%.2f"), "≤ 1.3", verdictMedian(r99, budgetAdded))
	case budgetHighRate:
		row(w, label+": toolgate errors", fmt.Sprint(errors), "0", verdict(errors == 0))
		row(w, label+": added p99, toolgate ÷ Caddy", spread(r99, "%.2f"), "≤ 2", verdictMedian(r99, budgetHighAdded))
	default:
		row(w, label+": added p50, toolgate ÷ Caddy", spread(r50, "%.2f"), "—", "")
		row(w, label+": added p99, toolgate ÷ Caddy", spread(r99, "%.2f"), "—", "")
	}
	row(w, label+": CPU per call, toolgate ÷ Caddy", spread(cpu, "%.2f"), "≤ 1.3", verdictMedian(cpu, budgetCPU))
	if rate == budgetRate {
		policyRows(w, label, runs)
		floorRow(w, label, runs)
	}
	baselineRows(w, label, runs)
}

// policyRows prints, for the request and the result stage, the share of
// toolgate's policy evaluations that took at most 50 µs (the p99 is within
// the budget when it is at least 99 %) and the bucket bound of their p99.
func policyRows(w io.Writer, label string, runs []run) {
	for _, stage := range []string{"request", "result"} {
		var within, bound []float64
		over := 0 // rounds whose p99 is beyond the histogram's last finite bound
		for _, r := range runs {
			l, ok := r.Policy[stage]
			if r.Party != toolgate || !ok || l.Within < 0 {
				continue
			}
			within = append(within, 100*l.Within)
			if l.P99Bound < 0 {
				over++
				continue
			}
			bound = append(bound, l.P99Bound*1e6)
		}
		if len(within) == 0 {
			continue
		}
		var p99 string
		switch {
		case over == 0:
			p99 = "p99 ≤ " + spread(bound, "%.0f") + " µs"
		case len(bound) == 0:
			p99 = "p99 beyond the last bucket"
		default:
			p99 = fmt.Sprintf("p99 ≤ %s µs, beyond the last bucket in %d round(s)", spread(bound, "%.0f"), over)
		}
		met := "yes"
		if median(within) < 99 {
			met = "**no**"
		}
		row(w, fmt.Sprintf("%s: %s policy evaluations within 50 µs, %%", label, stage),
			fmt.Sprintf("%s (%s)", spread(within, "%.1f"), p99), "≥ 99, i.e. p99 ≤ 50 µs", met)
	}
}

// floorRow prints what the machine did, during toolgate's and plain
// Caddy's runs, to computations as short and as frequent as toolgate's
// policy evaluations (floorProbeRate): the share within 50 µs that the
// evaluations' own can be held against.
func floorRow(w io.Writer, label string, runs []run) {
	var under map[string][]float64
	for _, r := range runs {
		if r.Floor == nil || r.Party != toolgate && r.Party != caddy {
			continue
		}
		if under == nil {
			under = map[string][]float64{}
		}
		under[r.Party] = append(under[r.Party], 100*(1-r.Floor.Over50))
	}
	if under == nil {
		return
	}
	row(w, fmt.Sprintf("%s: the machine during the runs: %d µs computations, %d a second, within 50 µs, %% (under toolgate's load; plain Caddy's)", label, floorProbeUs, floorProbeRate),
		spread(under[toolgate], "%.1f")+"; "+spread(under[caddy], "%.1f"), "—", "")
}

// baselineRows compares toolgate with the baseline binary (-baseline):
// toolgate's added latency over the baseline's, and CPU per call.
func baselineRows(w io.Writer, label string, runs []run) {
	var r50, r99, cpu []float64
	for _, rd := range byRound(runs) {
		if _, ok := rd[baseline]; !ok || len(rd) != len(parties) {
			continue
		}
		over := func(pick func(run) float64) (float64, bool) {
			d, b, g := pick(rd[direct]), pick(rd[baseline]), pick(rd[toolgate])
			if b-d <= 0 {
				return 0, false
			}
			return (g - d) / (b - d), true
		}
		if v, ok := over(func(r run) float64 { return r.P50 }); ok {
			r50 = append(r50, v)
		}
		if v, ok := over(func(r run) float64 { return r.P99 }); ok {
			r99 = append(r99, v)
		}
		if c := rd[baseline].CPU[baseline]; c > 0 {
			cpu = append(cpu, rd[toolgate].CPU[toolgate]/c)
		}
	}
	if len(cpu) == 0 {
		return
	}
	row(w, label+": added p50, toolgate ÷ baseline", spread(r50, "%.2f"), "—", "")
	row(w, label+": added p99, toolgate ÷ baseline", spread(r99, "%.2f"), "—", "")
	row(w, label+": CPU per call, toolgate ÷ baseline", spread(cpu, "%.2f"), "—", "")
}

// The bootstrap of the differences between parties' p50 in a run in
// turns (the 1 MiB result).
const (
	bootstrapResamples = 2000
	bootstrapSeed      = 1 // fixed, so that the same results give the same report
)

// comparisons are the differences between parties that runs in turns are
// reported by, each the first party's minus the second's; those with the
// baseline only with -baseline.
var comparisons = [][2]string{{toolgate, caddy}, {baseline, caddy}, {toolgate, baseline}}

// A difference is one party's p50 minus another's, of the calls of all
// rounds pooled, in ms, with its 95 % bootstrap interval [Low, High].
type difference struct {
	Point, Low, High float64
}

// p50Difference returns the p50 of a's latencies minus b's, a and b being
// each round's latencies of the two parties (the same rounds, in the same
// order), with a 95 % percentile bootstrap interval: resamples times, each
// round's latencies of each party are drawn again with replacement, as
// many as there were, and the difference of the pooled draws' p50 is
// taken; the interval runs from the 2.5th to the 97.5th percentile of
// these differences. Drawing within each round keeps each round's share
// of the calls, as the machine may differ from round to round. seed fixes
// the draws. false when a party has no latencies.
func p50Difference(a, b [][]float64, resamples int, seed uint64) (difference, bool) {
	pooled := func(rounds [][]float64) []float64 {
		all := slices.Concat(rounds...)
		slices.Sort(all)
		return all
	}
	pa, pb := pooled(a), pooled(b)
	if len(pa) == 0 || len(pb) == 0 {
		return difference{}, false
	}
	d := difference{Point: percentile(pa, 0.5) - percentile(pb, 0.5)}
	rng := rand.New(rand.NewPCG(seed, seed))
	draw := func(rounds [][]float64, into []float64) float64 {
		into = into[:0]
		for _, s := range rounds {
			for range s {
				into = append(into, s[rng.IntN(len(s))])
			}
		}
		slices.Sort(into)
		return percentile(into, 0.5)
	}
	diffs := make([]float64, resamples)
	for i := range diffs {
		diffs[i] = draw(a, pa) - draw(b, pb)
	}
	slices.Sort(diffs)
	d.Low, d.High = percentile(diffs, 0.025), percentile(diffs, 0.975)
	return d, true
}

// comparison is the difference of two parties in the runs of one load.
type comparison struct {
	a, b     string
	p50      difference
	ok       bool      // whether p50 is known: both parties have latencies
	p50Round []float64 // a's p50 − b's in each round
	p99Round []float64 // a's p99 − b's in each round
}

// compare computes the difference of a and b over the rounds in which
// both ran; false when one of them did not run at all.
func compare(runs []run, a, b string) (comparison, bool) {
	c := comparison{a: a, b: b}
	rounds := byRound(runs)
	numbers := slices.Sorted(maps.Keys(rounds)) // in order: the draws depend on it
	var la, lb [][]float64
	for _, n := range numbers {
		ra, okA := rounds[n][a]
		rb, okB := rounds[n][b]
		if !okA || !okB {
			continue
		}
		c.p50Round = append(c.p50Round, ra.P50-rb.P50)
		c.p99Round = append(c.p99Round, ra.P99-rb.P99)
		la, lb = append(la, ra.Latencies), append(lb, rb.Latencies)
	}
	if len(c.p50Round) == 0 {
		return c, false
	}
	c.p50, c.ok = p50Difference(la, lb, bootstrapResamples, bootstrapSeed)
	return c, true
}

// comparisonsOf are the comparisons of runs, of the parties that ran.
func comparisonsOf(runs []run) []comparison {
	var out []comparison
	for _, ab := range comparisons {
		if c, ok := compare(runs, ab[0], ab[1]); ok {
			out = append(out, c)
		}
	}
	return out
}

// formatDifference is the point estimate with its interval beside it.
func formatDifference(c comparison) string {
	if !c.ok {
		return "n/a"
	}
	return fmt.Sprintf("%+.2f (95 %%: %+.2f to %+.2f)", c.p50.Point, c.p50.Low, c.p50.High)
}

// turnsTable prints, under the latency table of a load whose calls took
// turns across the routes, the differences between the routes, and how
// to read them.
func turnsTable(w io.Writer, runs []run, perRoute time.Duration) {
	turns := runs[0].Turns
	labels := make([]string, len(turns))
	for i, p := range turns {
		labels[i] = partyLabels[p]
	}
	fmt.Fprintf(w, "\n| difference, ms | p50, all rounds' calls | 95 %% bootstrap interval | p50, per round | p99, per round |\n")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, c := range comparisonsOf(runs) {
		point, interval := "n/a", "n/a"
		if c.ok {
			point, interval = fmt.Sprintf("%+.2f", c.p50.Point), fmt.Sprintf("%+.2f to %+.2f", c.p50.Low, c.p50.High)
		}
		fmt.Fprintf(w, "| %s − %s | %s | %s | %s | %s |\n", partyLabels[c.a], partyLabels[c.b], point, interval,
			spread(c.p50Round, "%+.2f"), spread(c.p99Round, "%+.2f"))
	}
	rate := runs[0].Rate
	fmt.Fprintf(w, "\nThe routes' calls took turns in one run per round: call i went to route i mod %d (%s in the first round; "+
		"the order of the round's small-call runs, reversed every other round), %d calls/s in all, %.3g per route, for %d × %s, "+
		"so that every route met the upstream, whose own time for such a call varies by several ms, in the same conditions. "+
		"The differences are of all rounds' calls pooled; the interval is a 95 %% bootstrap one (%d resamples of each route's "+
		"latencies, drawn with replacement within each round, with a fixed seed, so the same results.json gives the same interval). "+
		"Read it as where the difference is likely to be: one holding 0 cannot tell the two routes apart, and the budget "+
		"(toolgate − plain Caddy ≤ +2 ms) is held against the point estimate, the interval beside it saying how far from it "+
		"another run may land. Per round are the differences of each round alone, median [min–max]. "+
		"Upstream CPU is the upstream's per call of all routes, the same in every row: /proc tells a process's CPU, not whose "+
		"call it spent it on. Proxy CPU and allocations are each proxy's own (a process of its own that serves only its route), "+
		"per call of its own.\n",
		len(turns), strings.Join(labels, ", "), rate, float64(rate)/float64(len(turns)), len(turns), perRoute,
		bootstrapResamples)
}

// bigRows prints what toolgate adds over Caddy to a 1 MiB result, and,
// with -baseline, what the baseline adds and what toolgate adds over it.
func bigRows(w io.Writer, kind string, runs []run) {
	if len(runs) == 0 {
		return
	}
	label := fmt.Sprintf("%s, 1 MiB result at %d/s, the routes taking turns", kind, runs[0].Rate)
	for _, c := range comparisonsOf(runs) {
		name := fmt.Sprintf("%s: %s p50 − %s p50 (ms), all rounds' calls", label, partyLabels[c.a], partyLabels[c.b])
		if c.a == toolgate && c.b == caddy {
			row(w, name, formatDifference(c), "≤ +2 ms", bigVerdict(c))
			row(w, fmt.Sprintf("%s: toolgate p99 − plain Caddy p99 (ms), per round", label), spread(c.p99Round, "%+.2f"), "—", "")
			continue
		}
		row(w, name, formatDifference(c), "—", "")
	}
}

// bigVerdict holds the point estimate of toolgate's p50 over Caddy's to
// the budget, and says so when the interval reaches across it.
func bigVerdict(c comparison) string {
	d := c.p50
	switch {
	case !c.ok:
		return "n/a"
	case d.Point <= budgetBigMs && d.High > budgetBigMs:
		return "yes (the interval reaches past it)"
	case d.Point <= budgetBigMs:
		return "yes"
	case d.Low <= budgetBigMs:
		return "**no** (the interval reaches below it)"
	default:
		return "**no**"
	}
}

func row(w io.Writer, measure, value, budget, met string) {
	fmt.Fprintf(w, "| %s | %s | %s | %s |\n", measure, value, budget, met)
}

func verdictMedian(v []float64, limit float64) string {
	if len(v) == 0 {
		return "n/a"
	}
	return verdict(median(v) <= limit)
}

func verdict(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// spread formats the median of v and, for more than one value, its range.
func spread(v []float64, format string) string {
	if len(v) == 0 {
		return "n/a"
	}
	s := fmt.Sprintf(format, median(v))
	if len(v) > 1 {
		s += fmt.Sprintf(" ["+format+"–"+format+"]", slices.Min(v), slices.Max(v))
	}
	return s
}

// median is the middle value of v (the mean of the two middle ones for an
// even count).
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func filterRuns(runs []run, keep func(run) bool) []run {
	var out []run
	for _, r := range runs {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// loadRange is the range of the 1-minute load average at the starts of
// runs.
func loadRange(runs []run) string {
	var v []float64
	for _, r := range runs {
		if f := strings.Fields(r.Load); len(f) > 0 {
			if x, err := strconv.ParseFloat(f[0], 64); err == nil {
				v = append(v, x)
			}
		}
	}
	if len(v) == 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f–%.1f", slices.Min(v), slices.Max(v))
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// printProfileTops prints the top functions of toolgate's CPU and
// allocation profiles with `go tool pprof`, when the go command is there;
// the profiles stay in the run's directory for a closer look.
func printProfileTops(w io.Writer, bin string, files []string) {
	if len(files) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### Profiles\n\nSaved: %s. Open one with `go tool pprof -http : %s <file>`.\n", strings.Join(files, ", "), bin)
	gocmd, err := exec.LookPath("go")
	if err != nil {
		return
	}
	for _, f := range files {
		base := filepath.Base(f)
		var args []string
		switch base {
		case "toolgate-cpu.pprof", "toolgate-1MiB-cpu.pprof":
			args = []string{"-top", "-nodecount=25"}
		case "toolgate-allocs.pprof":
			args = []string{"-top", "-nodecount=25", "-sample_index=alloc_space"}
		default:
			continue
		}
		out, err := exec.Command(gocmd, append(append([]string{"tool", "pprof"}, args...), bin, f)...).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "go tool pprof %s: %v\n", f, err)
			continue
		}
		fmt.Fprintf(w, "\n`go tool pprof %s %s`:\n\n```\n%s```\n", strings.Join(args, " "), base, out)
	}
}
