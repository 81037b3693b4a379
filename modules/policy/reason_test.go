package policy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/modules/gateway"
)

// A policy's reason is its own text, and a site policy can make it of
// the upstream's: joined from pieces (as it joins text items, or removes
// invisible characters), the call's credential that the upstream wrote
// back, split so that no search of the upstream's message found it,
// would be whole in the reason. The decision's reason, which the audit
// log, the console's activity record and the runner get, never holds it.
func TestReasonHoldsNoCredential(t *testing.T) {
	const secret = "ghp_ReasonJoinedFromTheUpstreamsPieces"
	dir := t.TempDir()
	rules := `package toolgate.result

decision := {"action": "deny", "reason": concat("", ["quoting the upstream: ", input.result.a, input.result.b])}
`
	if err := os.WriteFile(filepath.Join(dir, "result.rego"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(newSource(dir), "data.toolgate.result.decision", stageResult, evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	core, logs := observer.New(zap.InfoLevel)
	h := &ResultHandler{Config{Timeout: caddy.Duration(10 * time.Second), engine: e, audit: zap.New(core), logger: zap.NewNop()}}
	for _, value := range []string{"Bearer " + secret, secret} {
		call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
		call.Credential = &gateway.Credential{Header: "Authorization", Value: value}
		payload := `{"a":"` + secret[:10] + `","b":"` + secret[10:] + `"}`
		_, _, err := h.message(context.Background(), call, &asked{method: "tools/call", view: call},
			gateway.UpstreamMessage{Channel: gateway.ChannelNotification, Method: "notifications/message", Payload: []byte(payload)})
		if err != nil {
			t.Fatal(err)
		}
		entries := logs.TakeAll()
		if len(entries) != 1 {
			t.Fatalf("%d audit entries", len(entries))
		}
		reason, _ := entries[0].ContextMap()["reason"].(string)
		if !strings.HasPrefix(reason, "quoting the upstream: ") {
			t.Fatalf("control: the policy's reason is %q", reason)
		}
		if strings.Contains(reason, secret) {
			t.Errorf("credential %q: the audit entry's reason holds it: %q", value, reason)
		}
	}
}
