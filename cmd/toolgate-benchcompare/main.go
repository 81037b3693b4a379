// Command toolgate-benchcompare measures toolgate side by side with a plain
// Caddy reverse_proxy, in one run on one machine, against the performance
// budget of DESIGN.md. It is what `make bench-compare` runs.
//
// Every party is its own process, started so that its PID is the server
// itself: a go-sdk MCP upstream per kind (answering over SSE, and one
// answering with JSON bodies), a plain Caddy `reverse_proxy` in front of
// them, and toolgate with the default policies (policies/), an API-key
// caller and a toolgate session. Both proxies are the toolgate binary
// built from this tree (a full Caddy). An open-loop generator in this
// process sends small tools/call messages on a fixed schedule at each rate
// (latency counts from each call's scheduled start, so a stall is never
// hidden), the three routes — direct to the upstream, through Caddy,
// through toolgate — one after another in every round (in an order that
// changes from round to round so that every route follows every other one
// equally often: see inRound), the rounds repeated. For every run it records p50/p90/p99/max latency, errors, the
// CPU seconds per call of each process (utime+stime from /proc/<pid>/stat)
// and the allocations per call of the proxy in the path (the Go runtime's
// memory statistics, from Caddy's admin endpoint).
//
// Then, in the same run: a 1 MiB result at a low rate, in one run per
// round in which the routes' calls take turns (call i goes to route
// i mod n), so that all routes meet the upstream, whose own time for such
// a call varies by several ms, alike; the differences of their p50 come
// with a 95 % bootstrap interval. Then 10,000 idle MCP sessions opened
// through toolgate (resident memory and live heap per session, and the
// latency of calls while they are open); and CPU, allocation and heap
// profiles of both proxies under load. It prints
// Markdown tables with the median of the rounds and their spread, and the
// budget ratios (toolgate's added latency over plain Caddy's, CPU per call
// over plain Caddy's), and keeps everything — results.json, the
// Caddyfiles, each server's output and the profiles — in a new directory
// under -out.
//
// With -baseline, a second toolgate binary (say, built from the commit
// before a change) runs as a fourth party with the same configuration, in
// the same rounds, and the budget table adds its ratios: a before/after
// comparison that the machine's load affects alike.
//
// Usage:
//
//	toolgate-benchcompare [-toolgate bin/toolgate] [-baseline bin/toolgate-before] [-rates 400,1000] [-duration 10s] [-rounds 3] ...
//
// Run it from the repository root (it reads policies/). -h lists every
// option.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "floor-probe" {
		if err := runFloorProbe(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "toolgate-benchcompare floor-probe:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "upstream" {
		if err := runUpstream(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "toolgate-benchcompare upstream:", err)
			os.Exit(1)
		}
		return
	}
	opts, err := parseOptions(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "toolgate-benchcompare:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runBench(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "toolgate-benchcompare:", err)
		os.Exit(1)
	}
}

// options are the command line's settings.
type options struct {
	Toolgate     string        // the toolgate binary, run as both proxies
	Baseline     string        // another toolgate binary, run as a fourth party; "" for none
	Policies     string        // the default policies' directory
	Out          string        // where each run's directory is created
	Rates        []int         // calls per second of the small-call runs
	Duration     time.Duration // of each run
	Rounds       int           // how often every run is repeated
	Warmup       time.Duration // of the unrecorded warm-up per route
	Kinds        []string      // upstream kinds: sse, json
	MCPSessions  int           // MCP sessions per route the calls take in turn
	BigRate      int           // calls per second of the 1 MiB runs, of all routes taking turns; 0 skips them
	IdleSessions int           // idle MCP sessions opened through toolgate; 0 skips
	ProfileRate  int           // calls per second while profiling; 0 skips
	AuditLog     bool          // toolgate writes its audit log
	Console      bool          // toolgate serves the console (and keeps its activity record)
	Credential   bool          // each service carries a header credential
	Timeout      time.Duration // of one call
}

func parseOptions(args []string) (options, error) {
	fs := flag.NewFlagSet("toolgate-benchcompare", flag.ContinueOnError)
	o := options{}
	fs.StringVar(&o.Toolgate, "toolgate", "bin/toolgate", "the toolgate binary built from this tree; it runs both proxies")
	fs.StringVar(&o.Baseline, "baseline", "", "another toolgate binary (say, of the commit before a change), run as a fourth party with toolgate's configuration, for a before/after comparison in one run")
	fs.StringVar(&o.Policies, "policies", "policies", "the directory of the default policies")
	fs.StringVar(&o.Out, "out", ".bench-compare", "each run gets a new directory here (results.json, Caddyfiles, logs, profiles)")
	rates := fs.String("rates", "400,1000", "calls per second of the small-call runs, comma-separated")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "length of each run")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds; each runs direct, Caddy and toolgate for every upstream kind and rate")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "unrecorded load on each route before the first round")
	kinds := fs.String("upstreams", "sse,json", "upstream kinds, comma-separated: sse (answers over SSE), json (answers with JSON bodies)")
	fs.IntVar(&o.MCPSessions, "mcp-sessions", 1, "MCP sessions per route; calls take them in turn")
	fs.IntVar(&o.BigRate, "big-rate", 10, "calls per second of the 1 MiB-result runs, in which the routes take turns: each route gets its share of the rate for routes × -duration (0: skip them)")
	fs.IntVar(&o.IdleSessions, "idle-sessions", 10000, "idle MCP sessions to open through toolgate for the memory measure (0: skip)")
	fs.IntVar(&o.ProfileRate, "profile-rate", 400, "calls per second while both proxies are profiled under small calls, for -duration (0: no profiles); they are profiled under the 1 MiB result at -big-rate too")
	fs.BoolVar(&o.AuditLog, "audit-log", true, "toolgate writes its audit log (one entry per policy decision) to its output file, as deployed")
	fs.BoolVar(&o.Credential, "credential", true, "each toolgate service carries a credential (auth header), as nearly every deployed one does, so toolgate looks for it in every answer of the upstream")
	fs.BoolVar(&o.Console, "console", false, "toolgate also serves the console, as the README's deployment does, and so keeps its activity record of every decision in its storage")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Second, "a call without an answer after this long is an error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.Rates, err = parseRates(*rates); err != nil {
		return o, err
	}
	o.Kinds = nil
	for k := range strings.SplitSeq(*kinds, ",") {
		k = strings.TrimSpace(k)
		if k != "sse" && k != "json" {
			return o, fmt.Errorf("-upstreams: %q is not sse or json", k)
		}
		for _, seen := range o.Kinds {
			if seen == k {
				return o, fmt.Errorf("-upstreams: %s given twice", k)
			}
		}
		o.Kinds = append(o.Kinds, k)
	}
	switch {
	case o.Duration < time.Second:
		return o, errors.New("-duration: at least 1s")
	case o.Rounds < 1:
		return o, errors.New("-rounds: at least 1")
	case o.Warmup < 0:
		return o, errors.New("-warmup: not negative")
	case o.MCPSessions < 1:
		return o, errors.New("-mcp-sessions: at least 1")
	case o.BigRate < 0 || o.IdleSessions < 0 || o.ProfileRate < 0:
		return o, errors.New("-big-rate, -idle-sessions and -profile-rate: 0 (skip) or more")
	case o.Timeout <= 0:
		return o, errors.New("-timeout: positive")
	}
	if o.Toolgate, err = filepath.Abs(o.Toolgate); err != nil {
		return o, err
	}
	if _, err := os.Stat(o.Toolgate); err != nil {
		return o, fmt.Errorf("-toolgate: %v (build it with `make build`)", err)
	}
	if o.Baseline != "" {
		if o.Baseline, err = filepath.Abs(o.Baseline); err != nil {
			return o, err
		}
		if _, err := os.Stat(o.Baseline); err != nil {
			return o, fmt.Errorf("-baseline: %v", err)
		}
	}
	return o, nil
}

// parseRates reads a comma-separated list of positive call rates.
func parseRates(s string) ([]int, error) {
	var rates []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 100000 {
			return nil, fmt.Errorf("-rates: %q is not a rate between 1 and 100000 calls per second", f)
		}
		rates = append(rates, n)
	}
	return rates, nil
}
