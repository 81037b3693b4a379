//go:build open_findings

package integration

// Findings reproduced and not fixed yet: each test fails today. They are
// kept out of `make test` (build tag open_findings) and listed in the
// README's adversarial suite; run them with
// `go test -tags open_findings -run 'Test.*Attack' ./integration/`.

import (
	"strings"
	"testing"
	"time"
)

// TestIsolation3AttackRelistOnOtherReplicaStillRefused: two replicas on
// one PostgreSQL database (MCP sessions, pins and their changes shared)
// in front of an auth bearer service whose upstream describes echo per
// account. Alice's session lists echo (pinned); bob's listing through
// replica b records his account's definition as a waiting change; alice's
// call is refused with "list them again", she lists again through replica
// a — her account shows the pinned definition — and calls through replica
// b (a round-robin balancer). What happens: b refuses her call with "list
// them again" anew: shown, which remembers her listing, is replica a's
// alone, so behind a balancer she may never call the tool while the change
// waits. What should happen: a listing since the change counts on every
// replica that serves the session — kept with the shared MCP session (its
// catalog's listing time against the change's) rather than in a
// per-replica map (internal/toolpin shown).
func TestIsolation3AttackRelistOnOtherReplicaStillRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	data := t.TempDir()
	block := soBlock(postgresStorage(t), data, isoPerAccountUpstream(t), "echo", "auth bearer", "")
	a := startReplica(t, bin, block, data)
	b := startReplica(t, bin, block, data)
	lsPutToken(t, a.gateway, aliceKey, "token-alice")
	lsPutToken(t, a.gateway, bobKey, "token-bobs-own")

	session := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, session, "svc")
	ma.initialize()
	ma.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if ans := ma.call(2, "echo", `{}`); !strings.Contains(string(ans), "ok for ALICE") {
		t.Fatalf("control: alice's echo before bob listed: %s", ans)
	}
	mb := b.raw(t, bobKey, b.createSession(t, bobKey, "svc"), "svc")
	mb.initialize()
	mb.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)

	// Alice's same MCP session, through replica b.
	onB := b.raw(t, aliceKey, session, "svc")
	onB.sessionID = ma.sessionID
	waitWithin(t, 10*time.Second, "replica a to see the waiting change", func() bool {
		return strings.Contains(string(ma.call(3, "echo", `{}`)), "list them again")
	})
	// She lists again, as told, through replica a: her account shows the
	// pinned definition; control: a now lets her call.
	if ans := ma.rpc(`{"jsonrpc":"2.0","id":4,"method":"tools/list"}`); dig(ans, "result", "tools", "0", "name") != "echo" {
		t.Fatalf("alice's listing through a does not show her echo: %v", ans)
	}
	if ans := ma.call(5, "echo", `{}`); !strings.Contains(string(ans), "ok for ALICE") {
		t.Fatalf("control: alice's call through a after listing again: %s", ans)
	}
	if ans := onB.call(6, "echo", `{}`); !strings.Contains(string(ans), "ok for ALICE") {
		t.Errorf("alice listed again since the change (through replica a), and her call through replica b is refused: %s", ans)
	}
}
