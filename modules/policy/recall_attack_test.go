package policy

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/testpki"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Attack (fixed): a site rule extends the shipped request policy's deny set, as
// policies/README.md says to: calls are denied once the upstream's pinned
// certificate chain (kept in the policy's data) no longer verifies.
// crypto.x509.parse_and_verify_certificates checks the chain against the
// clock, yet is not one of OPA's non-deterministic built-ins, so the plan
// is taken for pure and its decisions are recalled; its outcome on data is
// no reading. A read-only call decided (allowed) while the chain was valid
// is recalled for the next read-only call after the chain expired: the
// gateway allows a call that the policy — and topdown, deciding the same
// call — denies.
// Fixed: regoplan's readsClock — a plan calling it is never recalled.
func TestRecallAttackShippedRequestAllowsAfterPinnedChainExpired(t *testing.T) {
	// The chain's lifetime must outlast building the engines and the
	// first decision; on a loaded machine it may not, and a longer one is
	// tried.
	for _, lifetime := range []time.Duration{2 * time.Second, 8 * time.Second, 30 * time.Second} {
		if !recallAfterChainExpired(t, lifetime) {
			return
		}
	}
	t.Fatal("the chain expired before the first decision, however long it lived")
}

// recallAfterChainExpired runs TestRecallAttackShippedRequestAllowsAfterPinnedChainExpired
// with a chain valid for lifetime; it reports whether the chain expired
// before the first decision (try again, longer).
func recallAfterChainExpired(t *testing.T, lifetime time.Duration) (expiredTooSoon bool) {
	// A certificate's times are whole seconds: the chain expires at the
	// second before now+lifetime, and what is checked against is that.
	expiry := time.Now().Add(lifetime).Truncate(time.Second)
	pins, err := json.Marshal(map[string]any{"upstream_pins": map[string]any{"chain": testpki.Chain(t, "upstream.example", expiry)}})
	if err != nil {
		t.Fatal(err)
	}
	dir := shippedPolicies(t, map[string]string{
		"data.json": string(pins),
		"pins.rego": `package toolgate.request

deny contains "the upstream's pinned certificate chain no longer verifies; calls are refused" if {
	input.method == "tools/call"
	not pinned_chain_valid
}

pinned_chain_valid if {
	[ok, _] := crypto.x509.parse_and_verify_certificates(data.upstream_pins.chain)
	ok
}
`,
	})
	var engines [2]*engine
	for i, ev := range []string{evaluatorPlan, evaluatorTopdown} {
		e, err := newEngine(newSource(dir), requestQuery, stageRequest, ev, 0, zap.NewNop(), policyMetrics)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Destruct() })
		engines[i] = e
	}
	if engines[0].current.Load().program == nil {
		t.Fatalf("the policy was not planned: %s", engines[0].current.Load().planNote)
	}
	ctx := context.Background()
	decide := func(e *engine, args string) outcome {
		call := benchCall(t, benchTool, args)
		input, err := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
		if err != nil {
			t.Fatal(err)
		}
		return e.decide(ctx, input, benchTimeout, "arguments")
	}
	if o := decide(engines[0], `{"ticket_id":"TEST-1"}`); o.Action != gateway.ActionAllow {
		if time.Now().After(expiry) {
			return true
		}
		t.Fatalf("while the chain is valid: %+v", o)
	}
	time.Sleep(time.Until(expiry) + 500*time.Millisecond)
	want := decide(engines[1], `{"ticket_id":"TEST-2"}`)
	if want.Action != gateway.ActionDeny {
		t.Fatalf("topdown after the chain expired: %+v", want)
	}
	prog := engines[0].current.Load().program
	before := prog.Recalled()
	if got := decide(engines[0], `{"ticket_id":"TEST-2"}`); got.Action != want.Action {
		t.Errorf("after the chain expired the plan %s (recalled %d) a call topdown %ss: %q", got.Action, prog.Recalled()-before, want.Action, want.Reason)
	}
	return false
}
