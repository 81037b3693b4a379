//go:build open_findings

package integration

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// Attack: a stateless (2026-07-28) tools/call opens its implied MCP session
// in toolgate_registry (openStateless), before toolgate_policy: the
// upstream gets server/discover, initialize, notifications/initialized
// and tools/list (with the service's credential) whatever the policies' matchers, and
// only then does toolgate_proxy refuse the call as unjudged. The opening's
// initialize is decided by the route's toolgate_policy gate
// (Route.DecideOpening) even where that policy's matcher misses the
// request, so the request policy's decision is not skipped for it; but
// through a route whose toolgate_result_policy matcher misses (/unseen)
// or whose toolgate_policy matcher misses (/unjudged), the upstream is
// contacted for a request the proxy then refuses as "not relayed" —
// contrary to the commit's "the proxy relays nothing that did not pass
// both", and the implied session and its catalog (kept for the caller,
// the toolgate session, the service and the capabilities, shared with
// later judged requests) are filled from an unjudged request.
// Severity: low (the upstream sees a session opened and listed, no tool
// call; a cost and a log entry per request, credential use, and an
// upstream-side session count a refused client can drive).
// Fix: open the implied session only for a request both policies will
// see: check the route's step coverage (or defer the opening to the
// proxy, after its mark check, and let the registry's pin check use the
// catalog the proxy then fetches), or have openStateless refuse at once
// when the request policy's matcher would skip the request.
func TestD2AttackStatelessOpeningThroughUnjudgedRouteContactsUpstream(t *testing.T) {
	for _, prefix := range []string{"unseen", "unjudged"} {
		t.Run(prefix, func(t *testing.T) {
			up := startUpstream(t)
			port := freePort(t)
			g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: d1Routes(port, aaPolicies(t, "", ""))})
			session := g.createSession(t, aliceKey, "svc")
			g2 := *g
			g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/" + prefix
			_, msg := statelessPost(t, &g2, aliceKey, session,
				`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"d2-stateless"},`+aaStatelessMeta(`{}`)+`}}`, nil)
			if text := aaJSON(msg); !strings.Contains(text, "without a policy's judgement") {
				t.Fatalf("premise: a stateless call through /%s is not refused: %s", prefix, text)
			}
			var methods []string
			for _, r := range up.requestLog() {
				if m := gjson.Get(r.Body, "method").String(); m != "" {
					methods = append(methods, m)
				}
			}
			if len(methods) != 0 {
				t.Errorf("a stateless request through /%s, refused as unjudged, still made toolgate contact the upstream: %v", prefix, methods)
			}
		})
	}
}
