package policy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(ResultHandler{})
}

// ResultHandler is toolgate_result_policy: it registers a hook that decides
// each tools/call result before the runner sees it. It sits before
// toolgate_proxy in the route and acts when the proxy has the result.
type ResultHandler struct {
	Config
}

// CaddyModule returns the Caddy module information.
func (ResultHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_result_policy",
		New: func() caddy.Module { return new(ResultHandler) },
	}
}

// Provision compiles the policy (file I/O only).
func (h *ResultHandler) Provision(ctx caddy.Context) error {
	return h.provision(ctx, stageResult, "data.toolgate.result.decision")
}

// Validate checks the configuration.
func (h *ResultHandler) Validate() error { return h.validate() }

// Cleanup releases the shared policy.
func (h *ResultHandler) Cleanup() error { return h.cleanup() }

// ServeHTTP registers the result hook for tools/call.
func (h *ResultHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	call := gateway.CallFrom(r)
	if call == nil || call.Service == nil {
		return caddyhttp.Error(http.StatusInternalServerError,
			errors.New("toolgate_result_policy must come after toolgate_session and toolgate_registry in the route"))
	}
	if call.IsRequest() && call.Method == "tools/call" {
		call.OnResult(h.check)
	}
	return next.ServeHTTP(w, r)
}

// check decides one result: allow (as is, or replaced), deny, or ask
// (withheld). A denied or withheld result reaches the runner as a tool
// error carrying the reason and the decision id.
func (h *ResultHandler) check(ctx context.Context, call *gateway.Call, result []byte) ([]byte, error) {
	if call.Tool == nil && call.MCPSession != nil {
		call.Tool = call.MCPSession.Tool(call.Message.Name)
	}
	input := requestInput(call, toolTerm(call.Tool, call.Message.Name), false)
	input.Insert(keyResult, ast.NewTerm(jsonValue(gjson.ParseBytes(result))))
	o := h.engine.decide(ctx, input, time.Duration(h.Timeout), "result")
	d := h.newDecision(ctx, call, o, stageResult, result, input)
	switch o.Action {
	case gateway.ActionAllow:
		if o.Result == nil {
			return nil, nil
		}
		return json.Marshal(o.Result)
	case gateway.ActionAsk:
		return gateway.ToolError("the result is withheld pending approval: "+o.Reason, d), nil
	default:
		return gateway.ToolError("the result was withheld by policy: "+o.Reason, d), nil
	}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*ResultHandler)(nil)
	_ caddy.Validator             = (*ResultHandler)(nil)
	_ caddy.CleanerUpper          = (*ResultHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*ResultHandler)(nil)
)
