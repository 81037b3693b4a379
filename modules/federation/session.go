package federation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/account"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/modules/gateway"
)

// maxReplayedInitialize bounds what a federated session keeps of the
// runner's initialize (as toolgate_proxy does for one service's).
const maxReplayedInitialize = 64 << 10

// capabilities are the federated endpoint's: everything a service behind
// it may offer. A service without prompts (say) simply adds none.
const capabilities = `{"tools":{"listChanged":true},"resources":{"subscribe":true,"listChanged":true},` +
	`"prompts":{"listChanged":true},"logging":{},"completions":{}}`

// initialize starts a federated MCP session. toolgate answers it itself:
// the services' own sessions start when the runner first needs them.
func (x *exchange) initialize() {
	version := x.msg.ProtocolVersion
	if !gateway.SupportsProtocolVersion(version) {
		version = gateway.LatestProtocolVersion
	}
	replay := []byte(`{"protocolVersion":`)
	replay = mcpmsg.AppendQuote(replay, version)
	for _, key := range []string{"capabilities", "clientInfo"} {
		if v := gjson.GetBytes(x.msg.Params, key); v.Exists() {
			replay = append(replay, ',')
			replay = mcpmsg.AppendQuote(replay, key)
			replay = append(replay, ':')
			replay = append(replay, v.Raw...)
		}
	}
	replay = append(replay, '}')
	if len(replay) > maxReplayedInitialize {
		gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, gateway.CodeInvalidParams, fmt.Sprintf(
			"initialize: capabilities and clientInfo take %d bytes; toolgate keeps at most %d", len(replay), maxReplayedInitialize), nil)
		return
	}
	ctx := x.r.Context()
	ms, err := x.h.app.MCPSessions().Create(ctx, x.call.Caller.User, x.call.Session.ID, x.call.Session.ExpiresAt, Service)
	if err != nil {
		var limit *gateway.MCPSessionLimitError
		if errors.As(err, &limit) {
			gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, gateway.CodeInvalidRequest, err.Error(),
				map[string]any{"limit": limit.Option, "max": limit.Limit})
			return
		}
		gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, gateway.CodeUnavailable, x.h.runnerText(err), gateway.Retryable)
		return
	}
	_ = ms.CatalogListed(ctx, nil) // a federated session lists no upstream of its own
	if err := ms.SetUpstream(ctx, gateway.Upstream{ProtocolVersion: version, InitializeParams: replay}); err != nil {
		_, _, _ = x.h.app.MCPSessions().End(ctx, ms)
		if errors.Is(err, gateway.ErrMCPSessionClosed) {
			gateway.WriteRPCError(x.w, http.StatusNotFound, x.msg.ID, gateway.CodeSessionNotFound, "the MCP session was ended: initialize a new one", nil)
			return
		}
		gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, gateway.CodeUnavailable, x.h.runnerText(err), gateway.Retryable)
		return
	}
	remember(ms, replay)

	result := []byte(`{"protocolVersion":`)
	result = mcpmsg.AppendQuote(result, version)
	result = append(result, `,"capabilities":`+capabilities+`,"serverInfo":{"name":"toolgate","title":"toolgate (every service of your session)","version":"1"},"instructions":`...)
	result = mcpmsg.AppendQuote(result, x.instructions())
	result = append(result, '}')
	x.w.Header().Set("Mcp-Session-Id", ms.ID)
	gateway.WriteRPC(x.w, http.StatusOK, gateway.RPCResult(x.msg.ID, result))
}

// instructions are the federated initialize's: what the endpoint serves,
// and each service of the session the caller cannot use now, with what the
// person does about it. Many clients give the model an initialize's
// instructions and show it nothing of a merged list's _meta, where such a
// service is named too.
func (x *exchange) instructions() string {
	var b strings.Builder
	b.WriteString("Every service of your toolgate session, at once: the tool or prompt NAME of service SERVICE is SERVICE" + x.h.Separator + "NAME.")
	for _, svc := range x.services() {
		e := account.CatalogEntry(x.r.Context(), x.h.app, x.call.Caller, svc)
		switch e.Status {
		case account.StatusNeedsSignIn, account.StatusExpired:
			hint := gateway.ConnectHint(x.h.app.NeedsSignInFor(x.r, svc, x.call.Caller.User))
			fmt.Fprintf(&b, "\nNot connected, so not listed: %s (%s). The person connects it %s; its tools are listed from the next tools/list.", svc.ID, e.Name(), hint)
		case account.StatusUnavailable:
			fmt.Fprintf(&b, "\nNot listed now: %s (%s). toolgate cannot read the connection to it; try again later.", svc.ID, e.Name())
		}
	}
	return b.String()
}

// gap is a service the federated session could not reach: why, as the
// pipeline told it (a JSON-RPC error, such as needs_sign_in with the
// connect_url).
type gap struct {
	Service string `json:"service"`
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func gapOf(service string, msg mcpmsg.Message) *gap {
	e := gjson.ParseBytes(msg.Error)
	g := &gap{Service: service, Code: int(e.Get("code").Int()), Message: e.Get("message").String()}
	if d := e.Get("data"); d.Exists() {
		g.Data = d.Value()
	}
	return g
}

// response reads the response to a sub-call to service; a failure to
// read it, or an error response, is the service's gap.
func (a *answer) response(service string) (mcpmsg.Message, *gap) {
	msg, err := a.single()
	switch {
	case err != nil:
		return msg, unreachable(service, err)
	case msg.Error != nil:
		return msg, gapOf(service, msg)
	}
	return msg, nil
}

func unreachable(service string, err error) *gap {
	return &gap{Service: service, Code: gateway.CodeUnavailable, Message: "the service could not be reached: " + gateway.RunnerText(err),
		Data: gateway.Retryable}
}

// runnerText is gateway.RunnerText of err, a storage failure's own words
// logged.
func (h *Handler) runnerText(err error) string {
	if errors.Is(err, gateway.ErrStorageUnavailable) {
		h.logger.Warn("storage unavailable", zap.Error(err))
	}
	return gateway.RunnerText(err)
}

// childSession returns the federated session's MCP session with svc: the
// one linked to the federated session (by this replica or another), or a
// new one, initialized (initialize, then notifications/initialized,
// through the pipeline) when there is none or it ended, and linked.
func (x *exchange) childSession(ctx context.Context, svc *gateway.Service) (*child, *gap) {
	c := x.fs.child(svc.ID)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ms != nil && !c.ms.Closed() {
		return c, nil
	}
	c.ms = nil
	link, _ := x.call.MCPSession.Link(svc.ID)
	if link.ID != "" {
		switch err := x.adopt(ctx, c, link); {
		case err == nil:
			return c, nil
		case !errors.Is(err, gateway.ErrMCPSessionNotFound):
			return nil, unreachable(svc.ID, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(svc.Timeout))
	defer cancel()
	id := mcpmsg.Quote("toolgate-federation-" + gateway.NewID())
	body := append(append(append([]byte(`{"jsonrpc":"2.0","id":`), id...), `,"method":"initialize","params":`...), x.fs.init...)
	body = append(body, '}')
	a := x.h.subCall(ctx, x.r, x.next, x.call, svc, nil, http.MethodPost, body, "application/json")
	sid := a.header.Get("Mcp-Session-Id")
	msg, g := a.response(svc.ID)
	if g != nil {
		return nil, g
	}
	ms, err := x.h.app.MCPSessions().Open(ctx, sid, x.call.Caller.User, x.call.Session.ID)
	if err != nil {
		return nil, unreachable(svc.ID, errors.New("no MCP session was started"))
	}
	a = x.h.subCall(ctx, x.r, x.next, x.call, svc, ms, http.MethodPost, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), "application/json")
	a.drain()
	if a.status != http.StatusAccepted {
		x.endChild(svc, ms)
		return nil, unreachable(svc.ID, fmt.Errorf("notifications/initialized answered HTTP %d", a.status))
	}
	mine := mcpstate.Link{ID: ms.ID, Capabilities: json.RawMessage(gjson.GetBytes(msg.Result, "capabilities").Raw)}
	held, err := x.call.MCPSession.SetLink(ctx, svc.ID, link, mine)
	switch {
	case err != nil:
		x.endChild(svc, ms)
		return nil, unreachable(svc.ID, err)
	case held.ID != mine.ID:
		// Another replica linked its own meanwhile: that one is the
		// federated session's.
		x.endChild(svc, ms)
		if err := x.adopt(ctx, c, held); err != nil {
			return nil, unreachable(svc.ID, err)
		}
		return c, nil
	}
	c.ms, c.capabilities = ms, gjson.ParseBytes(mine.Capabilities)
	return c, nil
}

// adopt makes the session link names c's, on this replica. c.mu is held.
func (x *exchange) adopt(ctx context.Context, c *child, link mcpstate.Link) error {
	ms, err := x.h.app.MCPSessions().Open(ctx, link.ID, x.call.Caller.User, x.call.Session.ID)
	if err != nil {
		return err
	}
	c.ms, c.capabilities = ms, gjson.ParseBytes(link.Capabilities)
	return nil
}

// endChild ends an MCP session with svc that the federated session does
// not keep (DELETE through the pipeline, which ends it upstream too).
func (x *exchange) endChild(svc *gateway.Service, ms *gateway.MCPSession) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.r.Context()), time.Duration(svc.Timeout))
	defer cancel()
	x.h.subCall(ctx, x.r, x.next, x.call, svc, ms, http.MethodDelete, nil, "").drain()
}

// forget drops an MCP session of svc the pipeline no longer knows (it
// answered 404), so that the next use initializes a new one.
func (x *exchange) forget(svc *gateway.Service, ms *gateway.MCPSession) {
	c := x.fs.child(svc.ID)
	c.mu.Lock()
	if c.ms == ms {
		c.ms = nil
	}
	c.mu.Unlock()
}

// end ends the federated session: each service's MCP session, whichever
// replica opened it (DELETE through the pipeline, which ends it upstream
// too), then its own, everywhere.
func (x *exchange) end() {
	for id, ms := range x.started() {
		if svc := x.h.app.Registry().Lookup(id); svc != nil {
			x.endChild(svc, ms)
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.r.Context()), 30*time.Second)
	defer cancel()
	if _, _, err := x.h.app.MCPSessions().End(ctx, x.call.MCPSession); err != nil {
		gateway.WriteRPCError(x.w, http.StatusServiceUnavailable, nil, gateway.CodeUnavailable, x.h.runnerText(err), gateway.Retryable)
		return
	}
	x.w.WriteHeader(http.StatusNoContent)
}
