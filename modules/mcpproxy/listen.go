package mcpproxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/eventstream"
	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// listenLegacy serves a stateless runner's subscriptions/listen with an
// upstream of an earlier revision: toolgate acknowledges the part of the
// filter the upstream's capabilities can honour, subscribes upstream to the
// resources asked for, and relays from the upstream session's standalone
// stream the notifications the filter asked for, each tagged with the
// subscription's id, until the runner closes the stream. The listens of
// one implied MCP session share its standalone stream and its
// subscriptions (mcp2026.Runtime.Listen, Subscribe): a resource no listen
// names any more is unsubscribed.
func (h *Handler) listenLegacy(ctx context.Context, w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	d, _ := h.stateless.Discovery(call)
	caps := gjson.ParseBytes(d.Capabilities)
	asked := gjson.GetBytes(call.Message.Params, "notifications")
	filter := listenFilter{
		tools:     asked.Get("toolsListChanged").Bool() && caps.Get("tools.listChanged").Bool(),
		prompts:   asked.Get("promptsListChanged").Bool() && caps.Get("prompts.listChanged").Bool(),
		resources: asked.Get("resourcesListChanged").Bool() && caps.Get("resources.listChanged").Bool(),
		uris:      map[string]bool{},
	}
	uris, refusal := mcp2026.ListenSubscriptions(call.Message.Params) // (checked before the policy: see mcp2026.Check)
	if refusal != nil {
		refusal.Write(w, call.Message.ID)
		return
	}
	up := call.MCPSession.Upstream()
	if caps.Get("resources.subscribe").Bool() {
		for _, u := range uris {
			if filter.uris[u] {
				continue
			}
			key := upstreamKey(call.MCPSession, up) + "\x00" + u
			subscribe := func() bool { return h.subscribeLegacy(ctx, call, up, "resources/subscribe", u) }
			unsubscribe := func() {
				// Run when the last listen naming u ends, its runner gone.
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(call.Service.Timeout))
				defer cancel()
				h.subscribeLegacy(uctx, call, up, "resources/unsubscribe", u)
			}
			if h.stateless.Subscribe(key, subscribe, unsubscribe) {
				filter.uris[u] = true
				defer h.stateless.Unsubscribe(key)
			}
		}
	}
	out := newSSEWriter(w)
	out.start(nil)
	if out.send("", filter.ack(call.Message.ID)) != nil {
		return
	}
	defer h.keepAlive(out, call.Service)()
	// What the filter does not ask for is not relayed, so a flood of it
	// does not end the listen; a changed tool list is also toolgate's to
	// learn (the policy's tool definitions).
	wants := func(msg mcpmsg.Message) bool {
		return msg.Kind == mcpmsg.Notification && (filter.passes(msg) || msg.Method == "notifications/tools/list_changed")
	}
	msgs, leave, err := h.stateless.Listen(ctx, upstreamKey(call.MCPSession, up), wants, func(sctx context.Context) (func() (mcpmsg.Message, error), func(), error) {
		return h.openShared(sctx, call)
	})
	if err != nil {
		var ue *upstreamError
		if errors.As(err, &ue) && ue.status == http.StatusMethodNotAllowed {
			<-ctx.Done() // no stream upstream: nothing will come
		}
		return
	}
	defer leave()
	for {
		var msg mcpmsg.Message
		var open bool
		select {
		case msg, open = <-msgs:
		case <-ctx.Done():
		}
		if !open {
			return
		}
		// The stream redacted the credential of the listen that opened it;
		// this listen's call may carry another (a token rotated since).
		msg, err := h.redactCredential(call, msg)
		if err != nil {
			continue
		}
		data := h.deliver(ctx, call, up, msg, true)
		if data.none() || msg.Kind != mcpmsg.Notification || !filter.passes(msg) {
			continue
		}
		if out.send("", tagSubscription(data.joined(), call.Message.ID)) != nil {
			return
		}
	}
}

// errNoEventStream reports an upstream that answered the GET of its
// standalone stream with something other than an event stream.
var errNoEventStream = errors.New("the upstream's standalone stream is not an event stream")

// openShared opens the standalone stream of the call's upstream session
// for the listens of its implied MCP session. Server requests on it are
// refused once, here: a stateless runner takes none.
func (h *Handler) openShared(ctx context.Context, call *gateway.Call) (func() (mcpmsg.Message, error), func(), error) {
	up, resp, err := h.openStream(ctx, call)
	if err != nil {
		return nil, nil, err
	}
	if !isSSE(resp.Header) {
		resp.Body.Close()
		return nil, nil, errNoEventStream
	}
	rs := &response{h: h, ctx: ctx, call: call, up: up, resp: resp, sse: eventstream.NewReader(resp.Body, h.maxMessage)}
	next := func() (mcpmsg.Message, error) {
		for {
			msg, err := rs.next()
			if err != nil || msg.Kind != mcpmsg.Request {
				return msg, err
			}
			h.refuseServerRequest(call, up, msg, "the client speaks protocol "+mcp2026.Version+", which has no server requests on a stream")
		}
	}
	return next, rs.close, nil
}

// upstreamKey names the upstream session up of an implied MCP session: a
// session initialized again (the upstream forgot the last) is another,
// with its own stream and subscriptions.
func upstreamKey(ms *gateway.MCPSession, up gateway.Upstream) string {
	return ms.ID + "\x00" + strconv.FormatUint(up.Generation, 10)
}

// subscribeLegacy subscribes the upstream session up to a resource's
// updates (method resources/subscribe), or unsubscribes it
// (resources/unsubscribe).
func (h *Handler) subscribeLegacy(ctx context.Context, call *gateway.Call, up gateway.Upstream, method, uri string) bool {
	id := gatewayRequestID()
	body := []byte(`{"jsonrpc":"2.0","id":`)
	body = append(body, id...)
	body = append(body, `,"method":"`+method+`","params":{"uri":`...)
	body = mcpmsg.AppendQuote(body, uri)
	body = append(body, `}}`...)
	_, msg, err := h.roundTrip(ctx, call, up, id, body)
	return err == nil && msg.Result != nil
}

type listenFilter struct {
	tools, prompts, resources bool
	uris                      map[string]bool
}

func (f listenFilter) passes(msg mcpmsg.Message) bool {
	switch msg.Method {
	case "notifications/tools/list_changed":
		return f.tools
	case "notifications/prompts/list_changed":
		return f.prompts
	case "notifications/resources/list_changed":
		return f.resources
	case "notifications/resources/updated":
		return f.uris[msg.URI]
	}
	return false
}

// ack is the acknowledgement that opens the subscription's stream, with
// the part of the filter toolgate honours.
func (f listenFilter) ack(id []byte) []byte {
	b := []byte(`{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"_meta":{"` + mcp2026.MetaSubscriptionID + `":`)
	b = append(b, id...)
	b = append(b, `},"notifications":{`...)
	n := 0
	add := func(key string) {
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, `"`+key+`":true`...)
	}
	if f.tools {
		add("toolsListChanged")
	}
	if f.prompts {
		add("promptsListChanged")
	}
	if f.resources {
		add("resourcesListChanged")
	}
	if len(f.uris) > 0 {
		if n > 0 {
			b = append(b, ',')
		}
		b = append(b, `"resourceSubscriptions":[`...)
		i := 0
		for u := range f.uris {
			if i > 0 {
				b = append(b, ',')
			}
			i++
			b = mcpmsg.AppendQuote(b, u)
		}
		b = append(b, ']')
	}
	return append(b, `}}}`...)
}

// tagSubscription adds the subscription's id to a notification's _meta.
func tagSubscription(msg, id []byte) []byte {
	params := mcpmsg.MemberOf(msg, "params")
	if params == nil || params[0] != '{' {
		params = []byte("{}")
	}
	meta := mcpmsg.MemberOf(params, "_meta")
	if meta == nil || meta[0] != '{' {
		meta = []byte("{}")
	}
	meta = mcpmsg.ReplaceMember(meta, mcp2026.MetaSubscriptionID, id)
	return mcpmsg.ReplaceMember(msg, "params", mcpmsg.ReplaceMember(params, "_meta", meta))
}
