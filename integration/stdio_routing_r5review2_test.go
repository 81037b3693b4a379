package integration

import (
	"strings"
	"testing"
)

// FINDING: on a program shared by every user, bob's call answers and the
// program works on for him; bob ends his MCP session (or his runner goes
// idle and the sweep ends it). alice is then the only user connected, and
// the program's log of bob's work — naming no request — is relayed to her.
func TestR5Review2SharedProgramLogsBobsWorkToAliceAfterBobLeft(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", RequestPolicy: r5Policies(t),
		Services: backgroundProgram(t, "prog")})
	bob := g.raw(t, bobKey, g.createSession(t, bobKey, "prog"), "prog")
	bob.initialize()
	alice := g.raw(t, aliceKey, g.createSession(t, aliceKey, "prog"), "prog")
	alice.initialize()
	if _, answer := r5Raw(t, bob, `{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}`); !strings.Contains(answer, `"result"`) {
		t.Fatalf("bob's logging/setLevel: %s", answer)
	}
	if _, answer := r5Raw(t, bob, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"background","arguments":{"text":"BOB-PAYROLL-2026"}}}`); !strings.Contains(answer, "started") {
		t.Fatalf("bob's background call: %s", answer)
	}
	endMCPSession(t, bob)
	_, answer := r5Raw(t, alice, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"finish","arguments":{}}}`)
	if !strings.Contains(answer, "finished 1") {
		t.Fatalf("alice's finish call: %s", answer)
	}
	if strings.Contains(answer, "BOB-PAYROLL-2026") {
		t.Errorf("once bob's session ended, the program's log of his work reached alice's stream: %s", answer)
	}
}
