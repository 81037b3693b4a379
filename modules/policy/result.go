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

// ResultHandler is toolgate_result_policy: it registers hooks that decide
// everything the upstream sends toward the runner before the runner sees
// it — the result of every request (tools/call results, tool listings,
// resources, prompts, tasks, …), error responses, notifications and
// server→client requests (see channels.go). It sits before toolgate_proxy
// in the route and acts when the proxy has the upstream's message.
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

// ServeHTTP registers the result hook for a request, and the message hook
// for every call (a GET's covers the standalone stream).
func (h *ResultHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	call := gateway.CallFrom(r)
	if call == nil || call.Service == nil {
		return caddyhttp.Error(http.StatusInternalServerError,
			errors.New("toolgate_result_policy must come after toolgate_session and toolgate_registry in the route"))
	}
	call.ResultJudged = true
	if !call.RequestJudged {
		// It may answer in the upstream's place (a released result):
		// only what the request policy saw too, as toolgate_proxy relays.
		call.RefuseUnjudged(w, h.logger)
		return nil
	}
	var rq *asked
	if call.IsRequest() {
		var ok bool
		if rq, ok = h.asked(r.Context(), w, call); !ok {
			return nil
		}
		if h.approvals != nil && call.Method != "initialize" && h.approvals.MayRelease(r.Context(), call.Caller.User, gateway.SessionRef(call.Session.ID)) && h.released(w, r, call, rq) {
			return nil
		}
		call.ResultDecided = call.Method == "tools/call"
		base := h.app.BaseURL(r)
		call.OnResult(func(ctx context.Context, call *gateway.Call, result []byte) (gateway.Result, error) {
			return h.result(ctx, call, rq, result, base)
		})
	}
	call.OnMessage(func(ctx context.Context, call *gateway.Call, msg gateway.UpstreamMessage) ([]byte, bool, error) {
		return h.message(ctx, call, rq, msg)
	})
	call.TasksOwned = true // asked, ownTasks and message keep each task to its MCP session
	return next.ServeHTTP(w, r)
}

// check decides one tools/call result: allow (as is, or replaced), deny,
// or ask (withheld). An allowed result carries the decision in
// _meta["toolgate/decision"]; a denied or withheld one reaches the runner
// as a tool error carrying the reason and the decision.
func (h *ResultHandler) check(ctx context.Context, call *gateway.Call, result []byte, base string) (gateway.Result, error) {
	return h.toolResult(ctx, call, subject{channel: channelResult, method: "tools/call", view: call}, result, base)
}

// toolResult decides a CallToolResult: the answer to a tools/call, or a
// task's deferred one (tasks/result).
func (h *ResultHandler) toolResult(ctx context.Context, call *gateway.Call, s subject, result []byte, base string) (gateway.Result, error) {
	v := h.evaluate(ctx, call, s, result)
	o, d := v.o, v.d
	call.Decision = d
	switch o.Action {
	case gateway.ActionAllow:
		return v.out, nil
	case gateway.ActionAsk:
		if h.approvals == nil {
			return gateway.Whole(gateway.ToolError("the result is withheld pending approval: "+o.Reason+
				" (this gateway cannot take approvals: it has no cipher to keep them; an administrator must configure one)", d)), nil
		}
		withheld := result
		if o.Result != nil {
			// The policy's cleaned result is the one reviewed and released.
			var err error
			if withheld, err = appendJSON(nil, o.Result, v.spans); err != nil {
				return gateway.Whole(gateway.ToolError("the result was withheld: the policy's cleaned result cannot be written as JSON", d)), nil
			}
		}
		return whole(h.withhold(ctx, call, s, v, withheld, base, true))
	default:
		return gateway.Whole(gateway.ToolError("the result was withheld by policy: "+o.Reason, d)), nil
	}
}

// verdict is one result-stage decision, made and recorded.
type verdict struct {
	o     outcome
	d     *gateway.Decision
	input ast.Object
	spans map[*ast.Term]string
	// out is what an allow sends instead of the payload: the policy's
	// replacement, or for a tool result the payload with the decision in
	// its _meta (in pieces, the payload's bytes not copied); nil to send
	// the payload as it is.
	out gateway.Result
}

// evaluate decides the payload s is about with the policy and records the
// decision (metrics, audit entry).
func (h *ResultHandler) evaluate(ctx context.Context, call *gateway.Call, s subject, payload []byte) verdict {
	// The input is built for the policy version that decides, whose scan
	// settings it uses.
	audited := s.audited(call)
	ctx, span := startDecisionSpan(ctx, "toolgate.policy.result", audited)
	sum := h.digest(payload) // for the audit entry, hashed while the policy evaluates
	c := h.engine.current.Load()
	v := verdict{o: outcome{}.deny(failError, "the gateway could not build the policy input"), spans: make(map[*ast.Term]string)}
	var err error
	v.input, err = h.input(c, call, s, payload, v.spans)
	refused, isRefusal := errors.AsType[*Refusal](err) // no allocation, unlike errors.As: every result passes here
	switch {
	case err == nil:
		v.o = h.engine.decideWith(ctx, c, v.input, time.Duration(h.Timeout), "result")
	case isRefusal:
		v.o = v.o.deny(failMalformed, refused.Why)
	default:
		h.logger.Warn("cannot build the policy input", zap.String("service", call.Service.ID), zap.String("channel", s.channel), zap.Error(err))
	}
	id := gateway.NewID()
	if v.o.Action == gateway.ActionAllow {
		if v.out, err = s.write(payload, v.input, v.o, id, v.spans); err != nil {
			v.o = v.o.deny(failMalformed, err.Error())
		}
	}
	v.d = h.newDecisionWithID(ctx, id, audited, &v.o, stageResult, payload, sum, v.input, s.channel)
	endDecisionSpan(span, v.d, v.o)
	return v
}

// write is what an allow sends instead of payload (nil: payload as it
// is): a tool result gets the decision in its _meta, written as the
// upstream wrote it where the policy left it unchanged; anything else
// the policy's replacement.
func (s subject) write(payload []byte, input ast.Object, o outcome, id string, spans map[*ast.Term]string) (gateway.Result, error) {
	if s.marked() {
		mark := &gateway.Decision{ID: id, Action: o.Action}
		var out gateway.Result
		var err error
		if o.Result != nil {
			out, err = markedResult(nil, o.Result, mark, spans)
		} else {
			out, err = markedResult(payload, input.Get(keyResult), mark, spans)
		}
		if err != nil {
			return nil, errors.New("the policy's replacement result cannot be written as JSON")
		}
		return out, nil
	}
	if o.Result == nil {
		return nil, nil
	}
	if s.channel == gateway.ChannelError && !errorObject(o.Result) {
		return nil, errors.New("the policy's replacement error needs an integer code and a string message")
	}
	out, err := appendJSON(nil, o.Result, spans)
	if err != nil {
		return nil, errors.New("the policy's replacement cannot be written as JSON")
	}
	return gateway.Result{out}, nil
}

// whole is a hook's answer in one piece.
func whole(b []byte, err error) (gateway.Result, error) {
	return gateway.Whole(b), err
}

// input is the result-stage input for s: its channel and request input,
// the payload under result and, when the policy version c has scan
// settings, the scan.
func (h *ResultHandler) input(c *compiled, call *gateway.Call, s subject, payload []byte, spans map[*ast.Term]string) (ast.Object, error) {
	var sc *scanner
	if c != nil {
		sc = c.scanner
	}
	res, scan, err := resultTerms(payload, shapeOf(s.channel, s.method), sc, spans)
	if err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	own := [][2]*ast.Term{ast.Item(keyChannel, channelTerm(s.channel)), ast.Item(keyResult, res), ast.Item(keyScan, scan)}
	if scan == nil {
		own = own[:2]
	}
	return s.complete(call, own...)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*ResultHandler)(nil)
	_ caddy.Validator             = (*ResultHandler)(nil)
	_ caddy.CleanerUpper          = (*ResultHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*ResultHandler)(nil)
)
