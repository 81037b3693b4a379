package api

// Adversarial review of one property through toolgate_api: one
// authenticated caller acts only on what is theirs, and only as the rules
// allow. A gateway runs in this process with four API keys: alice (the
// requester), bob (another user, not an approver), carol (a named
// approver) and dave (in the approver group secops); alice's approval is
// stored as approval.Manager.Resolve stores one.

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/toolgate/toolgate/internal/testcaddy"

	"github.com/toolgate/toolgate/internal/approval"
	_ "github.com/toolgate/toolgate/modules/ciphers/local"
	"github.com/toolgate/toolgate/modules/gateway"
)

type authzGateway struct {
	url    string
	app    *gateway.App
	client *http.Client
}

func startAuthzGateway(t *testing.T) *authzGateway {
	t.Helper()
	data := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	g := &authzGateway{url: fmt.Sprintf("http://127.0.0.1:%d", port), client: &http.Client{Timeout: 30 * time.Second}}
	key := func(s string) string { return fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(s))) }
	caddyfile := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output discard
	}
	toolgate {
		public_url %[1]s
		storage file_system %[2]s
		cipher local %[2]s/cipher.key
		auth {
			api_key %[3]s alice@example.com eng
			api_key %[4]s bob@example.com eng
			api_key %[5]s carol@example.com
			api_key %[6]s dave@example.com secops
			api_key %[7]s Carol@example.com admins secops-readers
		}
		service bank {
			url http://127.0.0.1:1/mcp
			allow_http
			tools transfer
			auth bearer
		}
	}
}

%[1]s {
	route {
		toolgate_api
	}
}
`, g.url, data, key("alice-key"), key("bob-key"), key("carol-key"), key("dave-key"), key("Carol-key"))
	testcaddy.Load(t, caddyfile, g.url+"/.well-known/oauth-protected-resource", g.client)
	app, err := caddy.ActiveContext().App("toolgate")
	if err != nil {
		t.Fatal(err)
	}
	g.app = app.(*gateway.App)
	return g
}

// do sends method path with body as the holder of key; it returns the
// status and the body.
func (g *authzGateway) do(t *testing.T, key, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// pending stores alice's pending approval: the policy asked with spec.
func (g *authzGateway) pending(t *testing.T, id, args string, spec string) *approval.Approval {
	t.Helper()
	s, err := approval.ParseSpec([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	call := approval.Call{Requester: "alice@example.com", Session: "ref-alice", Service: "bank", Method: "tools/call",
		Tool: "transfer", Arguments: []byte(args)}
	callKey, toolKey, digest := call.Keys()
	created := time.Now().UTC()
	a := &approval.Approval{ID: id, State: approval.StatePending, Stage: approval.StageRequest, Requester: call.Requester,
		Session: call.Session, Service: call.Service, Method: call.Method, Tool: call.Tool, ArgumentsSHA256: digest,
		DecisionID: "d-" + id, Reason: "transfers are reviewed", Revision: "r1", Approvers: s.Approvers.Users,
		ApproverGroups: s.Approvers.Groups, RequesterMayApprove: s.RequesterMayApprove, Scopes: s.Scopes,
		CreatedAt: created, ExpiresAt: created.Add(s.TTL), CallKey: callKey, ToolKey: toolKey}
	if err := approval.NewStore(g.app).Create(context.Background(), a, approval.Contents{Arguments: []byte(args), Masked: []byte(args)}); err != nil {
		t.Fatal(err)
	}
	return a
}

func (g *authzGateway) state(t *testing.T, id string) *approval.Approval {
	t.Helper()
	a, err := approval.NewStore(g.app).Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Holds: bob, another authenticated user who is neither alice's approver
// nor in its group, names alice's approval by its id: reading it,
// approving it and denying it all answer 404 (never 403, which would
// confirm it exists) and change nothing; neither his approver queue nor
// his own requests list it. Carol@example.com — carol's name in another
// case, with other groups — is not carol. alice's own requests list it.
func TestAuthzHoldsOtherUserCannotReachAnApproval(t *testing.T) {
	g := startAuthzGateway(t)
	a := g.pending(t, "apprAAAAAAAAAAAAAAAAAAAAAAAAAAAA", `{"to":"x","amount":10}`,
		`{"approvers":{"users":["carol@example.com"],"groups":["secops"]},"requester_may_approve":false,"scopes":["once"]}`)
	for _, key := range []string{"bob-key", "Carol-key"} {
		for _, c := range []struct{ method, path, body string }{
			{http.MethodGet, "/v1/approvals/" + a.ID, ""},
			{http.MethodPost, "/v1/approvals/" + a.ID + "/approve", `{"scope":"once"}`},
			{http.MethodPost, "/v1/approvals/" + a.ID + "/approve", ""},
			{http.MethodPost, "/v1/approvals/" + a.ID + "/deny", `{"note":"no"}`},
		} {
			if status, body := g.do(t, key, c.method, c.path, c.body); status != http.StatusNotFound {
				t.Errorf("%s: %s %s = %d, want 404: %s", key, c.method, c.path, status, body)
			}
		}
		for _, q := range []string{"", "?role=approver", "?role=requester", "?role=requester&state=pending"} {
			if _, body := g.do(t, key, http.MethodGet, "/v1/approvals"+q, ""); strings.Contains(body, a.ID) {
				t.Errorf("%s: /v1/approvals%s lists alice's approval: %s", key, q, body)
			}
		}
	}
	if got := g.state(t, a.ID); got.Status() != approval.StatePending {
		t.Fatalf("a stranger's request changed the approval: %+v", got)
	}
	if _, body := g.do(t, "alice-key", http.MethodGet, "/v1/approvals?role=requester", ""); !strings.Contains(body, a.ID) {
		t.Errorf("control: alice does not see her own request: %s", body)
	}
	if _, body := g.do(t, "carol-key", http.MethodGet, "/v1/approvals", ""); !strings.Contains(body, a.ID) {
		t.Errorf("control: carol's queue lacks it: %s", body)
	}
}

// Holds: the requester approves her own call whose policy leaves it to
// others: 403, as the README says, and it stays pending; she is not in
// her own approver queue. Then an approver asks for a scope the policy
// did not offer (400), approves for once, and tries to widen it or flip
// it to a denial (409); the record keeps the first decision.
func TestAuthzHoldsSelfApprovalScopeAndSecondDecision(t *testing.T) {
	g := startAuthzGateway(t)
	a := g.pending(t, "apprBBBBBBBBBBBBBBBBBBBBBBBBBBBB", `{"to":"y","amount":20}`,
		`{"approvers":{"groups":["secops"]},"requester_may_approve":false,"scopes":["once"]}`)
	for _, body := range []string{`{"scope":"once"}`, ""} {
		if status, out := g.do(t, "alice-key", http.MethodPost, "/v1/approvals/"+a.ID+"/approve", body); status != http.StatusForbidden {
			t.Errorf("alice approving her own call (%q): %d, want 403: %s", body, status, out)
		}
	}
	if status, out := g.do(t, "alice-key", http.MethodPost, "/v1/approvals/"+a.ID+"/deny", ""); status != http.StatusForbidden {
		t.Errorf("alice denying her own call: %d, want 403: %s", status, out)
	}
	if _, out := g.do(t, "alice-key", http.MethodGet, "/v1/approvals?role=approver", ""); strings.Contains(out, a.ID) {
		t.Errorf("alice's approver queue holds her own call: %s", out)
	}
	for _, scope := range []string{"session", "tool", "Once", "forever"} {
		if status, out := g.do(t, "dave-key", http.MethodPost, "/v1/approvals/"+a.ID+"/approve", `{"scope":"`+scope+`"}`); status != http.StatusBadRequest {
			t.Errorf("dave approving for %q: %d, want 400: %s", scope, status, out)
		}
	}
	if status, out := g.do(t, "dave-key", http.MethodPost, "/v1/approvals/"+a.ID+"/deny", `{"scope":"session"}`); status != http.StatusBadRequest {
		t.Errorf("a denial with a scope: %d, want 400: %s", status, out)
	}
	if got := g.state(t, a.ID); got.Status() != approval.StatePending {
		t.Fatalf("refused decisions changed the approval: %+v", got)
	}
	if status, out := g.do(t, "dave-key", http.MethodPost, "/v1/approvals/"+a.ID+"/approve", `{"scope":"once","note":"ok"}`); status != http.StatusOK {
		t.Fatalf("control: dave approving: %d %s", status, out)
	}
	for _, c := range []struct{ path, body string }{
		{"/approve", `{"scope":"session"}`}, {"/approve", `{"scope":"once"}`}, {"/deny", `{"note":"changed my mind"}`},
	} {
		if status, out := g.do(t, "dave-key", http.MethodPost, "/v1/approvals/"+a.ID+c.path, c.body); status != http.StatusConflict {
			t.Errorf("deciding again %s %s: %d, want 409: %s", c.path, c.body, status, out)
		}
	}
	if got := g.state(t, a.ID); got.State != approval.StateApproved || got.Scope != approval.ScopeOnce || got.DecidedBy != "dave@example.com" {
		t.Errorf("a second decision changed the first: %+v", got)
	}
}

// Holds: an approval past its expiry answers 409 to its approver and
// stays undecided.
func TestAuthzHoldsExpiredApprovalIsNotDecided(t *testing.T) {
	g := startAuthzGateway(t)
	a := g.pending(t, "apprCCCCCCCCCCCCCCCCCCCCCCCCCCCC", `{"to":"z","amount":30}`,
		`{"approvers":{"users":["carol@example.com"]},"requester_may_approve":false,"ttl":"1s"}`)
	time.Sleep(time.Until(a.ExpiresAt) + 50*time.Millisecond)
	for _, path := range []string{"/approve", "/deny"} {
		if status, out := g.do(t, "carol-key", http.MethodPost, "/v1/approvals/"+a.ID+path, ""); status != http.StatusConflict {
			t.Errorf("%s of an expired approval: %d, want 409: %s", path, status, out)
		}
	}
	if got := g.state(t, a.ID); got.DecidedBy != "" || got.Status() != approval.StateExpired {
		t.Errorf("an expired approval was decided: %+v", got)
	}
}

// Holds: bob reads and ends alice's toolgate session by its id (403, and
// the session lives on); a session ref or path tricks name nothing.
// bob's connection calls touch only his own credential; tool pins are
// for admins only.
func TestAuthzHoldsSessionsConnectionsAndPins(t *testing.T) {
	g := startAuthzGateway(t)
	status, out := g.do(t, "alice-key", http.MethodPost, "/v1/sessions", `{"services":["bank"]}`)
	if status != http.StatusCreated {
		t.Fatalf("control: alice's session: %d %s", status, out)
	}
	var sess struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal([]byte(out), &sess)
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		if status, out := g.do(t, "bob-key", method, "/v1/sessions/"+sess.ID, ""); status != http.StatusForbidden && status != http.StatusNotFound {
			t.Errorf("bob %s alice's session: %d %s", method, status, out)
		}
		if status, _ := g.do(t, "bob-key", method, "/v1/sessions/"+gateway.SessionRef(sess.ID), ""); status == http.StatusOK || status == http.StatusNoContent {
			t.Errorf("bob %s alice's session by its ref: %d", method, status)
		}
	}
	if status, out := g.do(t, "alice-key", http.MethodGet, "/v1/sessions/"+sess.ID, ""); status != http.StatusOK {
		t.Errorf("alice's session did not survive bob: %d %s", status, out)
	}
	ctx := context.Background()
	if status, out := g.do(t, "alice-key", http.MethodPut, "/v1/connections/bank", `{"token":"alice-token"}`); status != http.StatusNoContent {
		t.Fatalf("control: alice's token: %d %s", status, out)
	}
	if status, out := g.do(t, "bob-key", http.MethodPut, "/v1/connections/bank", `{"token":"bob-token"}`); status != http.StatusNoContent {
		t.Fatalf("control: bob's token: %d %s", status, out)
	}
	if status, _ := g.do(t, "bob-key", http.MethodDelete, "/v1/connections/bank", ""); status != http.StatusNoContent {
		t.Fatalf("control: bob's disconnect: %d", status)
	}
	conn, err := g.app.Connections().Load(ctx, "bank", "alice@example.com")
	if err != nil || conn.AccessToken != "alice-token" {
		t.Errorf("bob's calls changed alice's connection: %+v, %v", conn, err)
	}
	for _, key := range []string{"bob-key", "dave-key", "carol-key"} {
		if status, _ := g.do(t, key, http.MethodGet, "/v1/tool-pins", ""); status != http.StatusForbidden {
			t.Errorf("%s lists tool pins: %d, want 403", key, status)
		}
		if status, _ := g.do(t, key, http.MethodPost, "/v1/tool-pins/accept", `{"service":"bank","tool":"transfer","digest":"x"}`); status != http.StatusForbidden {
			t.Errorf("%s accepts a tool pin: %d, want 403", key, status)
		}
	}
}
