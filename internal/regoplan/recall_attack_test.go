package regoplan

import (
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/testpki"
)

// Attack (fixed): crypto.x509.parse_and_verify_certificates verifies the chain
// against the clock (x509.VerifyOptions without CurrentTime is time.Now),
// but OPA does not mark it non-deterministic, so Compile takes a program
// that calls it for pure and recallable. Called on data (no tag), its
// outcome is no reading: a decision recorded while the upstream's pinned
// certificate was valid is recalled after the certificate expired, for
// the same input — "allow", where evaluating the policy (topdown, Eval, or
// Value on a new program) says "deny". Before recall, every evaluation
// called the built-in and saw the clock.
// Fixed: readsClock — a plan that calls it is impure, never recalled.
func TestRecallAttackCertificateExpiryIsNotRead(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
chain_valid if {
	[ok, _] := crypto.x509.parse_and_verify_certificates(data.chain)
	ok
}
r := "allow" if {
	input.method == "tools/call"
	chain_valid
} else := "deny"
`})
	// A certificate's times are whole seconds: the chain expires at the
	// second before now+3s, two to three seconds from now.
	expiry := time.Now().Add(3 * time.Second).Truncate(time.Second)
	d := map[string]any{"chain": testpki.Chain(t, "upstream.example", expiry)}
	dv, err := ast.InterfaceToValue(d)
	if err != nil {
		t.Fatal(err)
	}
	data := ast.NewTerm(dv)
	prog := program(t, compiler, "data.p.r")
	input := parseInput(t, `{"method":"tools/call","arguments":{"n":1}}`)
	if got := valueOutcome(prog, ast.NewTerm(input), data); got != `"allow"` {
		t.Fatalf("while the certificate is valid: %s, want \"allow\"", got)
	}
	time.Sleep(time.Until(expiry) + 500*time.Millisecond)
	want := topdownOutcome(t, compiler, d, "data.p.r", input)
	if want != `"deny"` {
		t.Fatalf("topdown after expiry: %s", want)
	}
	if fresh := valueOutcome(program(t, compiler, "data.p.r"), ast.NewTerm(input), data); fresh != want {
		t.Fatalf("a new program after expiry: %s, topdown %s", fresh, want)
	}
	if got := valueOutcome(prog, ast.NewTerm(parseInput(t, `{"method":"tools/call","arguments":{"n":2}}`)), data); got != want {
		t.Errorf("after the certificate expired: %s (recalled %d), topdown %s", got, prog.Recalled(), want)
	}
}

// Attack (fixed by contract): a recall is kept for the data term's
// pointer (e.data == data), not for what the evaluation read of data. A
// caller that kept one data term and changed it in place between
// evaluations (a service made read-only) was given the decision the old
// data made. Value's contract now says that the data term must not
// change while the program is used, and the policy engine builds one per
// policy version and never changes it: new data is a new term, which
// shares no recall with the old one.
// Fixed: Value's documentation; the test changes the data as the engine
// does, with a new term.
func TestRecallAttackDataChangedInPlace(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
r := "allow" if {
	input.method == "tools/call"
	not data.services[input.service].read_only == true
} else := "deny"
`})
	dataOf := func(readOnly bool) *ast.Term {
		services := ast.NewObject(ast.Item(ast.StringTerm("tracker"), ast.ObjectTerm(ast.Item(ast.StringTerm("read_only"), ast.BooleanTerm(readOnly)))))
		return ast.ObjectTerm(ast.Item(ast.StringTerm("services"), ast.NewTerm(services)))
	}
	data := dataOf(false)
	prog := program(t, compiler, "data.p.r")
	input := ast.NewTerm(parseInput(t, `{"method":"tools/call","service":"tracker"}`))
	if got := valueOutcome(prog, input, data); got != `"allow"` {
		t.Fatalf("before: %s", got)
	}
	// The service is made read-only: new data.
	data = dataOf(true)
	want := evalOutcome(prog, input, data)
	if want != `"deny"` {
		t.Fatalf("Eval after the change: %s", want)
	}
	if got := valueOutcome(prog, ast.NewTerm(parseInput(t, `{"method":"tools/call","service":"tracker"}`)), data); got != want {
		t.Errorf("after data changed: %s (recalled %d), evaluated %s", got, prog.Recalled(), want)
	}
}
