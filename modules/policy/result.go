package policy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"

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
		if h.approvals != nil && h.approvals.MayRelease(call.Caller.User, gateway.SessionRef(call.Session.ID)) && h.released(w, r, call) {
			return nil
		}
		call.ResultDecided = true
		base := h.app.BaseURL(r)
		call.OnResult(func(ctx context.Context, call *gateway.Call, result []byte) ([]byte, error) {
			return h.check(ctx, call, result, base)
		})
	}
	return next.ServeHTTP(w, r)
}

// check decides one result: allow (as is, or replaced), deny, or ask
// (withheld). An allowed result carries the decision in
// _meta["toolgate/decision"]; a denied or withheld one reaches the runner
// as a tool error carrying the reason and the decision.
func (h *ResultHandler) check(ctx context.Context, call *gateway.Call, result []byte, base string) ([]byte, error) {
	// The input is built for the policy version that decides, whose scan
	// settings it uses.
	ctx, span := gateway.StartSpan(ctx, "toolgate.policy.result", traceAttributes(call)...)
	sum := h.digest(result) // for the audit entry, hashed while the policy evaluates
	c := h.engine.current.Load()
	o := outcome{}.deny(failError, "the gateway could not build the policy input")
	spans := make(map[*ast.Term]string)
	input, err := h.input(c, call, result, spans)
	if err == nil {
		o = h.engine.decideWith(ctx, c, input, time.Duration(h.Timeout), "result")
	} else {
		h.logger.Warn("cannot build the policy input", zap.String("service", call.Service.ID), zap.Error(err))
	}
	id := gateway.NewID()
	var out []byte
	if o.Action == gateway.ActionAllow {
		// What the policy left as it was is written as the upstream wrote it.
		mark := &gateway.Decision{ID: id, Action: o.Action}
		if o.Result != nil {
			out, err = markResult(nil, o.Result, mark, spans)
		} else {
			out, err = markResult(result, input.Get(keyResult), mark, spans)
		}
		if err != nil {
			o = o.deny(failMalformed, "the policy's replacement result cannot be written as JSON")
		}
	}
	d := h.newDecisionWithID(ctx, id, call, o, stageResult, result, sum, input)
	call.Decision = d
	endDecisionSpan(span, d, o)
	switch o.Action {
	case gateway.ActionAllow:
		return out, nil
	case gateway.ActionAsk:
		if h.approvals == nil {
			return gateway.ToolError("the result is withheld pending approval: "+o.Reason+
				" (this gateway cannot take approvals: it has no cipher to keep them; an administrator must configure one)", d), nil
		}
		withheld := result
		if o.Result != nil {
			// The policy's cleaned result is the one reviewed and released.
			if withheld, err = appendJSON(nil, o.Result, spans); err != nil {
				return gateway.ToolError("the result was withheld: the policy's cleaned result cannot be written as JSON", d), nil
			}
		}
		return h.withhold(ctx, call, o, d, input, withheld, base), nil
	default:
		return gateway.ToolError("the result was withheld by policy: "+o.Reason, d), nil
	}
}

// input is the result-stage input: the request input plus the result and,
// when the policy version c has scan settings, the scan.
func (h *ResultHandler) input(c *compiled, call *gateway.Call, result []byte, spans map[*ast.Term]string) (ast.Object, error) {
	var sc *scanner
	if c != nil {
		sc = c.scanner
	}
	res, scan, err := resultTerms(result, sc, spans)
	if err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	common := append(commonItems(call), ast.Item(keyResult, res))
	if scan != nil {
		common = append(common, ast.Item(keyScan, scan))
	}
	return inputFor(common, call, toolTerm(call.ToolDefinition(), call.Message.Name, call.Service), false)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*ResultHandler)(nil)
	_ caddy.Validator             = (*ResultHandler)(nil)
	_ caddy.CleanerUpper          = (*ResultHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*ResultHandler)(nil)
)
