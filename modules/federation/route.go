package federation

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

var errSessionGone = errors.New("its MCP session ended")

// request answers a runner request: locally (ping), merged from every
// service (lists, logging/setLevel), or routed to the service its name or
// URI names.
func (x *exchange) request() {
	m := x.msg
	if l, ok := listings[m.Method]; ok {
		x.list(l)
		return
	}
	switch m.Method {
	case "ping":
		gateway.WriteRPC(x.w, http.StatusOK, gateway.RPCResult(m.ID, []byte(`{}`)))
	case "logging/setLevel":
		if g := x.broadcast(); g != nil {
			gateway.WriteRPCError(x.w, http.StatusOK, m.ID, g.Code, "service "+g.Service+": "+g.Message, g.Data)
			return
		}
		gateway.WriteRPC(x.w, http.StatusOK, gateway.RPCResult(m.ID, []byte(`{}`)))
	case "tools/call", "prompts/get":
		what := "tool"
		if m.Method == "prompts/get" {
			what = "prompt"
		}
		svc, name, ok := x.split(m.Name)
		if !ok {
			gateway.WriteRPCError(x.w, http.StatusOK, m.ID, gateway.CodeInvalidParams, "Unknown "+what+": "+m.Name, nil)
			return
		}
		x.route(svc, withParam(m, "name", mcpmsg.Quote(name)), func(result []byte) []byte { return x.prefixBlocks(svc, m.Method, result) })
	case "resources/read", "resources/subscribe", "resources/unsubscribe":
		svc, uri, ok := x.split(m.URI)
		if !ok {
			gateway.WriteRPCError(x.w, http.StatusOK, m.ID, gateway.CodeInvalidParams, "Unknown resource: "+m.URI, nil)
			return
		}
		var rewrite func([]byte) []byte
		if m.Method == "resources/read" {
			rewrite = func(result []byte) []byte { return x.prefixContents(svc, result) }
		}
		x.route(svc, withParam(m, "uri", mcpmsg.Quote(uri)), rewrite)
	case "completion/complete":
		x.complete()
	default:
		gateway.WriteRPCError(x.w, http.StatusOK, m.ID, gateway.CodeMethodNotFound, "Method not found: "+m.Method, nil)
	}
}

// complete routes completion/complete by the prompt or resource template
// its ref names.
func (x *exchange) complete() {
	m := x.msg
	ref := gjson.GetBytes(m.Params, "ref")
	member := "name"
	if ref.Get("type").String() == "ref/resource" {
		member = "uri"
	}
	svc, name, ok := x.split(ref.Get(member).String())
	if !ref.IsObject() || !ok {
		gateway.WriteRPCError(x.w, http.StatusOK, m.ID, gateway.CodeInvalidParams, "Unknown reference: "+ref.Get(member).String(), nil)
		return
	}
	params := mcpmsg.ReplaceMember(m.Params, "ref", mcpmsg.ReplaceMember([]byte(ref.Raw), member, mcpmsg.Quote(name)))
	x.route(svc, mcpmsg.ReplaceMember(m.Raw, "params", params), nil)
}

// withParam is m with params[key] replaced by value.
func withParam(m mcpmsg.Message, key string, value []byte) []byte {
	return mcpmsg.ReplaceMember(m.Raw, "params", mcpmsg.ReplaceMember(m.Params, key, value))
}

// prefixContents puts svc's prefix before the URIs of a resources/read
// result, so that they are the URIs the runner asked for.
func (x *exchange) prefixContents(svc *gateway.Service, result []byte) []byte {
	return eachItem(result, "contents", func(c []byte) []byte { return x.prefix(svc, c, []string{"uri"}) })
}

// prefixBlocks puts svc's prefix before the URIs of the resource links and
// embedded resources of a tools/call or prompts/get result: a service's
// blocks name its own resources, as the runner reads them, and cannot
// point the runner at another service's.
func (x *exchange) prefixBlocks(svc *gateway.Service, method string, result []byte) []byte {
	if !bytes.Contains(result, []byte("resource")) && !bytes.Contains(result, []byte(`\u`)) {
		return result // no block names a resource (a type may be spelled with escapes)
	}
	block := func(b []byte) []byte {
		_, raw := mcpmsg.MemberFold(b, "type")
		typ, _ := mcpmsg.String(raw)
		switch typ {
		case "resource_link":
			return x.prefix(svc, b, []string{"uri"})
		case "resource":
			if name, r := mcpmsg.MemberFold(b, "resource"); isObject(r) {
				return mcpmsg.ReplaceMember(b, name, x.prefix(svc, r, []string{"uri"}))
			}
		}
		return b
	}
	if method == "prompts/get" {
		return eachItem(result, "messages", func(m []byte) []byte {
			if name, c := mcpmsg.MemberFold(m, "content"); isObject(c) {
				return mcpmsg.ReplaceMember(m, name, block(c))
			}
			return m
		})
	}
	return eachItem(result, "content", block)
}

// A service's members are found by their key in any case (mcpmsg.MemberFold)
// wherever the federated endpoint rewrites them: a runner whose decoder
// ignores case (Go's encoding/json) reads "Uri" as the uri, and a block
// whose "Uri" kept another service's prefix would point it there.

// eachItem is obj with f applied to each item of its array member key, in
// any case (obj itself when it is no array).
func eachItem(obj []byte, key string, f func(item []byte) []byte) []byte {
	name, items := mcpmsg.MemberFold(obj, key)
	if len(items) == 0 || items[0] != '[' {
		return obj
	}
	out := []byte{'['}
	mcpmsg.Elements(items, func(item []byte) bool {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, f(item)...)
		return true
	})
	return mcpmsg.ReplaceMember(obj, name, append(out, ']'))
}

// isObject reports whether the JSON text v is an object.
func isObject(v []byte) bool { return len(v) > 0 && v[0] == '{' }

// route sends the runner's request (body, as the service knows it) to svc
// and relays the answer: the response (its result changed by rewrite, when
// set) and, on a stream, the notifications and server→client requests
// before it. A service MCP session the pipeline no longer knows is
// initialized again, once.
func (x *exchange) route(svc *gateway.Service, body []byte, rewrite func(result []byte) []byte) {
	ctx := x.r.Context()
	key, token := mcpmsg.IDKey(x.msg.ID), mcpmsg.IDKey(x.msg.ProgressToken)
	x.fs.mu.Lock()
	x.fs.inflight[key] = svc.ID
	if token != "" {
		x.fs.progress[token] = svc.ID
	}
	x.fs.mu.Unlock()
	defer func() {
		x.fs.mu.Lock()
		delete(x.fs.inflight, key)
		if token != "" && x.fs.progress[token] == svc.ID {
			delete(x.fs.progress, token)
		}
		x.fs.mu.Unlock()
	}()
	a, ms, g := x.post(ctx, svc, nil, body, strings.Join(x.r.Header.Values("Accept"), ", "))
	if g != nil {
		gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, g.Code, "service "+svc.ID+": "+g.Message, g.Data)
		return
	}
	x.relay(svc, ms, a, rewrite)
}

// post sends body to svc on the federated session's MCP session with it,
// ms (nil: childSession's), and — when the pipeline no longer knows that
// one (404: its person connected again, or it expired) — on a new one,
// once. It returns the answer and the session it came on, or the gap that
// kept the request from being sent.
func (x *exchange) post(ctx context.Context, svc *gateway.Service, ms *gateway.MCPSession, body []byte, accept string) (*answer, *gateway.MCPSession, *gap) {
	for attempt := 0; ; attempt++ {
		if ms == nil {
			c, g := x.childSession(ctx, svc)
			if g != nil {
				return nil, nil, g
			}
			ms = c.ms
		}
		a := x.h.subCall(ctx, x.r, x.next, x.call, svc, ms, http.MethodPost, body, accept)
		if a.status != http.StatusNotFound || attempt > 0 {
			return a, ms, nil
		}
		a.drain()
		x.forget(svc, ms)
		ms = nil
	}
}

// relay writes a service's answer to the runner: a JSON body as it came
// (with its HTTP status), or a stream, each message rewritten for the
// federated session.
func (x *exchange) relay(svc *gateway.Service, ms *gateway.MCPSession, a *answer, rewrite func([]byte) []byte) {
	defer a.close()
	if a.err != nil {
		x.h.logger.Error("a federated call failed in the pipeline", zap.String("service", svc.ID), zap.Error(a.err))
		gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, gateway.CodeInternalError, "toolgate could not route the call to "+svc.ID, nil)
		return
	}
	if !a.sse {
		msg, err := a.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				x.w.WriteHeader(a.status)
				return
			}
			gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, gateway.CodeUnavailable, "service "+svc.ID+" answered unreadably", gateway.Retryable)
			return
		}
		out := x.outgoing(svc, ms, msg, rewrite)
		if out == nil {
			gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, gateway.CodeUnavailable, "service "+svc.ID+" answered unreadably", gateway.Retryable)
			return
		}
		gateway.WriteRPC(x.w, a.status, out)
		return
	}
	out := newStream(x.w)
	a.keepAlive = out.keepAlive
	for {
		msg, err := a.next()
		if err != nil {
			if !errors.Is(err, io.EOF) || !out.started {
				out.send(gateway.RPCError(x.msg.ID, gateway.CodeUnavailable, "the stream of service "+svc.ID+" ended without an answer", gateway.Retryable))
			}
			return
		}
		if b := x.outgoing(svc, ms, msg, rewrite); b != nil && out.send(b) != nil {
			return
		}
		if msg.Kind == mcpmsg.Response && mcpmsg.IDKey(msg.ID) == mcpmsg.IDKey(x.msg.ID) {
			return
		}
	}
}

// outgoing is a message of svc as the federated session's runner gets it:
// the response to its request with its result rewritten; a server→client
// request, or the cancellation of one, with an id that names the service;
// a notification about a resource with the resource's federated URI; a
// progress notification only when it is about a request routed to svc
// (nil: nothing reaches the runner).
func (x *exchange) outgoing(svc *gateway.Service, ms *gateway.MCPSession, msg mcpmsg.Message, rewrite func([]byte) []byte) []byte {
	switch {
	case msg.Kind == mcpmsg.Response && rewrite != nil && msg.Result != nil:
		return mcpmsg.ReplaceMember(msg.Raw, "result", rewrite(msg.Result))
	case msg.Kind == mcpmsg.Request:
		return mcpmsg.ReplaceMember(msg.Raw, "id", serverRequestID(svc.ID, msg.ID))
	case msg.Kind == mcpmsg.Notification && msg.Method == "notifications/progress":
		// Only about a request of the runner's that went to svc: a
		// service cannot report progress on another's.
		token := mcpmsg.IDKey([]byte(gjson.GetBytes(msg.Params, "progressToken").Raw))
		x.fs.mu.Lock()
		own := token != "" && x.fs.progress[token] == svc.ID
		x.fs.mu.Unlock()
		if !own {
			x.h.logger.Debug("a service's progress on a request it does not have is dropped", zap.String("service", svc.ID))
			return nil
		}
	case msg.Kind == mcpmsg.Notification && msg.Method == "notifications/cancelled":
		// It names one of svc's own requests, as the runner knows it: a
		// service cannot cancel another's.
		if name, id := mcpmsg.MemberFold(msg.Params, "requestId"); id != nil {
			return withParam(msg, name, serverRequestID(svc.ID, id))
		}
	case msg.Kind == mcpmsg.Notification && msg.URI != "" && strings.HasPrefix(msg.Method, "notifications/resources/"):
		return withParam(msg, "uri", mcpmsg.Quote(svc.ID+x.h.Separator+msg.URI))
	}
	return msg.Raw
}

// A server→client request of a service reaches the runner with the id
// "toolgate:<service>:<its id's JSON text>", so that the runner's answer
// goes back to that service with the id it sent.
const serverRequestPrefix = "toolgate:"

func serverRequestID(service string, id []byte) []byte {
	return mcpmsg.Quote(serverRequestPrefix + service + ":" + string(id))
}

// answerServer relays the runner's answer to a server→client request to
// the service that sent it.
func (x *exchange) answerServer() {
	id := gjson.ParseBytes(x.msg.ID)
	rest, ok := strings.CutPrefix(id.Str, serverRequestPrefix)
	service, orig, found := strings.Cut(rest, ":")
	if id.Type != gjson.String || !ok || !found || mcpmsg.IDKey([]byte(orig)) == "" {
		gateway.WriteRPCError(x.w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest,
			"this response answers no pending server request of this MCP session", nil)
		return
	}
	ms := x.started()[service]
	svc := x.h.app.Registry().Lookup(service)
	if ms == nil || svc == nil {
		gateway.WriteRPCError(x.w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest,
			"this response answers no pending server request of this MCP session", nil)
		return
	}
	a := x.h.subCall(x.r.Context(), x.r, x.next, x.call, svc, ms, http.MethodPost,
		mcpmsg.ReplaceMember(x.msg.Raw, "id", []byte(orig)), "application/json, text/event-stream")
	x.passOn(a)
}

// notification relays a runner notification: a cancellation to the
// service working on the request, notifications/initialized nowhere (each
// service's session had its own), anything else to every service.
func (x *exchange) notification() {
	m := x.msg
	switch m.Method {
	case "notifications/initialized":
		x.w.WriteHeader(http.StatusAccepted)
		return
	case "notifications/cancelled":
		requestID := gjson.GetBytes(m.Params, "requestId")
		x.fs.mu.Lock()
		service := x.fs.inflight[mcpmsg.IDKey([]byte(requestID.Raw))]
		x.fs.mu.Unlock()
		ms, svc := x.started()[service], x.h.app.Registry().Lookup(service)
		if ms != nil && svc != nil {
			x.passOn(x.h.subCall(x.r.Context(), x.r, x.next, x.call, svc, ms, http.MethodPost, m.Raw, "application/json"))
			return
		}
		x.w.WriteHeader(http.StatusAccepted) // nothing in flight: nothing to cancel
		return
	}
	x.broadcast()
	x.w.WriteHeader(http.StatusAccepted)
}

// broadcast sends the runner's message to every service whose MCP session
// started, at once, and waits for them. What they answer a notification is
// logged only; a request (logging/setLevel) refused by every one of them —
// by the request policy, say — returns the refusal of the first service
// by id, which the runner is answered with (nil: one accepted it, or none
// started).
func (x *exchange) broadcast() *gap {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		accepted bool
		refusal  *gap
	)
	answered := func(id string, g *gap) {
		mu.Lock()
		defer mu.Unlock()
		if g == nil {
			accepted = true
			return
		}
		x.h.logger.Info("a service refused a federated request", zap.String("service", id),
			zap.String("method", x.msg.Method), zap.Int("code", g.Code))
		if refusal == nil || g.Service < refusal.Service {
			refusal = g
		}
	}
	for id, ms := range x.started() {
		svc := x.h.app.Registry().Lookup(id)
		if svc == nil {
			continue
		}
		wg.Go(func() {
			if x.msg.Kind != mcpmsg.Request {
				a := x.h.subCall(x.r.Context(), x.r, x.next, x.call, svc, ms, http.MethodPost, x.msg.Raw, "application/json")
				if a.status >= 300 {
					x.h.logger.Info("a service refused a federated message", zap.String("service", id),
						zap.String("method", x.msg.Method), zap.Int("status", a.status))
				}
				a.drain()
				return
			}
			a, _, g := x.post(x.r.Context(), svc, ms, x.msg.Raw, "application/json")
			if g == nil {
				_, g = a.response(id)
			}
			answered(id, g)
		})
	}
	wg.Wait()
	if accepted {
		return nil
	}
	return refusal
}

// passOn answers the runner with a service's answer to a message that
// gets no response (a notification, or the answer to a server request):
// its status, and its body when it has one.
func (x *exchange) passOn(a *answer) {
	defer a.close()
	msg, err := a.next()
	if err != nil {
		x.w.WriteHeader(a.status)
		return
	}
	gateway.WriteRPC(x.w, a.status, msg.Raw)
}
