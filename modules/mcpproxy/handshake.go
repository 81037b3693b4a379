package mcpproxy

import (
	"context"
	"net/http"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// initialize relays the runner's initialize and, when the upstream accepts
// it, starts an MCP session known to the runner by toolgate's own
// Mcp-Session-Id. The upstream's session id never reaches the runner.
func (h *Handler) initialize(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(call.Service.Timeout))
	defer cancel()
	params := call.Message.Params
	if !gateway.SupportsProtocolVersion(call.Message.ProtocolVersion) {
		// Offer what toolgate speaks, so the upstream cannot settle on a
		// version toolgate does not know.
		params = mcpmsg.ReplaceMember(params, "protocolVersion", mcpmsg.Quote(gateway.LatestProtocolVersion))
	}
	body := initializeRequest(call.Message.ID, params)
	resp, msg, err := h.roundTrip(ctx, call, gateway.Upstream{}, call.Message.ID, body)
	if err != nil {
		h.answerError(w, r, call, err)
		return
	}
	version := gjson.GetBytes(msg.Result, "protocolVersion")
	if !version.Exists() {
		gateway.WriteRPC(w, http.StatusOK, msg.Raw) // the upstream's error, as is
		return
	}
	up := gateway.Upstream{
		SessionID:        resp.Header.Get("Mcp-Session-Id"),
		ProtocolVersion:  version.String(),
		InitializeParams: params,
	}
	if !gateway.SupportsProtocolVersion(up.ProtocolVersion) {
		h.endUpstream(call, up)
		gateway.WriteRPCError(w, http.StatusOK, call.Message.ID, gateway.CodeInvalidRequest,
			"the upstream chose protocol version "+version.String()+", which toolgate does not speak", nil)
		return
	}
	ms := h.app.MCPSessions().Create(call.Caller.User, call.Session.ID, call.Service.ID)
	ms.SetUpstream(up)
	w.Header().Set("Mcp-Session-Id", ms.ID)
	gateway.WriteRPC(w, http.StatusOK, msg.Raw)
}

// reinitialize replaces an upstream session the upstream forgot (it answered
// 404), replaying the runner's initialize. Concurrent requests that saw the
// same session share one re-initialization.
func (h *Handler) reinitialize(ctx context.Context, call *gateway.Call, seen gateway.Upstream) (gateway.Upstream, error) {
	return call.MCPSession.Reinitialize(seen.Generation, func(cur gateway.Upstream) (gateway.Upstream, error) {
		id := gatewayRequestID()
		resp, msg, err := h.roundTrip(ctx, call, gateway.Upstream{}, id, initializeRequest(id, cur.InitializeParams))
		if err != nil {
			return cur, err
		}
		version := gjson.GetBytes(msg.Result, "protocolVersion").String()
		next := gateway.Upstream{
			SessionID:        resp.Header.Get("Mcp-Session-Id"),
			ProtocolVersion:  version,
			InitializeParams: cur.InitializeParams,
		}
		if version != cur.ProtocolVersion {
			h.endUpstream(call, next)
			h.app.MCPSessions().Delete(call.MCPSession.ID)
			return cur, unavailable("the upstream restarted and no longer speaks protocol %s; initialize a new session", cur.ProtocolVersion)
		}
		ack, err := h.exchange(ctx, call, next, http.MethodPost, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), "")
		if err != nil {
			return cur, err
		}
		ack.Body.Close()
		h.logger.Info("re-initialized upstream session", zap.String("service", call.Service.ID))
		if err := h.fetchCatalog(ctx, call, next); err != nil {
			h.logger.Warn("cannot list the upstream's tools", zap.String("service", call.Service.ID), zap.Error(err))
		}
		return next, nil
	})
}

// maxCatalogPages bounds how many tools/list pages toolgate reads itself.
const maxCatalogPages = 50

// fetchCatalog lists the upstream's tools and keeps the definitions of the
// allowlisted ones in the MCP session, for the request policy's input.tool.
func (h *Handler) fetchCatalog(ctx context.Context, call *gateway.Call, up gateway.Upstream) error {
	tools := make(map[string]*gateway.ToolDefinition)
	var cursor []byte
	for range maxCatalogPages {
		id := gatewayRequestID()
		body := make([]byte, 0, 128)
		body = append(body, `{"jsonrpc":"2.0","id":`...)
		body = append(body, id...)
		body = append(body, `,"method":"tools/list"`...)
		if cursor != nil {
			body = append(body, `,"params":{"cursor":`...)
			body = append(body, cursor...)
			body = append(body, '}')
		}
		body = append(body, '}')
		_, msg, err := h.roundTrip(ctx, call, up, id, body)
		if err != nil {
			return err
		}
		if msg.Result == nil {
			return unavailable("tools/list failed: %s", gjson.GetBytes(msg.Error, "message").String())
		}
		res := gjson.ParseBytes(msg.Result)
		res.Get("tools").ForEach(func(_, t gjson.Result) bool {
			if name := t.Get("name").String(); call.Service.AllowsTool(name) {
				tools[name] = &gateway.ToolDefinition{Name: name, Raw: []byte(t.Raw)}
			}
			return true
		})
		next := res.Get("nextCursor")
		if next.Type != gjson.String || next.Str == "" {
			break
		}
		cursor = []byte(next.Raw)
	}
	call.MCPSession.SetCatalog(tools)
	return nil
}

// endUpstream ends an upstream session toolgate will not use. Best effort.
func (h *Handler) endUpstream(call *gateway.Call, up gateway.Upstream) {
	if up.SessionID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if resp, err := h.exchange(ctx, call, up, http.MethodDelete, nil, ""); err == nil {
		resp.Body.Close()
	}
}

func initializeRequest(id, params []byte) []byte {
	b := make([]byte, 0, 64+len(id)+len(params))
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"method":"initialize","params":`...)
	b = append(b, params...)
	return append(b, '}')
}
