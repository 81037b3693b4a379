package integration

// Adversarial suite for replicas sharing one PostgreSQL storage, second
// round: approvals whose sealed contents are kept apart from their records
// and whose pending ones are counted per requester (max_pending_per_user),
// made, decided, expired and released through either replica. Tests whose comment starts with
// "Attack" describe what an attack would get through without the defence
// the test checks (each failed before its fix); those whose comment starts
// with "Holds" are attacks the design resists.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// r2Approvals is the toolgate block of two replicas taking approvals, with
// extra lines in it.
func r2Approvals(t *testing.T, extra string) (up *upstream, a, b *replica, dsn string) {
	t.Helper()
	up = startUpstream(t)
	a, b, dsn = soReplicas(t, testdataPath(t, "approvals"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "echo gated_tool", "", extra)
	})
	return up, a, b, dsn
}

// r2Record is an approval record as stored (signed, not sealed).
type r2Record struct {
	ID             string    `json:"id"`
	State          string    `json:"state"`
	Requester      string    `json:"requester"`
	ExpiresAt      time.Time `json:"expires_at"`
	ContentsSHA256 string    `json:"contents_sha256"`
}

// r2State is what the storage of dsn holds of approvals: the records, the
// ids with sealed contents, and the ids in the pending index of each
// requester (any requester: the index names a hash).
type r2State struct {
	records   map[string]r2Record
	contents  map[string]bool
	pendingOf map[string]bool
}

func r2Read(t *testing.T, dsn string) r2State {
	t.Helper()
	s := r2State{records: map[string]r2Record{}, contents: map[string]bool{}, pendingOf: map[string]bool{}}
	for k, v := range soRows(t, dsn) {
		switch {
		case strings.HasPrefix(k, "toolgate/approvals/"):
			var r r2Record
			if json.Unmarshal(v, &r) == nil && r.ID != "" {
				s.records[r.ID] = r
			}
		case strings.HasPrefix(k, "toolgate/approvals-contents/"):
			s.contents[strings.TrimPrefix(k, "toolgate/approvals-contents/")] = true
		case strings.HasPrefix(k, "toolgate/approvals-pending-of/"):
			s.pendingOf[k[strings.LastIndex(k, "/")+1:]] = true
		}
	}
	return s
}

// waiting returns the ids of user's approvals waiting for a decision.
func (s r2State) waiting(user string) []string {
	var ids []string
	for id, r := range s.records {
		if r.Requester == user && r.State == "pending" && time.Now().Before(r.ExpiresAt) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// r2Ask sends alice's tools/call of gated_tool through m and gives up
// (closing the connection, as a runner that goes away does) after d; it
// returns the answer, or nil when it gave up first.
func r2Ask(m *rawMCP, id int, args string, d time.Duration) (int, []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"gated_tool","arguments":%s}}`, id, args)
	resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", body, "")
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil
	}
	return resp.StatusCode, data
}

// Attack: a runner that gives up on its call (closes the connection) while
// toolgate is making the approval it asks for leaves a half-made approval:
// Store.Create (internal/approval/approval.go:308) writes the sealed
// contents (:318), then the record (:323), then the four index entries
// (:326-334), one storage write each under the request's context
// (Manager.Resolve, internal/approval/manager.go:425, called with
// r.Context() by modules/policy/approve.go), which ends with the
// connection. Cut after the record and before its place in the
// requester's pending index (approval.go:330) the approval waits for a
// decision without being counted by CountPending (approval.go:715), so
// max_pending_per_user (manager.go:419) no longer bounds the person's
// waiting approvals; cut after the contents and before the record, the
// sealed arguments stay in storage for ever (Sweep walks records only,
// approval.go:646). Here alice, with max_pending_per_user 3, cancels her
// asks at varying moments on both replicas (and denies the ones that were
// counted, to keep asking): she ends with more than 3 approvals waiting.
// The defence: make an approval under a context that outlives the request
// (context.WithoutCancel), index it in the requester's pending index
// before the record exists, and sweep contents without a record.
func TestReplicas2AttackCanceledAsksEscapeMaxPendingPerUser(t *testing.T) {
	_, a, b, dsn := r2Approvals(t, "approvals {\n\t\t\tmax_pending_per_user 3\n\t\t}")
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.sessionID = ma.sessionID

	// How long a whole ask takes (the median of seven after three to warm
	// up, each denied).
	var took []time.Duration
	for i := range 10 {
		start := time.Now()
		p := mustPend(t, ma.call(1+i, "gated_tool", fmt.Sprintf(`{"text":"calibrate-%d"}`, i)))
		if i >= 3 {
			took = append(took, time.Since(start))
		}
		if r := a.decide(t, aliceKey, p.ApprovalID, false, "", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("denying: %d %s", r.StatusCode, r.Body)
		}
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	whole := took[len(took)/2]

	denyCounted := func() {
		s := r2Read(t, dsn)
		for _, id := range s.waiting(alice) {
			if s.pendingOf[id] {
				if r := a.decide(t, aliceKey, id, false, "", ""); r.StatusCode != http.StatusOK && r.StatusCode != http.StatusConflict {
					t.Fatalf("denying %s: %d %s", id, r.StatusCode, r.Body)
				}
			}
		}
	}
	const attempts, max = 600, 3
	orphansOf := func(s r2State) int {
		n := 0
		for id := range s.contents {
			if _, ok := s.records[id]; !ok {
				n++
			}
		}
		return n
	}
	// A staircase on the moment alice gives up: later when her ask did
	// not get as far as storing anything, earlier when it was answered,
	// so that she keeps giving up while toolgate is making an approval.
	d := whole / 2
	seen := len(r2Read(t, dsn).contents)
	for i := range attempts {
		m := ma
		if i%2 == 1 {
			m = mb
		}
		jitter := 0.9 + 0.2*(float64(i%7)/6)
		_, answer := r2Ask(m, 100+i, fmt.Sprintf(`{"text":"flood-%d %s"}`, i, strings.Repeat("x", 512)),
			time.Duration(float64(d)*jitter))
		time.Sleep(30 * time.Millisecond) // an ask given up on may still be finishing
		s := r2Read(t, dsn)
		stored := len(s.contents) > seen
		seen = len(s.contents)
		switch {
		case answer != nil:
			d = d * 93 / 100
		case !stored:
			d = d * 107 / 100
		}
		denyCounted()
		if len(s.waiting(alice)) > max && orphansOf(s) > 0 {
			break
		}
	}
	time.Sleep(500 * time.Millisecond) // asks given up on may still be finishing
	s := r2Read(t, dsn)
	orphans := orphansOf(s)
	waiting := s.waiting(alice)
	uncounted := 0
	for _, id := range waiting {
		if !s.pendingOf[id] {
			uncounted++
		}
	}
	t.Logf("a whole ask took %v; alice has %d approvals waiting (%d not in her pending index), %d sealed contents without a record",
		whole, len(waiting), uncounted, orphans)
	if len(waiting) > max {
		t.Errorf("alice has %d approvals waiting for a decision with max_pending_per_user %d (%d of them not counted)", len(waiting), max, uncounted)
	} else if uncounted > 0 {
		t.Errorf("%d of alice's approvals wait for a decision without being counted under max_pending_per_user", uncounted)
	}
	if orphans > 0 {
		t.Errorf("%d approvals' sealed contents are in storage without a record: nothing ever removes them", orphans)
	}
}

// Holds: alice's asks, all at once, half through each replica, with
// max_pending_per_user 5: counting and making are one step under her lock
// on every replica, so exactly 5 wait and the others are refused (-32011,
// retryable); bob is not counted against her.
func TestReplicas2HoldsMaxPendingPerUserRacedAcrossReplicas(t *testing.T) {
	_, a, b, dsn := r2Approvals(t, "approvals {\n\t\t\tmax_pending_per_user 5\n\t\t}")
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.sessionID = ma.sessionID
	const n = 24
	var wg sync.WaitGroup
	var mu sync.Mutex
	pending, refused := 0, 0
	start := make(chan struct{})
	for i := range n {
		m := ma
		if i%2 == 1 {
			m = mb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			status, answer := r2Ask(m, 10+i, fmt.Sprintf(`{"text":"race-%d"}`, i), 60*time.Second)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case strings.Contains(string(answer), `"approval_required":true`):
				pending++
			case status/100 == 2 && strings.Contains(string(answer), "max_pending_per_user") && strings.Contains(string(answer), `"retryable":true`):
				refused++
			default:
				t.Errorf("ask %d: %d %s", i, status, answer)
			}
		}()
	}
	close(start)
	wg.Wait()
	if pending != 5 || refused != n-5 {
		t.Errorf("%d concurrent asks over two replicas with max_pending_per_user 5: %d pending, %d refused; want 5 and %d", n, pending, refused, n-5)
	}
	if w := r2Read(t, dsn).waiting(alice); len(w) != 5 {
		t.Errorf("alice has %d approvals waiting in storage, want 5", len(w))
	}
	bs := b.createSession(t, bobKey, "svc")
	mbob := b.raw(t, bobKey, bs, "svc")
	mbob.initialize()
	mustPend(t, mbob.call(1, "gated_tool", `{"text":"bob's own"}`))
}

// r2Post sends one JSON-RPC message through m without touching t (for
// goroutines) and returns the last message of the answer.
func r2Post(m *rawMCP, body string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := m.send(ctx, http.MethodPost, "application/json", body, "")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// Holds: a withheld result approved on b, retried identically by eight
// runners at once, half through each replica: exactly one gets the
// withheld result (consumed under the approval's lock, then its contents
// read); the others are not given it (their calls go upstream and are
// withheld anew), and the contents of the consumed approval are still
// there for its page.
func TestReplicas2HoldsWithheldResultReleasedOnceAcrossReplicas(t *testing.T) {
	up, a, b, _ := r2Approvals(t, "")
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.sessionID = ma.sessionID
	const args = `{"text":"review-me: wire 100 to acct 7"}`
	id := caWithheldID(t, ma.call(1, "echo", args))
	if r := b.decide(t, aliceKey, id, true, "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving on b: %d %s", r.StatusCode, r.Body)
	}
	const n = 8
	var wg sync.WaitGroup
	answers := make([]string, n)
	start := make(chan struct{})
	for i := range n {
		m := ma
		if i%2 == 1 {
			m = mb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, answers[i] = r2Post(m, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":%s}}`, 10+i, args))
		}()
	}
	close(start)
	wg.Wait()
	released := 0
	for i, ans := range answers {
		var v struct {
			Result *struct {
				IsError bool `json:"isError"`
				Meta    struct {
					Approval *struct{ ID string } `json:"toolgate/approval"`
				} `json:"_meta"`
			}
		}
		if json.Unmarshal([]byte(ans), &v) != nil || v.Result == nil {
			t.Errorf("retry %d: %s", i, ans)
			continue
		}
		switch {
		case !v.Result.IsError && strings.Contains(ans, "review-me"):
			released++
		case v.Result.IsError && v.Result.Meta.Approval != nil && v.Result.Meta.Approval.ID != id:
			// withheld again, under a new approval
		default:
			t.Errorf("retry %d: %s", i, ans)
		}
	}
	if released != 1 {
		t.Errorf("%d concurrent identical retries over two replicas: the withheld result was released %d times, want once", n, released)
	}
	if got := up.upstreamCalls("echo"); got != n {
		t.Logf("the upstream ran echo %d times (1 before the approval, %d retries not released)", got, n-1)
	}
	for _, g := range []*replica{a, b} {
		r := g.api(t, http.MethodGet, "/v1/approvals/"+id, aliceKey, nil)
		// Used up, it no longer holds what it was about
		// (TestR17UsedApprovalsKeepTheirContents).
		if r.StatusCode != http.StatusOK || !strings.Contains(string(r.Body), `"state":"consumed"`) || strings.Contains(string(r.Body), "review-me") {
			t.Errorf("the released approval on %s: %d %s", g.URL, r.StatusCode, r.Body)
		}
		if r := g.api(t, http.MethodGet, "/v1/approvals/"+id, bobKey, nil); r.StatusCode != http.StatusNotFound {
			t.Errorf("bob reading alice's released approval on %s: %d %s", g.URL, r.StatusCode, r.Body)
		}
	}
}

// Holds: approvals that expired free their place under
// max_pending_per_user on every replica: alice fills her two places with
// one-second approvals through a, is refused a third through b, and once
// they expired (nothing decided them, no sweep ran: sweeps run every
// minute) her next ask through b is taken. No person is locked out by
// index entries left behind.
func TestReplicas2HoldsExpiredApprovalsFreeMaxPendingPerUser(t *testing.T) {
	_, a, b, dsn := r2Approvals(t, "approvals {\n\t\t\tmax_pending_per_user 2\n\t\t}")
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.sessionID = ma.sessionID
	// The check is conclusive only when the third ask came within the
	// first one's second: on a loaded machine it may have expired by then,
	// and the round is tried again once the asks of the last expired.
	for attempt := 1; ; attempt++ {
		start := time.Now()
		mustPend(t, ma.call(10*attempt+1, "gated_tool", fmt.Sprintf(`{"text":"short one %d"}`, attempt)))
		mustPend(t, ma.call(10*attempt+2, "gated_tool", fmt.Sprintf(`{"text":"short two %d"}`, attempt)))
		ans := string(mb.call(10*attempt+3, "gated_tool", fmt.Sprintf(`{"text":"third %d"}`, attempt)))
		time.Sleep(1500 * time.Millisecond) // the asks expire (ttl 1s)
		if strings.Contains(ans, "max_pending_per_user") {
			break
		}
		if time.Since(start) < 2400*time.Millisecond || attempt == 5 {
			t.Fatalf("a third ask past max_pending_per_user 2 on b: %s", ans)
		}
		t.Logf("attempt %d: the first ask may have expired before the third was made (%v); again", attempt, time.Since(start)-1500*time.Millisecond)
	}
	mustPend(t, mb.call(4, "gated_tool", `{"text":"third"}`))
	mustPend(t, ma.call(5, "gated_tool", `{"text":"fourth"}`))
	if ans := string(mb.call(6, "gated_tool", `{"text":"fifth"}`)); !strings.Contains(ans, "max_pending_per_user") {
		t.Fatalf("a fifth ask with two waiting: %s", ans)
	}
	if w := r2Read(t, dsn).waiting(alice); len(w) != 2 {
		t.Errorf("alice has %d approvals waiting in storage, want 2", len(w))
	}
}

// r2Deny sends key's denial of id through g, giving up after d.
func r2Deny(g *replica, key, id string, d time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/approvals/"+id+"/deny", strings.NewReader(`{"note":"no"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: g.transport()}).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.ReadAll(resp.Body)
	return resp.StatusCode
}

// Attack: an approver whose browser or script goes away just after a
// decision leaves the requester's place under max_pending_per_user taken:
// Store.Decide (internal/approval/approval.go:552) saves the decision
// under the approval's lock, then deletes its pending index entries with
// the request's context (approval.go:583-584, errors ignored), which ends
// with the approver's connection. The decided approval stays counted by
// CountPending until its ttl (up to 24h), so alice, with nothing waiting,
// is refused every ask ("you have 2 approvals waiting"). Here carol (an
// admin, who decides alice's four-eyes asks) gives up on her denials at
// varying moments, on both replicas. The defence: delete the index entries
// under a context that outlives the request (or in the same step as the
// decision), and have CountPending skip entries whose record is decided.
func TestReplicas2AttackCanceledDecisionKeepsRequesterLockedOut(t *testing.T) {
	_, a, b, dsn := r2Approvals(t, "approvals {\n\t\t\tmax_pending_per_user 2\n\t\t}")
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()

	// How long a whole denial takes (the median of three).
	var took []time.Duration
	for i := range 3 {
		p := mustPend(t, ma.call(1+i, "gated_tool", fmt.Sprintf(`{"text":"four-eyes calibrate-%d"}`, i)))
		start := time.Now()
		if status := r2Deny(a, carolKey, p.ApprovalID, 30*time.Second); status != http.StatusOK {
			t.Fatalf("carol denying: %d", status)
		}
		took = append(took, time.Since(start))
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	whole := took[len(took)/2]

	const rounds = 150
	lockedOut := ""
	for i := 0; i < rounds && lockedOut == ""; i++ {
		ans := string(ma.call(100+i, "gated_tool", fmt.Sprintf(`{"text":"four-eyes ask-%d"}`, i)))
		if strings.Contains(ans, "max_pending_per_user") {
			st := r2Read(t, dsn)
			if w := st.waiting(alice); len(w) == 0 {
				decided := 0
				for id := range st.pendingOf {
					if r, ok := st.records[id]; ok && r.State != "pending" {
						decided++
					}
				}
				lockedOut = fmt.Sprintf("%s (%d decided approvals still in her pending index)", ans, decided)
			}
			break
		}
		p := mustPend(t, json.RawMessage(ans))
		g := a
		if i%2 == 1 {
			g = b
		}
		frac := float64(i) * 0.6180339887
		frac -= float64(int(frac))
		r2Deny(g, carolKey, p.ApprovalID, time.Duration(float64(whole)*(0.3+0.9*frac)))
		time.Sleep(20 * time.Millisecond) // a denial given up on may still be finishing
		if soApprovalState(t, a.gateway, aliceKey, p.ApprovalID) == "pending" {
			// 409: the denial given up on finished meanwhile (a loaded
			// machine takes longer than the pause above).
			status := r2Deny(g, carolKey, p.ApprovalID, 30*time.Second)
			if status == http.StatusConflict && soApprovalState(t, a.gateway, aliceKey, p.ApprovalID) != "pending" {
				continue
			}
			if status != http.StatusOK {
				t.Fatalf("carol denying in full: %d", status)
			}
		}
	}
	if lockedOut != "" {
		t.Errorf("alice has no approval waiting, yet her ask is refused: %s", lockedOut)
	}
}
