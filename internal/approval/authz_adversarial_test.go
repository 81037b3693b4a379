package approval

// Adversarial review of one property: an authenticated caller acts only on
// what is theirs, and only as the rules allow. Attackers: another
// authenticated user, a requester approving their own call when the
// policy did not allow it, an approver widening a decision's scope or
// deciding twice or too late, a runner answering an in-band elicitation
// for another person or session, a user whose groups changed, and user
// names that differ only in case or by a look-alike character.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// authzClock pins the package clock at a time the test moves.
func authzClock(t *testing.T) *time.Time {
	t.Helper()
	clock := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	orig := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = orig })
	return &clock
}

// authzManager is a Manager over a fresh file storage, as Resolve and
// Decide use it (no webhook, no announcements).
func authzManager(t *testing.T) *Manager {
	t.Helper()
	return &Manager{Store: testStore(&certmagic.FileStorage{Path: t.TempDir()}), app: &gateway.App{},
		cfg: Config{MaxPendingPerUser: DefaultMaxPendingPerUser}, audit: zap.NewNop(), logger: zap.NewNop(),
		waiting: map[string][]chan struct{}{}, results: map[string]time.Time{}, watches: map[string]struct{}{}, watching: map[string]int{}}
}

func authzSpec(t *testing.T, raw string) Spec {
	t.Helper()
	s, err := ParseSpec([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func authzAsk(user, session, args string, spec Spec, revision string) Ask {
	return Ask{Call: Call{Requester: user, Session: session, Service: "bank", Method: "tools/call", Tool: "transfer",
		Arguments: []byte(args)}, Stage: StageRequest, Spec: spec, Decision: &gateway.Decision{ID: "d", Reason: "r"},
		Revision: revision, Masked: []byte(args), Base: "https://gw.example.com"}
}

// authzPending stores alice's pending approval with the given spec.
func authzPending(t *testing.T, m *Manager, spec Spec) *Approval {
	t.Helper()
	res, err := m.Resolve(context.Background(), authzAsk("alice@example.com", "ref-s1", `{"amount":1}`, spec, "r1"))
	if err != nil || res.Kind != Pending {
		t.Fatalf("control: the ask is not pending: %+v, %v", res, err)
	}
	return res.Approval
}

func authzState(t *testing.T, m *Manager, id string) *Approval {
	t.Helper()
	a, err := m.Store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Holds: the requester, who is also in the approver group, decides their
// own call whose policy says requester_may_approve false (four eyes):
// refused, approve and deny alike, through Manager.Decide; an
// authenticated stranger is refused too, and neither changes the record.
func TestAuthzHoldsRequesterAndStrangerCannotDecide(t *testing.T) {
	authzClock(t)
	m := authzManager(t)
	a := authzPending(t, m, authzSpec(t, `{"approvers":{"groups":["secops"],"users":["carol@example.com"]},"requester_may_approve":false}`))
	ctx := context.Background()
	for _, c := range []*gateway.Caller{
		{User: "alice@example.com", Groups: []string{"secops"}, Method: "jwt"},
		{User: "alice@example.com", Groups: []string{"secops"}, Method: "console"},
		{User: "eve@example.com", Groups: []string{"eng"}, Method: "api_key"},
		{User: "", Groups: nil, Method: "anonymous"},
	} {
		for _, approve := range []bool{true, false} {
			if _, err := m.Decide(ctx, a.ID, c, approve, "", "mine"); !errors.Is(err, ErrForbidden) {
				t.Errorf("%q %v decided (approve=%v): %v, want ErrForbidden", c.User, c.Groups, approve, err)
			}
		}
	}
	if got := authzState(t, m, a.ID); got.Status() != StatePending || got.DecidedBy != "" {
		t.Errorf("a refused decision changed the record: %+v", got)
	}
	if a.Visible(&gateway.Caller{User: "eve@example.com"}) {
		t.Error("a stranger may see alice's approval")
	}
}

// Holds: user names that differ from the approver's or the requester's
// only in case, by the Kelvin sign (U+212A, which folds to k), by a
// fullwidth letter or by a trailing space do not match them: such a user
// neither sees nor decides the approval as the named approver, and the
// requester's four-eyes rule is not lifted for the exact requester.
func TestAuthzHoldsLookAlikeUserNamesDoNotMatch(t *testing.T) {
	a := &Approval{Requester: "alice@example.com", RequesterMayApprove: false,
		Approvers: []string{"kim@example.com"}, ApproverGroups: []string{"secops"}}
	for _, user := range []string{"Kim@example.com", "KIM@EXAMPLE.COM", "\u212Aim@example.com", "\uff4bim@example.com",
		"kim@example.com ", " kim@example.com", "kim@example.com\x00"} {
		c := &gateway.Caller{User: user}
		if a.MayDecide(c) || a.Visible(c) {
			t.Errorf("%q passes for the approver kim@example.com", user)
		}
	}
	if !a.MayDecide(&gateway.Caller{User: "kim@example.com"}) {
		t.Error("control: kim may not decide")
	}
	// Look-alikes of the requester are other users: they see nothing of
	// hers as her (OfRequester keys on the exact name).
	s := testStore(&certmagic.FileStorage{Path: t.TempDir()})
	ctx := context.Background()
	rec := &Approval{ID: "a1", State: StatePending, Requester: "alice@example.com", Approvers: []string{"kim@example.com"},
		Scopes: []string{ScopeOnce}, CreatedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Hour).UTC()}
	if err := s.Create(ctx, rec, Contents{Arguments: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"Alice@example.com", "alice@example.com ", "\u0430lice@example.com"} {
		if list, err := s.OfRequester(ctx, user); err != nil || len(list) != 0 {
			t.Errorf("%q lists alice's approvals as theirs: %d, %v", user, len(list), err)
		}
		if rec.Visible(&gateway.Caller{User: user}) {
			t.Errorf("%q sees alice's approval", user)
		}
	}
}

// Holds: an approver asks for a scope the approval does not offer
// (session or tool where the policy offered once; an unknown scope; a
// scope spelled in another case): refused with ErrScope, and the approval
// stays pending. A result-stage approval offers once only, whatever the
// policy listed.
func TestAuthzHoldsScopeNotOfferedIsRefused(t *testing.T) {
	authzClock(t)
	m := authzManager(t)
	ctx := context.Background()
	a := authzPending(t, m, authzSpec(t, `{"approvers":{"users":["carol@example.com"]},"requester_may_approve":false,"scopes":["once"]}`))
	carol := &gateway.Caller{User: "carol@example.com"}
	for _, scope := range []string{ScopeSession, ScopeTool, "forever", "Once", "ONCE", " once", "once,session"} {
		if _, err := m.Decide(ctx, a.ID, carol, true, scope, ""); !errors.Is(err, ErrScope) {
			t.Errorf("scope %q: %v, want ErrScope", scope, err)
		}
	}
	if got := authzState(t, m, a.ID); got.Status() != StatePending {
		t.Fatalf("a refused scope changed the approval: %+v", got)
	}
	res, err := m.Resolve(ctx, Ask{Call: Call{Requester: "alice@example.com", Session: "ref-s1", Service: "bank", Method: "tools/call",
		Tool: "report", Arguments: []byte(`{}`)}, Stage: StageResult,
		Spec:     authzSpec(t, `{"approvers":{"users":["carol@example.com"]},"requester_may_approve":false,"scopes":["session","tool"]}`),
		Decision: &gateway.Decision{ID: "d2"}, Revision: "r1", Result: []byte(`{"secret":1}`)})
	if err != nil || res.Kind != Pending {
		t.Fatalf("control: result ask %+v, %v", res, err)
	}
	for _, scope := range []string{ScopeSession, ScopeTool} {
		if _, err := m.Decide(ctx, res.Approval.ID, carol, true, scope, ""); !errors.Is(err, ErrScope) {
			t.Errorf("a withheld result approved for %s: %v, want ErrScope", scope, err)
		}
	}
}

// Holds: an approval is decided once. Approving an approved one again
// (for a wider scope), denying it, approving a denied one, and deciding a
// consumed one are refused with ErrDecided, and change nothing.
func TestAuthzHoldsDecidedOnlyOnce(t *testing.T) {
	authzClock(t)
	m := authzManager(t)
	ctx := context.Background()
	spec := authzSpec(t, `{"approvers":{"users":["carol@example.com","dave@example.com"]},"requester_may_approve":false,"scopes":["once","session","tool"]}`)
	a := authzPending(t, m, spec)
	carol := &gateway.Caller{User: "carol@example.com"}
	dave := &gateway.Caller{User: "dave@example.com"}
	if _, err := m.Decide(ctx, a.ID, carol, true, ScopeOnce, ""); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		by      *gateway.Caller
		approve bool
		scope   string
	}{{carol, true, ScopeSession}, {dave, true, ScopeTool}, {dave, false, ""}, {carol, true, ScopeOnce}} {
		if _, err := m.Decide(ctx, a.ID, c.by, c.approve, c.scope, ""); !errors.Is(err, ErrDecided) {
			t.Errorf("%s deciding an approved approval (approve=%v %s): %v, want ErrDecided", c.by.User, c.approve, c.scope, err)
		}
	}
	if got := authzState(t, m, a.ID); got.State != StateApproved || got.Scope != ScopeOnce || got.DecidedBy != "carol@example.com" {
		t.Fatalf("a second decision changed the first: %+v", got)
	}
	// Consumed by the retry: still decided.
	if res, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":1}`, spec, "r1")); err != nil || res.Kind != Allow {
		t.Fatalf("control: the retry %+v, %v", res, err)
	}
	if _, err := m.Decide(ctx, a.ID, dave, true, ScopeSession, ""); !errors.Is(err, ErrDecided) {
		t.Errorf("a consumed approval was decided again: %v", err)
	}
	// Denied, then approved.
	b, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":2}`, spec, "r1"))
	if err != nil || b.Kind != Pending {
		t.Fatal(b, err)
	}
	if _, err := m.Decide(ctx, b.Approval.ID, dave, false, "", "no"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Decide(ctx, b.Approval.ID, carol, true, ScopeSession, ""); !errors.Is(err, ErrDecided) {
		t.Errorf("a denied approval was approved: %v", err)
	}
	if res, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":2}`, spec, "r1")); err != nil || res.Kind != Denied {
		t.Errorf("the retry of a denied call: %+v, %v, want Denied", res, err)
	}
}

// Holds: an approval past its expiry cannot be decided, to the
// nanosecond, and an approved once approval past its expiry is not
// consumed.
func TestAuthzHoldsExpiredNotDecidable(t *testing.T) {
	clock := authzClock(t)
	m := authzManager(t)
	ctx := context.Background()
	spec := authzSpec(t, `{"approvers":{"users":["carol@example.com"]},"requester_may_approve":false,"ttl":"1m"}`)
	a := authzPending(t, m, spec)
	carol := &gateway.Caller{User: "carol@example.com"}
	*clock = a.ExpiresAt
	for _, approve := range []bool{true, false} {
		if _, err := m.Decide(ctx, a.ID, carol, approve, "", ""); !errors.Is(err, ErrExpired) {
			t.Errorf("deciding (approve=%v) at the expiry: %v, want ErrExpired", approve, err)
		}
	}
	*clock = a.ExpiresAt.Add(-time.Nanosecond)
	if _, err := m.Decide(ctx, a.ID, carol, true, ScopeOnce, ""); err != nil {
		t.Fatalf("control: deciding just before the expiry: %v", err)
	}
	*clock = a.ExpiresAt
	if _, ok, err := m.Store.Consume(ctx, a.ID); ok || err != nil {
		t.Errorf("an expired approval was consumed: %v, %v", ok, err)
	}
	if res, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":1}`, spec, "r1")); err != nil || res.Kind == Allow {
		t.Errorf("the retry after the expiry: %+v, %v, want a new ask", res, err)
	}
}

// Holds: an approval for session lets through the identical call in its
// own toolgate session only: not in another session of the requester,
// not for another user in the same session ref, not with other
// arguments; an approval for once lets exactly one retry through.
func TestAuthzHoldsSessionAndOnceStayWithTheirCall(t *testing.T) {
	authzClock(t)
	m := authzManager(t)
	ctx := context.Background()
	spec := authzSpec(t, `{"approvers":{"users":["carol@example.com"]},"requester_may_approve":false}`)
	a := authzPending(t, m, spec)
	if _, err := m.Decide(ctx, a.ID, &gateway.Caller{User: "carol@example.com"}, true, ScopeSession, ""); err != nil {
		t.Fatal(err)
	}
	for name, ask := range map[string]Ask{
		"another session":   authzAsk("alice@example.com", "ref-s2", `{"amount":1}`, spec, "r1"),
		"another user":      authzAsk("bob@example.com", "ref-s1", `{"amount":1}`, spec, "r1"),
		"another case":      authzAsk("Alice@example.com", "ref-s1", `{"amount":1}`, spec, "r1"),
		"other arguments":   authzAsk("alice@example.com", "ref-s1", `{"amount":1000}`, spec, "r1"),
		"arguments + space": authzAsk("alice@example.com", "ref-s1", `{"amount":1, "to":"x"}`, spec, "r1"),
	} {
		if res, err := m.Resolve(ctx, ask); err != nil || res.Kind != Pending || res.Approval.ID == a.ID {
			t.Errorf("%s: %+v, %v, want a new pending approval", name, res.Kind, err)
		}
	}
	for i := 0; i < 2; i++ {
		if res, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{ "amount" : 1 }`, spec, "r1")); err != nil || res.Kind != Allow {
			t.Errorf("control: retry %d in the session: %+v, %v", i, res.Kind, err)
		}
	}
	b, _ := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":5}`, spec, "r1"))
	if _, err := m.Decide(ctx, b.Approval.ID, &gateway.Caller{User: "carol@example.com"}, true, ScopeOnce, ""); err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for i := 0; i < 3; i++ {
		if res, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":5}`, spec, "r1")); err == nil && res.Kind == Allow {
			allowed++
		}
	}
	if allowed != 1 {
		t.Errorf("a once approval let %d retries through", allowed)
	}
}

// Holds: a requester whose groups changed. Alice approved her own call
// for session while the policy let her (she was staff); her groups
// change and the same policy revision now leaves her calls to secops
// (four eyes). Her retry in the same session is asked anew, not let
// through by her own earlier approval. Likewise a tool approval she gave
// herself does not cover a call of the tool that now needs secops.
func TestAuthzHoldsRequesterWhoseGroupsChanged(t *testing.T) {
	authzClock(t)
	m := authzManager(t)
	ctx := context.Background()
	self := authzSpec(t, `{"scopes":["once","session","tool"]}`)
	fourEyes := authzSpec(t, `{"approvers":{"groups":["secops"]},"requester_may_approve":false,"scopes":["once","session","tool"]}`)
	a := authzPending(t, m, self)
	alice := &gateway.Caller{User: "alice@example.com", Groups: []string{"staff"}}
	if _, err := m.Decide(ctx, a.ID, alice, true, ScopeSession, ""); err != nil {
		t.Fatal(err)
	}
	if res, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":1}`, fourEyes, "r1")); err != nil || res.Kind == Allow {
		t.Errorf("alice's self-approval let through a call now left to secops: %+v, %v", res.Kind, err)
	}
	b, _ := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":7}`, self, "r1"))
	if _, err := m.Decide(ctx, b.Approval.ID, alice, true, ScopeTool, ""); err != nil {
		t.Fatal(err)
	}
	if res, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":99}`, fourEyes, "r1")); err != nil || res.Kind == Allow {
		t.Errorf("alice's tool self-approval let through a call now left to secops: %+v, %v", res.Kind, err)
	}
	if res, err := m.Resolve(ctx, authzAsk("alice@example.com", "ref-s1", `{"amount":99}`, self, "r1")); err != nil || res.Kind != Allow {
		t.Errorf("control: her tool approval under the policy she gave it under: %+v, %v", res.Kind, err)
	}
}

// Holds: a runner answers an in-band approval's form elicitation — from
// another user's call in the same session id, from the requester's other
// toolgate session, or for an approval that is not in band (whose page is
// the only place to decide it): toolgate refuses the answer and the
// approval stays pending. Control: the requester's own session decides it.
func TestAuthzHoldsInBandAnswerOnlyFromItsSession(t *testing.T) {
	authzClock(t)
	m := authzManager(t)
	ctx := context.Background()
	ref := gateway.SessionRef("s1")
	ask := func(args string, spec Spec) *Approval {
		res, err := m.Resolve(ctx, authzAsk("alice@example.com", ref, args, spec, "r1"))
		if err != nil || res.Kind != Pending {
			t.Fatalf("control: %+v, %v", res, err)
		}
		return res.Approval
	}
	inBand := ask(`{"amount":1}`, authzSpec(t, `{"in_band":true}`))
	notInBand := ask(`{"amount":3}`, authzSpec(t, `{}`))
	yes := []byte(`{"action":"accept","content":{"approve":true}}`)
	answer := func(a *Approval) mcpmsg.Message {
		return mcpmsg.Message{ID: []byte(`"` + ElicitationID(a, ModeForm) + `"`), Result: yes}
	}
	bob := &gateway.Call{Caller: &gateway.Caller{User: "bob@example.com"}, Session: &gateway.Session{ID: "s1"}}
	kelvin := &gateway.Call{Caller: &gateway.Caller{User: "Alice@example.com"}, Session: &gateway.Session{ID: "s1"}}
	other := &gateway.Call{Caller: &gateway.Caller{User: "alice@example.com"}, Session: &gateway.Session{ID: "s2"}}
	own := &gateway.Call{Caller: &gateway.Caller{User: "alice@example.com"}, Session: &gateway.Session{ID: "s1"}}
	for name, c := range map[string]*gateway.Call{"another user": bob, "another case": kelvin, "another session": other} {
		if err := m.clientAnswer(ctx, c, answer(inBand)); err == nil {
			t.Errorf("%s: the in-band answer was taken", name)
		}
	}
	if got := authzState(t, m, inBand.ID); got.Status() != StatePending {
		t.Fatalf("an in-band answer from elsewhere decided it: %+v", got)
	}
	if err := m.clientAnswer(ctx, own, answer(notInBand)); err == nil {
		t.Error("a form answer was taken for an approval that is not in band")
	}
	if got := authzState(t, m, notInBand.ID); got.Status() != StatePending {
		t.Errorf("an approval not in band was decided in the client: %+v", got)
	}
	if err := m.clientAnswer(ctx, own, answer(inBand)); err != nil {
		t.Fatalf("control: the requester's own answer: %v", err)
	}
	if got := authzState(t, m, inBand.ID); got.Status() != StateApproved || got.Scope != ScopeOnce {
		t.Errorf("control: the in-band answer did not approve it for once: %+v", got)
	}
}

// Holds: several approvers decide one approval at once, some approving
// for session, some for once, some denying: exactly one decision is
// taken (the storage lock), the others are told it was decided.
func TestAuthzHoldsConcurrentDecisionsTakeOne(t *testing.T) {
	authzClock(t)
	m := authzManager(t)
	ctx := context.Background()
	a := authzPending(t, m, authzSpec(t, `{"approvers":{"groups":["secops"]},"requester_may_approve":false}`))
	type outcome struct {
		by  string
		err error
	}
	out := make(chan outcome)
	for i := 0; i < 6; i++ {
		go func(i int) {
			c := &gateway.Caller{User: fmt.Sprintf("approver%d@example.com", i), Groups: []string{"secops"}}
			scope := []string{ScopeOnce, ScopeSession, ""}[i%3]
			_, err := m.Decide(ctx, a.ID, c, i%2 == 0, scope, "")
			out <- outcome{c.User, err}
		}(i)
	}
	won := ""
	for i := 0; i < 6; i++ {
		o := <-out
		switch {
		case o.err == nil && won != "":
			t.Errorf("%s and %s both decided the approval", won, o.by)
		case o.err == nil:
			won = o.by
		case !errors.Is(o.err, ErrDecided):
			t.Errorf("%s: %v, want ErrDecided", o.by, o.err)
		}
	}
	if got := authzState(t, m, a.ID); won == "" || got.DecidedBy != won {
		t.Errorf("the record says %q decided it, the winner was %q", got.DecidedBy, won)
	}
}
