// Tests whose comment starts with "Attack" reproduce a flaw (they fail until it is fixed); those whose comment starts with "Holds" check an attack that toolgate withstands.
package integration

// Attacks on subscriptions/listen (protocol 2026-07-28), whose filter
// names resources that toolgate decides one by one as the
// resources/subscribe an earlier revision would send, and on the
// progress notifications toolgate drops on the standalone stream. The
// site policy of each test denies (or asks about) subscribing to some
// resources and allows everything else.

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// ---- helpers ---------------------------------------------------------------

// lnDenySecret is a site rule: nobody subscribes to test://secret.
const lnDenySecret = `decision := {"action": "deny", "reason": "test://secret is off limits"} if {
	input.method == "resources/subscribe"
	input.params.uri == "test://secret"
}
`

// lnModern is a hand-written upstream of the stateless revision only
// (2026-07-28) that offers resource subscriptions and decodes the params
// of subscriptions/listen with encoding/json, as many Go servers do (it
// matches keys to struct fields ignoring case). A listen is answered with
// the acknowledgement, a notifications/resources/updated for each resource
// it subscribed to, a progress notification on a token nobody issued and a
// tools/list_changed, then its result (so every stream ends).
type lnModern struct {
	URL string

	mu         sync.Mutex
	bodies     []string
	subscribed []string // the resources its listen handler subscribed to
}

func lnStartModern(t *testing.T) *lnModern {
	t.Helper()
	u := &lnModern{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		body, _ := io.ReadAll(r.Body)
		msg := gjson.ParseBytes(body)
		id, method := msg.Get("id"), msg.Get("method").String()
		u.mu.Lock()
		u.bodies = append(u.bodies, string(body))
		u.mu.Unlock()
		if method == "subscriptions/listen" && id.Exists() {
			var listen struct {
				Params struct {
					Notifications *struct {
						ResourceSubscriptions []string `json:"resourceSubscriptions"`
					} `json:"notifications"`
				} `json:"params"`
			}
			_ = json.Unmarshal(body, &listen)
			var uris []string
			if n := listen.Params.Notifications; n != nil {
				uris = n.ResourceSubscriptions
			}
			u.mu.Lock()
			u.subscribed = append(u.subscribed, uris...)
			u.mu.Unlock()
			meta := `"_meta":{"io.modelcontextprotocol/subscriptionId":` + id.Raw + `}`
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			events := []string{`{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{` + meta + `,"notifications":{}}}`}
			for _, uri := range uris {
				events = append(events, `{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":`+aaJSON(uri)+`,`+meta+`}}`)
			}
			events = append(events,
				`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"never-issued","progress":1,"message":"FORGED-LISTEN-PROGRESS"}}`,
				`{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{`+meta+`}}`,
				`{"jsonrpc":"2.0","id":`+id.Raw+`,"result":{"resultType":"complete",`+meta+`}}`)
			for _, e := range events {
				_, _ = io.WriteString(w, "event: message\ndata: "+e+"\n\n")
			}
			return
		}
		if !id.Exists() {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		status, payload := http.StatusOK, ""
		switch method {
		case "server/discover":
			payload = `"result":{"resultType":"complete","supportedVersions":["2026-07-28"],` +
				`"capabilities":{"tools":{"listChanged":true},"resources":{"subscribe":true,"listChanged":true}},` +
				`"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"listen-modern","version":"1"}},"ttlMs":0,"cacheScope":"public"}`
		case "tools/list":
			payload = `"result":{"resultType":"complete","tools":[],"ttlMs":0,"cacheScope":"public"}`
		default:
			status, payload = http.StatusNotFound, `"error":{"code":-32601,"message":"Method not found"}`
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+id.Raw+`,`+payload+`}`)
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL + "/mcp"
	return u
}

// subscriptions are the resources the upstream's listen handler
// subscribed to so far.
func (u *lnModern) subscriptions() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.subscribed...)
}

// listensNaming are the subscriptions/listen messages the upstream got
// that name uri anywhere.
func (u *lnModern) listensNaming(uri string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, b := range u.bodies {
		if strings.Contains(b, `"subscriptions/listen"`) && strings.Contains(b, uri) {
			out = append(out, b)
		}
	}
	return out
}

// lnListen sends a stateless subscriptions/listen with params (its members
// before _meta), declaring caps, and returns the status and the whole
// answer (the test upstreams end their streams).
func lnListen(t *testing.T, g *gateway, session, id, params, caps string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	idPart := ""
	if id != "" {
		idPart = `"id":` + id + `,`
	}
	resp := aaStatelessSend(t, ctx, g, aliceKey, session, "subscriptions/listen",
		`{"jsonrpc":"2.0",`+idPart+`"method":"subscriptions/listen","params":{`+params+aaStatelessMeta(caps)+`}}`)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// lnLegacySubscribed are the resources a go-sdk upstream of an earlier
// revision was asked to subscribe to.
func lnLegacySubscribed(up *upstream) []string {
	var uris []string
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"resources/subscribe"`) {
			uris = append(uris, gjson.Get(r.Body, "params.uri").String())
		}
	}
	return uris
}

// lnFirstData reads an open stream up to its first data line (at most 8
// lines) and returns what it read.
func lnFirstData(r io.Reader) string {
	br := bufio.NewReader(r)
	var read strings.Builder
	for range 8 {
		line, err := br.ReadString('\n')
		read.WriteString(line)
		if err != nil || strings.HasPrefix(line, "data:") {
			break
		}
	}
	return read.String()
}

func lnContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ---- attacks ---------------------------------------------------------------

// Attack: the filter's members spelled in another case. Parse refuses case
// variants only of the members it reads itself (name, arguments, uri, …),
// and ListenSubscriptions looks up "notifications" and
// "resourceSubscriptions" case-sensitively, so a listen whose filter says
// "ResourceSubscriptions" (or "Notifications", or "reſourceSubscriptions"
// with a long s, which encoding/json folds to "s") names no resource to
// the policy and is allowed; an upstream of 2026-07-28 that decodes with
// encoding/json reads the member as resourceSubscriptions, subscribes to
// test://secret and sends its updates, which toolgate relays. Both a
// stateless runner (relayed listen) and a runner that initialized in front
// of that upstream (a translated POST subscriptions/listen) get through.
// Such a filter must be refused (-32602) or denied, and nothing naming
// test://secret reach the upstream.
func TestListenAttackCaseVariantFilterKeys(t *testing.T) {
	up := lnStartModern(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: aaPolicies(t, lnDenySecret, "")})
	session := g.createSession(t, aliceKey, "svc")

	// The control: spelled right, the listen is denied.
	status, body := lnListen(t, g, session, "1", `"notifications":{"resourceSubscriptions":["test://secret"]},`, `{}`)
	if !strings.Contains(body, `is denied`) || len(up.listensNaming("test://secret")) != 0 {
		t.Fatalf("the control listen naming test://secret: %d %s", status, body)
	}

	for i, params := range []string{
		`"notifications":{"ResourceSubscriptions":["test://secret"]},`,
		`"Notifications":{"resourceSubscriptions":["test://secret"]},`,
		`"notifications":{"re\u017fourceSubscriptions":["test://secret"]},`,
	} {
		status, body := lnListen(t, g, session, strconv.Itoa(10+i), params, `{}`)
		if strings.Contains(body, `"notifications/resources/updated"`) && strings.Contains(body, "test://secret") {
			t.Errorf("stateless listen {%s}: the runner got the updates of test://secret: %d %.300s", params, status, body)
		}
	}

	// A runner that initialized, in front of the same upstream.
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":5,"method":"subscriptions/listen","params":{"notifications":{"ResourceSubscriptions":["test://secret"]}}}`)
	for _, msg := range msgs {
		if strings.Contains(string(msg), `"notifications/resources/updated"`) && strings.Contains(string(msg), "test://secret") {
			t.Errorf("a 2025-11-25 runner's listen got the updates of test://secret: %s", msg)
		}
	}

	if got := up.subscriptions(); lnContains(got, "test://secret") {
		t.Errorf("the upstream was subscribed to test://secret past a policy that denies it (it subscribed to %q)", got)
	}
}

// Attack: a subscriptions/listen sent as a notification (no id). The
// per-resource decisions run only for a request (decideSubscriptions
// returns early unless call.IsRequest()), so the listen is decided as a
// listen alone and a stateless runner's notification is passed on to an
// upstream of 2026-07-28 with test://secret in its filter — a listen no
// decision allowed; a server that dispatches on the method without looking
// at the id subscribes. It must be decided resource by resource like a
// request (denied here), or refused, and never reach the upstream.
func TestListenAttackNotificationSkipsDecisions(t *testing.T) {
	up := lnStartModern(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: aaPolicies(t, lnDenySecret, "")})
	session := g.createSession(t, aliceKey, "svc")
	status, body := lnListen(t, g, session, "", `"notifications":{"resourceSubscriptions":["test://secret"]},`, `{}`)
	if got := up.listensNaming("test://secret"); len(got) != 0 {
		t.Errorf("a listen notification naming test://secret reached the upstream undecided (runner got %d %s): %s", status, body, got[0])
	}
}

// Attack: an ask about one resource decides who may approve the others. A
// listen whose resources ask is asked with the approval object of the
// first asking decision only (or the listen's own when it asks), so a
// runner names first a resource whose ask its requester may approve and
// then one the policy leaves to carol alone (requester_may_approve: false):
// alice approves the listen herself, and the upstream is subscribed to
// test://secret. One approval answers every ask of the listen, so asks for
// different approvals deny the listen (the runner subscribes to such
// resources in listens of their own), and nothing is subscribed.
func TestListenAttackFirstAskChoosesApprovers(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "ask", "reason": "watching test://watched needs a nod"} if {
	input.method == "resources/subscribe"
	input.params.uri == "test://watched"
}

decision := {"action": "ask", "reason": "only carol lets anyone watch test://secret",
	"approval": {"approvers": {"users": ["carol@example.test"]}, "requester_may_approve": false}} if {
	input.method == "resources/subscribe"
	input.params.uri == "test://secret"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	params := `"notifications":{"resourceSubscriptions":["test://watched","test://secret"]},`
	status, body := lnListen(t, g, session, "1", params, `{}`)
	if id := gjson.Get(body, "error.data.approval_id").String(); id != "" {
		t.Errorf("the listen naming test://watched and test://secret asks for one approval: %d %s", status, body)
	} else if gjson.Get(body, "error.code").Int() != -32013 || !strings.Contains(body, "another approval") {
		t.Fatalf("the listen naming test://watched and test://secret: %d %s, want denied, saying the resources ask for different approvals", status, body)
	}
	// Alone, test://secret asks for carol's approval, which alice cannot give.
	alone := `"notifications":{"resourceSubscriptions":["test://secret"]},`
	status, body = lnListen(t, g, session, "3", alone, `{}`)
	id := gjson.Get(body, "error.data.approval_id").String()
	if id == "" {
		t.Fatalf("the listen naming test://secret: %d %s, want an approval", status, body)
	}
	params = alone
	if r := g.decide(t, aliceKey, id, true, "once", ""); r.StatusCode == http.StatusOK {
		t.Errorf("alice approved her own listen of test://secret, which the policy leaves to carol: %d %s", r.StatusCode, r.Body)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp := aaStatelessSend(t, ctx, g, aliceKey, session, "subscriptions/listen",
			`{"jsonrpc":"2.0","id":2,"method":"subscriptions/listen","params":{`+params+aaStatelessMeta(`{}`)+`}}`)
		first := lnFirstData(resp.Body) // the stream stays open: its beginning
		resp.Body.Close()
		if got := lnLegacySubscribed(up); lnContains(got, "test://secret") {
			t.Errorf("with alice's own approval the upstream was subscribed to %q (the runner got %d %q)", got, resp.StatusCode, first)
		}
	}
}

// Attack: an approved listen of a runner that takes approvals in band
// (declared elicitation.url) never opens. The ask is stored for the
// listen's whole params, and the retry toolgate asked for carries its
// requestState and inputResponses in those params (removed only on the
// way upstream), so the approval is never found for it: the retry asks
// again, with a new approval, forever. (The requestState, bound to the
// listen's arguments — none — and URI — none — would also open a retry of
// any other listen.) The retry echoing the state must open the approved
// listen.
func TestListenAttackInBandApprovalNeverMatches(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "ask", "reason": "watching test://watched needs a nod"} if {
	input.method == "resources/subscribe"
	input.params.uri == "test://watched"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	caps := `{"elicitation":{"url":{}}}`
	params := `"notifications":{"resourceSubscriptions":["test://watched"]},`
	status, body := lnListen(t, g, session, "1", params, caps)
	answer := gjson.Parse(body)
	if strings.HasPrefix(strings.TrimSpace(body), "event:") || strings.HasPrefix(strings.TrimSpace(body), "data:") {
		answer = gjson.Parse(string(answerBody(&http.Response{Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(strings.NewReader(body))})))
	}
	state := answer.Get("result.requestState").String()
	id := answer.Get(`result._meta.toolgate/approval.id`).String()
	if state == "" || id == "" {
		t.Fatalf("the listen asking in band: %d %s", status, body)
	}
	if r := g.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving the listen: %d %s", r.StatusCode, r.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp := aaStatelessSend(t, ctx, g, aliceKey, session, "subscriptions/listen",
		`{"jsonrpc":"2.0","id":2,"method":"subscriptions/listen","params":{`+params+
			`"inputResponses":{"io.toolgate/approval":{"action":"accept"}},"requestState":`+aaJSON(state)+`,`+aaStatelessMeta(caps)+`}}`)
	first := lnFirstData(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(first, "notifications/subscriptions/acknowledged") ||
		!lnContains(lnLegacySubscribed(up), "test://watched") {
		t.Errorf("the retry of the approved listen with its requestState: %d %.400q, subscribed %q; want the listen open",
			resp.StatusCode, first, lnLegacySubscribed(up))
	}
}

// ---- attacks toolgate withstands -------------------------------------------

// Holds: the denied resource hidden in the filter of a stateless listen to
// an upstream of an earlier revision — escaped, duplicated, after 63
// allowed resources, among entries that are not strings — is denied or
// refused every time, and the upstream is never subscribed to it; the
// allowed resources of a listen that also names it are not subscribed
// either.
func TestListenHoldsSpellingsDuplicatesAndOrder(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: aaPolicies(t, lnDenySecret, "")})
	session := g.createSession(t, aliceKey, "svc")
	var many []string
	for i := range 63 {
		many = append(many, `"test://r`+strconv.Itoa(i)+`"`)
	}
	for i, list := range []string{
		`"test://\u0073ecret"`,
		`"test:\/\/secret"`,
		`"test://watched","test://watched","test://secret","test://secret"`,
		strings.Join(many, ",") + `,"test://secret"`,
		strings.Join(many, ",") + `,"test://r0","test://secret"`,
		`"test://secret",null`,
		`"test://watched",["test://secret"]`,
		`"test://watched",{"uri":"test://secret"}`,
	} {
		status, body := lnListen(t, g, session, strconv.Itoa(100+i),
			`"notifications":{"resourceSubscriptions":[`+list+`]},`, `{}`)
		code := gjson.Get(body, "error.code").Int()
		if code != -32013 && code != -32602 {
			t.Errorf("a listen naming [%.80s]: %d %.300s, want denied or refused", list, status, body)
		}
	}
	if got := lnLegacySubscribed(up); len(got) != 0 {
		t.Errorf("denied and refused listens subscribed the upstream to %q", got)
	}
}

// Holds: the federated endpoint offers no subscriptions/listen (the
// stateless revision is refused there, and the method is unknown to it),
// and a resources/subscribe of the denied resource through it, prefixed
// and escaped, is decided with the service's own URI and denied: the
// upstream is never subscribed to test://secret.
func TestListenHoldsFederatedEndpoint(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Federation: " ", RequestPolicy: aaPolicies(t, lnDenySecret, "")})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.url = g.URL + "/v1/mcp"
	m.initialize()
	for _, c := range []struct {
		body string
		code int64
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["svc__test://secret","test://secret"]}}}`, -32601},
		{`{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"svc__test://secret"}}`, -32013},
		{`{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"svc\u005f_test://\u0073ecret"}}`, -32013},
	} {
		status, _, msgs := m.post(c.body)
		if len(msgs) != 1 || gjson.GetBytes(msgs[0], "error.code").Int() != c.code {
			t.Errorf("federated %.60s: %d %s, want error %d", c.body, status, msgs, c.code)
		}
	}
	if got := lnLegacySubscribed(up); lnContains(got, "test://secret") {
		t.Errorf("the upstream was subscribed to test://secret through the federated endpoint: %q", got)
	}
}

// Holds: progress on a token nobody issued, sent by an upstream of
// 2026-07-28 on the stream of a stateless runner's listen and on the
// listen toolgate opens for a 2025-11-25 runner's GET stream, never
// reaches the runner, while the rest of those streams does.
func TestListenHoldsForgedProgressOnListenStreams(t *testing.T) {
	up := lnStartModern(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: aaPolicies(t, lnDenySecret, "")})
	session := g.createSession(t, aliceKey, "svc")
	status, body := lnListen(t, g, session, "1", `"notifications":{"toolsListChanged":true,"resourceSubscriptions":["test://watched"]},`, `{}`)
	if !strings.Contains(body, `"notifications/resources/updated"`) {
		t.Fatalf("the stateless listen: %d %s", status, body)
	}
	if strings.Contains(body, "FORGED-LISTEN-PROGRESS") {
		t.Errorf("progress on a token nobody issued reached the stateless listen: %s", body)
	}

	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, answer := m.openStream(t, ctx)
	if stream.StatusCode != http.StatusOK {
		t.Fatalf("the GET stream: %d %s", stream.StatusCode, answer)
	}
	got, _ := io.ReadAll(stream.Body) // ends with the upstream's listen
	stream.Body.Close()
	if !strings.Contains(string(got), "notifications/tools/list_changed") {
		t.Fatalf("the GET stream carried %q, want the upstream's tools/list_changed", got)
	}
	if strings.Contains(string(got), "FORGED-LISTEN-PROGRESS") {
		t.Errorf("progress on a token nobody issued reached the GET stream: %s", got)
	}
}
