package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/stdioserver"
)

// bobsBackgroundWork starts a gateway with the shared program "prog" (and
// the services of more), initializes bob's and then alice's MCP session
// at it, sets the program's log level (it logs nothing until a client sets
// one; the level is the program's, shared by everyone), and has bob start
// background work on BOB-PAYROLL-2026.
func bobsBackgroundWork(t *testing.T, more string) (g *gateway, bob, alice *rawMCP) {
	t.Helper()
	g = startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", RequestPolicy: r5Policies(t),
		Services: backgroundProgram(t, "prog") + "\n" + more})
	bob = g.raw(t, bobKey, g.createSession(t, bobKey, "prog"), "prog")
	bob.initialize()
	alice = g.raw(t, aliceKey, g.createSession(t, aliceKey, "prog"), "prog")
	alice.initialize()
	if _, answer := r5Raw(t, bob, `{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}`); !strings.Contains(answer, `"result"`) {
		t.Fatalf("bob's logging/setLevel: %s", answer)
	}
	if _, answer := r5Raw(t, bob, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"background","arguments":{"text":"BOB-PAYROLL-2026"}}}`); !strings.Contains(answer, "started") {
		t.Fatalf("bob's background call: %s", answer)
	}
	return g, bob, alice
}

// backgroundProgram is a service running this test binary as a Go SDK
// server over stdio, one process for every user (no per_user), with the
// tools that work on after they answered: "background" answers at once,
// and "finish" logs that the background work is done (a log message that
// names no request), then answers.
func backgroundProgram(t *testing.T, id string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`service %s {
			command %s -test.run=^$
			env %s %s
			tools background finish
			timeout 10s
			stop_timeout 2s
		}`, id, exe, stdioserver.EnvMode, stdioserver.ModeServe)
}

// A program shared by every user of a service (the default for a
// command) logs without naming the request the message is about: bob's
// call answered at once and the program works on for him, and logs that
// it is done while alice's call is in progress. The message may be about
// any user's data the program served, so it goes to nobody once two users
// have used the program since it started ("Programs and legacy SSE
// servers"), even after one left; a program alice alone has used logs to
// her.
func TestR5ResultSharedProgramLogsBobsWorkToAlice(t *testing.T) {
	g, _, alice := bobsBackgroundWork(t, backgroundProgram(t, "alone"))
	_, answer := r5Raw(t, alice, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"finish","arguments":{}}}`)
	t.Logf("alice's stream: %s", answer)
	if !strings.Contains(answer, "finished 1") {
		t.Fatalf("alice's finish call: %s", answer)
	}
	if strings.Contains(answer, "BOB-PAYROLL-2026") {
		t.Fatalf("a log of bob's work reached alice's stream: %s", answer)
	}

	// (Once bob left: TestR5Review2SharedProgramLogsBobsWorkToAliceAfterBobLeft.)

	// A program only alice has used: its log of her own work reaches her
	// (the program logs, and toolgate relays it when it cannot be
	// someone else's).
	only := g.raw(t, aliceKey, g.createSession(t, aliceKey, "alone"), "alone")
	only.initialize()
	for i, call := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"background","arguments":{"text":"ALICE-NOTES"}}}`,
	} {
		if _, answer := r5Raw(t, only, call); !strings.Contains(answer, `"result"`) {
			t.Fatalf("alice's call %d at the program she alone uses: %s", i, answer)
		}
	}
	_, answer = r5Raw(t, only, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"finish","arguments":{}}}`)
	if !strings.Contains(answer, "finished working on ALICE-NOTES") {
		t.Errorf("alone on the program, alice's stream did not carry the log of her own work: %s", answer)
	}
}
