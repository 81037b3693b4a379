package integration

import (
	"strings"
	"testing"
)

// Attack (fixed): on a program shared by every user, bob's call answers and the
// program works on for him; bob ends his MCP session (or his runner goes
// idle and the sweep ends it). alice is then the only user connected, and
// the program's log of bob's work — naming no request — is relayed to her.
func TestR5Review2SharedProgramLogsBobsWorkToAliceAfterBobLeft(t *testing.T) {
	_, bob, alice := bobsBackgroundWork(t, "")
	endMCPSession(t, bob)
	_, answer := r5Raw(t, alice, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"finish","arguments":{}}}`)
	if !strings.Contains(answer, "finished 1") {
		t.Fatalf("alice's finish call: %s", answer)
	}
	if strings.Contains(answer, "BOB-PAYROLL-2026") {
		t.Errorf("once bob's session ended, the program's log of his work reached alice's stream: %s", answer)
	}
}
