package approval

// Adversarial review of what toolgate sends to third parties about
// approvals: the approval webhook (notify.go), its configuration, and a
// hostile or broken receiver.

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/logtest"
	"github.com/toolgate/toolgate/internal/testcaddy"
	"github.com/toolgate/toolgate/modules/gateway"

	_ "github.com/toolgate/toolgate/modules/ciphers/local"
)

const hookSecret = "a-webhook-secret-of-at-least-32-bytes!!"

// hookClient is a client like the gateway's (it follows no redirect).
func hookClient() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// hookManager is authzManager with a webhook to url; its deliveries run
// until the test ends, with the backoff given (nil: the real one).
func hookManager(t *testing.T, url string, include bool, backoff []time.Duration) (*Manager, *observer.ObservedLogs) {
	t.Helper()
	m := authzManager(t)
	core, logs := observer.New(zapcore.DebugLevel)
	m.logger = zap.New(core)
	m.cfg.Webhook = &Webhook{URL: url, Secret: hookSecret, IncludeArguments: include, Timeout: caddy.Duration(2 * time.Second)}
	m.hook = newNotifier(m.cfg.Webhook, hookClient(), m.logger)
	if backoff != nil {
		m.hook.backoff = backoff
	}
	return m, logs
}

// runHook starts m's deliveries; the stop it returns (also called when
// the test ends) stops them as the app's Done does.
func runHook(t *testing.T, m *Manager) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var once sync.Once
	stop = func() { once.Do(func() { close(done) }) }
	t.Cleanup(stop)
	m.hook.start(done)
	return stop
}

type hookDelivery struct {
	header http.Header
	body   []byte
}

// Holds: what an announcement carries. The call's raw arguments (a PIN the
// policy masks), the approval's digest of the arguments (approvers could
// match guesses of a masked PIN against arguments_sha256, which the
// approval's view no longer shows), the toolgate session's ref, the call
// and tool keys (digests too) and the approvers' internals never reach the
// receiver; with include_arguments only the masked copy does, without it
// no arguments at all. The signature is the HMAC over exactly the bytes
// received and the timestamp header; a retry keeps the delivery id and
// signs a fresh timestamp.
func TestWebhookHoldsPayloadCarriesNoDigestSessionOrRawArguments(t *testing.T) {
	for _, include := range []bool{true, false} {
		got := make(chan hookDelivery, 8)
		var first atomic.Bool
		receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got <- hookDelivery{r.Header.Clone(), b}
			if !first.Swap(true) {
				w.WriteHeader(http.StatusServiceUnavailable) // retried
			}
		}))
		t.Cleanup(receiver.Close)
		m, _ := hookManager(t, receiver.URL, include, []time.Duration{50 * time.Millisecond})
		runHook(t, m)
		ask := authzAsk("alice@example.com", "ref-s1", `{"account":"DE89","pin":"918273"}`,
			authzSpec(t, `{"approvers":{"groups":["secops"]},"requester_may_approve":false}`), "r1")
		ask.Masked = []byte(`{"account":"DE89","pin":"[masked]"}`)
		res, err := m.Resolve(context.Background(), ask)
		if err != nil || res.Kind != Pending {
			t.Fatalf("control: %+v, %v", res, err)
		}
		a := res.Approval
		var ds []hookDelivery
		for len(ds) < 2 {
			select {
			case d := <-got:
				ds = append(ds, d)
			case <-time.After(5 * time.Second):
				t.Fatalf("include=%v: %d deliveries, want 2 (one retry)", include, len(ds))
			}
		}
		for _, d := range ds {
			ts, _ := strconv.ParseInt(d.header.Get("X-Toolgate-Timestamp"), 10, 64)
			if want := Signature(hookSecret, ts, d.body); !hmac.Equal([]byte(d.header.Get("X-Toolgate-Signature")), []byte(want)) {
				t.Errorf("the signature does not verify over the body received")
			}
			if s := string(d.body); strings.Contains(s, "918273") || strings.Contains(s, a.ArgumentsSHA256) ||
				strings.Contains(s, "ref-s1") || strings.Contains(s, a.CallKey) || strings.Contains(s, a.ToolKey) ||
				strings.Contains(s, "sha256") || strings.Contains(s, `"session":`) || strings.Contains(s, hookSecret) {
				t.Errorf("include=%v: the announcement carries more than it should: %s", include, s)
			}
			var body struct {
				Delivery string
				Approval map[string]json.RawMessage
			}
			if err := json.Unmarshal(d.body, &body); err != nil || body.Delivery != d.header.Get("X-Toolgate-Delivery") {
				t.Fatalf("the body %s, %v", d.body, err)
			}
			args, has := body.Approval["arguments"]
			if has != include || (include && string(args) != `{"account":"DE89","pin":"[masked]"}`) {
				t.Errorf("include=%v: arguments %s", include, args)
			}
		}
		if ds[0].header.Get("X-Toolgate-Delivery") != ds[1].header.Get("X-Toolgate-Delivery") {
			t.Error("a retry has another delivery id")
		}
	}
}

// Attack (fixed): the receiver (a chat tool's hook: one channel, a wider audience
// than any approval's approvers) is told nothing about who may decide an
// approval — no approvers, approver groups, requester_may_approve or
// in_band. It cannot route an announcement to those who may see it, so it
// posts every one to the channel: a four-eyes payroll transfer only the
// secops group may see (the console shows it to its requester and its
// deciders alone, Approval.Visible), and alice's own in-band approval
// that nobody but alice may decide, reason and masked arguments included,
// go to everyone in the channel.
// Fix: add approvers, approver_groups, requester_may_approve and in_band
// to the announcement (and document that a receiver must route by them),
// or let the webhook announce only approvals that name approvers.
// Fixed: announcements carry approvers, approver_groups, requester_may_approve and in_band; the README tells receivers to route by them.
func TestWebhookAttackAnnouncementDoesNotSayWhoMayDecide(t *testing.T) {
	got := make(chan []byte, 8)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
	}))
	t.Cleanup(receiver.Close)
	m, _ := hookManager(t, receiver.URL, true, nil)
	runHook(t, m)
	for _, spec := range []string{
		`{"approvers":{"groups":["secops"]},"requester_may_approve":false}`,
		`{"in_band":true}`,
	} {
		ask := authzAsk("alice@example.com", "ref-s1", `{"amount":`+strconv.Itoa(len(spec))+`}`, authzSpec(t, spec), "r1")
		if res, err := m.Resolve(context.Background(), ask); err != nil || res.Kind != Pending {
			t.Fatalf("control: %+v, %v", res, err)
		}
		var body struct{ Approval map[string]json.RawMessage }
		select {
		case b := <-got:
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no delivery")
		}
		for _, field := range []string{"approvers", "approver_groups", "requester_may_approve", "in_band"} {
			if _, ok := body.Approval[field]; !ok {
				t.Errorf("policy %s: the announcement does not say %s; the receiver can only post it to everyone", spec, field)
			}
		}
	}
}

// Attack (fixed): a runner calls with arguments up to max_request_size (4 MiB by
// default) and the policy's reason quotes them; with include_arguments the
// announcement carries them whole. One announcement is megabytes: a chat
// API refuses it (a 413 ends the delivery for good: the approval is never
// announced) or times out (retried six times, holding the single delivery
// loop ~90 s each), and the queue, bounded in count only (1,024), holds
// up to 4 GiB in memory — 16 times max_request_bytes_in_flight, the bound
// that exists so that large requests cannot exhaust memory.
// Fix: cap what an announcement carries (arguments and reason, e.g. 16 KiB
// each, replaced by a "truncated" marker past it; the page has the rest),
// and bound the queue in bytes.
// Fixed: the reason and the arguments are cut past 16 KiB each (arguments_truncated), so a body stays small.
func TestWebhookAttackAnnouncementSizeIsUnbounded(t *testing.T) {
	m, _ := hookManager(t, "http://127.0.0.1:1/", true, nil) // deliveries not started
	big := `{"text":"` + strings.Repeat("A", 4<<20) + `"}`
	a := &Approval{ID: "big", State: StatePending, Stage: StageRequest, Requester: "mallory@example.com", Service: "bank",
		Method: "tools/call", Tool: "transfer", Reason: "transfer: " + strings.Repeat("B", 1<<20), Scopes: []string{ScopeOnce},
		CreatedAt: now(), ExpiresAt: now().Add(time.Hour)}
	m.hook.announce(a, "https://gw.example.com/console/approvals/big", true, []byte(big))
	d := <-m.hook.queue
	const bound = 256 << 10
	if len(d.body) > bound {
		t.Errorf("one announcement is %d bytes (bound %d): the queue of %d may hold %d MiB", len(d.body), bound, hookQueue, hookQueue*len(d.body)>>20)
	}
}

// Attack (fixed): mallory asks for 32 approvals (her share of the queue) whose
// announcements the receiver fails — a 5xx, or a timeout on bodies as
// large as mallory makes them (see above). Deliveries are retried in
// place by the single delivery loop, so every one of them holds the queue
// for its whole backoff (1+2+4+8+16 s) before the next is tried: alice's
// approval, asked right after, is announced only after 32 × 31 s ≈ 16
// minutes of backoff — past the default ttl of 10 minutes: her approvers
// hear of it once it has expired. The per-requester share (README: "one
// person's flood of asks cannot keep other people's approvals from being
// announced") does not stop it.
// Fix: do not retry in the delivery loop; schedule a failed delivery's
// retry (a timer or a retry heap) and go on with the queue, or deliver
// round-robin by requester with a few concurrent workers.
// Fixed: a failed delivery waits for its retry out of the loop (in due order), and new announcements go first.
func TestWebhookAttackOneRequestersFailingDeliveriesDelayOthersPastTTL(t *testing.T) {
	var mu sync.Mutex
	malloryAttempts, beforeAlice := 0, -1
	aliceSeen := make(chan struct{})
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(string(b), "mallory@") {
			malloryAttempts++
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		if beforeAlice < 0 {
			beforeAlice = malloryAttempts
			close(aliceSeen)
		}
	}))
	t.Cleanup(receiver.Close)
	real := newNotifier(&Webhook{}, nil, zap.NewNop()).backoff
	fast := make([]time.Duration, len(real))
	for i := range fast {
		fast[i] = time.Millisecond
	}
	m, _ := hookManager(t, receiver.URL, false, fast)
	mk := func(id, user string) *Approval {
		return &Approval{ID: id, State: StatePending, Stage: StageRequest, Requester: user, Service: "bank", Method: "tools/call",
			Tool: "transfer", Scopes: []string{ScopeOnce}, CreatedAt: now(), ExpiresAt: now().Add(DefaultTTL)}
	}
	for i := range hookShare {
		m.hook.announce(mk(fmt.Sprint("m", i), "mallory@example.com"), "https://gw/x", false, nil)
	}
	m.hook.announce(mk("alice1", "alice@example.com"), "https://gw/x", false, nil)
	runHook(t, m)
	select {
	case <-aliceSeen:
	case <-time.After(20 * time.Second):
		t.Fatal("alice's announcement never arrived")
	}
	mu.Lock()
	n := beforeAlice
	mu.Unlock()
	// Each failed attempt but the last of a delivery waits its backoff.
	var delay time.Duration
	for i := range n {
		if k := i % (len(real) + 1); k < len(real) {
			delay += real[k]
		}
	}
	if delay >= DefaultTTL {
		t.Errorf("%d attempts of mallory's deliveries went before alice's: at the real backoff, alice's approval is announced %s after it was asked (the default ttl is %s)",
			n, delay, DefaultTTL)
	}
}

// Attack (fixed): every config reload (or a replica stopping) closes the app's
// Done: the delivery loop returns, and the announcements still queued, and
// the one waiting for its retry, are dropped without a word — the README
// promises that dropped announcements are logged — and no other config or
// replica announces them: approvals asked moments before a reload are
// never announced, and nobody knows.
// Fix: on stop, log each dropped announcement (approval id), and better,
// hand the queue to the next config's notifier (a caddy.UsagePool like
// the shared transport), or mark announced approvals in their record and
// let the sweep announce pending ones that were not.
// Fixed: what is left when the notifier stops is logged, approval by
// approval, and handed to the next configuration's notifier of the same
// URL (TestWebhookHandsOverAtAReload).
func TestWebhookAttackReloadDropsAnnouncementsSilently(t *testing.T) {
	attempted := make(chan struct{}, 8)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempted <- struct{}{}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(receiver.Close)
	m, logs := hookManager(t, receiver.URL, false, nil) // backoff 1 s first
	ids := []string{"r1", "r2", "r3"}
	for _, id := range ids {
		m.hook.announce(&Approval{ID: id, State: StatePending, Requester: "alice", Scopes: []string{ScopeOnce},
			CreatedAt: now(), ExpiresAt: now().Add(time.Hour)}, "https://gw/x", false, nil)
	}
	stop := runHook(t, m)
	select {
	case <-attempted:
	case <-time.After(5 * time.Second):
		t.Fatal("no attempt")
	}
	stop() // the config is reloaded while r1 waits for its retry
	time.Sleep(200 * time.Millisecond)
	for _, id := range ids {
		if logs.FilterField(zap.String("approval_id", id)).Len() == 0 && logs.FilterMessageSnippet(id).Len() == 0 {
			t.Errorf("the announcement of approval %s was dropped at the reload, and nothing says so", id)
		}
	}
}

// Attack (fixed): announcements still queued, or waiting for a retry, when
// the configuration was reloaded were only logged: the new configuration's
// webhook, the same receiver, never got them, and approvers never heard
// of approvals asked moments before a reload.
// Fixed: the stopping notifier hands them over; the next configuration's
// notifier of the same URL (running already: Caddy starts it first)
// delivers them.
func TestWebhookHandsOverAtAReload(t *testing.T) {
	var (
		mu        sync.Mutex
		failed    bool
		delivered []string
	)
	attempted := make(chan struct{}, 8)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body announcement
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		defer mu.Unlock()
		if !failed { // the first attempt fails: its announcement waits for a retry
			failed = true
			w.WriteHeader(http.StatusServiceUnavailable)
			attempted <- struct{}{}
			return
		}
		delivered = append(delivered, body.Approval.ID)
	}))
	t.Cleanup(receiver.Close)
	old, _ := hookManager(t, receiver.URL, false, []time.Duration{time.Hour})
	ids := []string{"h1", "h2", "h3"}
	for _, id := range ids {
		old.hook.announce(&Approval{ID: id, State: StatePending, Requester: "alice", Scopes: []string{ScopeOnce},
			CreatedAt: now(), ExpiresAt: now().Add(time.Hour)}, "https://gw/x", false, nil)
	}
	stopOld := runHook(t, old)
	select {
	case <-attempted:
	case <-time.After(5 * time.Second):
		t.Fatal("no attempt")
	}
	next, _ := hookManager(t, receiver.URL, false, nil) // the reloaded configuration, started first
	runHook(t, next)
	stopOld()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := len(delivered)
		mu.Unlock()
		if n >= len(ids) {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(delivered)
	if !slices.Equal(delivered, ids) {
		t.Errorf("delivered after the reload: %q, want %q", delivered, ids)
	}
	next.hook.mu.Lock()
	defer next.hook.mu.Unlock()
	if next.hook.waiting != 0 || len(next.hook.queued) != 0 {
		t.Errorf("the next notifier counts %d waiting (%v) once all were delivered", next.hook.waiting, next.hook.queued)
	}
}

// Holds: a receiver that never answers blocks neither the runner's call
// nor the creation of approvals: announce never waits (a full share or
// queue drops, logged), Resolve returns at once, and no goroutine is
// started per announcement.
func TestWebhookHoldsSlowReceiverBlocksNothing(t *testing.T) {
	hang := make(chan struct{})
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(receiver.Close)
	t.Cleanup(func() { close(hang) })
	m, logs := hookManager(t, receiver.URL, true, nil)
	runHook(t, m)
	start := time.Now()
	for i := range 50 {
		ask := authzAsk(fmt.Sprint("user", i%5, "@example.com"), "ref", fmt.Sprint(`{"n":`, i, `}`), authzSpec(t, `{}`), "r1")
		if res, err := m.Resolve(context.Background(), ask); err != nil || res.Kind != Pending {
			t.Fatalf("Resolve: %+v, %v", res, err)
		}
	}
	before := runtime.NumGoroutine() // (the file storage's locks leave goroutines for 5 s: counted from here)
	for i := range 3000 {
		m.hook.announce(&Approval{ID: fmt.Sprint("x", i), Requester: fmt.Sprint("u", i)}, "https://gw/x", false, nil)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("asks with a hanging receiver took %s", took)
	}
	if g := runtime.NumGoroutine(); g > before+10 {
		t.Errorf("goroutines grew from %d to %d", before, g)
	}
	if logs.FilterMessageSnippet("queue full").Len() == 0 {
		t.Error("a full queue's drops are not logged")
	}
}

// Holds: a receiver that answers 200 and then an endless body, or echoes
// the secret, delays the loop no more than the answer's headers: the body
// is never read, the next delivery goes, and nothing of the answer (nor
// the secret) reaches the log.
func TestWebhookHoldsEndlessAnswerAndEchoedSecret(t *testing.T) {
	var n atomic.Int32
	second := make(chan struct{})
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 {
			close(second)
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte("bad signature, expected secret " + hookSecret))
			return
		}
		w.WriteHeader(http.StatusOK)
		chunk := []byte(strings.Repeat(hookSecret, 1000))
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(receiver.Close)
	m, logs := hookManager(t, receiver.URL, false, []time.Duration{time.Millisecond})
	runHook(t, m)
	for _, id := range []string{"e1", "e2"} {
		m.hook.announce(&Approval{ID: id, Requester: "alice"}, "https://gw/x", false, nil)
	}
	select {
	case <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("an endless answer body held the delivery loop")
	}
	time.Sleep(100 * time.Millisecond)
	if leaked := logtest.Leaked(t, logs, hookSecret, "expected secret"); len(leaked) > 0 {
		t.Errorf("the log holds the receiver's answer or the secret: %q", leaked)
	}
}

// Holds: the webhook URL must be https, or http on a loopback address
// (localhost, 127/8, ::1) — look-alike hosts (localhost.evil.example,
// 127.0.0.1.nip.io, a loopback address as userinfo), other schemes and
// hostless URLs are refused, and the refusal never echoes a password in
// the URL; a secret under 32 bytes is refused.
func TestWebhookHoldsURLAndSecretValidation(t *testing.T) {
	for _, u := range []string{
		"http://chat.example.com/hook", "http://localhost.evil.example/", "http://127.0.0.1.nip.io/",
		"http://127.0.0.1@evil.example/", "http://0.0.0.0:8080/", "ftp://127.0.0.1/", "//chat.example.com/",
		"https:///path", "http://user:s3cr3t-pw@chat.example.com/", "javascript:alert(1)", "file:///etc/passwd",
	} {
		err := (&Webhook{URL: u, Secret: hookSecret}).validate()
		if err == nil {
			t.Errorf("%s was accepted", u)
		} else if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("the refusal echoes the password: %v", err)
		}
	}
	for _, u := range []string{"https://chat.example.com/hook", "http://127.0.0.1:9/", "http://[::1]:9/", "http://localhost:9/"} {
		if err := (&Webhook{URL: u, Secret: hookSecret}).validate(); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	if err := (&Webhook{URL: "https://chat.example.com/", Secret: strings.Repeat("x", 31)}).validate(); err == nil {
		t.Error("a 31-byte secret was accepted")
	}
	// A timeout past a minute would hold every announcement behind a
	// silent receiver's.
	for timeout, ok := range map[time.Duration]bool{0: true, time.Minute: true, time.Minute + time.Second: false, time.Hour: false, -time.Second: false} {
		err := (&Webhook{URL: "https://chat.example.com/", Secret: hookSecret, Timeout: caddy.Duration(timeout)}).validate()
		if (err == nil) != ok {
			t.Errorf("timeout %s: %v", timeout, err)
		}
	}
}

// Holds: with the gateway's own client (a toolgate app loaded in Caddy),
// a receiver answering 307/308 to another host does not get the signed
// body (or its headers) sent on there: redirects are not followed, the
// 3xx is a failure retried against the configured URL only; the secret
// reaches no log.
func TestWebhookHoldsRedirectsAreNotFollowed(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(other.Close)
	var hits atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := http.StatusTemporaryRedirect
		if hits.Add(1)%2 == 0 {
			code = http.StatusPermanentRedirect
		}
		http.Redirect(w, r, strings.Replace(other.URL, "127.0.0.1", "localhost", 1)+"/steal", code)
	}))
	t.Cleanup(receiver.Close)
	ctx, app := loadHookApp(t, receiver.URL, hookSecret)
	m, err := For(ctx, app)
	if err != nil {
		t.Fatalf("For: %v", err)
	}
	if m.hook == nil || m.hook.client != app.HTTPClient() {
		t.Fatal("control: the manager has no webhook with the gateway's client")
	}
	core, logs := observer.New(zapcore.DebugLevel)
	m.hook.logger = zap.New(core)
	m.hook.backoff = []time.Duration{10 * time.Millisecond, 10 * time.Millisecond}
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	m.hook.start(done)
	m.hook.announce(&Approval{ID: "redir", Requester: "alice"}, "https://gw.example.com/console/approvals/redir", false, nil)
	deadline := time.Now().Add(5 * time.Second)
	for logs.FilterMessageSnippet("delivery failed").Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if hits.Load() != 3 {
		t.Errorf("the receiver was tried %d times, want 3 (the redirects are failures, retried)", hits.Load())
	}
	if elsewhere.Load() != 0 {
		t.Errorf("the redirect was followed: another host got %d signed deliveries", elsewhere.Load())
	}
	if leaked := logtest.Leaked(t, logs, hookSecret, other.URL, "steal"); len(leaked) > 0 {
		t.Errorf("the log: %q", leaked)
	}
}

// loadHookApp loads, in this process, a toolgate app whose approvals
// announce to url signed with secret; it stops when the test ends.
func loadHookApp(t *testing.T, url, secret string) (caddy.Context, *gateway.App) {
	t.Helper()
	data := t.TempDir()
	caddyfile := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output discard
	}
	toolgate {
		public_url https://gw.example.com
		storage file_system %[1]s
		cipher local %[1]s/cipher.key
		approvals {
			webhook %[2]s {
				secret %[3]s
				timeout 2s
			}
		}
	}
}
`, data, url, secret)
	testcaddy.Load(t, caddyfile, "", nil)
	ctx := caddy.ActiveContext()
	v, err := ctx.App("toolgate")
	if err != nil {
		t.Fatal(err)
	}
	return ctx, v.(*gateway.App)
}

// Attack (fixed): the operator mistypes the secret's placeholder, say
// {environment.TOOLGATE_APPROVAL_WEBHOOK_SECRET} for {env.…}. Caddy
// replaces only placeholders it knows (ReplaceKnown): the text stays as it
// is, 46 bytes, and passes the 32-byte minimum. Every delivery is then
// signed with a "secret" that is the config file's own text (in the
// repository, in Caddy's admin API /config/): anyone who reads it forges
// announcements the receiver trusts — an approval.requested pointing
// approvers at a phishing page. The README's own hint for a short secret
// ("is its environment variable set?") shows the check is meant to catch
// an unset variable; a misspelt one slips through.
// Fix: refuse a secret that still holds a {…} placeholder once replaced
// (caddy's replacer can report unknown placeholders: ReplaceOrErr with
// errOnUnknown).
// Fixed: a secret holding a placeholder Caddy does not know is refused (caddyopt.Secret), as are state_secret, header credentials, client secrets and Vault's.
func TestWebhookAttackUnresolvedPlaceholderBecomesTheSecret(t *testing.T) {
	ctx, app := loadHookApp(t, "https://chat.example.com/hooks/toolgate", "{environment.TOOLGATE_APPROVAL_WEBHOOK_SECRET}")
	m, err := For(ctx, app)
	if err == nil {
		t.Errorf("a webhook secret that is an unknown placeholder's text was accepted: deliveries are signed with %q", m.cfg.Webhook.Secret)
	}
}

// Attack (fixed): a runner's arguments (or a policy's reason quoting them) hold
// bidirectional controls and invisible characters, such as U+202E
// (right-to-left override) and U+200B. The console shows the arguments
// with every such character (Unicode's format characters) written as a
// \u escape, "so that no argument can hide text or show it reordered";
// the webhook, documented as sending the arguments "masked as approvers
// see them", sends them raw. A chat tool that posts them shows approvers
// "to": "acct-1 ‮..." reordered: an IBAN or an amount read
// backwards, text hidden — the spoof the console prevents.
// Fix: escape format characters in the announced arguments (and reason)
// as the console does (modules/console visible(): the same JSON, since
// every such character is inside a string).
// Fixed: the reason and the arguments are written with format characters escaped (approval.Visible, the console's own).
func TestWebhookAttackAnnouncedArgumentsKeepBidiControls(t *testing.T) {
	m, _ := hookManager(t, "http://127.0.0.1:1/", true, nil) // deliveries not started
	a := &Approval{ID: "bidi", State: StatePending, Stage: StageRequest, Requester: "mallory@example.com", Service: "bank",
		Method: "tools/call", Tool: "transfer", Reason: "transfer to DE89\u202e1000\u200b", Scopes: []string{ScopeOnce},
		CreatedAt: now(), ExpiresAt: now().Add(time.Hour)}
	m.hook.announce(a, "https://gw.example.com/console/approvals/bidi", true, []byte("{\"to\":\"DE89\u202e1000\",\"amount\":\"10\u200b000\"}"))
	d := <-m.hook.queue
	if strings.ContainsRune(string(d.body), '\u202e') || strings.ContainsRune(string(d.body), '\u200b') {
		t.Errorf("the announcement carries raw format characters (approvers' view escapes them): %q", d.body)
	}
}

// Holds: a result-stage approval (the upstream's answer withheld for
// review) is announced without the result, raw or masked, even with
// include_arguments: only the masked arguments go.
func TestWebhookHoldsWithheldResultIsNotAnnounced(t *testing.T) {
	got := make(chan []byte, 4)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
	}))
	t.Cleanup(receiver.Close)
	m, _ := hookManager(t, receiver.URL, true, nil)
	runHook(t, m)
	ask := authzAsk("alice@example.com", "ref-s1", `{"q":"salaries"}`, authzSpec(t, `{"approvers":{"users":["carol@example.com"]}}`), "r1")
	ask.Stage = StageResult
	ask.Result = []byte(`{"content":[{"type":"text","text":"raw-result-token-4242"}]}`)
	ask.MaskedResult = []byte(`{"content":[{"type":"text","text":"masked-result-text-1717"}]}`)
	if res, err := m.Resolve(context.Background(), ask); err != nil || res.Kind != Pending {
		t.Fatalf("control: %+v, %v", res, err)
	}
	select {
	case b := <-got:
		// The results' own words: their numbers alone turn up in the
		// announcement's timestamps now and then.
		if s := string(b); strings.Contains(s, "raw-result-token") || strings.Contains(s, "masked-result-text") || !strings.Contains(s, `"stage":"result"`) ||
			!strings.Contains(s, `"arguments":{"q":"salaries"}`) {
			t.Errorf("the announcement of a withheld result: %s", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery")
	}
}

// Holds: announcements waiting for their retry count toward the queue's
// bound, though they wait outside the queue: with as many waiting as the
// queue holds, from requesters each under their share, a new one is
// dropped (logged), not added.
func TestWebhookHoldsRetriesCountTowardTheQueue(t *testing.T) {
	m, logs := hookManager(t, "http://127.0.0.1:1/", false, nil) // deliveries not started
	n := m.hook
	for i := range hookQueue {
		n.queued[fmt.Sprint("user", i)] = 1 // one each, waiting for a retry
	}
	n.waiting = hookQueue
	n.announce(&Approval{ID: "one-more", Requester: "alice", Scopes: []string{ScopeOnce}, CreatedAt: now(), ExpiresAt: now().Add(time.Hour)},
		"https://gw/x", false, nil)
	if len(n.queue) != 0 || logs.FilterMessageSnippet("queue full").Len() != 1 {
		t.Errorf("with %d announcements waiting for retries, a new one was queued (%d queued) or its drop not logged", hookQueue, len(n.queue))
	}
}
