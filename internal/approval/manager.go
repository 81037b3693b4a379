package approval

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/internal/storecache"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	gateway.RegisterOption("approvals", parseCaddyfile)
}

// Config is the approvals option of the toolgate global block:
//
//	approvals {
//		webhook <url> {
//			secret            <secret>     # required: signs every delivery
//			include_arguments              # add the arguments, masked as approvers see them
//			timeout           <duration>   # per delivery attempt, default 10s
//		}
//		max_pending_per_user <n>                # default 100
//	}
type Config struct {
	// Webhook announces new pending approvals, for chat tools to notify
	// approvers.
	Webhook *Webhook `json:"webhook,omitempty"`
	// MaxPendingPerUser bounds the approvals one person's calls may have
	// waiting for a decision at once (each keeps the call's arguments, up
	// to max_request_size, until it is decided or expires). A call that
	// would ask past it is refused with a retryable error. Default 100.
	MaxPendingPerUser int `json:"max_pending_per_user,omitempty"`
}

// DefaultMaxPendingPerUser is max_pending_per_user's default.
const DefaultMaxPendingPerUser = 100

// ErrTooManyPending refuses an ask of a person who has
// max_pending_per_user approvals waiting already.
type ErrTooManyPending struct{ Max int }

func (e *ErrTooManyPending) Error() string {
	return fmt.Sprintf("you have %d approvals waiting for a decision or approved and not used yet (max_pending_per_user): retry once some were denied, used or expired, or their session ended", e.Max)
}

// Webhook is where new pending approvals are announced: an HTTPS POST of a
// JSON body, signed with HMAC-SHA256 over the timestamp and the body, and
// retried with backoff. It needs the toolgate public_url: the approval
// page it links to is there, never on a host a runner's request named.
type Webhook struct {
	// URL receives the POSTs; https unless on a loopback address.
	URL string `json:"url"`
	// Secret signs each delivery (X-Toolgate-Signature). At least 32
	// bytes; use a placeholder such as {env.APPROVAL_WEBHOOK_SECRET} (one
	// Caddy does not know is refused: its text would be the secret).
	Secret string `json:"secret"`
	// IncludeArguments adds the call's arguments, masked by the policy's
	// data.toolgate.log.mask as approvers see them. Off by default.
	IncludeArguments bool `json:"include_arguments,omitempty"`
	// Timeout bounds one delivery attempt. Default 10s, at most 1m.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

func parseCaddyfile(d *caddyfile.Dispenser) (any, error) {
	var cfg Config
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	err := caddyopt.Block(d, "approvals", func(opt string) error {
		switch opt {
		case "webhook":
			w := new(Webhook)
			if !d.NextArg() {
				return d.ArgErr()
			}
			w.URL = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			if err := caddyopt.Block(d, "webhook", func(sub string) error {
				switch sub {
				case "secret":
					return caddyopt.String(d, &w.Secret)
				case "include_arguments":
					w.IncludeArguments = true
					return caddyopt.NoArgs(d)
				case "timeout":
					return caddyopt.Duration(d, &w.Timeout)
				}
				return caddyopt.Unknown(d, "webhook")
			}); err != nil {
				return err
			}
			cfg.Webhook = w
			return nil
		case "max_pending_per_user":
			var v string
			if err := caddyopt.String(d, &v); err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return d.Errf("approvals: max_pending_per_user must be a positive whole number, not %q", v)
			}
			cfg.MaxPendingPerUser = n
			return nil
		}
		return caddyopt.Unknown(d, "approvals")
	})
	return cfg, err
}

// Manager holds the approvals of one config: the store, the webhook,
// metrics, the audit log, and the calls waiting for a decision.
type Manager struct {
	Store  *Store
	app    *gateway.App
	cfg    Config
	hook   *notifier
	audit  *zap.Logger
	logger *zap.Logger

	mu      sync.Mutex
	waiting map[string][]chan struct{} // approval id → calls held for its decision
	// results: the sessions (requester and session ref) that had a result
	// withheld through this replica, until when: only their calls look for
	// a released result before going upstream.
	results  map[string]time.Time
	watches  map[string]struct{} // WatchDecision's keys
	watching map[string]int      // WatchDecision's watches by requester
	// decisions hears of decisions made on other replicas (with a storage
	// that announces changes), so that waiters wake at once instead of at
	// their next poll.
	decisions *storecache.Watch
	// withheld follows the stored marks of sessions that had a result
	// withheld through any replica (see MayRelease).
	withheld      *storecache.Watch
	withheldCache *storecache.Cache[time.Time]
}

// slowPoll is how often a waiter reads its approval again while decisions
// on other replicas are announced: only a lost announcement needs it.
const slowPoll = 30 * time.Second

// For returns the approvals of app's config, made on first use. Handlers
// call it in Provision.
func For(ctx caddy.Context, app *gateway.App) (*Manager, error) {
	v, err := app.Shared("approvals", func() (any, error) { return newManager(ctx, app) })
	if err != nil {
		return nil, err
	}
	m := v.(*Manager)
	app.TakeClientAnswers(elicitationPrefix, m.clientAnswer)
	return m, nil
}

func newManager(ctx caddy.Context, app *gateway.App) (*Manager, error) {
	m := &Manager{app: app, audit: caddy.Log().Named("toolgate.audit"), logger: app.Logger().Named("approvals"),
		waiting: map[string][]chan struct{}{}, results: map[string]time.Time{}, watches: map[string]struct{}{}, watching: map[string]int{}}
	if raw := app.Extension("approvals"); raw != nil {
		if err := jsonStrict(raw, &m.cfg); err != nil {
			return nil, fmt.Errorf("approvals: %v", err)
		}
	}
	if m.cfg.MaxPendingPerUser < 0 {
		return nil, errors.New("approvals: max_pending_per_user must be positive")
	}
	if m.cfg.MaxPendingPerUser == 0 {
		m.cfg.MaxPendingPerUser = DefaultMaxPendingPerUser
	}
	if app.Cipher() == nil {
		return nil, errors.New("approvals keep the arguments of the calls they are about, encrypted: configure a cipher (local, vault_transit or kms)")
	}
	// The approvals' key, sealed by the cipher, tells on a storage sealed
	// before it had a canary whether the cipher's key opens its records.
	app.AddSealedWitness(macKeyName, macKeyContext)
	m.Store = NewStore(app)
	if storage := app.Storage(); storage != nil {
		m.decisions = storecache.NewWatch(storage, prefix+"/")
		m.decisions.OnChange(func(c storecache.Change) {
			if c.Reset {
				m.wakeAll() // announcements may have been lost meanwhile
				return
			}
			m.wake(path.Base(c.Key))
		})
		m.withheld = storecache.NewWatch(storage, withheldPrefix)
		m.withheldCache = storecache.NewCache[time.Time](m.withheld, time.Duration(app.CacheTTL), func() time.Time { return now() })
	}
	if w := m.cfg.Webhook; w != nil {
		repl := caddy.NewReplacer()
		w.URL = repl.ReplaceKnown(w.URL, "")
		var err error
		if w.Secret, err = caddyopt.Secret(repl, w.Secret); err != nil {
			return nil, fmt.Errorf("approvals webhook: secret %w", err)
		}
		if err := w.validate(); err != nil {
			return nil, err
		}
		if app.PublicURL == "" {
			// Without it, the page an announcement links approvers to would
			// be on whatever host the runner's request named.
			return nil, errors.New("approvals webhook: set the toolgate public_url: announcements link approvers to the approval page there")
		}
		m.hook = newNotifier(w, app.HTTPClient(), m.logger)
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return nil, err
	}
	app.OnStart(m.start)
	return m, nil
}

func (w *Webhook) validate() error {
	if err := caddyopt.FetchURL(w.URL); err != nil {
		return fmt.Errorf("approvals webhook %w", err)
	}
	if len(w.Secret) < 32 {
		return errors.New("approvals webhook: secret must be at least 32 bytes (is its environment variable set?)")
	}
	if w.Timeout < 0 || time.Duration(w.Timeout) > time.Minute {
		// Deliveries are made one at a time: a longer wait for one
		// receiver holds up every announcement behind it.
		return errors.New("approvals webhook: timeout must be between 0 (the default, 10s) and 1m")
	}
	return nil
}

// start begins the webhook deliveries and the periodic sweep, until the
// app stops.
func (m *Manager) start() {
	if m.hook != nil {
		m.hook.start(m.app.Done())
	}
	if m.decisions != nil {
		if err := m.decisions.Follow(m.app.Done(), m.logger); err != nil {
			m.logger.Warn("decisions on other replicas are seen at the next poll", zap.Error(err))
		}
		if err := m.withheld.Follow(m.app.Done(), m.logger); err != nil {
			m.logger.Warn("results withheld through other replicas are seen after cache_ttl", zap.Error(err))
		}
	}
	go func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-m.app.Done():
				return
			case <-tick.C:
				m.sweep(context.Background())
			}
		}
	}()
}

func (m *Manager) sweep(ctx context.Context) {
	m.sweepWithheld(ctx)
	expired, err := m.Store.Sweep(ctx)
	if err != nil {
		m.logger.Warn("sweeping approvals", zap.Error(err))
		return
	}
	for _, a := range expired {
		m.event(a, "expired", nil)
	}
	if pending, err := m.Store.Pending(ctx); err == nil {
		metrics.pending.Set(float64(len(pending)))
	}
}

// URL is the page where a is decided.
func URL(base string, a *Approval) string {
	return base + gateway.ConsolePath + "approvals/" + url.PathEscape(a.ID)
}

// event audits and counts what happened to a.
func (m *Manager) event(a *Approval, what string, by *gateway.Caller) { m.eventFor(a, what, by, "") }

// eventFor is event for an approval that let a call through (consumed,
// used) or a denial that refused one (refused): its decision_id is that
// call's decision (callDecision), so that the trail ties the call to the
// approval that decided it, and requested_decision_id the decision that
// asked.
func (m *Manager) eventFor(a *Approval, what string, by *gateway.Caller, callDecision string) {
	metrics.total.WithLabelValues(a.Service, what).Inc()
	if ce := m.audit.Check(zap.InfoLevel, "approval"); ce != nil {
		decision := a.DecisionID
		if callDecision != "" {
			decision = callDecision
		}
		fields := []zap.Field{
			zap.String("event", what), zap.String("approval_id", a.ID), zap.String("stage", a.Stage),
			zap.String("decision_id", decision), zap.String("user", a.Requester),
			zap.String("service", a.Service), zap.String("method", a.Method), zap.String("tool", a.Tool),
			zap.String("arguments_sha256", a.ArgumentsSHA256),
		}
		if callDecision != "" && callDecision != a.DecisionID {
			fields = append(fields, zap.String("requested_decision_id", a.DecisionID))
		}
		if by != nil {
			fields = append(fields, zap.String("approver", by.User))
		}
		if a.Scope != "" {
			fields = append(fields, zap.String("scope", a.Scope))
		}
		if a.Note != "" && (what == "approved" || what == "denied") {
			fields = append(fields, zap.String("note", a.Note))
		}
		ce.Write(fields...)
	}
}

// Kinds of Resolution.
const (
	Allow   = "allow"   // an approval lets the call through
	Pending = "pending" // the call waits for a decision
	Denied  = "denied"  // a person denied the identical call
	Release = "release" // an approved withheld result goes to the runner
)

// Resolution is what approvals make of an ask.
type Resolution struct {
	Kind     string
	Approval *Approval
	Result   []byte // for Release: the withheld result, exactly
}

// Ask is an ask of a policy, for Resolve.
type Ask struct {
	Call         Call
	Stage        string // StageRequest or StageResult
	Spec         Spec
	Decision     *gateway.Decision
	Revision     string
	Masked       []byte // the arguments as approvers see them
	Result       []byte // the result a result-stage ask withholds
	MaskedResult []byte // that result as approvers see it
	Base         string // the gateway's base URL, for the approval page
}

// Resolve decides what becomes of an ask: an approval of the identical call
// lets it through (a once approval is consumed here, once), a denial
// answers it, a pending approval is the one to wait for; otherwise a new
// approval is created and announced.
func (m *Manager) Resolve(ctx context.Context, ask Ask) (res Resolution, err error) {
	callKey, toolKey, digest := ask.Call.Keys()
	// Identical calls resolve one at a time (on every replica), so that a
	// burst of retries finds one pending approval instead of making many.
	unlock, err := m.Store.lock(ctx, "toolgate_approval_call_"+callKey)
	if err != nil {
		return Resolution{}, err
	}
	defer unlock()
	found, err := m.Store.ForCall(ctx, callKey, toolKey)
	if err != nil {
		return Resolution{}, err
	}
	for _, a := range found {
		if a.Stage != ask.Stage {
			continue
		}
		exact := a.CallKey == callKey
		switch a.Status() {
		case StateExpired:
			if a.HasContents() {
				m.expire(ctx, a)
			}
		case StateApproved:
			switch {
			case !a.Covers(ask.Spec):
				// Its decider may not decide this ask, or the ask does not
				// offer approvals of its scope or age: it asks anew.
			case a.Scope == ScopeTool && a.ToolKey == toolKey:
				m.eventFor(a, "used", nil, ask.Decision.ID)
				return Resolution{Kind: Allow, Approval: a}, nil
			case !exact:
			case a.Stage == StageResult:
				// The identical retry gets the withheld result (the caller
				// released it earlier on the way in; here the result was
				// asked about again: release the approved one).
				if res, ok, err := m.release(ctx, a); err != nil || ok {
					return res, err
				}
			case a.Scope == ScopeSession:
				m.eventFor(a, "used", nil, ask.Decision.ID)
				return Resolution{Kind: Allow, Approval: a}, nil
			case a.Scope == ScopeOnce:
				got, ok, err := m.Store.Consume(ctx, a.ID)
				if err != nil {
					return Resolution{}, err
				}
				if ok {
					m.eventFor(got, "consumed", nil, ask.Decision.ID)
					return Resolution{Kind: Allow, Approval: got}, nil
				}
			}
		case StateDenied:
			if exact {
				m.eventFor(a, "refused", nil, ask.Decision.ID)
				return Resolution{Kind: Denied, Approval: a}, nil
			}
		case StatePending:
			if exact && a.AsksLike(ask.Spec) {
				return Resolution{Kind: Pending, Approval: a}, nil
			}
		}
	}
	a := &Approval{
		ID: gateway.NewID(), State: StatePending, Stage: ask.Stage,
		Requester: ask.Call.Requester, Session: ask.Call.Session, StoredSession: ask.Call.SessionStored, Service: ask.Call.Service,
		Method: ask.Call.Method, Tool: ask.Call.Tool, ArgumentsSHA256: digest,
		DecisionID: ask.Decision.ID, Reason: ask.Decision.Reason, Revision: ask.Revision,
		Approvers: ask.Spec.Approvers.Users, ApproverGroups: ask.Spec.Approvers.Groups,
		RequesterMayApprove: ask.Spec.RequesterMayApprove, Scopes: ask.Spec.Scopes, InBand: ask.Spec.InBand,
		CreatedAt: now().UTC(), CallKey: callKey, ToolKey: toolKey,
	}
	a.ExpiresAt = a.CreatedAt.Add(ask.Spec.TTL)
	if ask.Stage == StageResult {
		// A withheld result can only be released to the identical call once.
		a.Scopes = []string{ScopeOnce}
	}
	// A person's pending approvals are counted and made one at a time (on
	// every replica), under max_pending_per_user.
	unlockRequester, err := m.Store.lock(ctx, "toolgate_approval_requester_"+hashOf(a.Requester))
	if err != nil {
		return Resolution{}, err
	}
	defer unlockRequester()
	if n, err := m.Store.CountPending(ctx, a.Requester); err != nil {
		return Resolution{}, err
	} else if n >= m.cfg.MaxPendingPerUser {
		return Resolution{}, &ErrTooManyPending{Max: m.cfg.MaxPendingPerUser}
	}
	contents := Contents{Arguments: Canonical(ask.Call.Arguments), Masked: ask.Masked, Result: ask.Result, MaskedResult: ask.MaskedResult}
	if err := m.Store.Create(ctx, a, contents); err != nil {
		return Resolution{}, err
	}
	m.event(a, "requested", nil)
	metrics.pending.Inc()
	if a.Stage == StageResult {
		m.noteResult(ctx, a)
	}
	if m.hook != nil {
		m.hook.announce(a, URL(ask.Base, a), m.cfg.Webhook.IncludeArguments, ask.Masked)
	}
	return Resolution{Kind: Pending, Approval: a}, nil
}

// Released returns the withheld result approved for the identical call, if
// there is one, consuming it: the runner's retry gets exactly the result
// the approver saw, without the upstream being called again.
func (m *Manager) Released(ctx context.Context, call Call) (Resolution, bool, error) {
	callKey, toolKey, _ := call.Keys()
	found, err := m.Store.ForCall(ctx, callKey, toolKey)
	if err != nil {
		return Resolution{}, false, err
	}
	for _, a := range found {
		if a.Stage == StageResult && a.CallKey == callKey && a.Status() == StateApproved {
			if res, ok, err := m.release(ctx, a); err != nil || ok {
				return res, ok, err
			}
		}
	}
	return Resolution{}, false, nil
}

func (m *Manager) release(ctx context.Context, a *Approval) (Resolution, bool, error) {
	// Opened before it is used up, which drops it (see Store.Consume).
	c, err := m.Store.Open(ctx, a)
	if err != nil {
		if cur, gerr := m.Store.Get(ctx, a.ID); gerr == nil && cur.Status() != StateApproved {
			return Resolution{}, false, nil // another retry released it meanwhile
		}
		return Resolution{}, false, err
	}
	got, ok, err := m.Store.Consume(ctx, a.ID)
	if err != nil || !ok {
		return Resolution{}, false, err
	}
	m.event(got, "released", nil)
	return Resolution{Kind: Release, Approval: got, Result: c.Result}, true, nil
}

// expire drops the sealed contents of an expired approval: what it was
// about (and a withheld result) is of no use any more.
func (m *Manager) expire(ctx context.Context, a *Approval) {
	_, _ = m.Store.clearContents(ctx, a.ID, StateExpired)
	m.event(a, "expired", nil)
}

// Decide approves or denies an approval for caller, audits it and wakes
// the calls held for it on this replica.
func (m *Manager) Decide(ctx context.Context, id string, caller *gateway.Caller, approve bool, scope, note string) (*Approval, error) {
	if len(note) > 1000 {
		return nil, ErrNote
	}
	a, err := m.Store.Decide(ctx, id, caller, approve, scope, note)
	if err != nil {
		return nil, err
	}
	m.event(a, a.State, caller)
	metrics.pending.Dec()
	if a.Stage == StageResult {
		m.noteResult(ctx, a)
	}
	m.wake(id)
	if m.decisions != nil {
		m.decisions.Changed(ctx, recordKey(id)) // the other replicas' waiters
	}
	return a, nil
}

// Decided reads the approval id again for the call held for it, whose
// decision is callDecision: Allow (an approval for once is consumed here),
// Denied, Pending, or, when it expired or another retry used it, a
// Resolution with no Kind.
func (m *Manager) Decided(ctx context.Context, id, callDecision string) (Resolution, error) {
	a, err := m.Store.Get(ctx, id)
	if err != nil {
		return Resolution{}, err
	}
	switch a.Status() {
	case StatePending:
		return Resolution{Kind: Pending, Approval: a}, nil
	case StateDenied:
		return Resolution{Kind: Denied, Approval: a}, nil
	case StateApproved:
		if a.Scope != ScopeOnce {
			m.eventFor(a, "used", nil, callDecision)
			return Resolution{Kind: Allow, Approval: a}, nil
		}
		got, ok, err := m.Store.Consume(ctx, id)
		if err != nil || !ok {
			return Resolution{}, err
		}
		m.eventFor(got, "consumed", nil, callDecision)
		return Resolution{Kind: Allow, Approval: got}, nil
	}
	return Resolution{Approval: a}, nil
}

// Decidable returns the pending approvals caller may decide.
func (m *Manager) Decidable(ctx context.Context, caller *gateway.Caller) ([]*Approval, error) {
	pending, err := m.Store.Pending(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pending, func(a *Approval) bool { return !a.MayDecide(caller) }), nil
}

// Visible reports whether caller may see a: its requester, and whoever may
// decide it.
func (a *Approval) Visible(caller *gateway.Caller) bool {
	return caller.User == a.Requester || a.MayDecide(caller)
}

// Wait returns when the approval id is decided on this replica or
// announced as decided by another, or at the latest after poll, so that a
// decision is seen by reading the store again even when its announcement
// was lost (Poll says how often that is needed).
func (m *Manager) Wait(ctx context.Context, id string, poll time.Duration) {
	ch := make(chan struct{})
	m.mu.Lock()
	m.waiting[id] = append(m.waiting[id], ch)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.waiting[id] = slices.DeleteFunc(m.waiting[id], func(c chan struct{}) bool { return c == ch })
		if len(m.waiting[id]) == 0 {
			delete(m.waiting, id)
		}
		m.mu.Unlock()
	}()
	t := time.NewTimer(poll)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-ch:
	}
}

// Poll is how often a waiter must read its approval again: base, or, while
// decisions on other replicas are announced, rarely (an announcement lost
// is the only reason left).
func (m *Manager) Poll(base time.Duration) time.Duration {
	if m.decisions != nil && m.decisions.Live() {
		return max(base, slowPoll)
	}
	return base
}

// wakeAll wakes every waiter.
func (m *Manager) wakeAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, chs := range m.waiting {
		for _, ch := range chs {
			close(ch)
		}
		delete(m.waiting, id)
	}
}

func (m *Manager) wake(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ch := range m.waiting[id] {
		close(ch)
	}
	delete(m.waiting, id)
}
