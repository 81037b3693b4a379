package stdio

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpbridge"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Restart backoff: the delay before the nth restart in a row is
// minBackoff·2ⁿ⁻¹, at most maxBackoff, less up to a fifth of it at random
// (so that programs that failed together do not restart together). A
// process that ran for stablePeriod resets the count.
const (
	minBackoff   = 250 * time.Millisecond
	maxBackoff   = 8 * time.Second
	stablePeriod = 30 * time.Second
)

func backoff(n int, random func() float64) time.Duration {
	d := maxBackoff
	if n <= 6 {
		d = min(minBackoff<<(n-1), maxBackoff)
	}
	return d - time.Duration(random()*float64(d)/5)
}

// Clock and timers; tests replace them.
var (
	now       = time.Now
	afterFunc = func(d time.Duration, f func()) interface{ Stop() bool } { return time.AfterFunc(d, f) }
	random    = rand.Float64
)

// errWorkerClosed is a worker stopped for good.
var errWorkerClosed = errors.New("the program was stopped")

// runtime is a service's processes, shared by the configs that run the
// service with the same spec.
type runtime struct {
	spec   *spec
	bridge *mcpbridge.Bridge
	logger atomic.Pointer[zap.Logger]

	mu       sync.Mutex
	workers  map[string]*worker // by user; "" when one process serves all
	closed   bool
	janitor  chan struct{} // closed to stop the idle sweep
	restarts []restart     // the restart schedule, for tests and logs

	// places counts what max_processes bounds: each worker (its process
	// running, starting or waiting to be restarted) and the processes
	// retiring beside them, which finish their requests in progress
	// (replaceLocked). A place is taken by adding to it and comparing
	// what the addition returns, so that two takes at once never both
	// find the last place free; atomic, so that replaceLocked can take
	// one under a worker's lock without rt.mu (worker.ended takes rt.mu
	// under its own). procs counts the processes alive or starting.
	places, procs atomic.Int64
}

// restart is one scheduled restart.
type restart struct {
	Delay  time.Duration
	Reason string
}

func newRuntime(s *spec, logger *zap.Logger) *runtime {
	rt := &runtime{spec: s, workers: map[string]*worker{}}
	rt.bridge = mcpbridge.New(mcpbridge.Config{Service: s.Service, MaxMessage: s.MaxMessage,
		Limits: mcpmsg.Limits{MaxDepth: s.Depth, MaxValues: s.Values}, Logger: logger}, rt)
	rt.logger.Store(logger)
	return rt
}

// use is Bridge.Use for the runtime's own logger too.
func (rt *runtime) use(l *zap.Logger, idle time.Duration) (restore func()) {
	prev := rt.logger.Swap(l)
	restoreBridge := rt.bridge.Use(l, idle)
	return func() {
		rt.logger.CompareAndSwap(l, prev)
		restoreBridge()
	}
}

func (rt *runtime) log() *zap.Logger { return rt.logger.Load() }

// Open starts a runner's session on the caller's process (mcpbridge.Opener).
func (rt *runtime) Open(r *http.Request, init mcpmsg.Message) (*mcpbridge.Session, []byte, error) {
	user := gateway.UpstreamUser(r.Context())
	cred := rt.spec.credential(r.Header.Get(rt.spec.CredHeader))
	// The tokens the caller's connection sent before (gateway.Connection.
	// Retired) are kept out of the process's log too: a program may have
	// cached one.
	var also []string
	if call := gateway.CallFrom(r); call != nil && cred != "" {
		call.Credential.EachSecret(func(s string) bool {
			if s != cred {
				also = append(also, s)
			}
			return true
		})
	}
	for range 3 { // a process retired or ended between ready and NewSession: take the next one
		w, err := rt.worker(user)
		if err != nil {
			return nil, nil, err
		}
		link, err := w.ready(r.Context(), cred, also)
		if errors.Is(err, errWorkerClosed) {
			continue // stopped (idle) just now: rt.worker makes a new one
		}
		if err != nil {
			return nil, nil, err
		}
		if s := link.NewSession(r.Context(), user, init); s != nil {
			return s, gateway.RPCResult(init.ID, link.InitializeResult()), nil
		}
	}
	return nil, nil, &mcpbridge.Unavailable{Reason: "the program of service " + rt.spec.Service + " keeps ending; retry later"}
}

// Down reports why the caller's process cannot take a session now.
func (rt *runtime) Down(r *http.Request) error {
	rt.mu.Lock()
	w := rt.workers[rt.keyFor(gateway.UpstreamUser(r.Context()))]
	rt.mu.Unlock()
	if w == nil {
		return nil
	}
	return w.down()
}

func (rt *runtime) keyFor(user string) string {
	if rt.spec.PerUser {
		return user
	}
	return ""
}

// worker returns the caller's worker, making it if need be; a per_user
// service over max_processes stops its least recently used idle process
// for it, or refuses.
func (rt *runtime) worker(user string) (*worker, error) {
	key := rt.keyFor(user)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return nil, &mcpbridge.Unavailable{Reason: "toolgate is stopping the program of service " + rt.spec.Service}
	}
	if w := rt.workers[key]; w != nil {
		return w, nil
	}
	if rt.places.Add(1) > int64(rt.spec.MaxProcs) { // the new worker's place
		var oldest *worker
		var oldestUse time.Time
		for _, w := range rt.workers {
			if busy, used := w.busy(); !busy && (oldest == nil || used.Before(oldestUse)) {
				oldest, oldestUse = w, used
			}
		}
		if oldest == nil {
			rt.places.Add(-1)
			return nil, &mcpbridge.Unavailable{Reason: fmt.Sprintf(
				"service %s runs as many programs as its max_processes allows (%d), all busy; retry later", rt.spec.Service, rt.spec.MaxProcs)}
		}
		rt.dropLocked(oldest.key)
		go oldest.stop("another user needed its place")
	}
	w := &worker{rt: rt, key: key, retiring: map[*process]struct{}{}}
	rt.workers[key] = w // its place is taken above
	if rt.janitor == nil && rt.spec.Idle > 0 {
		rt.janitor = make(chan struct{})
		go rt.sweep(rt.janitor)
	}
	return w, nil
}

// dropLocked forgets the worker of key and gives its place back (its
// retiring processes keep theirs until they end).
func (rt *runtime) dropLocked(key string) {
	if _, ok := rt.workers[key]; ok {
		delete(rt.workers, key)
		rt.places.Add(-1)
	}
}

// connectionGone stops the process of the user whose connection to svc
// key names (gateway.ConnectionKey; "" names every user's), once storage
// confirms that the connection is gone (they disconnected, or the
// provider refused the grant): the process holds its credential in its
// environment. A user connected again keeps theirs (their next request
// replaces it); one whose connection cannot be read keeps it until their
// next request or the idle timeout.
func (rt *runtime) connectionGone(app *gateway.App, svc *gateway.Service, key string) {
	gone := rt.holding(func(user string) bool { return key == "" || gateway.ConnectionKey(svc.ID, user) == key })
	if len(gone) == 0 {
		return
	}
	go rt.stopGone(gone, func(user string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(svc.Timeout))
		defer cancel()
		return app.GrantFor(ctx, svc, user, true)
	})
}

// held is a user's worker and the credential its process held when their
// connection was reported gone.
type held struct {
	w    *worker
	cred string
}

// holding lists the workers of the users match selects, with the
// credential each holds now.
func (rt *runtime) holding(match func(user string) bool) map[string]held {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	gone := map[string]held{}
	for user, w := range rt.workers {
		if match(user) {
			w.mu.Lock()
			gone[user] = held{w, w.cred}
			w.mu.Unlock()
		}
	}
	return gone
}

// stopGone stops each worker of gone whose user grantFor finds without a
// connection. A worker that took another credential since it was listed
// (the user connected again, and a request of theirs came in between the
// read and now) holds the new one and goes on; a request that finds its
// worker stopped gets a new one.
func (rt *runtime) stopGone(gone map[string]held, grantFor func(user string) (string, error)) {
	for user, h := range gone {
		if grant, err := grantFor(user); err != nil || grant != "" {
			continue
		}
		rt.mu.Lock()
		w := rt.workers[user]
		stale := w == h.w && w.holds(h.cred)
		if stale {
			rt.dropLocked(user)
		}
		rt.mu.Unlock()
		if stale {
			w.stop("its user disconnected the service")
		}
	}
}

// sweep stops idle processes until the runtime is destroyed.
func (rt *runtime) sweep(stop chan struct{}) {
	every := min(max(rt.spec.Idle/4, 50*time.Millisecond), time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		cutoff := now().Add(-rt.spec.Idle)
		rt.mu.Lock()
		var idle []*worker
		for key, w := range rt.workers {
			if busy, used := w.busy(); !busy && used.Before(cutoff) {
				idle = append(idle, w)
				rt.dropLocked(key)
			}
		}
		rt.mu.Unlock()
		for _, w := range idle {
			w.stop("idle for " + rt.spec.Idle.String())
		}
	}
}

func (rt *runtime) recordRestart(delay time.Duration, reason string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	// Counted with the record, so that whoever sees a restart recorded
	// sees it counted.
	stdioMetrics.restarts.WithLabelValues(rt.spec.Service, reason).Inc()
	rt.restarts = append(rt.restarts, restart{Delay: delay, Reason: reason})
	if len(rt.restarts) > 64 {
		rt.restarts = rt.restarts[1:]
	}
}

// Destruct stops every process of the service: after their grace period,
// none is left (caddy.Destructor).
func (rt *runtime) Destruct() error {
	rt.mu.Lock()
	rt.closed = true
	workers := rt.workers
	rt.workers = map[string]*worker{}
	rt.places.Add(-int64(len(workers)))
	if rt.janitor != nil {
		close(rt.janitor)
	}
	rt.mu.Unlock()
	rt.bridge.Close()
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.stop("toolgate stopped the service") })
	}
	wg.Wait()
	return nil
}

// Worker states.
type state uint8

const (
	stateStopped  state = iota // no process; the next request starts one
	stateStarting              // a process is starting and initializing
	stateRunning
	stateBackoff // the process ended; a new one starts after a delay
	stateClosed  // the worker was stopped for good
)

// worker keeps one process running for a user (or for everyone): it starts
// it on demand, restarts it with backoff when it ends, and stops it.
type worker struct {
	rt  *runtime
	key string

	mu        sync.Mutex
	state     state
	cred      string   // the credential the process got
	also      []string // more secrets kept out of its log (see Open)
	proc      *process
	link      *mcpbridge.Link
	started   chan struct{} // closed when the start in progress ends
	startedAt time.Time
	failures  int // ends in a row without a stable run
	retryAt   time.Time
	lastEnd   string // why the last process ended
	timer     interface{ Stop() bool }
	lastUse   time.Time
	retiring  map[*process]struct{} // old processes finishing their requests
}

// ready returns the link to a running, initialized process that holds
// cred, starting one (or a replacement, when the credential changed) and
// waiting for it as long as ctx allows.
func (w *worker) ready(ctx context.Context, cred string, also []string) (*mcpbridge.Link, error) {
	for {
		w.mu.Lock()
		w.lastUse = now()
		switch w.state {
		case stateRunning:
			if w.cred == cred {
				l := w.link
				w.mu.Unlock()
				return l, nil
			}
			w.replaceLocked(cred, also)
		case stateStopped:
			w.startLocked(cred, also)
		case stateBackoff:
			if w.cred != cred {
				// The process that keeps ending was started with a
				// credential the caller has replaced since (a revoked
				// token a program checks as it starts): the restart
				// already scheduled starts it with the new one. Not
				// sooner: a caller rotating bad tokens must not start a
				// process per request.
				w.cred, w.also = cred, also
			}
			err := w.downLocked()
			w.mu.Unlock()
			return nil, err
		case stateClosed:
			w.mu.Unlock()
			return nil, errWorkerClosed
		}
		started := w.started
		w.mu.Unlock()
		select {
		case <-started:
		case <-ctx.Done():
			return nil, &mcpbridge.Unavailable{Reason: "the program of service " + w.rt.spec.Service + " did not start in time"}
		}
	}
}

// holds reports whether the worker's process (running, starting or to be
// restarted) holds cred.
func (w *worker) holds(cred string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cred == cred
}

// down reports why no session can be made now: the process is waiting to
// be restarted.
func (w *worker) down() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != stateBackoff {
		return nil
	}
	return w.downLocked()
}

func (w *worker) downLocked() error {
	wait := max(w.retryAt.Sub(now()), 0).Round(time.Millisecond)
	return &mcpbridge.Unavailable{Reason: fmt.Sprintf("the program of service %s %s; toolgate restarts it in %s",
		w.rt.spec.Service, w.lastEnd, wait)}
}

// busy reports whether a request is in progress or a stream open on the
// worker's process, and when it was last used.
func (w *worker) busy() (bool, time.Time) {
	w.mu.Lock()
	link, used := w.link, w.lastUse
	starting := w.state == stateStarting
	retiring := len(w.retiring) > 0 // finishing calls in progress
	w.mu.Unlock()
	if starting || retiring {
		return true, used
	}
	if link == nil {
		return false, used
	}
	b, linkUsed := link.Busy()
	if linkUsed.After(used) {
		used = linkUsed
	}
	return b, used
}

// startLocked starts a process with cred (counted in procs from now on).
func (w *worker) startLocked(cred string, also []string) {
	w.rt.procs.Add(1)
	w.state, w.cred, w.also = stateStarting, cred, also
	w.started = make(chan struct{})
	go w.run(cred, also, w.started)
}

// replaceLocked sets the running process aside and starts one with cred.
// The old one takes no new sessions and stops once its requests in
// progress are answered — or at once, its calls in progress failing, when
// the service has no room for it beside the one that replaces it
// (max_processes counts retiring processes: a user who stores new
// credentials does not get a process for each).
func (w *worker) replaceLocked(cred string, also []string) {
	p, link := w.proc, w.link
	w.proc, w.link = nil, nil
	w.retiring[p] = struct{}{}
	room := w.rt.places.Add(1) <= int64(w.rt.spec.MaxProcs) // the old one's place, beside its worker's
	w.startLocked(cred, also)
	if !room {
		go p.stop(w.rt.spec.Stop)
		return
	}
	// Its idle callback runs on the program's output reader, which p.stop
	// waits for: it stops the process on a goroutine of its own.
	go link.Retire(func() { go p.stop(w.rt.spec.Stop) })
}

// run starts a process and initializes it.
func (w *worker) run(cred string, also []string, started chan struct{}) {
	s := w.rt.spec
	p, err := startProcess(s, cred, also, w.rt.log())
	if err != nil {
		w.rt.procs.Add(-1) // the place startLocked took
		w.rt.log().Error("cannot start the program", zap.String("service", s.Service), zap.Error(err))
		w.ended(nil, started, "could not be started ("+err.Error()+")", "start_failed")
		return
	}
	cfg := mcpbridge.LinkConfig{Send: p.send, Owned: true, MayLog: p.stdoutLog.take}
	if s.CredEnv != "" {
		// A request with another credential (a refreshed token) is for a
		// process that holds that one.
		cfg.OnRequest = func(r *http.Request) bool { return s.credential(r.Header.Get(s.CredHeader)) == cred }
	}
	link := w.rt.bridge.NewLink(cfg)
	go p.serve(link, func(why, reason string) {
		w.rt.procs.Add(-1)
		// The worker knows first, so that a request finding its session
		// gone is told the program is restarting.
		w.ended(p, started, why, reason)
		link.Close(&mcpbridge.Unavailable{Reason: "the program of service " + s.Service + " " + why})
	})
	w.mu.Lock()
	if w.started != started || w.state != stateStarting {
		w.mu.Unlock()
		p.stop(s.Stop) // the worker was stopped meanwhile
		return
	}
	w.proc = p
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.StartTimeout)
	version, err := link.Initialize(ctx, initializeParams())
	cancel()
	if err != nil {
		p.kill("init_failed", "did not initialize ("+err.Error()+")")
		return
	}
	w.mu.Lock()
	if w.proc == p && w.state == stateStarting {
		w.state, w.link, w.startedAt = stateRunning, link, now()
		close(started)
	}
	w.mu.Unlock()
	if !mcpmsg.LoggedRevision(version) {
		// The program's own text, which may be a secret it was given:
		// not logged. Runners are refused this version (toolgate_proxy).
		version = "not written as MCP names its revisions"
	}
	w.rt.log().Info("program started", zap.String("service", s.Service), zap.Int("pid", p.pid),
		zap.String("protocol_version", version))
}

// ended handles the end of a process (p nil: it never started). A process
// toolgate stopped on purpose is done with; any other is restarted after
// the backoff delay.
func (w *worker) ended(p *process, started chan struct{}, why, reason string) {
	// The restart is recorded once w.mu is let go: recordRestart takes
	// rt.mu, which is held while workers' locks are taken (runtime.worker,
	// sweep), never the other way round.
	delay, ok := w.endedLocked(p, started, why)
	if !ok {
		return
	}
	w.rt.log().Warn("program ended; restarting it", zap.String("service", w.rt.spec.Service),
		zap.String("reason", why), zap.Duration("delay", delay))
	w.rt.recordRestart(delay, reason)
}

// endedLocked is ended's part under w.mu: it reports whether a restart was
// scheduled, and after how long.
func (w *worker) endedLocked(p *process, started chan struct{}, why string) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p != nil {
		if _, ok := w.retiring[p]; ok {
			delete(w.retiring, p)
			w.rt.places.Add(-1)
			return 0, false
		}
		if w.proc != p {
			return 0, false // stopped on purpose
		}
	} else if w.started != started {
		return 0, false
	}
	if w.state == stateClosed {
		return 0, false // stopped for good while its start failed
	}
	if w.state == stateRunning && now().Sub(w.startedAt) >= stablePeriod {
		w.failures = 0
	}
	w.proc, w.link = nil, nil
	w.failures++
	delay := backoff(w.failures, random)
	w.state, w.retryAt, w.lastEnd = stateBackoff, now().Add(delay), why
	if w.started != nil {
		select {
		case <-w.started:
		default:
			close(w.started)
		}
	}
	w.timer = afterFunc(delay, w.restart)
	return delay, true
}

// restart starts a new process after the backoff delay, unless the
// service went unused meanwhile: then the next request starts it.
func (w *worker) restart() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != stateBackoff {
		return
	}
	if idle := w.rt.spec.Idle; idle > 0 && now().Sub(w.lastUse) >= idle {
		w.state = stateStopped
		return
	}
	w.startLocked(w.cred, w.also)
}

// stop stops the worker's processes for good, each within its grace
// period.
func (w *worker) stop(why string) {
	w.mu.Lock()
	w.state = stateClosed
	if w.timer != nil {
		w.timer.Stop()
	}
	procs := make([]*process, 0, 1+len(w.retiring))
	if w.proc != nil {
		procs = append(procs, w.proc)
	}
	for p := range w.retiring {
		procs = append(procs, p)
	}
	link := w.link
	w.proc, w.link = nil, nil
	if w.started != nil {
		select {
		case <-w.started:
		default:
			close(w.started)
		}
	}
	w.mu.Unlock()
	if link != nil {
		link.Close(&mcpbridge.Unavailable{Reason: "toolgate stopped the program of service " + w.rt.spec.Service + " (" + why + ")"})
	}
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { p.stop(w.rt.spec.Stop) })
	}
	wg.Wait()
}
