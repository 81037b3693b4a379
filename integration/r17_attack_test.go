package integration

// The seventeenth look: authentication, the HTTP API and the console as
// another user, resource exhaustion by an authenticated runner, secrets
// and logs. Each test names the attack, the contract it checks, and
// whether it was reproduced (and fixed) or held.

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Attack: a runner floods POST /v1/connections/{service}/test. Each test
// is an MCP initialize sent to the upstream (plus its DELETE), held until
// the upstream answers or 15 s pass: a goroutine, buffers up to
// max_response_size and an upstream connection, exactly what a call in
// progress holds. The MCP endpoint counts those against max_streams and
// max_streams_per_caller; the connection test counted nothing, so one
// caller could hold any number of upstream connections at once (and send
// the upstream as many initializes, with the service's own credential).
//
// Expected: README, max_streams_per_caller: "responses this gateway
// process relays at once …: calls waiting for their answer and open SSE
// streams (each holds a goroutine, buffers and an upstream connection);
// one more gets … a retryable … error naming the option". A connection
// test is such a response.
//
// Reproduced: with max_streams_per_caller 2, eight concurrent tests of
// one caller were all waiting at the upstream at once.
//
// Severity: medium (an authenticated runner holds unbounded goroutines,
// memory and upstream connections; an amplified flood of the upstream).
func TestR17ConnectionTestsBypassStreamLimits(t *testing.T) {
	up := startUpstream(t)
	release := make(chan struct{})
	var mu sync.Mutex
	waiting, most := 0, 0
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if !strings.Contains(string(body), "toolgate-connection-test") {
			return false
		}
		mu.Lock()
		waiting++
		most = max(most, waiting)
		mu.Unlock()
		defer func() {
			mu.Lock()
			waiting--
			mu.Unlock()
		}()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return false // then the real server answers
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_streams_per_caller 2"})

	const tests = 8
	var wg sync.WaitGroup
	answers := make(chan apiResponse, tests)
	for range tests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers <- g.api(t, http.MethodPost, "/v1/connections/svc/test", aliceKey, nil)
		}()
	}
	// Wait until every test either reached the upstream or was answered.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := waiting
		mu.Unlock()
		if n+len(answers) >= tests || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	seen := most
	mu.Unlock()
	close(release)
	wg.Wait()
	close(answers)

	if seen > 2 {
		t.Errorf("%d connection tests of one caller waited at the upstream at once; max_streams_per_caller is 2", seen)
	}
	refused := 0
	for a := range answers {
		var res struct {
			OK        bool   `json:"ok"`
			Error     string `json:"error"`
			Retryable bool   `json:"retryable"`
		}
		if err := json.Unmarshal(a.Body, &res); err != nil {
			t.Fatalf("test answer %d %s: %v", a.StatusCode, a.Body, err)
		}
		if !res.OK {
			if !res.Retryable || !strings.Contains(res.Error, "max_streams_per_caller") {
				t.Errorf("a refused test answered %d %s, want a retryable error naming max_streams_per_caller", a.StatusCode, a.Body)
			}
			refused++
		}
	}
	if refused != tests-seen {
		t.Logf("%d of %d tests refused, %d reached the upstream at once", refused, tests, seen)
	}
	if seen == 0 {
		t.Fatal("no connection test reached the upstream: the check could not fail")
	}
}

// Attack: an MCP session on a program (stdio) or a legacy SSE server is a
// session of toolgate's bridge (internal/mcpbridge), which remembers each
// resource URI the runner subscribed to (so that sessions sharing the
// program's connection subscribe once, and an ended session's are
// dropped). It remembered every one the server accepted: a runner that
// subscribes to many distinct URIs, each as long as max_request_size
// allows, makes toolgate keep all of them (twice: per session and per
// connection) for as long as the session lives. The policy sees
// resources/subscribe, but the default one allows every method but
// tools/call.
//
// Expected: README, max_request_size and max_request_values bound what
// one message costs; DESIGN, "Bodies, SSE lines and JSON nesting have
// limits": a session's runner cannot make toolgate hold memory without
// bound by sending messages (max_streams, max_mcp_sessions_per_caller, …
// bound the rest).
//
// Reproduced: 64 subscriptions with distinct 256 KiB URIs left ~16 MiB
// held in the gateway after the requests were answered.
//
// Severity: medium (an authenticated runner grows the gateway's memory
// without bound: 4 MiB per message, as many messages as it likes).
func TestR17BridgeSubscriptionsUnbounded(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", Services: goSDKStdioService(t, "prog", "")})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "prog"), "prog")
	m.initialize()
	const subs, uriBytes = 64, 256 << 10
	subscribe := func(i int) string {
		uri := exFiller(fmt.Sprintf("file:///r17/%d/", i), uriBytes)
		status, _, msgs := m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"resources/subscribe","params":{"uri":%q}}`, 10+i, uri))
		if status != http.StatusOK || len(msgs) != 1 {
			t.Fatalf("subscribe %d: %d %s", i, status, msgs)
		}
		return string(msgs[0])
	}
	// Control: the program accepts a subscription.
	if answer := subscribe(-1); !strings.Contains(answer, `"result"`) {
		t.Fatalf("control: the program refused a subscription: %.200s", answer)
	}
	base, _ := inUse()
	accepted := 0
	for i := range subs {
		if answer := subscribe(i); strings.Contains(answer, `"result"`) {
			accepted++
		}
	}
	held, _ := inUse()
	grown := int64(held) - int64(base)
	t.Logf("heap: %d MiB before, %d MiB after %d subscriptions (%d accepted) with %d KiB URIs: %+d MiB",
		base>>20, held>>20, subs, accepted, uriBytes>>10, grown>>20)
	if grown > 4<<20 {
		t.Errorf("%d subscriptions of one MCP session with %d KiB URIs hold %d MiB in the gateway after they were answered",
			accepted, uriBytes>>10, grown>>20)
	}
	// Unsubscribing makes room again.
	unsub := exFiller("file:///r17/-1/", uriBytes)
	if status, _, msgs := m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":1000,"method":"resources/unsubscribe","params":{"uri":%q}}`, unsub)); status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"result"`) {
		t.Fatalf("unsubscribe: %d %.200s", status, msgs)
	}
	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":1001,"method":"resources/subscribe","params":{"uri":"file:///r17/small"}}`); status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"result"`) {
		t.Errorf("a subscription after an unsubscribe: %d %.200s", status, msgs)
	}
	endMCPSession(t, m)
}

// Attack: an approval keeps the call's arguments (and a masked copy),
// sealed, beside its record. max_pending_per_user bounds the approvals a
// person's calls have waiting, but a denied one kept its contents until
// its record was swept, a day after the decision. A runner whose policy
// lets its user decide their own asks (the default) asks with megabytes of
// arguments, denies the approval at once through the API with the same
// key, which frees its place, and asks again: the storage fills with
// sealed arguments nobody will ever read, at the runner's pace. (The same
// with approvals approved and used, or approved and left unused:
// TestR17UsedApprovalsKeepTheirContents,
// TestR17ApprovedUnusedApprovalsHoldTheirPlace.)
//
// Expected: README, Approvals: "each keeps the call's arguments (and a
// withheld result), encrypted, until it is decided or expires"; "records
// are kept, without them, a day after they expired or were decided".
//
// Reproduced: 12 asks of 256 KiB arguments, each denied by its own
// requester, left 8 MiB of sealed contents in storage.
//
// Severity: medium (one authenticated runner grows the shared storage
// without bound, up to twice max_request_size per cycle, for a day).
func TestR17DeniedApprovalsKeepTheirContents(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	const cycles, argBytes = 12, 256 << 10
	for i := range cycles {
		text := exFiller(fmt.Sprintf("r17-%d-", i), argBytes)
		p := mustPend(t, m.call(100+i, "gated_tool", fmt.Sprintf(`{"text":%q}`, text)))
		if r := g.api(t, http.MethodPost, "/v1/approvals/"+p.ApprovalID+"/deny", aliceKey, []byte(`{"note":"no"}`)); r.StatusCode != http.StatusOK {
			t.Fatalf("deny %d: %d %s", i, r.StatusCode, r.Body)
		}
		// The identical retry still gets the denial, from the record.
		if answer := m.call(200+i, "gated_tool", fmt.Sprintf(`{"text":%q}`, text)); !strings.Contains(string(answer), "denied by alice@example.test: no") {
			t.Fatalf("the retry of denied call %d: %.300s", i, answer)
		}
	}
	size := approvalContentsBytes(g)
	t.Logf("%d approvals denied: %d KiB of sealed contents in storage", cycles, size>>10)
	if size > argBytes {
		t.Errorf("%d denied approvals keep %d KiB of sealed contents", cycles, size>>10)
	}
	// The records stay, without them: their requester still sees them.
	r := g.api(t, http.MethodGet, "/v1/approvals?role=requester", aliceKey, nil)
	if r.StatusCode != http.StatusOK || strings.Count(string(r.Body), `"state":"denied"`) != cycles {
		t.Errorf("the requester's approvals: %d %.300s", r.StatusCode, r.Body)
	}
}

// Attack (fixed): the loop of TestR17DeniedApprovalsKeepTheirContents
// with approvals approved for once and used at once by their own requester
// (the default lets them): a used approval kept its sealed arguments (and
// a released result) for its page until its record was removed, a day
// after the decision, so a runner grew the storage by up to twice
// max_request_size per ask, for a day, at its pace (each cycle runs the
// call upstream once).
//
// Expected: README, Approvals: an approval keeps what it is about only
// while it may still be used.
//
// Reproduced: 12 asks of 256 KiB, each approved and used, left 8 MiB.
// Fixed: a used-up approval drops its contents (Store.Consume); the record
// stays, without them.
//
// Severity: medium.
func TestR17UsedApprovalsKeepTheirContents(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	const cycles, argBytes = 12, 256 << 10
	var last string
	for i := range cycles {
		text := exFiller(fmt.Sprintf("r17-used-%d-", i), argBytes)
		p := mustPend(t, m.call(100+i, "gated_tool", fmt.Sprintf(`{"text":%q}`, text)))
		last = p.ApprovalID
		if r := g.api(t, http.MethodPost, "/v1/approvals/"+p.ApprovalID+"/approve", aliceKey, []byte(`{"scope":"once"}`)); r.StatusCode != http.StatusOK {
			t.Fatalf("approve %d: %d %s", i, r.StatusCode, r.Body)
		}
		mustSucceed(t, m.call(200+i, "gated_tool", fmt.Sprintf(`{"text":%q}`, text)))
	}
	if size := approvalContentsBytes(g); size > argBytes {
		t.Errorf("%d approvals approved once and used keep %d KiB of sealed contents", cycles, size>>10)
	}
	r := g.api(t, http.MethodGet, "/v1/approvals?role=requester", aliceKey, nil)
	if r.StatusCode != http.StatusOK || strings.Count(string(r.Body), `"state":"consumed"`) != cycles {
		t.Errorf("the requester's approvals: %d %.300s", r.StatusCode, r.Body)
	}
	// Its page says what became of them.
	if status, page := g.signedIn(t, aliceKey).get(g.URL + "/console/approvals/" + last); status != http.StatusOK ||
		!strings.Contains(page, "are no longer kept") || strings.Contains(page, "r17-used-") {
		t.Errorf("the console page of a used approval: %d %.2000s", status, page)
	}
}

// Attack (fixed): approve each ask at once and never use it. An approved
// approval keeps what it is about until it is used or expires (its retry
// needs it), and approving freed its place under max_pending_per_user, so
// a runner could keep max_request_size of sealed arguments per ask for the
// approval's whole ttl (up to 24 hours, as its policy sets), at its pace.
//
// Fixed: an approved approval keeps its place until it is used up or
// expires; past max_pending_per_user the next ask is refused (-32011,
// retryable), and using one gives its place back.
func TestR17ApprovedUnusedApprovalsHoldTheirPlace(t *testing.T) {
	_, g := approvalsGateway(t, "approvals {\n\t\tmax_pending_per_user 3\n\t}")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	args := func(i int) string { return fmt.Sprintf(`{"text":"r17-unused-%d"}`, i) }
	for i := range 3 {
		p := mustPend(t, m.call(100+i, "gated_tool", args(i)))
		if r := g.api(t, http.MethodPost, "/v1/approvals/"+p.ApprovalID+"/approve", aliceKey, []byte(`{"scope":"once"}`)); r.StatusCode != http.StatusOK {
			t.Fatalf("approve %d: %d %s", i, r.StatusCode, r.Body)
		}
	}
	if answer := m.call(103, "gated_tool", args(3)); !strings.Contains(string(answer), "max_pending_per_user") || !strings.Contains(string(answer), `"retryable":true`) {
		t.Fatalf("a fourth ask beside three approved and unused approvals (max_pending_per_user 3): %.300s", answer)
	}
	mustSucceed(t, m.call(200, "gated_tool", args(0))) // uses one up: its place is free again
	mustPend(t, m.call(104, "gated_tool", args(3)))
}

// approvalContentsBytes is the size of the approvals' sealed contents in
// g's storage.
func approvalContentsBytes(g *gateway) int64 {
	size := int64(0)
	root := filepath.Join(g.DataDir, "toolgate", "approvals-contents")
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				size += info.Size()
			}
		}
		return nil
	})
	return size
}
