package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// demoCaddyfile is caddyfile/demo.Caddyfile on the ports given, with its
// data in a temporary directory, the repository's policies (with the
// deadline policyTimeout, unless ""), no admin endpoint and no log: only
// what lets tests run beside a demo differs from the file.
func demoCaddyfile(t testing.TB, gwPort, upPort int, policyTimeout string) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "caddyfile", "demo.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	policy := func(step string) string {
		if policyTimeout == "" {
			return step + " ../policies"
		}
		return step + " ../policies {\n\t\t\ttimeout " + policyTimeout + "\n\t\t}"
	}
	return strings.NewReplacer(
		"127.0.0.1:8080", "127.0.0.1:"+strconv.Itoa(gwPort),
		"127.0.0.1:8081", "127.0.0.1:"+strconv.Itoa(upPort),
		"localhost:8080", "localhost:"+strconv.Itoa(gwPort),
		".toolgate-demo", t.TempDir(),
		"toolgate_policy policies", policy("toolgate_policy"),
		"toolgate_result_policy policies", policy("toolgate_result_policy"),
		"auto_https off", "auto_https off\n\tadmin off\n\tlog {\n\t\toutput discard\n\t}",
	).Replace(string(text))
}

// TestDemoWalkthrough runs caddyfile/demo.Caddyfile — the README's first
// command — and follows the README's walk-through: a session for alice,
// connecting the tracker through its OAuth provider, then MCP initialize,
// tools/list (whoami and read_ticket, not delete_ticket) and a call of
// read_ticket; bob cannot use alice's session; demo-admin administers tool
// pins. Only the ports and the data
// directory differ from the file, so that the test runs beside a demo.
func TestDemoWalkthrough(t *testing.T) {
	gwPort, upPort := freePort(t), freePort(t)
	// A generous deadline: the test runs under -race beside others.
	loadCaddyfile(t, demoCaddyfile(t, gwPort, upPort, "30s"))
	g := &gateway{URL: fmt.Sprintf("http://127.0.0.1:%d", gwPort)}
	waitListening(t, g.URL)
	waitListening(t, fmt.Sprintf("http://127.0.0.1:%d", upPort))

	// What the demo does not serve is said so: a path it does not know,
	// and the gateway's address spelled localhost (not its public_url).
	for _, c := range []struct {
		url  string
		want int
	}{{g.URL + "/nothing", http.StatusNotFound}, {fmt.Sprintf("http://localhost:%d/v1/mcp/tracker", gwPort), http.StatusMisdirectedRequest}} {
		resp, err := http.Get(c.url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want || len(body) == 0 {
			t.Errorf("GET %s: HTTP %d %q, want %d with a word of why", c.url, resp.StatusCode, body, c.want)
		}
	}

	sess := g.createSession(t, "demo-alice", "tracker")
	if status, page := g.signedIn(t, "demo-alice").connect("tracker"); status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("connecting the tracker: %d %s", status, page)
	}

	m := g.raw(t, "demo-alice", sess, "tracker")
	m.initialize()
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	var list struct {
		Result struct{ Tools []struct{ Name string } }
	}
	if len(msgs) == 0 || json.Unmarshal(msgs[len(msgs)-1], &list) != nil {
		t.Fatalf("tools/list: %s", msgs)
	}
	var names []string
	for _, tool := range list.Result.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"comment_ticket", "read_ticket", "whoami"}) {
		t.Errorf("tools/list = %v, want comment_ticket, read_ticket and whoami", names)
	}

	_, _, msgs = m.post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_ticket","arguments":{"ticket_id":"TEST-123"}}}`)
	if len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), "Login page returns 500") {
		t.Errorf("read_ticket TEST-123: %s", msgs)
	}
	_, _, msgs = m.post(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	if len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), "alice@example.test") {
		t.Errorf("whoami: %s", msgs)
	}
	_, _, msgs = m.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"delete_ticket","arguments":{"ticket_id":"TEST-123"}}}`)
	if len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), "Unknown tool") {
		t.Errorf("delete_ticket: %s", msgs)
	}

	// comment_ticket changes a ticket: the default policy asks, alice
	// approves it (here with the API, as the README's curl does), and the
	// identical retry runs.
	comment := `{"ticket_id":"TEST-123","comment":"Reproduced on staging."}`
	p := mustPend(t, m.call(6, "comment_ticket", comment))
	if r := g.decide(t, "demo-alice", p.ApprovalID, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving comment_ticket: %d %s", r.StatusCode, r.Body)
	}
	_, _, msgs = m.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"comment_ticket","arguments":` + comment + `}}`)
	if len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), "Reproduced on staging.") || strings.Contains(string(msgs[len(msgs)-1]), `"isError":true`) {
		t.Errorf("comment_ticket after the approval: %s", msgs)
	}

	// The README's one-line client setup: the federated endpoint with only
	// a token.
	fed := g.raw(t, "demo-alice", "", "")
	fed.url, fed.headers = g.URL+"/v1/mcp", map[string]string{"Authorization": "Bearer demo-alice"}
	fed.initialize()
	if names := listedTools(t, fed); !slices.Equal(slices.Sorted(slices.Values(names)), []string{"tracker__comment_ticket", "tracker__read_ticket", "tracker__whoami"}) {
		t.Errorf("the federated endpoint lists %v", names)
	}
	_, _, msgs = fed.post(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"tracker__whoami","arguments":{}}}`)
	if len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), "alice@example.test") {
		t.Errorf("tracker__whoami: %s", msgs)
	}

	bobRaw := g.raw(t, "demo-bob", sess, "tracker")
	bobRaw.sessionID = m.sessionID
	if status, _, _ := bobRaw.post(`{"jsonrpc":"2.0","id":6,"method":"tools/list"}`); status != http.StatusForbidden {
		t.Errorf("bob with alice's session: %d, want 403", status)
	}

	// demo-admin administers tool pins; alice does not.
	for key, want := range map[string]int{"demo-admin": http.StatusOK, "demo-alice": http.StatusForbidden} {
		req, _ := http.NewRequest(http.MethodGet, g.URL+"/v1/tool-pins", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET /v1/tool-pins as %s: HTTP %d %s, want %d", key, resp.StatusCode, body, want)
		}
	}
}

// An oauth service needs the console (where people connect) and the API
// (whose callback the provider sends them back to): the demo without
// either is refused at start, naming what to add. Without the API, the
// provider's redirect met the site's 404 and the code was lost.
func TestDemoWithoutAPIOrConsoleIsRefused(t *testing.T) {
	console := regexp.MustCompile(`(?s)\n\ttoolgate_console \{.*?\n\t\}`)
	for _, c := range []struct {
		name, want string
		cut        func(string) string
	}{
		{"toolgate_api", "add toolgate_api to the site", func(s string) string { return strings.Replace(s, "\n\ttoolgate_api\n", "\n", 1) }},
		{"toolgate_console", "add toolgate_console to the site", func(s string) string { return console.ReplaceAllString(s, "") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			demo := demoCaddyfile(t, freePort(t), freePort(t), "")
			cut := c.cut(demo)
			if cut == demo {
				t.Fatalf("premise: the demo has no %s to leave out", c.name)
			}
			cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cut), map[string]any{"filename": "Caddyfile"})
			if err != nil {
				t.Fatal(err)
			}
			caddyMu.Lock()
			err = caddy.Load(cfgJSON, true)
			caddyMu.Unlock()
			t.Cleanup(func() {
				caddyMu.Lock()
				defer caddyMu.Unlock()
				_ = caddy.Stop()
			})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("the demo without %s: %v; want it refused: %q", c.name, err, c.want)
			}
		})
	}
}
