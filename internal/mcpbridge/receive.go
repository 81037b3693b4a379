package mcpbridge

import (
	"bytes"
	"errors"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// What the program sends, routed: an answer to the request it belongs
// to; a server→client request or a notification to the one session it
// can be about (see routeLocked); a notification about the server's state
// to every session (broadcast). A malformed message fails the request it
// names, if any, at once.

// Receive routes one message the server sent.
func (l *Link) Receive(data []byte) {
	msg, err := mcpmsg.Parse(OneLine(data), l.bridge.limits)
	if err != nil {
		// Neither the log nor a runner gets the server's own words (a key
		// it quotes could be a credential it was sent).
		why := err.Error()
		if se, ok := errors.AsType[*mcpmsg.SyntaxError](err); ok {
			why = se.Redacted()
		}
		if l.mayLog() {
			l.bridge.log().Warn("dropped a malformed message from the server", zap.String("service", l.bridge.service), zap.String("error", why))
		}
		l.malformedAnswer(data, why)
		return
	}
	switch msg.Kind {
	case mcpmsg.Response:
		l.response(msg)
	case mcpmsg.Request:
		l.serverRequest(msg)
	case mcpmsg.Notification:
		l.notification(msg)
	}
}

// malformedAnswer answers the pending request a malformed message names
// by its id, if it names one, with a retryable error: its caller learns at
// once that the server answered what toolgate cannot relay, rather than
// waiting out its timeout.
func (l *Link) malformedAnswer(data []byte, why string) {
	l.FailAnswer(data, "the upstream sent a malformed answer ("+why+")")
}

// FailAnswer answers the request in progress that data names by its id —
// the text, or the beginning, of an answer of the server's that the
// transport cannot relay (malformed, too long, under another SSE event
// type) — if it names one, with toolgate's own retryable error saying why.
// Toolgate's, not the server's: not recoded as a server's use of
// toolgate's codes. A message naming a method is a request of the
// server's, whose id is its own, not the link's: it fails nothing.
func (l *Link) FailAnswer(data []byte, why string) {
	id := gjson.GetBytes(data, "id")
	if id.Type != gjson.Number && id.Type != gjson.String || gjson.GetBytes(data, "method").Exists() {
		return
	}
	key := mcpmsg.IDKey([]byte(id.Raw))
	if key == "" {
		return
	}
	l.mu.Lock()
	p := l.pending[key]
	l.mu.Unlock()
	if p == nil {
		return
	}
	answer, err := mcpmsg.Parse(gateway.RPCError(p.linkID, gateway.CodeUnavailable, why, gateway.Retryable), l.bridge.limits)
	if err == nil {
		l.deliver(answer, true)
	}
}

// OneLine turns the line breaks of a JSON text into spaces: outside
// strings they are whitespace, and strings cannot hold them unescaped, so
// the message reads the same and fits on one line (of stdio framing, or an
// SSE data line). data is not changed.
func OneLine(data []byte) []byte {
	for i, c := range data {
		if c == '\n' || c == '\r' {
			out := append([]byte(nil), data...)
			for j := i; j < len(out); j++ {
				if out[j] == '\n' || out[j] == '\r' {
					out[j] = ' '
				}
			}
			return out
		}
	}
	return data
}

func (l *Link) response(msg mcpmsg.Message) { l.deliver(msg, false) }

// deliver hands a response to the pending request it answers; own: the
// response is toolgate's, not the server's (whose errors with toolgate's
// own codes are recoded).
func (l *Link) deliver(msg mcpmsg.Message, own bool) {
	l.mu.Lock()
	p := l.pending[mcpmsg.IDKey(msg.ID)]
	if p == nil {
		l.mu.Unlock()
		// Within the transport's budget: a server may send any number.
		if ce := l.bridge.log().Check(zapcore.DebugLevel, "dropped a response to no pending request"); ce != nil && l.mayLog() {
			ce.Write(zap.String("service", l.bridge.service))
		}
		return
	}
	l.dropLocked(p)
	p.answered = true
	if p.onResult != nil {
		p.onResult(msg.Result != nil)
	}
	idle := l.idleLocked()
	l.mu.Unlock()
	if idle != nil {
		defer idle()
	}
	if p.reply != nil {
		p.reply <- msg
		return
	}
	raw := msg.Raw
	if recoded, ok := gateway.OwnCodeRecoded(msg.Error); ok && msg.Error != nil && !own {
		raw = mcpmsg.ReplaceMember(raw, "error", recoded) // the server's, not toolgate's
	}
	p.out.push(mcpmsg.ReplaceMember(raw, "id", p.runnerID))
	p.out.finish()
}

// serverRequest relays a server→client request to the one runner it can be
// for: a session whose runner declared what the request needs, with a
// request in progress or a standalone stream open, and — on a connection
// several people share — only while its person is the only one connected
// (routeLocked), so that nobody is asked about someone else's work.
func (l *Link) serverRequest(msg mcpmsg.Message) {
	if msg.Method == "ping" {
		l.sendLater(gateway.RPCResult(msg.ID, []byte("{}")))
		return
	}
	if msg.Method == "roots/list" && l.cfg.Owned {
		// toolgate does not offer roots to a server it initialized: what a
		// program may reach is its operator's choice, not a runner's.
		l.sendLater(gateway.RPCError(msg.ID, gateway.CodeMethodNotFound, "toolgate offers no roots to this server", nil))
		return
	}
	l.mu.Lock()
	s, out, why := l.routeLocked(msg.Method, msg.Params)
	if s != nil && len(l.serverRequests) >= maxServerRequests {
		s, why = nil, "too many of its requests are waiting for their clients' answers"
	}
	if s != nil {
		relayed := l.relayedID(msg.ID)
		key := mcpmsg.IDKey(relayed)
		l.serverRequests[key] = &serverRequest{session: s, out: out, id: bytes.Clone(msg.ID)}
		if !out.push(mcpmsg.ReplaceMember(msg.Raw, "id", relayed)) {
			delete(l.serverRequests, key)
			s, why = nil, "the client's stream closed"
		}
	}
	l.mu.Unlock()
	if s == nil {
		if l.mayLog() {
			l.bridge.log().Info("refused a server request", zap.String("service", l.bridge.service),
				zap.String("method", mcpmsg.LoggedMethod(msg.Method)), zap.String("reason", why))
		}
		l.sendLater(gateway.RPCError(msg.ID, gateway.CodeMethodNotFound, "toolgate cannot relay "+msg.Method+": "+why, nil))
	}
}

// relayedID is the id a server request of the link's, whose own id is id,
// is relayed to a runner under: the link's tag and the id. Two programs
// of one MCP session (one winding down after its runner's credential
// changed, beside the one that replaced it; or one on each replica, which
// the runner's answers may reach alike) number their requests alike; the
// runner's answer to each reaches the program that asked it (see
// Bridge.ownerOf), under its own id again (Session.answer), and no other.
func (l *Link) relayedID(id []byte) []byte {
	return mcpmsg.Quote(l.tag + ":" + mcpmsg.IDKey(id))
}

// mayLog reports whether one more thing the server sent may be logged
// (LinkConfig.MayLog).
func (l *Link) mayLog() bool { return l.cfg.MayLog == nil || l.cfg.MayLog() }

// routeLocked picks the session and stream for a server→client message
// that names no request of a runner (a server→client request, a log
// message). It may be about any person the server has served — their
// call in progress, or one that answered and works on in the background,
// even after their session ended — so it goes to a session only when that
// session's person is the only one who had a session on the link since
// the server started (or has a call in progress), whether or not their
// runner could take the message. Of that person's sessions, the latest
// request in progress is the likely cause of it; without one, a
// standalone stream.
func (l *Link) routeLocked(method string, params []byte) (*Session, *stream, string) {
	users := map[string]bool{}
	for user := range l.served {
		// A person whose session ended may have left work running in
		// the program (a call that answered and works on, one whose
		// session ended under it): what the program says of it must not
		// reach someone else. The program's next start forgets them.
		users[user] = true
	}
	var best *pending
	incapableCaller := false
	for _, p := range l.pending {
		if p.session == nil {
			continue
		}
		// A call whose runner went away, or whose session ended, may still
		// run in the server: its user counts, though nothing can be
		// relayed to them.
		users[p.session.User] = true
		if !p.out.open() {
			continue
		}
		if !p.session.caps.allows(method, params) {
			incapableCaller = true
			continue
		}
		if best == nil || p.seq > best.seq {
			best = p
		}
	}
	var target *Session
	capable := false
	for s := range l.sessions {
		if !s.caps.allows(method, params) {
			continue
		}
		capable = true
		if s.get == nil || !s.get.open() {
			continue
		}
		if target == nil || s.getSeq > target.getSeq {
			target = s
		}
	}
	switch {
	case len(users) > 1 && best == nil && incapableCaller:
		return nil, nil, "the client whose call is in progress did not declare the capability it needs"
	case len(users) > 1:
		return nil, nil, "several users have used a server they share since it started, and toolgate cannot tell whom it is for"
	case best != nil:
		return best.session, best.out, ""
	case target != nil:
		return target, target.get, ""
	case incapableCaller:
		return nil, nil, "the client whose call is in progress did not declare the capability it needs"
	case !capable:
		return nil, nil, "no connected client declared the capability it needs"
	}
	return nil, nil, "no client stream is open to carry it"
}

func (l *Link) notification(msg mcpmsg.Message) {
	switch msg.Method {
	case "notifications/progress":
		l.progress(msg)
	case "notifications/cancelled":
		id := []byte(gjson.GetBytes(msg.Params, "requestId").Raw)
		if mcpmsg.IDKey(id) == "" {
			return // names no request
		}
		relayed := l.relayedID(id)
		key := mcpmsg.IDKey(relayed)
		l.mu.Lock()
		sr := l.serverRequests[key]
		delete(l.serverRequests, key)
		if sr != nil {
			raw := mcpmsg.ReplaceMember(msg.Raw, "params", mcpmsg.ReplaceMember(msg.Params, "requestId", relayed))
			if !sr.out.push(raw) && sr.session.get != nil {
				sr.session.get.push(raw)
			}
		}
		l.mu.Unlock()
	// What goes to every session carries nothing but what says what
	// changed: the program may have put anyone's data in the rest.
	case "notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/resources/list_changed":
		l.broadcast(append(mcpmsg.AppendQuote([]byte(`{"jsonrpc":"2.0","method":`), msg.Method), '}'), "")
	case "notifications/resources/updated":
		uri := gjson.GetBytes(msg.Params, "uri")
		if uri.Type != gjson.String || uri.Str == "" {
			return // about no resource: no subscription says whose it is
		}
		raw := mcpmsg.AppendQuote([]byte(`{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":`), uri.Str)
		l.broadcast(append(raw, "}}"...), uri.Str)
	default:
		l.mu.Lock()
		if s, out, _ := l.routeLocked(msg.Method, msg.Params); s != nil {
			out.push(msg.Raw)
		}
		l.mu.Unlock()
	}
}

// progress relays a progress notification to the request whose token it
// carries, with the runner's own token.
func (l *Link) progress(msg mcpmsg.Message) {
	token := gjson.GetBytes(msg.Params, "progressToken")
	l.mu.Lock()
	p := l.tokens[mcpmsg.IDKey([]byte(token.Raw))]
	l.mu.Unlock()
	if p == nil || p.out == nil {
		return
	}
	params := mcpmsg.ReplaceMember(msg.Params, "progressToken", p.token)
	p.out.push(mcpmsg.ReplaceMember(msg.Raw, "params", params))
}

// broadcast sends a notification about the server's state to every
// session (to those subscribed to uri, when uri is set): on its standalone
// stream, or else on its latest request in progress.
func (l *Link) broadcast(raw []byte, uri string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.sessions {
		if uri != "" && !s.subscriptions[uri] {
			continue
		}
		if s.get != nil && s.get.push(raw) {
			continue
		}
		var latest *pending
		for _, p := range s.requests {
			if latest == nil || p.seq > latest.seq {
				latest = p
			}
		}
		if latest != nil {
			latest.out.push(raw)
		}
	}
}
