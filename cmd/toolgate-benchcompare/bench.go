package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolgate/toolgate/internal/testproc"
)

// The parties. baseline is another toolgate binary (-baseline), for a
// before/after comparison in one run.
const (
	direct   = "direct"
	caddy    = "caddy"
	toolgate = "toolgate"
	baseline = "baseline"
)

// parties are the routes every round runs, in an order that changes from
// round to round (see inRound). -baseline adds baseline.
var parties = []string{direct, caddy, toolgate}

// inRound returns the parties in the order round runs them: the rows of a
// Williams design, balanced for what one run leaves behind on the machine
// for the next (the upstream's state, a collection, the CPU's caches).
// Over n rounds of an even number n of parties, or 2n of an odd number,
// every party runs right after every other one equally often, and each
// runs first in turn. A rotation alone (what three parties get in their
// first three rounds) makes every party follow the same other one in
// every round: with a baseline, toolgate always ran right after plain
// Caddy and the baseline right after toolgate, in every run of fewer than
// three rounds.
func inRound(round int) []string {
	n := len(parties)
	first := make([]int, n) // 0, 1, n-1, 2, n-2, …
	for j := 1; j < n; j++ {
		if j%2 == 1 {
			first[j] = (j + 1) / 2
		} else {
			first[j] = n - j/2
		}
	}
	row := func(i int) []string {
		order := make([]string, n)
		for j, k := range first {
			order[j] = parties[(k+i)%n]
		}
		return order
	}
	r := round - 1
	if n%2 == 0 {
		return row(r % n)
	}
	r %= 2 * n
	if r < n {
		return row(r)
	}
	// An odd number of parties needs the mirrored rows too; each is taken
	// from the row after, so that no two rounds in a row start alike.
	order := row((r - n + 1) % n)
	slices.Reverse(order)
	return order
}

// inTurns returns the parties in the order the 1 MiB calls of round take
// turns (call i goes to the party at i mod their number): inRound's order,
// reversed every other round. A rotation alone keeps the cyclic order, so
// every party's calls would follow the same other party's in every round;
// reversed, they follow another one, and what one party's call leaves
// behind on the machine (a collection, a buffer being freed) does not
// always fall on the same next party.
func inTurns(round int) []string {
	order := inRound(round)
	if round%2 == 0 {
		slices.Reverse(order)
	}
	return order
}

// apiKey is the benchmark caller's API key at toolgate.
const (
	apiKey = "benchcompare-key"
	caller = "bench@example.test"
)

// bench is one run of the harness: its servers, routes and results.
type bench struct {
	opts   options
	dir    string
	procs  map[string]*server           // "upstream-<kind>", "caddy", "toolgate", "baseline"
	admin  map[string]string            // proxy party → its admin endpoint's base URL
	base   map[string]string            // proxy party → its site's base URL
	routes map[string]map[string]*route // upstream kind → party → route
	http   *http.Client                 // for admin endpoints and setup requests
	res    results
}

// results is everything a run measured; results.json holds it.
type results struct {
	Date       time.Time
	Machine    string
	GoVersion  string
	Revision   string // of the harness binary, from its build information
	Options    options
	LoadBefore string // load averages (1, 5, 15 min) when the run started
	LoadAfter  string
	Runs       []run
	Idle       *idleResult   `json:",omitempty"`
	Profiles   []string      `json:",omitempty"`
	Noise      []noiseWindow // the machine's floor, measured before the load
}

// run is one open-loop run of one route. Times are in milliseconds.
type run struct {
	Phase      string // "rounds" or "idle-sessions"
	Round      int
	Kind       string // the upstream kind
	Call       string // "small" or "1MiB"
	Rate       int
	Party      string
	Calls      int
	Errors     int
	FirstError string `json:",omitempty"`
	P50        float64
	P90        float64
	P99        float64
	Max        float64
	MaxLag     float64 // how late the generator started a call, at worst
	Load       string  // the machine's load averages when the run started
	// Timeline is the slowest call scheduled in each second of the run.
	Timeline []float64
	// CPU is the CPU time per call of each process, by name, in
	// milliseconds ("generator" is this program).
	CPU map[string]float64
	// Allocations per call in the party's proxy process (none for direct),
	// and its garbage collections during the run.
	Allocs   float64
	AllocKiB float64
	GCs      uint32
	// Policy is how long toolgate's policy evaluations of the run took,
	// by stage (toolgate and the baseline only).
	Policy map[string]policyLatency `json:",omitempty"`
	// Floor is what the machine did to short computations during the
	// run (small calls only; see floorProbeRate).
	Floor *noiseWindow `json:",omitempty"`
	// Turns are the parties whose calls took turns in the run this one is
	// part of (the 1 MiB result), in the order of the turns; none for a
	// run of one party alone. Rate is then the calls per second of all of
	// them, the upstream's and the generator's CPU is per call of them
	// all (the processes serve every party's calls in one stretch of
	// time), and the proxy's own CPU and allocations are per call of its
	// own.
	Turns []string `json:",omitempty"`
	// Latencies are the run's latencies, sorted, for the bootstrap
	// interval of the differences between parties (runs in turns only).
	Latencies []float64 `json:",omitempty"`
}

// idleResult is the idle-session phase: memory of toolgate (and of the
// upstream, whose sessions toolgate's open too) before and after opening
// the sessions, and the runs made while they were open. The budget's
// measure is toolgate's live memory: heap after a full collection plus
// goroutine stacks. Resident memory is reported too, but it moves with
// what the Go runtime has not yet returned to the system after the load
// rounds, so it can even shrink.
type idleResult struct {
	Sessions     int
	UpstreamKind string
	OpenSeconds  float64
	Before       memSnapshot
	After        memSnapshot
	KiBLive      float64 // Δ(heap + stacks) per session
	KiBRSS       float64 // ΔRSS per session
	UpstreamKiB  float64 // the upstream's ΔRSS per session
	Goroutines   float64 // Δgoroutines per session
	Runs         []run
}

// memSnapshot is toolgate's memory at one moment, after a full collection.
type memSnapshot struct {
	RSS         int64
	HeapAlloc   uint64
	StackInuse  uint64
	Goroutines  int
	UpstreamRSS int64
}

func (m memSnapshot) live() float64 { return float64(m.HeapAlloc + m.StackInuse) }

func runBench(ctx context.Context, o options) error {
	dir, err := filepath.Abs(filepath.Join(o.Out, time.Now().Format("20060102-150405")))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b := &bench{opts: o, dir: dir, procs: map[string]*server{}, admin: map[string]string{}, base: map[string]string{},
		routes: map[string]map[string]*route{}, http: &http.Client{}}
	b.res = results{Date: time.Now(), Machine: machine(), GoVersion: runtime.Version(), Revision: revision(),
		Options: o, LoadBefore: loadAverage()}
	if o.Baseline != "" {
		parties = append(parties, baseline)
	}
	defer b.stopAll()
	logf("toolgate-benchcompare: %s, load average %s; writing to %s", b.res.Machine, b.res.LoadBefore, dir)
	b.res.Noise = machineNoise()
	if err := b.start(); err != nil {
		return err
	}
	if err := b.prepareRoutes(ctx); err != nil {
		return err
	}
	if err := b.warmUp(ctx); err != nil {
		return err
	}
	if err := b.rounds(ctx); err != nil {
		return err
	}
	if o.ProfileRate > 0 {
		if err := b.profile(ctx); err != nil {
			return err
		}
	}
	if o.IdleSessions > 0 {
		if err := b.idleSessions(ctx); err != nil {
			return err
		}
	}
	b.res.LoadAfter = loadAverage()
	data, _ := json.MarshalIndent(b.res, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "results.json"), data, 0o644); err != nil {
		return err
	}
	report(os.Stdout, &b.res)
	printProfileTops(os.Stdout, o.Toolgate, b.res.Profiles)
	fmt.Printf("\nEverything is in %s.\n", dir)
	return nil
}

// logf reports progress on stderr; the report goes to stdout.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// revision is the commit of the working tree the run is made from
// ("-dirty" when it has changes), as git describes it.
func revision() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty", "--abbrev=12").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// start runs the upstreams, then the plain Caddy and toolgate in front of
// them, each on free loopback ports, and waits until all listen.
func (b *bench) start() error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	upstreams := map[string]string{}
	for _, kind := range b.opts.Kinds {
		port, err := testproc.FreePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		args := []string{"upstream", "-listen", addr}
		if kind == "json" {
			args = append(args, "-json")
		}
		name := "upstream-" + kind
		s, err := startServer(name, b.dir, exe, nil, args...)
		if err != nil {
			return err
		}
		b.procs[name] = s
		if err := s.waitListening(addr, 30*time.Second); err != nil {
			return err
		}
		upstreams[kind] = "http://" + addr
	}
	policies := filepath.Join(b.dir, "policies")
	if err := preparePolicies(b.opts.Policies, policies, b.opts.Kinds, 2<<20); err != nil {
		return err
	}
	for _, party := range parties[1:] {
		cfg := proxyConfig{Dir: filepath.Join(b.dir, party), Upstreams: upstreams, APIKeyHash: apiKeyHash(apiKey),
			Caller: caller, Policies: policies, NoAuditLog: !b.opts.AuditLog, Console: b.opts.Console,
			Credential:  b.opts.Credential,
			MaxSessions: max(10000, b.opts.IdleSessions+1000)}
		if cfg.Port, err = testproc.FreePort(); err != nil {
			return err
		}
		if cfg.AdminPort, err = testproc.FreePort(); err != nil {
			return err
		}
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return err
		}
		tmpl, bin := plainCaddyfile, b.opts.Toolgate
		switch party {
		case toolgate:
			tmpl = toolgateCaddyfile
		case baseline:
			tmpl, bin = toolgateCaddyfile, b.opts.Baseline
		}
		caddyfile, err := writeCaddyfile(tmpl, cfg)
		if err != nil {
			return err
		}
		home := filepath.Join(cfg.Dir, "home")
		env := []string{"HOME=" + home, "XDG_DATA_HOME=" + home, "XDG_CONFIG_HOME=" + home}
		s, err := startServer(party, b.dir, bin, env, "run", "--config", caddyfile, "--adapter", "caddyfile")
		if err != nil {
			return err
		}
		b.procs[party] = s
		for _, port := range []int{cfg.Port, cfg.AdminPort} {
			if err := s.waitListening("127.0.0.1:"+strconv.Itoa(port), 60*time.Second); err != nil {
				return err
			}
		}
		b.admin[party] = "http://127.0.0.1:" + strconv.Itoa(cfg.AdminPort)
		b.base[party] = "http://127.0.0.1:" + strconv.Itoa(cfg.Port)
	}
	for _, kind := range b.opts.Kinds {
		b.routes[kind] = map[string]*route{
			direct:   {party: direct, kind: kind, url: upstreams[kind] + "/mcp"},
			caddy:    {party: caddy, kind: kind, url: b.base[caddy] + "/" + kind + "/mcp"},
			toolgate: {party: toolgate, kind: kind, url: b.base[toolgate] + "/v1/mcp/" + kind},
		}
		if b.opts.Baseline != "" {
			b.routes[kind][baseline] = &route{party: baseline, kind: kind, url: b.base[baseline] + "/v1/mcp/" + kind}
		}
	}
	for name, s := range b.procs {
		logf("  %s: pid %d, output in %s", name, s.pid, s.logs)
	}
	return nil
}

// stopAll stops every server by its PID.
func (b *bench) stopAll() {
	for _, s := range b.procs {
		s.stop()
	}
}

// prepareRoutes gives each route its HTTP client (one per party) and its
// MCP sessions; toolgate's routes get the API key and a toolgate session
// that selects every upstream's service.
func (b *bench) prepareRoutes(ctx context.Context) error {
	clients := map[string]*http.Client{}
	sessions := map[string]string{}
	for _, p := range parties {
		clients[p] = newClient(b.opts.Timeout)
		if p == toolgate || p == baseline {
			session, err := createToolgateSession(ctx, b.http, b.base[p], apiKey, b.opts.Kinds)
			if err != nil {
				return err
			}
			sessions[p] = session
		}
	}
	for _, kind := range b.opts.Kinds {
		for _, p := range parties {
			r := b.routes[kind][p]
			r.client = clients[p]
			if session, ok := sessions[p]; ok {
				r.header = http.Header{"Authorization": {"Bearer " + apiKey}, "X-Toolgate-Session": {session}}
			}
			var err error
			if r.sessions, err = r.openSessions(ctx, b.opts.MCPSessions, 4); err != nil {
				return err
			}
		}
	}
	return nil
}

// warmUp runs every route unrecorded at the first rate, so connection
// pools, caches and the Go runtimes are warm before the first round. Its
// failures are reported, not counted; only a route on which every call
// fails stops the run.
func (b *bench) warmUp(ctx context.Context) error {
	if b.opts.Warmup == 0 {
		return nil
	}
	for _, kind := range b.opts.Kinds {
		for _, p := range parties {
			res := openLoop(ctx, b.routes[kind][p], smallCall, b.opts.Rates[0], b.opts.Warmup)
			switch {
			case res.Calls > 0 && res.Errors == res.Calls:
				return fmt.Errorf("warm-up of %s via %s: every call failed; the first: %s", kind, p, res.FirstError)
			case res.Errors > 0:
				logf("  warm-up of %s via %s: %d of %d calls failed; the first: %s", kind, p, res.Errors, res.Calls, res.FirstError)
			}
		}
	}
	return ctx.Err()
}

// rounds runs, per round, every upstream kind at every rate on every
// route in turn, then the 1 MiB result on all routes at once, their calls
// taking turns.
//
// The 1 MiB result is held to an absolute budget (toolgate's p50 at most
// 2 ms over plain Caddy's) while the upstream alone spends 35 to 50 ms of
// CPU on each such call, with an interquartile range of some 14 ms: routes
// run one after another, each meeting the upstream of its own stretch of
// time, differed by several ms from run to run. Taking turns, every route
// meets the same upstream. The calls keep the rate of all routes together
// at -big-rate, as low as when each route ran alone (on a small machine
// four times the rate would queue the calls behind the upstream's CPU),
// and the run lasts -duration per route, so each route still makes
// -big-rate × -duration calls.
func (b *bench) rounds(ctx context.Context) error {
	for round := 1; round <= b.opts.Rounds; round++ {
		for _, kind := range b.opts.Kinds {
			for _, rate := range b.opts.Rates {
				for _, p := range inRound(round) {
					if err := b.measure(ctx, "rounds", round, []*route{b.routes[kind][p]}, smallCall, rate, b.opts.Duration); err != nil {
						return err
					}
				}
			}
			if b.opts.BigRate == 0 {
				continue
			}
			var turns []*route
			for _, p := range inTurns(round) {
				turns = append(turns, b.routes[kind][p])
			}
			d := time.Duration(len(turns)) * b.opts.Duration
			if err := b.measure(ctx, "rounds", round, turns, bigCall, b.opts.BigRate, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// measure makes one recorded run of d, the calls taking turns across
// routes (see openLoopTurns; most runs have one route), and appends a run
// per route to the results. A proxy serves only its own route's calls,
// so its CPU and allocations are per call of its own; every other
// process's CPU (the upstream's, which serves all routes, the
// generator's, and that of the proxies not in the run) is per call of all
// routes together.
func (b *bench) measure(ctx context.Context, phase string, round int, routes []*route, c call, rate int, d time.Duration) error {
	cpu0, err := b.cpu()
	if err != nil {
		return err
	}
	mem0, mem1 := map[string]memStats{}, map[string]memStats{}
	pol0, pol1 := map[string]map[string]histogram{}, map[string]map[string]histogram{}
	readAdmin := func(mem map[string]memStats, pol map[string]map[string]histogram) error {
		for _, r := range routes {
			admin := b.admin[r.party]
			if admin == "" {
				continue
			}
			m, err := readMemStats(ctx, b.http, admin)
			if err != nil {
				return err
			}
			mem[r.party] = m
			if r.party == toolgate || r.party == baseline {
				if pol[r.party], err = readPolicyHistograms(ctx, b.http, admin); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := readAdmin(mem0, pol0); err != nil {
		return err
	}
	load := loadAverage()
	var probe *floorProbe
	if c.name == smallCall.name {
		if probe, err = startFloorProbe(ctx, d); err != nil {
			return err
		}
	}
	lrs := openLoopTurns(ctx, routes, c, rate, d)
	if err := ctx.Err(); err != nil {
		return err
	}
	var floor *noiseWindow
	if probe != nil {
		if floor, err = probe.wait(); err != nil {
			return err
		}
	}
	cpu1, err := b.cpu()
	if err != nil {
		return err
	}
	if err := readAdmin(mem1, pol1); err != nil {
		return err
	}
	for _, s := range b.procs {
		if err := s.alive(); err != nil {
			return err
		}
	}
	var turns, party []string
	var calls []int
	for k, r := range routes {
		party, calls = append(party, r.party), append(calls, lrs[k].Calls)
	}
	if len(routes) > 1 {
		turns = party
	}
	for k, r := range routes {
		lr := lrs[k]
		x := run{Phase: phase, Round: round, Kind: r.kind, Call: c.name, Rate: rate, Party: r.party,
			Calls: lr.Calls, Errors: lr.Errors, FirstError: lr.FirstError,
			P50: ms(percentile(lr.latencies, 0.50)), P90: ms(percentile(lr.latencies, 0.90)),
			P99: ms(percentile(lr.latencies, 0.99)), Max: ms(percentile(lr.latencies, 1)), MaxLag: ms(lr.MaxLag),
			Load: load, CPU: cpuPerCall(cpu0, cpu1, party, k, calls), Floor: floor, Turns: turns}
		for _, l := range lr.Timeline {
			x.Timeline = append(x.Timeline, ms(l))
		}
		if len(turns) > 0 {
			for _, l := range lr.latencies {
				x.Latencies = append(x.Latencies, ms(l))
			}
		}
		if m0, ok := mem0[r.party]; ok {
			m1 := mem1[r.party]
			x.Allocs = float64(m1.Mallocs-m0.Mallocs) / float64(lr.Calls)
			x.AllocKiB = float64(m1.TotalAlloc-m0.TotalAlloc) / 1024 / float64(lr.Calls)
			x.GCs = m1.NumGC - m0.NumGC
		}
		for stage, h := range pol1[r.party] {
			if l, ok := h.since(pol0[r.party][stage]); ok {
				if x.Policy == nil {
					x.Policy = map[string]policyLatency{}
				}
				x.Policy[stage] = l
			}
		}
		b.res.Runs = append(b.res.Runs, x)
		logf("  %-13s round %d  %-4s %-5s %5d/s  %-8s  p50 %6.2f  p99 %7.2f  max %7.2f ms  errors %d  cpu %.3f ms/call  lag %.1f ms",
			phase, round, r.kind, c.name, rate, r.party, x.P50, x.P99, x.Max, x.Errors, x.CPU[r.processName()], x.MaxLag)
		if lr.FirstError != "" {
			logf("    first error: %s", lr.FirstError)
		}
	}
	// Every run starts alike: without the idle connections a saturated run
	// left behind (one per call that was in flight), and after calls that
	// timed out on the client side have drained from the servers.
	for _, r := range routes {
		r.client.CloseIdleConnections()
	}
	time.Sleep(250 * time.Millisecond)
	return nil
}

// cpuPerCall is the CPU time per call, in ms, of each process (by name,
// as b.cpu gives it at a run's start and end) for the run of parties[k],
// the parties' calls having taken turns (calls are how many each made).
// A proxy (named after its party) serves its own party's calls alone, so
// parties[k]'s proxy's CPU is per call of its own, and the other proxies
// of the run are left out; every other process, the upstream (which
// serves all of them, and is direct's process), the generator and the
// proxies not in the run, is per call of all parties together. With one
// party, every process is per call of the run.
func cpuPerCall(cpu0, cpu1 map[string]float64, parties []string, k int, calls []int) map[string]float64 {
	all := 0
	for _, n := range calls {
		all += n
	}
	out := map[string]float64{}
	for name, t := range cpu1 {
		per := all
		switch {
		case name == parties[k]:
			per = calls[k]
		case slices.Contains(parties, name):
			continue
		}
		out[name] = (t - cpu0[name]) * 1000 / float64(per)
	}
	return out
}

// processName is the process whose CPU a call on r pays for besides the
// upstream: the proxy, or the upstream itself for direct calls.
func (r *route) processName() string {
	if r.party == direct {
		return "upstream-" + r.kind
	}
	return r.party
}

// cpu returns the CPU seconds used so far by every server and by this
// program.
func (b *bench) cpu() (map[string]float64, error) {
	out := map[string]float64{}
	for name, s := range b.procs {
		t, err := cpuSeconds(s.pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		out[name] = t
	}
	t, err := cpuSeconds(os.Getpid())
	if err != nil {
		return nil, err
	}
	out["generator"] = t
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// profile captures CPU, allocation and heap profiles of each proxy under
// the small-call load at -profile-rate, and under the 1 MiB result at
// -big-rate, on the first upstream kind.
func (b *bench) profile(ctx context.Context) error {
	kind := b.opts.Kinds[0]
	seconds := int(b.opts.Duration.Seconds())
	type load struct {
		c    call
		rate int
		name string // of the profiles' files: "<party><name>-cpu.pprof"
	}
	loads := []load{{smallCall, b.opts.ProfileRate, ""}}
	if b.opts.BigRate > 0 {
		loads = append(loads, load{bigCall, b.opts.BigRate, "-" + bigCall.name})
	}
	for _, l := range loads {
		for _, p := range []string{caddy, toolgate} {
			logf("  profiling %s at %d calls/s (%s) for %ds", p, l.rate, l.c.name, seconds)
			var lr loadResult
			files, err := captureProfiles(ctx, b.http, b.admin[p], b.dir, p+l.name, seconds, func() {
				lr = openLoop(ctx, b.routes[kind][p], l.c, l.rate, time.Duration(seconds+2)*time.Second)
			})
			if err != nil {
				return fmt.Errorf("profiling %s: %v", p, err)
			}
			if lr.Errors > 0 {
				logf("    %d of %d calls failed while profiling; the first: %s", lr.Errors, lr.Calls, lr.FirstError)
			}
			b.res.Profiles = append(b.res.Profiles, files...)
		}
	}
	return ctx.Err()
}

// idleSessions opens -idle-sessions MCP sessions through toolgate and
// leaves them idle: toolgate's resident memory and live heap (after a full
// collection) before and after give the memory per session. Then, with
// the sessions open, each route runs the small call once at the first
// rate.
func (b *bench) idleSessions(ctx context.Context) error {
	kind := b.opts.Kinds[0]
	tg := b.procs[toolgate]
	up := b.procs["upstream-"+kind]
	n := b.opts.IdleSessions
	res := &idleResult{Sessions: n, UpstreamKind: kind}
	snapshot := func() (m memSnapshot, err error) {
		settle(ctx, tg.pid, 30*time.Second)
		if err = collectGarbage(ctx, b.http, b.admin[toolgate]); err != nil {
			return
		}
		var stats memStats
		if stats, err = readMemStats(ctx, b.http, b.admin[toolgate]); err != nil {
			return
		}
		m.HeapAlloc, m.StackInuse = stats.HeapAlloc, stats.StackInuse
		if m.Goroutines, err = goroutines(ctx, b.http, b.admin[toolgate]); err != nil {
			return
		}
		if m.RSS, err = rssBytes(tg.pid); err != nil {
			return
		}
		m.UpstreamRSS, err = rssBytes(up.pid)
		return m, err
	}
	var err error
	if res.Before, err = snapshot(); err != nil {
		return err
	}
	logf("  opening %d idle MCP sessions through toolgate", n)
	// A route of its own, so the sessions' connections do not join the
	// load's pool.
	r := *b.routes[kind][toolgate]
	r.client = newClient(b.opts.Timeout)
	began := time.Now()
	if _, err := r.openSessions(ctx, n, 8); err != nil {
		return fmt.Errorf("idle sessions: %v", err)
	}
	res.OpenSeconds = time.Since(began).Seconds()
	r.client.CloseIdleConnections()
	if res.After, err = snapshot(); err != nil {
		return err
	}
	per := func(before, after float64) float64 { return (after - before) / float64(n) }
	res.KiBLive = per(res.Before.live(), res.After.live()) / 1024
	res.KiBRSS = per(float64(res.Before.RSS), float64(res.After.RSS)) / 1024
	res.UpstreamKiB = per(float64(res.Before.UpstreamRSS), float64(res.After.UpstreamRSS)) / 1024
	res.Goroutines = per(float64(res.Before.Goroutines), float64(res.After.Goroutines))
	logf("  %d sessions in %.1fs: toolgate live memory %+.1f KiB/session, RSS %+.1f KiB/session, %+.2f goroutines/session",
		n, res.OpenSeconds, res.KiBLive, res.KiBRSS, res.Goroutines)
	before := len(b.res.Runs)
	for _, p := range parties {
		dumped := make(chan error, 1)
		if p == toolgate {
			// Where toolgate's goroutines are halfway through its run.
			go func() {
				time.Sleep(b.opts.Duration / 2)
				data, err := getBytes(ctx, b.http, b.admin[toolgate]+"/debug/pprof/goroutine?debug=1", 30*time.Second)
				if err == nil {
					err = os.WriteFile(filepath.Join(b.dir, "toolgate-idle-goroutines.txt"), data, 0o644)
				}
				dumped <- err
			}()
		} else {
			dumped <- nil
		}
		if err := b.measure(ctx, "idle-sessions", 1, []*route{b.routes[kind][p]}, smallCall, b.opts.Rates[0], b.opts.Duration); err != nil {
			return err
		}
		if err := <-dumped; err != nil {
			logf("  the goroutine dump failed: %v", err)
		}
	}
	res.Runs = append(res.Runs, b.res.Runs[before:]...)
	b.res.Runs = b.res.Runs[:before]
	b.res.Idle = res
	return nil
}
