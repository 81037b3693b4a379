//go:build open_findings

package integration

import "testing"

// Attack: a stateless (2026-07-28) tools/call through a route whose
// toolgate_result_policy matcher misses (/unseen) has its implied MCP
// session opened upstream (server/discover, initialize,
// notifications/initialized, tools/list, with the service's credential)
// by toolgate_policy, which runs the registry's opening once it has the
// request (gateway.Call.Prepare), so that its decision sees the tool's
// definition; only then does toolgate_proxy refuse the call as unjudged.
// The opening's initialize is decided by the route's request policy
// (Route.DecideOpening) and the listing is never shown to the runner, but
// the upstream is contacted for a request the proxy then refuses. Through
// a route whose toolgate_policy matcher misses (/unjudged), nothing is
// sent (TestStatelessOpeningWaitsForTheRequestPolicy).
// Severity: low (the upstream sees a session opened and listed, no tool
// call: a cost, a log entry and credential use per request, through a
// misconfigured route).
// Fix: the request policy cannot know, when it decides, whether a later
// step's matcher will miss; either the result policy's coverage is known
// before (a route-level record of the steps' matchers), or the opening
// waits for the proxy and the request policy decides without the tool's
// definition, which the default policies need.
func TestD2AttackStatelessOpeningThroughUnseenRouteContactsUpstream(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: d1Routes(port, aaPolicies(t, "", ""))})
	if methods := statelessThroughPrefix(t, g, up, port, "unseen"); len(methods) != 0 {
		t.Errorf("a stateless request through /unseen, refused as unjudged, still made toolgate contact the upstream: %v", methods)
	}
}
