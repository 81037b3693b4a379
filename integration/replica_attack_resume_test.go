package integration

// Replica attacks on stream resumption (GET with Last-Event-ID) when the
// resuming request reaches another replica than the one writing the
// stream.

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Attack (held): alice's call streams progress through replica a; its
// event id is then presented to replica b — by alice in the same MCP
// session, by alice in another MCP session, by bob in his own session,
// and by bob with alice's Mcp-Session-Id — and b, which never wrote that
// stream, answers none of them with a stream (alice's own resume: 400,
// not 404, as the README says; bob with alice's id: refused), leaks no
// event of the stream, stops nothing on a (alice gets all 30 steps and
// the answer) and asks the upstream to resume or cancel nothing.
func TestReplicaAttackResumeOnOtherReplicaLeaksNothing(t *testing.T) {
	up := startUpstream(t)
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "echo progress", "", "")
	})
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.sessionID = ma.sessionID
	other := b.raw(t, aliceKey, sess, "svc")
	other.initialize()
	bobSess := b.createSession(t, bobKey, "svc")
	bobOwn := b.raw(t, bobKey, bobSess, "svc")
	bobOwn.initialize()
	bobStolen := b.raw(t, bobKey, bobSess, "svc")
	bobStolen.sessionID = ma.sessionID

	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	r0, err := ma.send(ctx, http.MethodPost, "application/json, text/event-stream", raProgressCall(1, 30, ""), "")
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Body.Close()
	text := raRead(t, r0.Body, "the first progress", func(s string) bool { return strings.Contains(s, `"progress":1`) && raHasID(s) })
	lastID := raLastID(text)
	for name, m := range map[string]*rawMCP{
		"alice, same MCP session, on b":     mb,
		"alice, another MCP session, on b":  other,
		"bob, his own session, on b":        bobOwn,
		"bob with alice's session id, on b": bobStolen,
	} {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		status, body, err := raGet(rctx, m, lastID)
		rcancel()
		if status == http.StatusOK || strings.Contains(body, "progress") || strings.Contains(body, `"text"`) {
			t.Errorf("%s resuming a's stream %q: %d %v %.300s", name, lastID, status, err, body)
		}
		if m == mb && status != http.StatusBadRequest {
			t.Errorf("alice's own resume on b: %d %.200s, want 400 (the session lives)", status, body)
		}
	}
	rest, _ := io.ReadAll(r0.Body)
	all := text + string(rest)
	if n := strings.Count(all, `"method":"notifications/progress"`); n != 30 || !strings.Contains(all, `"text":"done"`) {
		t.Errorf("alice's stream on a after the resumes on b: %d progress notifications, answer %v; want 30 and the answer",
			n, strings.Contains(all, `"text":"done"`))
	}
	if n := raResumes(up); n != 0 {
		t.Errorf("the upstream got %d resumptions", n)
	}
	if c := raCancelled(up); len(c) != 0 {
		t.Errorf("the upstream was told to cancel %v", c)
	}
}
