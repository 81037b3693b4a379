package mcpbridge

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// NewSession adds a runner's MCP session to the link; init is the runner's
// initialize request (its capabilities say which server→client requests it
// may get), ctx that of toolgate_proxy's request: the session takes the
// name it gives the MCP session (gateway.UpstreamSession), the same on
// every replica, or a new one. It returns nil when the link ended or was
// retired meanwhile.
func (l *Link) NewSession(ctx context.Context, user string, init mcpmsg.Message) *Session {
	id := gateway.UpstreamSession(ctx)
	if id == "" {
		id = gateway.NewID()
	}
	s := &Session{ID: id, User: user, link: l, caps: readCapabilities(init.Params),
		requests: map[string]*pending{}, subscriptions: map[string]bool{}}
	s.used()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.retired {
		return nil
	}
	l.sessions[s] = struct{}{}
	l.served[user] = struct{}{}
	l.lastUsed = now()
	return s
}

// retire ends s once its requests in progress are answered (at once when
// none is): a session whose runner's credential changed, whose calls
// still run. Until it ends it winds down: it starts nothing new, and takes
// only what its calls wait for (reachableLocked; the bridge keeps it
// reachable, see Bridge.winding). Its standalone stream ends now.
func (s *Session) retire(reason string) {
	l := s.link
	l.mu.Lock()
	busy := !s.closed && len(s.requests) > 0
	if busy {
		s.retiring = reason
		if s.get != nil {
			s.get.finish()
			s.get = nil
		}
	}
	l.mu.Unlock()
	if !busy {
		s.end(reason)
	}
}

// usableLocked reports whether the session takes requests.
func (s *Session) usableLocked() bool {
	return s.reachableLocked() && s.retiring == "" && !s.link.retired
}

// reachableLocked reports whether what its runner sends about the work in
// progress still reaches the session: answers to the server's requests and
// cancellations, which its calls in progress wait for even when the
// session or its link is retiring.
func (s *Session) reachableLocked() bool {
	return !s.closed && s.link.err == nil
}

// ended reports whether the session ended.
func (s *Session) ended() bool {
	s.link.mu.Lock()
	defer s.link.mu.Unlock()
	return s.closed
}

// awaits reports whether msg is something the session waits for from its
// runner: the answer to a server request routed to it, or the
// cancellation of a request of its in progress.
func (s *Session) awaits(msg mcpmsg.Message) bool {
	l := s.link
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case s.closed:
		return false
	case msg.Kind == mcpmsg.Response:
		sr := l.serverRequests[mcpmsg.IDKey(msg.ID)]
		return sr != nil && sr.session == s
	case msg.Method == "notifications/cancelled":
		return s.requests[mcpmsg.IDKey([]byte(gjson.GetBytes(msg.Params, "requestId").Raw))] != nil
	}
	return false
}

// winding reports whether the session is retiring and not ended yet: its
// runner can no longer start anything on it, and its calls in progress
// still reach their answers through it.
func (s *Session) winding() bool {
	s.link.mu.Lock()
	defer s.link.mu.Unlock()
	return !s.closed && s.retiring != ""
}

// request relays a runner's request and returns the response: an SSE
// stream carrying the messages routed to it and, last, its answer.
func (s *Session) request(r *http.Request, msg mcpmsg.Message) (*http.Response, error) {
	l := s.link
	if msg.Method == "initialize" {
		return rpcResponse(r, http.StatusBadRequest, gateway.RPCError(msg.ID, gateway.CodeInvalidRequest,
			"this MCP session is initialized already", nil), nil), nil
	}
	l.mu.Lock()
	if !s.usableLocked() {
		l.mu.Unlock()
		return nil, errSessionGone
	}
	l.lastUsed = now()
	if msg.Method == "resources/subscribe" && msg.URI != "" && !s.subscriptions[msg.URI] && !s.roomToSubscribeLocked(msg.URI) {
		l.mu.Unlock()
		return rpcResponse(r, http.StatusOK, gateway.RPCError(msg.ID, gateway.CodeInvalidRequest, tooManySubscriptions, nil), nil), nil
	}
	if local, ok := s.subscribeLocked(msg); ok {
		l.mu.Unlock()
		return rpcResponse(r, http.StatusOK, local, nil), nil
	}
	if _, dup := s.requests[mcpmsg.IDKey(msg.ID)]; dup {
		l.mu.Unlock()
		return rpcResponse(r, http.StatusBadRequest, gateway.RPCError(msg.ID, gateway.CodeInvalidRequest,
			"a request with this id is in progress already", nil), nil), nil
	}
	p := &pending{session: s, runnerID: msg.ID}
	out := newStream(r.Context(), l.bridge.maxQueue, func() { l.abandon(p) })
	p.out = out
	l.registerLocked(p, msg.Method, nil) // for the id; the body is built here
	body := mcpmsg.ReplaceMember(msg.Raw, "id", p.linkID)
	if msg.ProgressToken != nil {
		p.token = msg.ProgressToken
		l.tokens[p.key] = p
		meta := mcpmsg.ReplaceMember([]byte(gjson.GetBytes(msg.Params, "_meta").Raw), "progressToken", p.linkID)
		body = mcpmsg.ReplaceMember(body, "params", mcpmsg.ReplaceMember(msg.Params, "_meta", meta))
	}
	if msg.Method == "resources/subscribe" && msg.URI != "" {
		uri := msg.URI
		p.subURI = uri
		p.onResult = func(ok bool) {
			if ok && !s.closed && !s.subscriptions[uri] {
				s.subscriptions[uri] = true
				l.subscriptions[uri]++
			}
		}
	}
	s.requests[mcpmsg.IDKey(msg.ID)] = p
	l.mu.Unlock()

	if err := l.cfg.Send(r.Context(), body); err != nil {
		l.mu.Lock()
		answered := p.answered
		l.mu.Unlock()
		if !answered {
			l.forget(p)
			return nil, err
		}
		// The server answered it (or the link ended under it) before
		// sending failed (an HTTP+SSE server that answered on its stream,
		// then failed the POST): that answer is the call's, not "it may
		// not have reached the server", which a runner may retry.
	}
	if trace := httptrace.ContextClientTrace(r.Context()); trace != nil && trace.WroteHeaders != nil {
		trace.WroteHeaders() // the request reached the server: toolgate_proxy cancels it if it gives up
	}
	return sseResponse(r, out), nil
}

// A session remembers the resources its runner subscribed to (to share
// the server's subscriptions between sessions and drop them when it
// ends), each by its URI, which the runner chooses: so many, and so many
// bytes of them, at most, counting those asked and not answered yet.
const (
	maxSubscriptions     = 256
	maxSubscriptionBytes = 256 << 10
)

var tooManySubscriptions = fmt.Sprintf("too many resource subscriptions in this MCP session (at most %d, with %d KiB of URIs): unsubscribe from some first",
	maxSubscriptions, maxSubscriptionBytes>>10)

// roomToSubscribeLocked reports whether s may subscribe to one more
// resource, uri (see maxSubscriptions).
func (s *Session) roomToSubscribeLocked(uri string) bool {
	n, size := 1, len(uri)
	for u := range s.subscriptions {
		n, size = n+1, size+len(u)
	}
	for _, p := range s.link.pending {
		if p.session == s && p.subURI != "" {
			n, size = n+1, size+len(p.subURI)
		}
	}
	return n <= maxSubscriptions && size <= maxSubscriptionBytes
}

// subscribeLocked answers resources/subscribe and resources/unsubscribe
// itself where the server's state is shared and already right: a resource
// another session subscribed to, or one that another session still needs.
// It reports false for a request the server must see.
func (s *Session) subscribeLocked(msg mcpmsg.Message) ([]byte, bool) {
	l := s.link
	switch {
	case msg.URI == "":
		return nil, false
	case msg.Method == "resources/subscribe" && (s.subscriptions[msg.URI] || l.subscriptions[msg.URI] > 0):
		if !s.subscriptions[msg.URI] {
			s.subscriptions[msg.URI] = true
			l.subscriptions[msg.URI]++
		}
		return gateway.RPCResult(msg.ID, []byte("{}")), true
	case msg.Method == "resources/unsubscribe":
		if !s.subscriptions[msg.URI] {
			return gateway.RPCResult(msg.ID, []byte("{}")), true
		}
		delete(s.subscriptions, msg.URI)
		if l.subscriptions[msg.URI]--; l.subscriptions[msg.URI] > 0 {
			return gateway.RPCResult(msg.ID, []byte("{}")), true
		}
		delete(l.subscriptions, msg.URI)
	}
	return nil, false
}

// notify relays a runner's notification.
func (s *Session) notify(r *http.Request, msg mcpmsg.Message) (*http.Response, error) {
	l := s.link
	body := msg.Raw
	l.mu.Lock()
	if usable := s.usableLocked() || msg.Method == "notifications/cancelled" && s.reachableLocked(); !usable {
		l.mu.Unlock()
		return nil, errSessionGone
	}
	l.lastUsed = now()
	switch msg.Method {
	case "notifications/initialized", "notifications/roots/list_changed":
		if l.cfg.Owned {
			body = nil // toolgate initialized the server; roots are not offered to it
		}
	case "notifications/cancelled":
		p := s.requests[mcpmsg.IDKey([]byte(gjson.GetBytes(msg.Params, "requestId").Raw))]
		if p == nil {
			body = nil // nothing of this session's in progress with that id
			break
		}
		body = mcpmsg.ReplaceMember(msg.Raw, "params", mcpmsg.ReplaceMember(msg.Params, "requestId", p.linkID))
	}
	l.mu.Unlock()
	if body != nil {
		if err := l.cfg.Send(r.Context(), body); err != nil {
			return nil, err
		}
	}
	return statusResponse(r, http.StatusAccepted), nil
}

// answer relays a runner's response to a server→client request it got.
func (s *Session) answer(r *http.Request, msg mcpmsg.Message) (*http.Response, error) {
	l := s.link
	key := mcpmsg.IDKey(msg.ID)
	l.mu.Lock()
	if !s.reachableLocked() {
		l.mu.Unlock()
		return nil, errSessionGone
	}
	sr := l.serverRequests[key]
	mine := sr != nil && sr.session == s
	if mine {
		delete(l.serverRequests, key)
	}
	l.mu.Unlock()
	if !mine {
		// Answered already, cancelled by the server, or never this session's.
		return statusResponse(r, http.StatusAccepted), nil
	}
	if err := l.cfg.Send(r.Context(), mcpmsg.ReplaceMember(msg.Raw, "id", sr.id)); err != nil {
		return nil, err
	}
	return statusResponse(r, http.StatusAccepted), nil
}

// openStream opens the session's standalone stream, replacing an earlier
// one.
func (s *Session) openStream(r *http.Request) (*http.Response, error) {
	l := s.link
	l.mu.Lock()
	if !s.usableLocked() {
		l.mu.Unlock()
		return nil, errSessionGone
	}
	l.lastUsed = now()
	if s.get != nil {
		s.get.finish()
	}
	var out *stream
	out = newStream(r.Context(), l.bridge.maxQueue, func() {
		l.mu.Lock()
		if s.get == out {
			s.get = nil
		}
		l.lastUsed = now()
		l.mu.Unlock()
	})
	l.seq++
	s.get, s.getSeq = out, l.seq
	l.mu.Unlock()
	return sseResponse(r, out), nil
}

// end ends the session: its requests in progress are cancelled at the
// server, the server's requests waiting for its runner are refused, its
// subscriptions dropped where no other session needs them.
func (s *Session) end(reason string) {
	l := s.link
	var sends [][]byte
	l.mu.Lock()
	if s.closed {
		l.mu.Unlock()
		return
	}
	s.closed = true
	for _, p := range s.requests {
		sends = append(sends, cancelled(p.linkID, reason))
		p.out.finish()
		l.dropLocked(p)
	}
	for key, sr := range l.serverRequests {
		if sr.session == s {
			delete(l.serverRequests, key)
			sends = append(sends, gateway.RPCError(sr.id, gateway.CodeInternalError, "the client ended its session", nil))
		}
	}
	var unsubscribe []string
	for uri := range s.subscriptions {
		if l.subscriptions[uri]--; l.subscriptions[uri] <= 0 {
			delete(l.subscriptions, uri)
			unsubscribe = append(unsubscribe, uri)
		}
	}
	if s.get != nil {
		s.get.finish()
		s.get = nil
	}
	delete(l.sessions, s)
	last := len(l.sessions) == 0 && l.err == nil
	idle := l.idleLocked()
	l.mu.Unlock()

	for _, uri := range unsubscribe {
		params := append(append([]byte(`{"uri":`), mcpmsg.Quote(uri)...), '}')
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), answerTimeout)
			defer cancel()
			_, _ = l.call(ctx, "resources/unsubscribe", params)
		}()
	}
	for _, m := range sends {
		l.sendLater(m)
	}
	if idle != nil {
		idle()
	}
	if last && l.cfg.Release != nil {
		l.cfg.Release()
	}
}

func cancelled(id []byte, reason string) []byte {
	b := append([]byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":`), id...)
	b = append(b, `,"reason":`...)
	b = mcpmsg.AppendQuote(b, reason)
	return append(b, "}}"...)
}
