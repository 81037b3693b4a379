package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// d2At is g's raw MCP client for svc under one of d1Routes' prefixes
// (judged, unseen, unjudged) of the site on port.
func d2At(t *testing.T, g *gateway, port int, prefix, session string) *rawMCP {
	g2 := *g
	g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/" + prefix
	return g2.raw(t, aliceKey, session, "svc")
}

// d2Review is a result policy that withholds, pending a person's approval,
// any echo result naming "d2-review".
const d2Review = `decision := {"action": "ask", "reason": "d2: reviewed"} if {
	input.tool.name == "echo"
	some item in input.result.content
	contains(item.text, "d2-review")
}`

// Attack (fixed: toolgate_result_policy refuses what toolgate_policy did not
// see, Call.RefuseUnjudged): the proxy's new check (RequestJudged and ResultJudged) runs only
// when a request reaches toolgate_proxy; a step before it that answers the
// request itself is not covered. toolgate_result_policy does so for a
// tools/call whose withheld result a person released (ResultHandler.
// released): it answers the retry with the released result and never calls
// next. Through a route whose toolgate_policy matcher misses the service
// (/unjudged), the retry therefore gets the result though no request
// policy judged it — while the same route refuses every other request as
// "without a policy's judgement", as the commit promises for "any request
// that lacks either mark". Here the request policy in force denies the
// call by the time of the retry (an administrator tightened it after the
// result was withheld and released): through /judged the retry is denied,
// through /unjudged it gets the released result all the same, with no
// request decision audited.
// Severity: low-medium (the request policy in force is bypassed for a
// released result, and the fail-closed promise is broken; needs a route
// whose toolgate_policy matcher misses, the configuration the check exists
// for, and a released result).
// Fix: check RequestJudged in toolgate_result_policy before it answers
// itself (released results), and ResultJudged in toolgate_policy wherever
// it answers for the upstream; or factor the check into a helper
// (gateway.Call.Judged) that every handler answering in the upstream's
// place calls first.
func TestD2AttackReleasedResultThroughRouteWithoutRequestPolicy(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, "", d2Review)
	port := freePort(t)
	routes := strings.ReplaceAll(d1Routes(port, policies), "source "+policies, "source "+policies+"\n\t\t\treload_interval 50ms")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: routes})
	session := g.createSession(t, aliceKey, "svc")
	judged := d2At(t, g, port, "judged", session)
	judged.initialize()
	args := `{"text":"d2-review secret"}`
	answer := judged.call(1, "echo", args)
	id := gjson.GetBytes(answer, `result._meta.toolgate/approval.id`).String()
	if id == "" {
		t.Fatalf("premise: the result policy did not withhold the result through /judged: %s", answer)
	}
	if r := g.decide(t, aliceKey, id, true, "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving the result: %d %s", r.StatusCode, r.Body)
	}
	// The administrator now denies these calls in the request policy.
	deny := "package toolgate.request\n\ndefault decision := {\"action\": \"allow\"}\n\n" +
		"decision := {\"action\": \"deny\", \"reason\": \"d2: no longer allowed\"} if contains(object.get(input, [\"arguments\", \"text\"], \"\"), \"d2-\")\n"
	if err := os.WriteFile(filepath.Join(policies, "request.rego"), []byte(deny), 0o644); err != nil {
		t.Fatal(err)
	}
	denied := false
	for i := range 200 {
		if got := string(judged.call(100+i, "echo", `{"text":"d2-probe"}`)); strings.Contains(got, "no longer allowed") {
			denied = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !denied {
		t.Fatal("premise: the tightened request policy was not loaded")
	}
	// Control: another tools/call through /unjudged is refused.
	unjudged := d2At(t, g, port, "unjudged", session)
	unjudged.sessionID = judged.sessionID
	if got := string(unjudged.call(2, "echo", `{"text":"other"}`)); !strings.Contains(got, "without a policy's judgement") {
		t.Fatalf("premise: a tools/call through /unjudged is not refused: %s", got)
	}
	got := string(unjudged.call(3, "echo", args))
	if strings.Contains(got, "d2-review secret") || !strings.Contains(got, "without a policy's judgement") {
		t.Errorf("the retry of a released result, which the request policy in force denies, through a route whose toolgate_policy matcher misses it: %s (want refused like any request no request policy judged)", got)
	}
}

// Held: streams and session ends follow their own request's route, not
// the route that opened the MCP session: through /unseen a GET resuming a
// stream of /judged (Last-Event-ID) and a standalone GET are refused, and
// through /unjudged a DELETE is refused and the upstream session is not
// ended by it.
func TestD2AttackResumeAndDeleteThroughUnjudgedRoutesHeld(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo progress", Sites: d1Routes(port, aaPolicies(t, "", ""))})
	session := g.createSession(t, aliceKey, "svc")
	judged := d2At(t, g, port, "judged", session)
	judged.initialize()
	// An event id of a stream of /judged.
	resp, err := judged.send(context.Background(), http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"d2-resume"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	eventID := ""
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "id:"); ok {
			eventID = strings.TrimSpace(v)
		}
	}
	unseen := d2At(t, g, port, "unseen", session)
	unseen.sessionID = judged.sessionID
	lasts := []string{""}
	if eventID != "" {
		lasts = append(lasts, eventID)
	} else {
		t.Log("the judged call's answer carried no event id: only the standalone GET is tried")
	}
	for _, last := range lasts {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := unseen.send(ctx, http.MethodGet, "text/event-stream", "", last)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		cancel()
		if resp.StatusCode == http.StatusOK && strings.Contains(resp.Header.Get("Content-Type"), "event-stream") && !strings.Contains(string(data), "without a policy's judgement") {
			t.Errorf("GET (Last-Event-ID %q) through /unseen: HTTP %d %s (want refused)", last, resp.StatusCode, data)
		}
		if strings.Contains(string(data), "d2-resume") {
			t.Errorf("GET (Last-Event-ID %q) through /unseen delivered the judged stream's result: %s", last, data)
		}
	}
	unjudged := d2At(t, g, port, "unjudged", session)
	unjudged.sessionID = judged.sessionID
	if status := unjudged.delete(); status == http.StatusNoContent {
		t.Errorf("DELETE through /unjudged ended the MCP session (HTTP %d)", status)
	}
	for _, r := range up.requestLog() {
		if r.Method == http.MethodDelete {
			t.Errorf("the upstream session was ended through /unjudged")
		}
	}
	// The session still works through /judged.
	if _, _, msgs := judged.post(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"text":"still"}}}`); len(msgs) == 0 || gjson.GetBytes(msgs[len(msgs)-1], "result.content.0.text").String() == "" {
		t.Errorf("the MCP session after the refused DELETE: %s", msgs)
	}
}

// Held: the connection test's needs_sign_in is for personal credentials
// only and leaks nothing. A service-wide header credential the upstream
// refuses (401) reports the failure without needs_sign_in or connect_url
// (the user cannot mend it); a personal token refused (401) gets
// needs_sign_in and a connect_url on the gateway's public_url, and neither
// answer holds the token, the header credential or the upstream's URL.
func TestD2AttackConnectionTestRefusedCredentialsHeld(t *testing.T) {
	const svcCred = "d2-service-wide-upstream-key"
	const token = "d2-personal-token-alice"
	for _, c := range []struct {
		auth     string
		personal bool
	}{
		{"header X-Upstream-Key " + svcCred, false},
		{"bearer", true},
	} {
		up := startUpstream(t)
		up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+r.Host+`", error="invalid_token"`)
			http.Error(w, "unauthorized "+r.Header.Get("X-Upstream-Key")+r.Header.Get("Authorization"), http.StatusUnauthorized)
			return true
		})
		g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: c.auth})
		if c.personal {
			if r := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, []byte(`{"token":"`+token+`"}`)); r.StatusCode != http.StatusNoContent {
				t.Fatalf("PUT the token: %d %s", r.StatusCode, r.Body)
			}
		}
		r := g.api(t, http.MethodPost, "/v1/connections/svc/test", aliceKey, nil)
		var res struct {
			OK          bool   `json:"ok"`
			Error       string `json:"error"`
			NeedsSignIn bool   `json:"needs_sign_in"`
			ConnectURL  string `json:"connect_url"`
		}
		if err := json.Unmarshal(r.Body, &res); err != nil || res.OK || res.Error == "" {
			t.Errorf("%s: the connection test of a refused credential: %d %s", c.auth, r.StatusCode, r.Body)
			continue
		}
		if res.NeedsSignIn != c.personal || (res.ConnectURL != "") != c.personal {
			t.Errorf("%s: needs_sign_in %v, connect_url %q (want them only for a personal credential)", c.auth, res.NeedsSignIn, res.ConnectURL)
		}
		if c.personal && !strings.HasPrefix(res.ConnectURL, g.URL+"/") {
			t.Errorf("%s: connect_url %q is not on the gateway's public_url %s", c.auth, res.ConnectURL, g.URL)
		}
		upHost := strings.TrimPrefix(up.URL, "http://")
		for _, secret := range []string{svcCred, token, upHost, "unauthorized"} {
			if strings.Contains(string(r.Body), secret) {
				t.Errorf("%s: the connection test's answer holds %q: %s", c.auth, secret, r.Body)
			}
		}
	}
}

// Held: the federated endpoint's sub-calls are requests of their own,
// each with a new gateway.Call: a route whose toolgate_result_policy
// matcher misses the services' paths (/v1/mcp/{service}) relays none of
// them — the federated initialize, listing and tools/call reach no
// upstream method beyond what the refusals allow, and no result comes
// back unjudged. (A sub-call does not inherit the federated request's
// marks: it goes through the route's steps again.)
func TestD2AttackFederatedSubCallsThroughUncoveredRouteHeld(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Federation: " ", ResultPolicyElsewhere: true})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.url = g.URL + "/v1/mcp"
	status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status == http.StatusOK && hdr.Get("Mcp-Session-Id") != "" {
		m.sessionID = hdr.Get("Mcp-Session-Id")
		m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		_, _, listed := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`)
		_, _, called := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"d2-federated"}}}`)
		for _, msg := range append(listed, called...) {
			if strings.Contains(string(msg), "d2-federated") || gjson.GetBytes(msg, "result.tools.#").Int() > 0 {
				t.Errorf("the federated endpoint relayed an unjudged answer: %s", msg)
			}
		}
	} else {
		t.Logf("the federated initialize was refused: %d %s", status, msgs)
	}
	for _, r := range up.requestLog() {
		if m := gjson.Get(r.Body, "method").String(); m == "tools/call" || m == "tools/list" {
			t.Errorf("the upstream got %s through a route whose result policy covers no service", m)
		}
	}
}

// Attack (fixed: an address's or localhost's origin takes the connection's
// scheme, OwnOrigin): login CSRF against the console from another local origin. A
// gateway without public_url serving plain http on port 80 of the loopback
// (a local install: http://localhost/console/) takes Origin
// https://localhost as its own (App.OwnOrigin compares the origin's host
// text with Host, and neither names a port: https://localhost is port 443,
// the gateway is port 80). Browsers let an https page post to
// http://localhost (a potentially trustworthy origin: no mixed-content
// block), so any page served on https://localhost — a developer's local
// https server, a local app's UI — can post the console's sign-in form with
// an API key of its choosing and sign the victim's browser in as that key's
// owner: the victim's approvals, tokens and sessions pages are then the
// attacker's account (tokens the victim pastes into "connect" land in the
// attacker's account). The sign-in form checks only sameOrigin (no CSRF
// token: there is no session yet). The port-80 gateway is simulated here
// by sending Host: localhost to the test port (the site serves any Host).
// The control: a foreign https origin is refused.
// Severity: low (needs a port-80 loopback gateway without public_url and a
// page on https://localhost; state-changing forms after sign-in carry a
// CSRF token and are not reachable this way).
// Fix: in OwnOrigin compare effective origins (scheme, host, port with the
// scheme's default) against the connection's own scheme; accept https on a
// plain connection only with an explicit, equal port or when a trusted
// proxy's X-Forwarded-Proto says https.
func TestD2AttackLoginCSRFFromHTTPSLocalhostPage(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	caddyfile, _ := gatewayCaddyfile(t, port, gatewayConfig{Upstream: up.URL, AnyHost: true})
	without := strings.Replace(caddyfile, "public_url http://127.0.0.1:"+aaItoa(port)+"\n", "\n", 1)
	if without == caddyfile {
		t.Fatal("premise: the harness's public_url line was not found")
	}
	loadCaddyfile(t, without)
	base := "http://127.0.0.1:" + aaItoa(port)
	waitListening(t, base)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	signIn := func(origin string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/console/signin", strings.NewReader("api_key="+bobKey+"&return=%2Fconsole%2Fservices"))
		req.Host = "localhost"
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Set-Cookie")
	}
	if status, cookie := signIn("https://evil.example"); status != http.StatusForbidden || cookie != "" {
		t.Fatalf("premise: a foreign origin's sign-in: HTTP %d, cookie %q (want 403)", status, cookie)
	}
	if status, _ := signIn("http://localhost"); status == http.StatusForbidden {
		t.Fatalf("premise: the gateway's own origin's sign-in is refused (HTTP %d)", status)
	}
	if status, cookie := signIn("https://localhost"); status != http.StatusForbidden || cookie != "" {
		t.Errorf("a page of https://localhost (port 443) signed the browser in to the plain gateway at http://localhost (port 80) as the attacker's key: HTTP %d, Set-Cookie %q (want 403: another origin)", status, cookie)
	}
}

// statelessThroughPrefix sends a stateless tools/call through one of
// d1Routes' prefixes, checks that toolgate_proxy refuses it as unjudged,
// and returns the methods the upstream received meanwhile.
func statelessThroughPrefix(t *testing.T, g *gateway, up *upstream, port int, prefix string) []string {
	t.Helper()
	session := g.createSession(t, aliceKey, "svc")
	g2 := *g
	g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/" + prefix
	_, msg := statelessPost(t, &g2, aliceKey, session,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"d2-stateless"},`+aaStatelessMeta(`{}`)+`}}`, nil)
	if text := aaJSON(msg); !strings.Contains(text, "without a policy's judgement") {
		t.Fatalf("premise: a stateless call through /%s is not refused: %s", prefix, text)
	}
	var methods []string
	for _, r := range up.requestLog() {
		if m := gjson.Get(r.Body, "method").String(); m != "" {
			methods = append(methods, m)
		}
	}
	return methods
}

// A stateless tools/call's implied MCP session is opened upstream only once
// toolgate_policy has the request (gateway.Call.Prepare): through a route
// whose request policy matcher misses, the proxy refuses the call and the
// upstream hears nothing. (It was opened by toolgate_registry, before any
// policy step.)
func TestStatelessOpeningWaitsForTheRequestPolicy(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: d1Routes(port, aaPolicies(t, "", ""))})
	if methods := statelessThroughPrefix(t, g, up, port, "unjudged"); len(methods) != 0 {
		t.Errorf("a stateless request through /unjudged, refused as unjudged, still made toolgate contact the upstream: %v", methods)
	}
	// The same request through the judged route opens the session and runs.
	session := g.createSession(t, aliceKey, "svc")
	g2 := *g
	g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/judged"
	_, msg := statelessPost(t, &g2, aliceKey, session,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{"text":"d2-judged"},`+aaStatelessMeta(`{}`)+`}}`, nil)
	if text := aaJSON(msg); !strings.Contains(text, "d2-judged") || strings.Contains(text, `"error"`) {
		t.Fatalf("premise: the stateless call through /judged did not run: %s", text)
	}
}
