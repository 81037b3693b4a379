package integration

// Parity of the message policy between the protocol paths, end to end:
// a real gateway, a hand-written upstream of 2026-07-28, and a stateless
// runner. The result policy refuses every sampling/createMessage to the
// runner on the server_request channel (as in
// TestTranslateAttackModernInputRequestsSkipServerRequestChannel).
//
// Attack (fixed): the upstream answers a tools/call with inputRequests but no
// resultType "input_required" (none at all). finishStateless inspects
// input requests only under resultType "input_required", so the sampling
// request, its prompt included, reaches the runner with resultType
// "complete" added; the go-sdk client (v1.8.0) fulfils any result whose
// inputRequests is set, whatever its resultType. Should: withheld like the
// same request under input_required (or refused).
// (TestParityAttackInputRequestsWithoutResultType)
//
// Attack (fixed): the upstream spells an input request's params "Params". The
// legacy path refuses every case variant of "params" (mcpmsg.Parse);
// inspectInputRequests reads the params with an exact match, so a result
// policy that decides a sampling request on its messages (here: one that
// quotes SAMPLED-FOR-THE-UPSTREAM is denied) is given no params and lets
// it through, while the go-sdk runner's InputRequestMap.UnmarshalJSON
// (encoding/json, case-insensitive field names) reads "Params" as the
// params. Should: refused, as the legacy path refuses it.
// (TestParityAttackInputRequestParamsCaseVariant)
//
// Attack (fixed): the first attack with real go-sdk runners (v1.8.0), each with a
// sampling handler: a stateless one, and one that initializes (2025-11-25,
// translated in front of the same upstream: requestTranslated relays every
// result that is not input_required through finish, which never looks at
// inputRequests). Both runners' models are asked the upstream's prompt the
// policy refuses; the stateless runner then sends the model's answer
// upstream in its retry's inputResponses. Should: neither handler called.
// (TestParityAttackGoSDKRunnerSamplesWithoutResultType)
//
// Fixed: an answer whose input requests toolgate cannot inspect as the
//   runner reads them is withheld (mcp2026.InputRequestsProblem:
//   inputRequests outside an input_required result, spelled in another
//   case, not an object, or with method or params spelled in another
//   case); a runner of an earlier revision gets no result carrying input
//   requests at all (finish); toolgate's words name a method only when it
//   is one of mcp2026.InputMethods (InputMethodName).
//
// Holds: the same sampling request under resultType "input_required" is
// withheld, its prompt never reaches the runner (control of the first).
// (TestParityHoldsInputRequiredWithheld)

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"
)

const parityPrompt = "SAMPLED-FOR-THE-UPSTREAM"

func parityGateway(t *testing.T, answer string) *gateway {
	t.Helper()
	return parityGatewayWith(t, answer, `decision := {"action": "deny", "reason": "svc may not use the runner's model"} if {
	input.channel == "server_request"
	input.method == "sampling/createMessage"
}
`)
}

func parityGatewayWith(t *testing.T, answer, rule string) *gateway {
	t.Helper()
	up := saStartModern(t, `["2026-07-28"]`, `[{"name":"echo","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]`,
		func(params gjson.Result) (int, string) {
			if params.Get("inputResponses").Exists() {
				return http.StatusOK, `"result":{"resultType":"complete","content":[{"type":"text","text":"done"}]}`
			}
			return http.StatusOK, answer
		})
	policies := aaPolicies(t, "", rule)
	return startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies})
}

const paritySampling = `{"method":"sampling/createMessage","params":{"maxTokens":50,"messages":[{"role":"user","content":{"type":"text","text":"` + parityPrompt + `"}}]}}`

func TestParityHoldsInputRequiredWithheld(t *testing.T) {
	g := parityGateway(t, `"result":{"resultType":"input_required","inputRequests":{"draft":`+paritySampling+`},"requestState":"s1"}`)
	session := g.createSession(t, aliceKey, "svc")
	status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "echo", `{}`, `{"sampling":{}}`, ""), nil)
	if all := aaJSON(msg); strings.Contains(all, parityPrompt) || !strings.Contains(all, "withheld") {
		t.Fatalf("the sampling request under input_required: %d %s", status, all)
	}
}

func TestParityAttackInputRequestsWithoutResultType(t *testing.T) {
	g := parityGateway(t, `"result":{"inputRequests":{"draft":`+paritySampling+`},"requestState":"s1"}`)
	session := g.createSession(t, aliceKey, "svc")
	status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "echo", `{}`, `{"sampling":{}}`, ""), nil)
	if all := aaJSON(msg); strings.Contains(all, parityPrompt) {
		t.Fatalf("a stateless runner was sent a sampling/createMessage the policy refuses on the server_request channel (no resultType): %d %s", status, all)
	}
}

// parityContentRule denies a server→client request whose params quote the
// prompt.
const parityContentRule = `decision := {"action": "deny", "reason": "the upstream may not have the runner's model say that"} if {
	input.channel == "server_request"
	contains(json.marshal(input.result), "` + parityPrompt + `")
}
`

func TestParityAttackInputRequestParamsCaseVariant(t *testing.T) {
	for _, spelled := range []string{"params", "Params"} {
		t.Run(spelled, func(t *testing.T) {
			entry := strings.Replace(paritySampling, `"params"`, `"`+spelled+`"`, 1)
			g := parityGatewayWith(t, `"result":{"resultType":"input_required","inputRequests":{"draft":`+entry+`},"requestState":"s1"}`, parityContentRule)
			session := g.createSession(t, aliceKey, "svc")
			status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "echo", `{}`, `{"sampling":{}}`, ""), nil)
			if all := aaJSON(msg); strings.Contains(all, parityPrompt) {
				t.Fatalf("a stateless runner was sent a sampling request the policy denies on its messages (spelled %q): %d %s", spelled, status, all)
			}
		})
	}
}

// TestParityAttackGoSDKRunnerSamplesWithoutResultType: the first Attack
// with real go-sdk runners: a stateless one (2026-07-28) and one that
// initializes (2025-11-25, translated in front of the same upstream). Each
// has a sampling handler; the policy refuses every sampling request to the
// runner, yet the handler is called with the upstream's prompt, because
// the go-sdk client fulfils a result's inputRequests whatever its
// resultType and toolgate inspects them only under "input_required".
func TestParityAttackGoSDKRunnerSamplesWithoutResultType(t *testing.T) {
	for _, stateless := range []bool{true, false} {
		name := "initializes"
		if stateless {
			name = "stateless"
		}
		t.Run(name, func(t *testing.T) {
			g := parityGateway(t, `"result":{"inputRequests":{"draft":`+paritySampling+`},"requestState":"s1"}`)
			session := g.createSession(t, aliceKey, "svc")
			var mu sync.Mutex
			var asked []string
			opts := &mcp.ClientOptions{CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
				b, _ := json.Marshal(req.Params)
				mu.Lock()
				asked = append(asked, string(b))
				mu.Unlock()
				return &mcp.CreateMessageResult{Model: "m", Role: "assistant", Content: &mcp.TextContent{Text: "the model's words"}}, nil
			}}
			var cs *mcp.ClientSession
			if stateless {
				cs = g.connectStateless(t, aliceKey, session, "svc", opts)
			} else {
				cs = g.connect(t, aliceKey, session, "svc", opts)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}})
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(strings.Join(asked, "\n"), parityPrompt) {
				t.Errorf("the runner's model was asked the upstream's prompt the policy refuses (%v, %v): %s", res, err, asked)
			}
		})
	}
}
