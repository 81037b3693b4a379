package policy

import (
	"context"
	"strings"
	"testing"

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
	h, logs := observedRuleHandler(t, `decision := {"action": "deny", "reason": concat("", ["quoting the upstream: ", input.result.a, input.result.b])}`)
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
