package integration

// A review of the console and of approvals decided by people: a hostile
// runner that asks for one thing and gets another, text of a runner's
// that reaches an approver's page, and another signed-in person. Tests
// whose comment starts "Attack:" reproduce a flaw and fail until it is
// fixed; "Attack (held):" tests show attacks the gateway resists.

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Attack (fixed): a hostile runner has a policy's reason (or the name of what it
// calls) carry bidirectional controls, so that the approver reads on the
// approval page another call than the one they approve.
//
// Expected: README "Approvals" — the page shows what a call is about "with
// invisible and bidirectional control characters written as \u escapes, so
// that no argument can hide text or show it reordered"; the webhook writes
// "the reason and the arguments … as the console shows them, with
// invisible and direction-changing characters as \u escapes"
// (internal/approval/notify.go:34-37 says the same, and the Activity page
// escapes reason, method and tool with `visible`).
//
// What happens: modules/console/templates/approval.html:5,10 and
// approvals.html:15,17,46 write {{$a.Reason}}, {{$a.Tool}} and
// {{$a.Method}} as they are. A site policy whose reason quotes an argument
// (here `sprintf("post the comment %s", …)`), or an ask on prompts/get,
// whose name the runner chooses freely (no allowlist), puts U+202E on the
// approver's page: "pay to acct-\u202e1234" reads "pay to acct-4321".
//
// Fix: pipe Reason, Tool, Method (and Requester, Note) through `visible`
// in approval.html and approvals.html, as activity.html does.
// Fixed: approval.html and approvals.html write Service, Tool, Method,
// Requester, Reason, the decider and the note through `visible`
// (approval.Visible), as the Activity page does.
func TestConsoleReviewAttackApprovalPageShowsBidiInReasonAndName(t *testing.T) {
	up := startUpstream(t)
	policy := aaPolicies(t, `
decision := {"action": "ask", "reason": sprintf("post the comment %s", [input.arguments.text])} if {
	input.method == "tools/call"
	input.tool.name == "gated_tool"
}

decision := {"action": "ask", "reason": "prompts need an approval"} if {
	input.method == "prompts/get"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: policy})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	byReason := mustPend(t, m.call(1, "gated_tool", `{"text":"pay to acct-\u202e1234"}`))
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"weekly-report\u202efdp.exe","arguments":{}}}`)
	if len(msgs) != 1 {
		t.Fatalf("prompts/get: %s", msgs)
	}
	byName := mustPend(t, msgs[0])

	alicePage := g.signedIn(t, aliceKey)
	for _, u := range []string{"/console/approvals/" + byReason.ApprovalID, "/console/approvals/" + byName.ApprovalID, "/console/approvals"} {
		status, page := alicePage.get(g.URL + u)
		if status != http.StatusOK {
			t.Fatalf("%s: %d", u, status)
		}
		// The arguments are escaped (TestApprovalPageShowsInvisibleCharacters):
		// look at the rest of the page.
		if before, rest, ok := strings.Cut(page, `<code id="arguments">`); ok {
			_, after, _ := strings.Cut(rest, "</code>")
			page = before + after
		}
		if text := htmlUnescape(page); strings.ContainsRune(text, '\u202e') {
			i := strings.IndexRune(text, '\u202e')
			t.Errorf("%s shows U+202E as itself (not as \\u202e): %q", u, text[max(0, i-40):min(len(text), i+20)])
		}
	}
}

// Attack (fixed): a hostile runner asks for an approval of a small call, which the
// policy lets approvers grant for the whole tool, and then sends a large
// one, which the policy offers only for one call at a time (and for one
// minute): the large call runs on the small call's tool approval, and no
// approver ever sees it.
//
// Expected: README "Approvals" — "for `tool` (only where the policy offers
// it), any arguments of that tool", and "an approval lets a call through
// only if the call's own ask would have let the approval's decider decide
// it"; approval.CoversUnder's own rule is "a policy that narrows its
// approvals narrows those already given". The large call's ask offers only
// `once` with a ttl of 1m: a tool approval does not cover it.
//
// What happens: internal/approval/approval.go:542 (CoversUnder)
// checks the scope and the ttl against the new ask only when the policy's
// revision changed; under the same revision an ask that varies with the
// arguments (amount, target, environment) is covered by any tool approval
// whose decider could decide it (manager.go:386), whatever scopes and
// ttl that ask offers.
//
// (policies/README.md says the scope and ttl are checked again "once the
// policy changed (a new revision)", and TestApprovalFourEyesToolScope…
// expects a tool approval to cover an ask offering only once and session:
// the same-revision gap is the documented rule, and it defeats a policy
// whose approval object depends on the arguments or the tool's current
// annotations.)
//
// Fix: in CoversUnder, always require that a scope wider than once is one
// spec.Scopes offers and that the approval is not older than spec.TTL,
// whatever the revision (or at least when spec differs from the spec the
// approval was asked with).
//
// Fixed: Approval.Covers checks the ask's scopes and ttl whatever the
// revision; TestApprovalFourEyesToolScopeDenialAndExpiry now expects a
// call whose ask offers no tool scope to ask anew.
func TestApprovalReviewAttackToolScopeCoversCallOfferedOnlyOnce(t *testing.T) {
	up := startUpstream(t)
	policy := aaPolicies(t, `
text := object.get(input, ["arguments", "text"], "")

decision := {"action": "ask", "reason": "a small payment",
	"approval": {"approvers": {"groups": ["admins"]}, "requester_may_approve": false, "scopes": ["once", "session", "tool"], "ttl": "24h"}} if {
	input.method == "tools/call"
	input.tool.name == "gated_tool"
	startswith(text, "small:")
}

decision := {"action": "ask", "reason": "a large payment: each one is approved on its own",
	"approval": {"approvers": {"groups": ["admins"]}, "requester_may_approve": false, "scopes": ["once"], "ttl": "1m"}} if {
	input.method == "tools/call"
	input.tool.name == "gated_tool"
	startswith(text, "large:")
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: policy})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	small := mustPend(t, m.call(1, "gated_tool", `{"text":"small: pay 5 to acct-1"}`))
	if r := g.decide(t, carolKey, small.ApprovalID, true, "tool", "small ones are fine"); r.StatusCode != http.StatusOK {
		t.Fatalf("carol approving the small payment for the tool: %d %s", r.StatusCode, r.Body)
	}
	mustSucceed(t, m.call(2, "gated_tool", `{"text":"small: pay 7 to acct-1"}`)) // the control: what carol approved
	before := up.upstreamCalls("gated_tool")

	answer := m.call(3, "gated_tool", `{"text":"large: pay 1000000 to acct-666"}`)
	var a struct {
		Error *struct{ Code int }
	}
	_ = json.Unmarshal(answer, &a)
	if ran := up.upstreamCalls("gated_tool") - before; ran > 0 || a.Error == nil || a.Error.Code != -32012 {
		t.Errorf("a call the policy offers only once (ttl 1m) ran on a tool approval given for small calls (upstream calls: %d): %.300s", ran, answer)
	}
}

// Attack (held): the requester of a four-eyes call (approvers: admins,
// requester_may_approve false) tries to approve it in the console — on
// its page, with a form built by hand, and in bulk from the queue — and
// then replays the admin's approval. Nothing of it works: the page offers
// no form, every decision is refused and the approval stays pending; the
// admin's approval lets exactly one identical call through, the next one
// asks again, and deciding the used approval once more is refused.
func TestConsoleReviewAttackHeldRequesterCannotDecideFourEyes(t *testing.T) {
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"four-eyes transfer"}`))
	page := "/console/approvals/" + p.ApprovalID

	aliceB := g.signedIn(t, aliceKey)
	status, body := aliceB.get(g.URL + page)
	if status != http.StatusOK || strings.Contains(body, p.ApprovalID+"/approve") || !strings.Contains(body, "Someone else decides") {
		t.Fatalf("the requester's view of a four-eyes approval: %d, approve form shown: %v", status, strings.Contains(body, p.ApprovalID+"/approve"))
	}
	csrf := aliceB.csrf(body)
	for _, scope := range []string{"once", "session", ""} {
		if status, _ := aliceB.post(g.URL+page+"/approve", map[string][]string{"csrf": {csrf}, "scope": {scope}}); status != http.StatusForbidden {
			t.Errorf("the requester approving her own four-eyes call (scope %q) in the console: %d", scope, status)
		}
	}
	if _, body := aliceB.post(g.URL+"/console/approvals", map[string][]string{"csrf": {csrf}, "id": {p.ApprovalID}, "action": {"approve"}}); !strings.Contains(body, "Not decided") {
		t.Errorf("the requester's bulk approval of her own four-eyes call is not refused")
	}
	if r := g.api(t, http.MethodGet, "/v1/approvals/"+p.ApprovalID, aliceKey, nil); !strings.Contains(string(r.Body), `"state":"pending"`) {
		t.Fatalf("after the requester's attempts: %s", r.Body)
	}

	carolB := g.signedIn(t, carolKey)
	_, body = carolB.get(g.URL + page)
	if status, body := carolB.post(g.URL+page+"/approve", map[string][]string{"csrf": {carolB.csrf(body)}, "scope": {"once"}}); status != http.StatusOK || !strings.Contains(body, "Approved for one identical call") {
		t.Fatalf("the admin approving in the console: %d", status)
	}
	mustSucceed(t, m.call(2, "gated_tool", `{"text":"four-eyes transfer"}`))
	if again := mustPend(t, m.call(3, "gated_tool", `{"text":"four-eyes transfer"}`)); again.ApprovalID == p.ApprovalID {
		t.Error("the used approval was offered again")
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Errorf("the upstream ran the four-eyes call %d times, want 1", n)
	}
	_, body = carolB.get(g.URL + page)
	if status, _ := carolB.post(g.URL+page+"/approve", map[string][]string{"csrf": {carolB.csrf(body)}, "scope": {"once"}}); status != http.StatusConflict {
		t.Errorf("approving the used approval again: %d, want 409", status)
	}
}

// Attack (fixed): an agent (its arguments written by a model a page it read may
// have instructed) asks for an in_band approval of a payment whose account
// carries U+202E; the person approving in their MCP client reads
// "acct-4321" where "acct-\u202e1234" will go upstream.
//
// Expected: an approver reads what a call is about with invisible and
// bidirectional controls written as \u escapes, "so that no argument can
// hide text or show it reordered" (README "Approvals", for the console
// page; the webhook writes reason and arguments "as the console shows
// them"). The in-band form is the approval page of an in_band approval:
// README says it shows "the tool, the reason and the masked arguments".
//
// What happens: modules/policy/hold.go:182-186 (inBandQuestion) builds the form's
// message from a.Reason and the masked arguments as they are
// (string(c.Masked)), without approval.Visible.
//
// Fix: approval.Visible on the question (reason and arguments), as the
// console's indent and the webhook do.
// Fixed: inBandQuestion returns the whole question (tool, service, reason
// and masked arguments) through approval.Visible.
func TestApprovalReviewAttackInBandQuestionHidesArgumentsWithBidi(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), PolicyOptions: "approval_wait 10s"})
	var (
		mu    sync.Mutex
		asked []string
	)
	opts := &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			asked = append(asked, req.Params.Message)
			mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": false}}, nil
		},
	}
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", opts)
	if _, isErr := toolError(t, cs, "gated_tool", map[string]any{"text": "in-band pay to acct-\u202e1234"}); !isErr {
		t.Fatal("the control: the call denied in the client ran")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 {
		t.Fatalf("elicitations asked: %q", asked)
	}
	if strings.ContainsRune(asked[0], '\u202e') || !strings.Contains(asked[0], `acct-\u202e1234`) {
		t.Errorf("the in-band question shows U+202E as itself, not as \\u202e: %q", asked[0])
	}
}

// Attack (fixed): someone who can write the gateway's storage, and holds no key
// of its cipher, gets a four-eyes call (admins decide, not its requester)
// approved. Editing the approval record no longer works (records carry an
// HMAC: TestCipherAttackForgedApprovalDecisionRuns), so they mint a console sign-in instead: a
// browser-session record for carol, an admin, under the SHA-256 of a
// cookie value of their choosing, and its index entry. With that cookie
// the console signs them in as carol, and "carol" approves.
//
// Expected: README "Approvals" — "a record changed in storage by anyone
// but toolgate is no approval" (each approval carries an HMAC under a key
// sealed by the cipher, so "whoever can write the storage but holds no key
// of the cipher can delete approvals, not decide them",
// internal/approval/approval.go:141-144). A decision needs an approver.
//
// What happens: internal/websession/websession.go:187 (Get) trusts any
// record found under the hash of the cookie: user, groups and method are
// read from storage unauthenticated, so a storage writer signs in as
// anyone (Method "oidc" also skips the API-key check of FromRequest) and
// decides every approval through the console.
//
// Fix: authenticate browser-session records as approvals are (an HMAC over
// the record under a key sealed by the cipher, or the record sealed by
// it), and treat a record that does not verify as no sign-in.
//
// Fixed: each browser-session record carries a MAC over its id's hash and
// whom it signs in, under keys derived from state_secret
// (gateway.App.Keyring); websession.Get refuses a record without a good
// one.
func TestConsoleReviewAttackStorageWriterMintsApproverSignIn(t *testing.T) {
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"four-eyes wire the money"}`))

	const cookie = "minted-by-someone-who-can-write-the-storage-0001"
	now := time.Now().UTC()
	record, _ := json.Marshal(map[string]any{"user": carol, "groups": []string{"admins"}, "method": "oidc",
		"created_at": now, "seen_at": now, "idle": int64(time.Hour), "expires_at": now.Add(time.Hour)})
	caWrite(t, filepath.Join(g.DataDir, "toolgate", "browser-sessions-by-user", sha256Hex(carol), sha256Hex(cookie)), []byte(now.Add(time.Hour).Format(time.RFC3339)))
	caWrite(t, filepath.Join(g.DataDir, "toolgate", "browser-sessions", sha256Hex(cookie)), record)

	forger := g.newPerson(t)
	forger.client.Jar.SetCookies(mustURL(t, g.URL), []*http.Cookie{{Name: "toolgate_session", Value: cookie, Path: "/"}})
	_, page := forger.get(g.URL + "/console/approvals/" + p.ApprovalID)
	if strings.Contains(page, caSignedInAs(carol)) {
		t.Errorf("a browser-session record written into storage signs its writer in as %s", carol)
	}
	if !strings.Contains(page, `name="csrf"`) {
		return // not signed in: held
	}
	status, _ := forger.post(g.URL+"/console/approvals/"+p.ApprovalID+"/approve", map[string][]string{"csrf": {forger.csrf(page)}, "scope": {"once"}})
	answer := m.call(2, "gated_tool", `{"text":"four-eyes wire the money"}`)
	if n := up.upstreamCalls("gated_tool"); n > 0 {
		t.Errorf("the four-eyes call ran (%d upstream calls) on an approval decided through a forged sign-in (HTTP %d): %.200s", n, status, answer)
	}
}

// Attack (fixed): a hostile runner asks for a payment to "acct-1234" followed by
// U+3164 (HANGUL FILLER), an account of its own whose name the approver
// cannot tell from acct-1234: the character is invisible on the page.
// U+034F (COMBINING GRAPHEME JOINER) and the variation selectors hide
// inside a value the same way.
//
// Expected: README "Approvals" — the page shows the arguments "with
// invisible and bidirectional control characters written as \u escapes,
// so that no argument can hide text"; TestApprovalPageShowsInvisibleCharacters
// holds this for U+200B, whose effect these share.
//
// What happens: internal/approval/visible.go:36 escapes Unicode's format
// characters (Cf) only; the other default-ignorable code points (U+034F,
// U+115F, U+1160, U+17B4-17B5, U+180B-180D, U+3164, U+FE00-FE0F, U+FFA0,
// U+E0100-E01EF), which render as nothing, are written as they are by
// modules/console/approvals.go:107 (indent), and so by the webhook.
//
// Fix: escape every Default_Ignorable_Code_Point in approval.Visible
// (Cf plus Other_Default_Ignorable_Code_Point and the variation
// selectors), not just Cf.
// Fixed: approval.Visible escapes Cf, Other_Default_Ignorable_Code_Point
// and the variation selectors (TestVisibleEscapesDefaultIgnorables), so
// the page, the webhook and the in-band question show them as \u escapes.
func TestConsoleReviewAttackApprovalPageHidesDefaultIgnorables(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"pay to acct-1234\u3164","memo":"ok\u034f\ufe0f\u115f"}`))
	_, page := g.signedIn(t, aliceKey).get(g.URL + "/console/approvals/" + p.ApprovalID)
	_, args, _ := strings.Cut(page, `<code id="arguments">`)
	args, _, _ = strings.Cut(args, "</code>")
	args = htmlUnescape(args)
	for _, r := range []rune{'\u3164', '\u034f', '\ufe0f', '\u115f'} {
		if strings.ContainsRune(args, r) {
			t.Errorf("the approval page shows the invisible U+%04X as itself in %q", r, args)
		}
	}
}
