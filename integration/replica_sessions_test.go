package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// A federated session continues on any replica: the session it opened
// with a service on one replica is the one the other replica uses (the
// upstream sees one initialize), and DELETE on the other replica ends both
// the federated session and that service session, everywhere.
func TestFederatedSessionAcrossReplicas(t *testing.T) {
	up, a, b := twoReplicas(t, "echo", testdataPath(t, "policy"))
	sess := a.createSession(t, aliceKey, "svc")
	fa := a.raw(t, aliceKey, sess, "svc")
	fa.url = a.URL + "/v1/mcp"
	fa.initialize()
	fb := b.raw(t, aliceKey, sess, "svc")
	fb.url = b.URL + "/v1/mcp"
	fb.sessionID = fa.sessionID

	echo := func(m *rawMCP, id int, text string) {
		t.Helper()
		status, _, msgs := m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":%q}}}`, id, text))
		if status != http.StatusOK || len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), text) {
			t.Fatalf("svc__echo %q: %d %s", text, status, msgs)
		}
	}
	echo(fa, 1, "on a")
	echo(fb, 2, "on b")
	echo(fa, 3, "on a again")
	status, _, msgs := fb.post(`{"jsonrpc":"2.0","id":4,"method":"tools/list"}`)
	if status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"svc__echo"`) {
		t.Fatalf("tools/list on b: %d %s", status, msgs)
	}
	if n := len(up.openSessions()); n != 1 {
		t.Errorf("the upstream has %d sessions, want the one both replicas share", n)
	}

	if status := fb.delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE on b: %d", status)
	}
	// DELETE is answered once PostgreSQL sent the end to every replica;
	// a's listener takes it a moment later.
	waitFor(t, "the federated session to be unknown on a after DELETE on b (404)", func() bool {
		status, _, _ := fa.post(`{"jsonrpc":"2.0","id":5,"method":"ping"}`)
		return status == http.StatusNotFound
	})
	waitFor(t, "the service session to be ended upstream", func() bool { return len(up.openSessions()) == 0 })
}

// A hostile runner on another replica gets nothing from an Mcp-Session-Id
// it did not initialize: bob, with his own toolgate session or none, is
// refused alice's session (403) for requests and for DELETE; an altered id
// is unknown (404); alice naming another of her toolgate sessions is
// refused (403). None of it ends or changes alice's session, which goes
// on, on either replica, with its one upstream session.
func TestForeignMCPSessionIDsAcrossReplicas(t *testing.T) {
	up, a, b := twoReplicas(t, "echo", testdataPath(t, "policy"))
	ma := a.raw(t, aliceKey, a.createSession(t, aliceKey, "svc"), "svc")
	ma.initialize()
	ma.mustEcho(t, "before")

	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	bobs := map[string]*rawMCP{
		"bob in his session": b.raw(t, bobKey, b.createSession(t, bobKey, "svc"), "svc"),
		"bob in no session":  {t: t, url: b.URL + "/v1/mcp/svc", headers: map[string]string{"Authorization": "Bearer " + bobKey}},
		"bob in alice's":     b.raw(t, bobKey, ma.headers["X-Toolgate-Session"], "svc"),
	}
	for name, m := range bobs {
		m.sessionID = ma.sessionID
		if status, _, msgs := m.post(ping); status != http.StatusForbidden {
			t.Errorf("%s, POST on b: %d %s, want 403", name, status, msgs)
		}
		if status := m.delete(); status != http.StatusForbidden {
			t.Errorf("%s, DELETE on b: %d, want 403", name, status)
		}
	}
	other := b.raw(t, aliceKey, b.createSession(t, aliceKey, "svc"), "svc")
	other.sessionID = ma.sessionID
	if status, _, msgs := other.post(ping); status != http.StatusForbidden {
		t.Errorf("alice in another toolgate session on b: %d %s, want 403", status, msgs)
	}
	altered := b.raw(t, aliceKey, ma.headers["X-Toolgate-Session"], "svc")
	id := []byte(ma.sessionID)
	id[len(id)/2] ^= 1
	altered.sessionID = string(id)
	if status, _, msgs := altered.post(ping); status != http.StatusNotFound {
		t.Errorf("an altered id on b: %d %s, want 404", status, msgs)
	}
	if status := altered.delete(); status != http.StatusNotFound {
		t.Errorf("DELETE of an altered id on b: %d, want 404", status)
	}

	onB := b.raw(t, aliceKey, ma.headers["X-Toolgate-Session"], "svc")
	onB.sessionID = ma.sessionID
	onB.mustEcho(t, "after, on b")
	ma.mustEcho(t, "after, on a")
	if open := up.openSessions(); len(open) != 1 {
		t.Errorf("the upstream has %d open sessions, want alice's one", len(open))
	}
}

// A runner told on replica a to open an approval page (-32042) learns of
// the decision on its standalone stream held by replica b: the replica
// that watched the approval announces the notification through the
// storage, and b delivers it.
func TestElicitationCompleteAcrossReplicas(t *testing.T) {
	_, a, b := twoReplicas(t, "echo gated_tool", testdataPath(t, "approvals"))
	ma := a.raw(t, aliceKey, a.createSession(t, aliceKey, "svc"), "svc")
	status, hdr, msgs := ma.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"url":{}}},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status != http.StatusOK || hdr.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %s", status, msgs)
	}
	ma.sessionID = hdr.Get("Mcp-Session-Id")
	if status, _, _ := ma.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d", status)
	}

	// The standalone stream, on b.
	mb := b.raw(t, aliceKey, ma.headers["X-Toolgate-Session"], "svc")
	mb.sessionID = ma.sessionID
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, answer := mb.openStream(t, ctx)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the standalone stream on b: %d %s", resp.StatusCode, answer)
	}
	defer resp.Body.Close()
	events := make(chan string, 8)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events <- data
			}
		}
	}()

	// The call, on a.
	var pending struct {
		Error *struct {
			Code int
			Data struct {
				Elicitations []struct{ ElicitationID string } `json:"elicitations"`
			}
		}
	}
	if got := ma.call(1, "gated_tool", `{"text":"across replicas"}`); json.Unmarshal(got, &pending) != nil || pending.Error == nil ||
		pending.Error.Code != -32042 || len(pending.Error.Data.Elicitations) != 1 {
		t.Fatalf("a gated call from a URL-elicitation client on a: %s", got)
	}
	id := pending.Error.Data.Elicitations[0].ElicitationID
	if r := b.decide(t, aliceKey, id, true, "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving on b: %d %s", r.StatusCode, r.Body)
	}
	for {
		select {
		case data, ok := <-events:
			if !ok {
				t.Fatal("b's stream ended without notifications/elicitation/complete")
			}
			if gjson.Get(data, "method").String() == "notifications/elicitation/complete" {
				if got := gjson.Get(data, "params.elicitationId").String(); got != id {
					t.Fatalf("completed %q, want %q", got, id)
				}
				if got := ma.call(2, "gated_tool", `{"text":"across replicas"}`); !strings.Contains(string(got), "across replicas") || strings.Contains(string(got), `"error"`) {
					t.Fatalf("the retry after the approval: %s", got)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("no notifications/elicitation/complete on b's stream within a minute")
		}
	}
}

// A program's MCP session (its upstream session lives in the replica that
// runs the program) moving between replicas is continued on each with a
// session of that replica's own, under one name: each replica initializes
// the program's side once, not on every call that comes to it after one
// went to the other (which stored its own session as the upstream's and
// left the other's behind).
func TestProgramSessionAcrossReplicas(t *testing.T) {
	a, b, dsn := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return fmt.Sprintf(`state_secret %s
		%s
		cipher local %s/cipher.key
		auth {
			api_key %s %s
		}
		%s`, testStateSecret, storage, data, hashKey(aliceKey), alice, goSDKStdioService(t, "svc", ""))
	})
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.sessionID = ma.sessionID
	for i := range 8 {
		m := ma
		if i%2 == 1 {
			m = mb
		}
		if got := mustSucceed(t, m.call(10+i, "echo", `{"text":"call `+strconv.Itoa(i)+`"}`)); got != "call "+strconv.Itoa(i) {
			t.Fatalf("call %d: %s", i, got)
		}
	}
	var generation int
	for key, value := range soRows(t, dsn) {
		if strings.HasSuffix(key, "/state") && strings.HasPrefix(key, "toolgate/mcp/sessions/") {
			var rec struct {
				Upstream struct{ Generation int } `json:"upstream"`
			}
			if err := json.Unmarshal(value, &rec); err != nil {
				t.Fatal(err)
			}
			generation = rec.Upstream.Generation
		}
	}
	if generation != 2 {
		t.Errorf("8 calls alternating between two replicas initialized the program's session %d times, want 2 (once per replica)", generation)
	}
}
