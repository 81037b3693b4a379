package mcpproxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// maxReplayedInitialize bounds what an MCP session keeps of the runner's
// initialize to replay it upstream: its protocolVersion, capabilities and
// clientInfo.
const maxReplayedInitialize = 64 << 10

// initialize relays the runner's initialize and, when the upstream accepts
// it, starts an MCP session known to the runner by toolgate's own
// Mcp-Session-Id. The upstream's session id never reaches the runner.
func (h *Handler) initialize(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ctx, cancel := exchangeContext(r, call)
	defer cancel()
	params := call.Message.Params
	if !gateway.SupportsProtocolVersion(call.Message.ProtocolVersion) {
		// Offer what toolgate speaks, so the upstream cannot settle on a
		// version toolgate does not know.
		params = mcpmsg.ReplaceMember(params, "protocolVersion", mcpmsg.Quote(gateway.LatestProtocolVersion))
	}
	replay := replayedParams(params)
	if len(replay) > maxReplayedInitialize {
		call.Fail(w, http.StatusBadRequest, gateway.CodeInvalidParams, fmt.Sprintf(
			"initialize: capabilities and clientInfo take %d bytes; toolgate keeps at most %d", len(replay), maxReplayedInitialize), nil)
		return
	}
	sessions := h.app.MCPSessions()
	ms, err := sessions.Create(ctx, call.Caller.User, call.Session.ID, call.Session.ExpiresAt, call.Service.ID)
	if err != nil {
		h.refuseInitialize(w, r, call, err)
		return
	}
	defer ms.Begin()()
	call.MCPSession = ms
	body := initializeRequest(call.Message.ID, params)
	// An initialize runs to its end even if the runner hangs up: the
	// upstream may create a session, which toolgate must learn of to end
	// it (the new MCP session expires unused).
	ctx, cancel = completing(ctx)
	defer cancel()
	if h.modernOnly(ctx, call) {
		h.initializeTranslated(ctx, w, r, call, ms, replay)
		return
	}
	hdr, msg, err := h.roundTrip(ctx, call, gateway.Upstream{}, call.Message.ID, body)
	if err != nil {
		// Answered before the session ends, which would read as "ended
		// meanwhile" and tell the runner to initialize again at once.
		h.answerError(w, r, call, err)
		_, _, _ = sessions.End(ctx, ms) // not stored yet: forgotten here
		return
	}
	version := gjson.GetBytes(msg.Result, "protocolVersion")
	if !version.Exists() {
		_, _, _ = sessions.End(ctx, ms)
		answer := h.deliver(ctx, call, gateway.Upstream{}, msg, false) // the upstream's error, no session made
		gateway.WriteRPC(w, http.StatusOK, answer.parts()...)
		return
	}
	up := stamped(call, gateway.Upstream{
		SessionID:        hdr.Get("Mcp-Session-Id"),
		ProtocolVersion:  version.String(),
		InitializeParams: replay,
	})
	if !gateway.SupportsProtocolVersion(up.ProtocolVersion) {
		if v := up.ProtocolVersion; mcpmsg.LoggedRevision(v) {
			h.logger.Warn("the upstream chose a protocol version toolgate does not speak", zap.String("service", call.Service.ID), zap.String("version", v))
		} else {
			h.logger.Warn("the upstream chose a protocol version toolgate does not speak", zap.String("service", call.Service.ID))
		}
		_, _, _ = sessions.End(ctx, ms)
		h.endUpstream(ctx, call, up)
		gateway.WriteRPCError(w, http.StatusOK, call.Message.ID, gateway.CodeInvalidRequest,
			"the upstream chose a protocol version toolgate does not speak", nil) // not quoted: the upstream's words, which no policy saw
		return
	}
	if err := ms.SetUpstream(ctx, up); err != nil {
		// Not stored: no replica could continue it. Answered before the
		// session ends, which would read as "ended meanwhile" (a 404 that
		// tells the runner to initialize again).
		h.refuseInitialize(w, r, call, err)
		_, _, _ = sessions.End(ctx, ms)
		h.endUpstream(ctx, call, up)
		return
	}
	h.answerInitialize(ctx, w, call, ms, up, h.deliver(ctx, call, up, msg, false))
}

// answerInitialize writes answer, the upstream's initialize result as the
// result policy passed it, with the new MCP session's id. A result the
// policy withheld (answer is an error) leaves the runner nothing to use
// the session with: it ends, with the upstream's, and the runner gets no
// id (each such initialize would otherwise hold one of the caller's
// max_mcp_sessions_per_caller until it expired).
func (h *Handler) answerInitialize(ctx context.Context, w http.ResponseWriter, call *gateway.Call, ms *gateway.MCPSession, up gateway.Upstream, answer message) {
	if gjson.GetBytes(answer.joined(), "error").Exists() {
		_, _, _ = h.app.MCPSessions().End(ctx, ms)
		h.endUpstream(ctx, call, up)
	} else {
		w.Header().Set("Mcp-Session-Id", ms.ID)
	}
	gateway.WriteRPC(w, http.StatusOK, answer.parts()...)
}

// refuseInitialize answers an initialize whose MCP session could not be
// made or stored: past max_mcp_sessions_per_caller (or max_mcp_sessions),
// 429 naming the option; otherwise as answerError says.
func (h *Handler) refuseInitialize(w http.ResponseWriter, r *http.Request, call *gateway.Call, err error) {
	var limit *gateway.MCPSessionLimitError
	if errors.As(err, &limit) {
		call.Fail(w, http.StatusTooManyRequests, gateway.CodeInvalidRequest, err.Error(),
			map[string]any{"limit": limit.Option, "max": limit.Limit})
		return
	}
	h.answerError(w, r, call, err)
}

// replayedParams copies what is replayed of an initialize's params: a new
// slice, so that the request body it came from is not kept.
func replayedParams(params []byte) []byte {
	out := []byte{'{'}
	for _, key := range []string{"protocolVersion", "capabilities", "clientInfo"} {
		v := gjson.GetBytes(params, key)
		if !v.Exists() {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = mcpmsg.AppendQuote(out, key)
		out = append(out, ':')
		out = append(out, v.Raw...)
	}
	return append(out, '}')
}

// reinitialize replaces an upstream session the upstream forgot (it answered
// 404), replaying the runner's initialize. Concurrent requests that saw the
// same session share one re-initialization; each waits no longer than its
// own ctx.
func (h *Handler) reinitialize(ctx context.Context, call *gateway.Call, seen gateway.Upstream) (gateway.Upstream, error) {
	ms := call.MCPSession
	ran := false
	// Waiting for the lock honours ctx; the initialize itself runs to its
	// end within ctx's deadline even if the session is ended or the
	// runner hangs up meanwhile, so that an upstream session it creates
	// is known, and ended (discard).
	ictx, cancel := completing(ctx)
	defer cancel()
	init := func(cur gateway.Upstream) (gateway.Upstream, error) {
		ctx := ictx
		id := gatewayRequestID()
		hdr, msg, err := h.roundTrip(ctx, call, gateway.Upstream{}, id, initializeRequest(id, cur.InitializeParams))
		if err != nil {
			return cur, err
		}
		if msg.Result == nil { // refused for now (a program restarting, say): the session stays
			// The upstream's own words are not quoted: no policy inspected
			// them, and they can hold what it should not pass on.
			return cur, unavailable("the upstream did not re-create the session (it answered with error %d)", gjson.GetBytes(msg.Error, "code").Int())
		}
		version := gjson.GetBytes(msg.Result, "protocolVersion").String()
		next := stamped(call, gateway.Upstream{
			SessionID:        hdr.Get("Mcp-Session-Id"),
			ProtocolVersion:  version,
			InitializeParams: cur.InitializeParams,
		})
		if version != cur.ProtocolVersion {
			h.endUpstream(ctx, call, next)
			if up, ok, err := h.app.MCPSessions().End(ctx, ms); err == nil && ok {
				h.endUpstream(ctx, call, up)
			}
			return cur, unavailable("the upstream restarted and no longer speaks protocol %s; initialize a new session", cur.ProtocolVersion)
		}
		ack, err := h.exchange(ctx, call, next, http.MethodPost, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), "")
		if err != nil {
			h.endUpstream(ctx, call, next)
			return cur, err
		}
		drain(ack)
		ms.ListingTools()
		ran = true
		return next, nil
	}
	discard := func(up gateway.Upstream) { h.endUpstream(ictx, call, up) }
	up, err := ms.Reinitialize(ctx, seen.Generation, init, discard)
	if err != nil || !ran {
		return up, err
	}
	h.logger.Info("re-initialized upstream session", zap.String("service", call.Service.ID))
	if err := h.fetchCatalog(ctx, call, up); err != nil {
		h.logger.Warn("cannot list the upstream's tools", zap.String("service", call.Service.ID), zap.Error(err))
	}
	return up, nil
}

// maxCatalogPages bounds how many tools/list pages toolgate reads itself.
const maxCatalogPages = 50

// fetchCatalog lists the upstream's tools and keeps the definitions of the
// allowlisted ones in the MCP session, for the request policy's input.tool.
// The caller has marked the listing as in progress (ListingTools); it ends
// here either way.
func (h *Handler) fetchCatalog(ctx context.Context, call *gateway.Call, up gateway.Upstream) (err error) {
	ms := call.MCPSession
	defer func() {
		if err != nil {
			ms.CatalogFailed()
		}
	}()
	tools := make(map[string][]byte)
	var cursor []byte
	whole := false
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
			return unavailable("tools/list failed (the upstream answered with error %d)", gjson.GetBytes(msg.Error, "code").Int())
		}
		res := gjson.ParseBytes(msg.Result)
		res.Get("tools").ForEach(func(_, t gjson.Result) bool {
			if name := t.Get("name").String(); call.Service.AllowsTool(name) {
				tools[name] = []byte(t.Raw)
			}
			return true
		})
		next := res.Get("nextCursor")
		if next.Type != gjson.String || next.Str == "" {
			whole = true
			break
		}
		cursor = []byte(next.Raw)
	}
	if whole {
		h.warnUnlisted(call.Service, tools)
	}
	if err := ms.CatalogListed(ctx, tools); err != nil {
		h.logger.Warn("cannot store the upstream's tools for the other replicas; they judge calls without definitions until they list them",
			zap.String("service", call.Service.ID), zap.Error(err))
	}
	return nil
}

// warnUnlisted warns of allowlisted tools svc's upstream did not list
// (a misspelled name in the registry, or a tool the upstream dropped):
// runners never see them. Once per service and set of names.
func (h *Handler) warnUnlisted(svc *gateway.Service, listed map[string][]byte) {
	var missing []string
	for _, name := range svc.Tools {
		if _, ok := listed[name]; !ok {
			missing = append(missing, name)
		}
	}
	text := strings.Join(missing, ", ")
	if prev, ok := h.unlisted.Swap(svc.ID, text); (ok && prev == text) || (!ok && text == "") {
		return
	}
	if text != "" {
		h.logger.Warn("the upstream does not list tools the service's allowlist names: runners cannot see or call them (check the names in the registry's tools line)",
			zap.String("service", svc.ID), zap.Strings("tools", missing))
	}
}

// refreshCatalog lists the upstream's tools again in the background, after
// notifications/tools/list_changed; calls wait for it as for the first
// listing. A refresh already in progress is not started twice.
func (h *Handler) refreshCatalog(call *gateway.Call) {
	ms := call.MCPSession
	if !ms.ListingTools() {
		return
	}
	up := ms.Upstream()
	c := *call // exchange may replace the credential
	call = &c
	go func() {
		ctx, cancel := context.WithTimeout(ms.Context(), time.Duration(call.Service.Timeout))
		defer cancel()
		if err := h.fetchCatalog(ctx, call, up); err != nil {
			h.logger.Warn("cannot list the upstream's changed tools", zap.String("service", call.Service.ID), zap.Error(err))
		}
	}()
}

// stamped is up, an upstream session the call initializes, marked with
// the upstream and the caller's connection it was initialized with: the
// registry ends the MCP session when a reload makes the service name
// another, or the caller connects again (gateway.Upstream.Endpoint and
// Grant), and attempt never sends its id with another connection's
// credential.
func stamped(call *gateway.Call, up gateway.Upstream) gateway.Upstream {
	up.Endpoint = call.Service.Endpoint()
	if call.Credential != nil {
		up.Grant = call.Credential.Grant
	}
	return up
}

// endUpstream ends an upstream session toolgate no longer uses, with
// DELETE. Best effort: an upstream that fails to answer forgets the
// session at its own idle timeout.
func (h *Handler) endUpstream(ctx context.Context, call *gateway.Call, up gateway.Upstream) {
	if up.SessionID == "" {
		return
	}
	resp, err := h.exchange(ctx, call, up, http.MethodDelete, nil, "")
	if err != nil {
		h.logger.Debug("ending the upstream session failed", zap.String("service", call.Service.ID), zap.Error(err))
		return
	}
	drain(resp)
}

// expired ends the upstream session of an MCP session that ended without
// its runner's DELETE (it was idle for the idle timeout, or it was over:
// see gateway.App.EndUpstream), with the owner's current credential. A
// session whose service names another upstream since is left alone: its
// id is not the new upstream's to see. One whose owner connected again
// since is left alone too, where a server would see the DELETE: it would
// carry the new connection's credential with the old one's session (the
// upstream forgets it at its own idle timeout); a transport module (a
// program, a legacy SSE connection) ends it itself, given no credential.
// One another replica ended (Elsewhere) only ends here what a transport
// module of this replica holds of it.
func (h *Handler) expired(e gateway.EndedMCPSession) {
	if e.ID != "" {
		h.notices.Forget(e.ID) // nothing more waits for its stream
	}
	svc := h.app.Registry().Lookup(e.Service)
	if svc == nil || e.Upstream.SessionID == "" || !e.Upstream.From(svc.Endpoint()) {
		return
	}
	if e.Elsewhere && svc.Transport() == "" {
		return // the replica that ended it ended its upstream session
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(svc.Timeout))
	defer cancel()
	if e.Elsewhere {
		// Another replica ended it: this replica's transport module ends
		// its own session of it, given no credential (endsItself).
		h.endUpstream(ctx, &gateway.Call{Caller: &gateway.Caller{User: e.User}, Service: svc}, e.Upstream)
		return
	}
	cred, err := h.app.CredentialFor(ctx, svc, e.User)
	switch {
	case svc.Transport() != "" && (err != nil || cred.GrantName() != e.Upstream.Grant):
		// The owner disconnected or connected again: that must not keep
		// the session, and its connection, open.
		cred = nil
	case err != nil:
		h.logger.Info("cannot end an expired upstream session: no credential", zap.String("service", svc.ID), zap.Error(err))
		return
	case cred.GrantName() != e.Upstream.Grant:
		return
	}
	call := &gateway.Call{Caller: &gateway.Caller{User: e.User}, Service: svc, Credential: cred}
	h.endUpstream(ctx, call, e.Upstream)
}

// completing returns a context with ctx's deadline that is not cancelled
// with ctx: for exchanges that must not be abandoned halfway.
func completing(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(context.WithoutCancel(ctx))
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

func initializeRequest(id, params []byte) []byte {
	b := make([]byte, 0, 64+len(id)+len(params))
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"method":"initialize","params":`...)
	b = append(b, params...)
	return append(b, '}')
}
