package integration

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkSoak runs the toolgate binary, in its own process, under steady
// load for a long time — 200 small tools/call per second, open loop, over
// twenty runner sessions of which one is ended (its MCP session and its
// toolgate session) and replaced by a new one every half second — and
// samples the process every 30 s from Caddy's metrics: resident memory,
// heap in use, goroutines and open file descriptors. It reports every
// sample and fails when a call fails or when the figures grow: the lowest
// of the last three samples (so that a burst of calls in flight on a busy
// machine is not taken for growth) must stay within soakBounds of the
// sample taken after the first minute. A call the gateway denies because
// a policy missed its deadline (100 ms by default: the machine stalled) is
// its designed answer to overload; those are counted apart.
// TOOLGATE_SOAK_DURATION (default 10m) and TOOLGATE_SOAK_RATE (default
// 200) change the run.
//
//	make soak
func BenchmarkSoak(b *testing.B) {
	duration, rate := 10*time.Minute, 200
	if d, err := time.ParseDuration(os.Getenv("TOOLGATE_SOAK_DURATION")); err == nil {
		duration = d
	}
	if v, err := strconv.Atoi(os.Getenv("TOOLGATE_SOAK_RATE")); err == nil {
		rate = v
	}
	bin := toolgateBinary(b)
	up := startUpstream(b)
	for range b.N {
		samples, calls := soak(b, bin, up, rate, duration, 30*time.Second, 500*time.Millisecond)
		if len(samples) < 4 {
			b.Logf("too short to judge growth (%d samples)", len(samples))
			continue
		}
		for _, err := range soakGrowth(samples) {
			b.Error(err)
		}
		last := samples[len(samples)-1]
		b.ReportMetric(last.rss/(1<<20), "RSS-MiB")
		b.ReportMetric(last.heap/(1<<20), "heap-MiB")
		b.ReportMetric(float64(last.goroutines), "goroutines")
		b.ReportMetric(float64(last.fds), "fds")
		b.ReportMetric(float64(calls), "calls")
	}
}

// TestSoakBriefly runs the soak's load, churn and sampling for a few
// seconds (without judging growth), so that the code make soak runs is
// exercised by every test run and cannot rot.
func TestSoakBriefly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up := startUpstream(t)
	samples, calls := soak(t, bin, up, 20, 3*time.Second, time.Second, 200*time.Millisecond)
	if len(samples) != 3 {
		t.Fatalf("%d samples, want 3", len(samples))
	}
	last := samples[len(samples)-1]
	if calls == 0 || last.sessions <= 20 {
		t.Errorf("%d calls over %d sessions: no load or no churn", calls, last.sessions)
	}
	// The judge itself: flat figures and a burst at the end pass, steady
	// growth fails.
	series := func(grow func(k int, s *soakSample)) []soakSample {
		out := make([]soakSample, 6)
		for k := range out {
			out[k] = last
			grow(k, &out[k])
		}
		return out
	}
	if errs := soakGrowth(series(func(int, *soakSample) {})); len(errs) != 0 {
		t.Errorf("flat figures judged as growth: %v", errs)
	}
	burst := series(func(k int, s *soakSample) {
		if k == 5 {
			s.goroutines, s.fds, s.heap = s.goroutines*10, s.fds*10, s.heap*10
		}
	})
	if errs := soakGrowth(burst); len(errs) != 0 {
		t.Errorf("a burst in the last sample judged as growth: %v", errs)
	}
	leak := series(func(k int, s *soakSample) { s.goroutines += 100 * k; s.rss *= 1 + float64(k)/4 })
	if errs := soakGrowth(leak); len(errs) != 2 {
		t.Errorf("growing goroutines and RSS: %v, want two errors", errs)
	}
}

// soakConns is how many connections the soak's runners hold at most
// (their keep-alive pool): each is an open fd and two goroutines in the
// gateway, so a pool still filling up after the first minute is not a
// leak.
const soakConns = 32

// soakBounds are how far the figures may grow from the sample after the
// first minute: RSS by a quarter, the heap in use by half plus 16 MiB,
// goroutines by a tenth plus 20 plus two per runner connection, open fds
// by a tenth plus 20 plus one per runner connection.
var soakBounds = []struct {
	what          string
	of            func(soakSample) float64
	factor, slack float64
}{
	{"RSS", func(s soakSample) float64 { return s.rss }, 1.25, 0},
	{"heap in use", func(s soakSample) float64 { return s.heap }, 1.5, 16 << 20},
	{"goroutines", func(s soakSample) float64 { return float64(s.goroutines) }, 1.1, 20 + 2*soakConns},
	{"open fds", func(s soakSample) float64 { return float64(s.fds) }, 1.1, 20 + soakConns},
}

// soakGrowth judges samples taken every 30 s: the lowest of the last three
// against soakBounds from the second one (after the first minute).
func soakGrowth(samples []soakSample) []error {
	ref, tail := samples[1], samples[len(samples)-3:]
	var errs []error
	for _, b := range soakBounds {
		low := min(b.of(tail[0]), b.of(tail[1]), b.of(tail[2]))
		if bound := b.of(ref)*b.factor + b.slack; low > bound {
			errs = append(errs, fmt.Errorf("%s grew from %.0f (at %s) to at least %.0f (the last three samples), over the bound %.0f",
				b.what, b.of(ref), ref.at, low, bound))
		}
	}
	return errs
}

type soakSample struct {
	at                  time.Duration
	rss, heap           float64
	goroutines, fds     int
	calls, failed, late int64
	sessions            int64
}

// soak starts bin and loads it at rate calls/s for duration over twenty
// runner sessions, replacing one every churn and sampling the process
// every sample. It fails t when a call fails (but for policy deadlines),
// and returns the samples and the number of calls.
func soak(t testing.TB, bin string, up *upstream, rate int, duration, sample, churn time.Duration) ([]soakSample, int64) {
	r := startReloadable(t, bin, up, false)
	pool := newSoakPool(t, &gateway{URL: strings.TrimSuffix(r.gateway.url, "/v1/mcp/svc"), DataDir: r.dir}, 20)
	var c soakCounts
	stop := make(chan struct{})
	loaded := make(chan struct{})
	go func() { defer close(loaded); pool.load(stop, rate, &c) }()
	defer func() { close(stop); <-loaded }()

	fmt.Printf("soak: %s at %d calls/s, a session replaced every %s, a sample every %s\n", duration, rate, churn, sample)
	fmt.Printf("soak: %8s %10s %10s %10s %6s %8s %8s %8s %8s\n", "time", "RSS MiB", "heap MiB", "goroutines", "fds", "calls", "failed", "deadline", "sessions")
	var samples []soakSample
	start := time.Now()
	next := start.Add(sample)
	tick := time.NewTicker(churn)
	defer tick.Stop()
	for now := range tick.C {
		if now.Before(next) {
			pool.replaceOldest()
			continue
		}
		s := sampleProcess(t, r.admin)
		s.at, s.calls, s.failed, s.late, s.sessions = time.Since(start).Round(time.Second), c.calls.Load(), c.failed.Load(), c.late.Load(), pool.created
		samples = append(samples, s)
		fmt.Printf("soak: %8s %10.1f %10.1f %10d %6d %8d %8d %8d %8d\n", s.at, s.rss/(1<<20), s.heap/(1<<20), s.goroutines, s.fds, s.calls, s.failed, s.late, s.sessions)
		if next = next.Add(sample); next.Sub(start) > duration {
			break
		}
	}
	if n := c.late.Load(); n > 0 {
		t.Logf("%d of %d calls were denied because a policy missed its deadline (the machine stalled)", n, c.calls.Load())
	}
	if n := c.failed.Load(); n > 0 {
		t.Errorf("%d of %d calls failed; the first: %v", n, c.calls.Load(), c.firstFailure.Load())
	}
	return samples, c.calls.Load()
}

// sampleProcess reads the process's figures from Caddy's admin metrics.
func sampleProcess(t testing.TB, admin string) soakSample {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s soakSample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch name {
		case "process_resident_memory_bytes":
			s.rss = v
		case "go_memstats_heap_inuse_bytes":
			s.heap = v
		case "go_goroutines":
			s.goroutines = int(v)
		case "process_open_fds":
			s.fds = int(v)
		}
	}
	if s.rss == 0 || s.heap == 0 || s.goroutines == 0 || s.fds == 0 {
		t.Fatalf("the admin metrics lack the process's figures: %+v", s)
	}
	return s
}

// soakPool is a set of runner sessions, replaced one by one. Only the
// test's goroutine opens and ends sessions; load reads live under mu.
type soakPool struct {
	t       testing.TB
	g       *gateway
	mu      sync.Mutex
	live    []*soakSession
	created int64
}

// soakSession is one runner: a toolgate session and an MCP session in it.
type soakSession struct {
	id    string
	m     *rawMCP
	ended atomic.Bool // set before the sessions are ended
}

func newSoakPool(t testing.TB, g *gateway, n int) *soakPool {
	p := &soakPool{t: t, g: g}
	for range n {
		p.live = append(p.live, p.open())
	}
	return p
}

func (p *soakPool) open() *soakSession {
	id := p.g.createSession(p.t, aliceKey, "svc")
	m := p.g.raw(p.t, aliceKey, id, "svc")
	m.initialize()
	p.created++
	return &soakSession{id: id, m: m}
}

// replaceOldest opens a session and ends the oldest one: its MCP session
// (DELETE), then its toolgate session.
func (p *soakPool) replaceOldest() {
	fresh := p.open()
	p.mu.Lock()
	old := p.live[0]
	p.live = append(p.live[1:], fresh)
	old.ended.Store(true)
	p.mu.Unlock()
	if status := old.m.delete(); status != http.StatusNoContent {
		p.t.Errorf("ending an MCP session: %d", status)
	}
	if r := p.g.api(p.t, http.MethodDelete, "/v1/sessions/"+old.id, aliceKey, nil); r.StatusCode != http.StatusNoContent {
		p.t.Errorf("ending a toolgate session: %d %s", r.StatusCode, r.Body)
	}
}

// soakCounts are the soak's calls: all, failed, and denied for a policy
// deadline.
type soakCounts struct {
	calls, failed, late atomic.Int64
	firstFailure        atomic.Value
}

// load sends tools/call messages at rate per second, open loop, over the
// live sessions in turn, until stop. A call refused because its session
// was ended meanwhile (404 for the MCP session, 403 for the toolgate
// session), or answered with the JSON-RPC error of a session ended while
// it was in progress, is sent again in another one: that is the churn,
// not a failure. A call denied because a policy missed its deadline is counted
// as late; anything else but the echoed answer is a failure.
func (p *soakPool) load(stop <-chan struct{}, rate int, c *soakCounts) {
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: soakConns, MaxIdleConnsPerHost: soakConns}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	start, sent := time.Now(), 0
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		// A busy machine delays ticks and drops some: send every call due
		// by now, so that the rate holds on average.
		due := int(time.Since(start).Seconds() * float64(rate))
		for ; sent < due; sent++ {
			p.send(client, sent, c, &wg)
		}
	}
}

// send makes call i in a goroutine of wg.
func (p *soakPool) send(client *http.Client, i int, c *soakCounts, wg *sync.WaitGroup) {
	wg.Go(func() {
		for attempt := 0; ; attempt++ {
			p.mu.Lock()
			s := p.live[(i+attempt)%len(p.live)]
			p.mu.Unlock()
			status, body, err := soakCall(client, s.m, i)
			if s.ended.Load() && attempt < 3 && (status == http.StatusNotFound || status == http.StatusForbidden ||
				strings.Contains(body, "the MCP session was ended while the request was in progress")) {
				continue
			}
			c.calls.Add(1)
			switch {
			case err == nil && status == http.StatusOK && strings.Contains(body, `\"text\":\"soak\"`):
			case err == nil && status == http.StatusOK && strings.Contains(body, "took longer than its deadline"):
				c.late.Add(1)
			default:
				c.failed.Add(1)
				c.firstFailure.CompareAndSwap(nil, fmt.Sprintf("HTTP %d %v %.300s", status, err, body))
			}
			return
		}
	})
}

func soakCall(client *http.Client, m *rawMCP, id int) (int, string, error) {
	resp, err := client.Do(m.echoRequest(id, "soak"))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), err
}
