package approval

// Review of the webhook handover at a reload (notify.go: handOver,
// takeOver, handedOver): announcements left by a stopping notifier are
// kept, package-wide, by URL, for the next notifier of the same URL.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
)

// reviewReceiver is a webhook receiver whose first failing attempts answer
// 503 (the announcement then waits for a retry); it records the bodies it
// accepted.
type reviewReceiver struct {
	*httptest.Server
	mu        sync.Mutex
	failFirst int
	attempts  chan struct{}
	got       []announcement
}

func newReviewReceiver(t *testing.T, failFirst int) *reviewReceiver {
	rr := &reviewReceiver{failFirst: failFirst, attempts: make(chan struct{}, 64)}
	rr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body announcement
		_ = json.NewDecoder(r.Body).Decode(&body)
		rr.mu.Lock()
		defer rr.mu.Unlock()
		select {
		case rr.attempts <- struct{}{}:
		default:
		}
		if rr.failFirst > 0 {
			rr.failFirst--
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		rr.got = append(rr.got, body)
	}))
	t.Cleanup(rr.Close)
	t.Cleanup(func() { // leave nothing of this test in the package-wide handover
		handedOver.Lock()
		delete(handedOver.byURL, rr.URL)
		handedOver.Unlock()
	})
	return rr
}

func (rr *reviewReceiver) waitAttempt(t *testing.T) {
	t.Helper()
	select {
	case <-rr.attempts:
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery attempt")
	}
}

func (rr *reviewReceiver) accept() {
	rr.mu.Lock()
	rr.failFirst = 0
	rr.mu.Unlock()
}

func (rr *reviewReceiver) delivered() []announcement {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return append([]announcement(nil), rr.got...)
}

func handedOverFor(url string) int {
	handedOver.Lock()
	defer handedOver.Unlock()
	return len(handedOver.byURL[url])
}

func reviewApproval(id string, expires time.Time) *Approval {
	return &Approval{ID: id, State: StatePending, Requester: "alice", Scopes: []string{ScopeOnce},
		CreatedAt: now(), ExpiresAt: expires}
}

// Attack (fixed): a reload that changes the webhook's URL (X to Y; a rotated
// Slack/Teams URL carries its token in the path) leaves the announcements
// waiting for X in the package-wide handedOver map for the life of the
// process: no notifier of X will ever take them, nothing bounds the
// number of URLs kept (hookQueue bodies, up to ~32 KiB each, per URL), and
// they are logged at Info as "handed to the next configuration's webhook"
// — never the Warn that says they were dropped.
// Fixed: what no notifier of the configuration in force posts to is dropped at once, with a warning per approval.
func TestReviewHandoverKeptForeverForAURLNoLongerConfigured(t *testing.T) {
	x := newReviewReceiver(t, 1000) // X fails: all wait for a retry
	y := newReviewReceiver(t, 0)
	old, logs := hookManager(t, x.URL, false, []time.Duration{time.Hour})
	for _, id := range []string{"k1", "k2", "k3"} {
		old.hook.announce(reviewApproval(id, now().Add(time.Hour)), "https://gw/x", false, nil)
	}
	stopOld := runHook(t, old)
	for range 3 {
		x.waitAttempt(t)
	}
	next, _ := hookManager(t, y.URL, false, nil) // the reloaded configuration: webhook Y
	runHook(t, next)
	stopOld()
	deadline := time.Now().Add(2 * time.Second)
	for handedOverFor(x.URL) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the new configuration runs on
	if n := handedOverFor(x.URL); n != 0 {
		t.Errorf("%d announcements for %s, a URL no configuration has any more, are held in handedOver for good", n, x.URL)
	}
	warned := 0
	for _, e := range logs.All() {
		if e.Level >= zapcore.WarnLevel {
			warned++
		}
	}
	if warned == 0 {
		t.Errorf("the announcements left for the removed URL were logged only as handed over (Info), never as dropped")
	}
}

// Attack (fixed): announcements parked for a URL that a reload removed are
// delivered whenever a later configuration names that URL again — after
// their approvals expired: the receiver gets "approval.requested" with
// state "pending" for approvals that are long over (adopt sets them due
// now, and nothing looks at the approval's expiry or state).
// Fixed: an announcement of an approval that expired is not sent.
func TestReviewHandoverDeliversExpiredApprovalsWhenTheURLReturns(t *testing.T) {
	x := newReviewReceiver(t, 1000)
	y := newReviewReceiver(t, 0)
	old, _ := hookManager(t, x.URL, false, []time.Duration{time.Hour})
	expires := now().Add(200 * time.Millisecond)
	old.hook.announce(reviewApproval("stale1", expires), "https://gw/x", false, nil)
	old.hook.announce(reviewApproval("stale2", expires), "https://gw/x", false, nil)
	stopOld := runHook(t, old)
	x.waitAttempt(t)
	x.waitAttempt(t)
	mid, _ := hookManager(t, y.URL, false, nil) // reload: webhook Y
	stopMid := runHook(t, mid)
	stopOld()
	time.Sleep(400 * time.Millisecond) // the approvals expire
	x.accept()
	again, _ := hookManager(t, x.URL, false, nil) // reload: webhook X again
	runHook(t, again)
	stopMid()
	deadline := time.Now().Add(2 * time.Second)
	for len(x.delivered()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for _, a := range x.delivered() {
		if !a.Approval.ExpiresAt.After(time.Now()) {
			t.Errorf("announced %s as %q to the re-added webhook after it expired (at %s)",
				a.Approval.ID, a.Approval.State, a.Approval.ExpiresAt.Format(time.RFC3339Nano))
		}
	}
}

// Attack (fixed): a reload that turns include_arguments off (the receiver's
// channel got wider; the arguments must stop going out) still sends the
// call's arguments: the announcements built under the old configuration
// are handed to the new notifier of the same URL, which posts their
// bodies as they are.
// Fixed: an adopted announcement is written as the configuration in force says (no arguments unless it includes them).
func TestReviewHandoverSendsArgumentsAfterIncludeArgumentsWasTurnedOff(t *testing.T) {
	x := newReviewReceiver(t, 1)
	old, _ := hookManager(t, x.URL, true, []time.Duration{time.Hour})
	old.hook.announce(reviewApproval("args", now().Add(time.Hour)), "https://gw/x", true, []byte(`{"account":"DE-secret-iban"}`))
	stopOld := runHook(t, old)
	x.waitAttempt(t)
	next, _ := hookManager(t, x.URL, false, nil) // same URL, include_arguments off
	runHook(t, next)
	stopOld()
	deadline := time.Now().Add(3 * time.Second)
	for len(x.delivered()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	got := x.delivered()
	if len(got) == 0 {
		t.Fatal("nothing delivered after the reload")
	}
	for _, a := range got {
		if a.Approval.Arguments != nil {
			t.Errorf("the configuration in force says include_arguments off, but %s was announced with arguments %s",
				a.Approval.ID, a.Approval.Arguments)
		}
	}
}

// Holds: an announcement handed over is delivered once: the stopping
// notifier's copy goes with it (it returns after handOff), and two
// notifiers of the same URL running at once (a reload in progress) never
// both take it.
func TestReviewHoldsHandoverDeliversOnce(t *testing.T) {
	x := newReviewReceiver(t, 4) // all four wait for a retry
	old, _ := hookManager(t, x.URL, false, []time.Duration{time.Hour})
	for _, id := range []string{"o1", "o2", "o3", "o4"} {
		old.hook.announce(reviewApproval(id, now().Add(time.Hour)), "https://gw/x", false, nil)
	}
	stopOld := runHook(t, old)
	for range 4 {
		x.waitAttempt(t)
	}
	n1, _ := hookManager(t, x.URL, false, nil)
	n2, _ := hookManager(t, x.URL, false, nil)
	runHook(t, n1)
	runHook(t, n2)
	stopOld()
	time.Sleep(time.Second)
	seen := map[string]int{}
	for _, a := range x.delivered() {
		seen[a.Approval.ID]++
	}
	for _, id := range []string{"o1", "o2", "o3", "o4"} {
		if seen[id] != 1 {
			t.Errorf("%s delivered %d times", id, seen[id])
		}
	}
}
