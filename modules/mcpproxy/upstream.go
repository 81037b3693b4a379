package mcpproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/internal/eventstream"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Header values set on every upstream request, shared read-only.
var (
	jsonContentType = []string{"application/json"}
	acceptBoth      = []string{"application/json, text/event-stream"}
	acceptSSE       = []string{"text/event-stream"}
	userAgent       = []string{"toolgate"}
)

// upstreamError is a failed exchange with an upstream, classified by what
// the runner should be told.
type upstreamError struct {
	kind   errorKind
	status int    // the upstream's HTTP status, when it answered
	body   []byte // the upstream's JSON body, for kindRejected
	msg    string // safe to show the runner: no URLs, no credentials
	// sent reports that the request may be running upstream: it may have
	// reached the upstream (its headers were written) and was not answered.
	// An abandoned request in that state is cancelled.
	sent bool
	// cause is what failed (a refused dial, a TLS handshake, a name not
	// found), for the operator's log only: never the runner's, and never
	// with the request's URL, whose query may hold a secret.
	cause error
}

type errorKind uint8

const (
	kindUnavailable  errorKind = iota // network error, timeout, 5xx, malformed: retryable
	kindSessionGone                   // 404 for a known session: re-initialize
	kindUnauthorized                  // 401/403: the credential was refused
	kindRejected                      // another 4xx
	kindClosed                        // the MCP session was ended meanwhile
	kindOverLimit                     // an answer past max_response_values: the request ran, its answer is not relayed
)

// errSessionEnded is reading an upstream message of an MCP session that
// was ended meanwhile.
var errSessionEnded error = &upstreamError{kind: kindClosed, sent: true, msg: "the MCP session was ended while the request was in progress"}

func (e *upstreamError) Error() string { return e.msg }

func unavailable(format string, args ...any) *upstreamError {
	return &upstreamError{kind: kindUnavailable, msg: fmt.Sprintf(format, args...)}
}

// drainLimit is how much of a body toolgate does not use it reads before
// closing, so the connection can be reused.
const drainLimit = 64 << 10

// exchange sends one HTTP request to the call's upstream, as attempt does,
// and tries once more when the upstream refused the caller's OAuth or
// personal credential and a fresh one exists (another replica refreshed the
// grant, or the provider revoked the token early). A refused request was not
// processed, so sending it again is safe.
func (h *Handler) exchange(ctx context.Context, call *gateway.Call, up gateway.Upstream, method string, body []byte, lastEventID string) (resp *http.Response, err error) {
	ctx, span := gateway.StartSpan(ctx, "toolgate.upstream", attribute.String("toolgate.service", call.Service.ID),
		attribute.String("http.request.method", method), attribute.String("mcp.method", call.Method))
	if span.IsRecording() {
		defer func() {
			why := ""
			if resp != nil {
				span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
			}
			if err != nil {
				why = err.Error()
			}
			gateway.EndSpan(span, why)
		}()
	}
	resp, err = h.attempt(ctx, call, up, method, body, lastEventID)
	// Only a 401 says the token may be stale: a 403 (a missing scope,
	// RFC 6750 section 3.1) is not mended by a new token, and refreshing
	// on it would make every call a token request.
	if !isKind(err, kindUnauthorized) || call.Credential == nil || statusOf(err) != http.StatusUnauthorized {
		return resp, err
	}
	fresh, ferr := h.app.CredentialRefused(ctx, call.Service, call.Caller.User, call.Credential)
	if ferr != nil {
		return resp, err
	}
	// The refused token went upstream, and an upstream may quote it back,
	// in this answer or a later one: fresh's connection keeps it as
	// retired (gateway.Connection.Retired), and its EachSecret gives it.
	call.Credential = fresh
	return h.attempt(ctx, call, up, method, body, lastEventID)
}

// attempt sends one HTTP request to the call's upstream. method is POST
// (body set), GET (opens a stream) or DELETE. A 2xx response is returned
// open; anything else is an *upstreamError. The service's dial and
// response-header timeouts apply; ctx bounds the whole exchange.
func (h *Handler) attempt(ctx context.Context, call *gateway.Call, up gateway.Upstream, method string, body []byte, lastEventID string) (*http.Response, error) {
	svc := call.Service
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(gateway.WithDialTimeout(ctx, time.Duration(svc.DialTimeout)),
		&httptrace.ClientTrace{WroteHeaders: func() { sent.Store(true) }})
	if call.Caller != nil {
		ctx = gateway.WithUpstreamUser(ctx, call.Caller.User) // for an upstream of the caller's own (stdio per_user)
	}
	if call.MCPSession != nil && svc.Transport() != "" {
		ctx = gateway.WithUpstreamSession(ctx, call.MCPSession.Ref) // see gateway.UpstreamSession
		call.MCPSession.HeldHere()
	}
	ctx, cancel := context.WithCancel(ctx)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, svc.URL, rd)
	if err != nil {
		cancel()
		return nil, unavailable("building the upstream request: %v", err)
	}
	hdr := req.Header
	hdr["User-Agent"] = userAgent
	switch method {
	case http.MethodPost:
		hdr["Content-Type"] = jsonContentType
		hdr["Accept"] = acceptBoth
	case http.MethodGet:
		hdr["Accept"] = acceptSSE
	}
	if up.SessionID != "" && !up.From(svc.Endpoint()) {
		// The id was issued by the upstream the service named before a
		// reload: it is not another upstream's to see.
		cancel()
		return nil, unavailable("the service's upstream changed since this MCP session was initialized: initialize a new one")
	}
	if call.Credential == nil && svc.PerUserCredentials() && !endsItself(call, method) {
		// Only a DELETE a transport module answers itself goes without the
		// caller's credential (see endsItself); a server of a service of
		// per-user credentials never sees a request without one.
		cancel()
		return nil, unavailable("toolgate has no credential of yours for the service: connect it, then retry")
	}
	if (up.SessionID != "" || up.Grant != "") && call.Credential.GrantName() != up.Grant && !endsItself(call, method) {
		// The session's upstream session (with an id, or what toolgate
		// keeps of one, translated or implied) was opened through another
		// credential of the caller's: they connected again since (the
		// registry ends such a session; this request passed it just
		// before). The request was decided with what the upstream said
		// through the old one, and the old upstream session is not the
		// new credential's to use.
		cancel()
		if call.Stateless != nil {
			return nil, unavailable("you connected to the service again while this request was on its way: send it again")
		}
		return nil, unavailable("you connected to the service again since this MCP session was initialized: initialize a new one")
	}
	if up.SessionID != "" {
		hdr["Mcp-Session-Id"] = []string{up.SessionID}
	}
	if up.ProtocolVersion != "" {
		hdr["Mcp-Protocol-Version"] = []string{up.ProtocolVersion}
	}
	if lastEventID != "" {
		hdr["Last-Event-Id"] = []string{lastEventID}
	}
	for k, v := range upstreamHeaders(ctx) {
		hdr[k] = v
	}
	if c := call.Credential; c != nil {
		hdr.Set(c.Header, c.Value)
	}
	gateway.InjectTrace(ctx, hdr)
	var headerTimer *time.Timer
	if d := time.Duration(svc.ResponseHeaderTimeout); d > 0 {
		headerTimer = time.AfterFunc(d, cancel)
	}
	resp, err := h.app.UpstreamTransport(svc).RoundTrip(req)
	if headerTimer != nil && !headerTimer.Stop() {
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		return nil, &upstreamError{kind: kindUnavailable, sent: sent.Load(),
			msg: "the upstream sent no response headers within the service's response_header_timeout"}
	}
	if err != nil {
		timedOut := ctx.Err() != nil // before cancel, which sets it
		cancel()
		e := &upstreamError{kind: kindUnavailable, sent: sent.Load(), msg: "the upstream is unreachable", cause: caddyopt.URLError(err)}
		switch {
		case timedOut && e.sent:
			e.msg = "the upstream did not answer in time"
		case timedOut:
			e.msg = "the upstream could not be reached in time"
		case e.sent:
			e.msg = "the connection to the upstream broke"
		}
		return nil, e
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	e := &upstreamError{status: resp.StatusCode} // answered: nothing runs on
	switch s := resp.StatusCode; {
	case s == http.StatusNotFound && up.SessionID != "":
		e.kind, e.msg = kindSessionGone, "the upstream session expired"
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		e.kind, e.msg = kindUnauthorized, fmt.Sprintf("the upstream refused the credential (HTTP %d)", s)
	case s >= 300 && s < 400:
		e.kind, e.msg = kindUnavailable, fmt.Sprintf("the upstream answered with a redirect (HTTP %d); toolgate does not follow redirects", s)
	case s >= 400 && s < 500:
		e.kind, e.msg = kindRejected, fmt.Sprintf("the upstream rejected the request (HTTP %d)", s)
		if isJSON(resp.Header) {
			if data, err := readBody(resp.Body, resp.ContentLength, h.maxMessage); err == nil {
				e.body = data
			}
		}
	default:
		e.kind, e.msg = kindUnavailable, fmt.Sprintf("the upstream failed (HTTP %d)", s)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	return nil, e
}

// endsItself reports whether the request is a DELETE that a transport
// module (a program, a legacy SSE connection) answers itself, carrying no
// credential: it ends the upstream session of a caller who connected
// again since (see Handler.expired) with nothing reaching a server.
func endsItself(call *gateway.Call, method string) bool {
	return method == http.MethodDelete && call.Credential == nil && call.Service.Transport() != ""
}

// cancelOnClose ends a response's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// response is a stream of messages answering one upstream request: a
// single JSON body, or an SSE stream that may be resumed.
type response struct {
	h    *Handler
	ctx  context.Context
	call *gateway.Call
	up   gateway.Upstream
	resp *http.Response
	sse  *eventstream.Reader
	body []byte // a JSON body read already (an upstream's 4xx answer)
	// status is the HTTP status of that 4xx answer, 0 for a 2xx one.
	status int
	done   bool // the single JSON message was returned

	// stalls counts the resumptions in a row that brought nothing new.
	stalls int
	// progress is set when an event or a new event id arrived since the
	// stream was last (re)connected.
	progress bool
	// onPrime, when set, is called with the event id of an event without
	// data (the upstream's priming event, SEP-1699).
	onPrime func(id string)
	// sent is the other credentials the exchange sent upstream besides
	// call's (those of the retries that continued a call held between
	// rounds, the original request's of a resumed stream: an OAuth access
	// token may have been refreshed meanwhile): what the upstream sends is
	// searched for them too.
	sent []*gateway.Credential
	// own marks the answer to a request toolgate makes itself (roundTrip):
	// it is read to its end even if the MCP session ends meanwhile, so
	// that an upstream session an initialize made is known, and ended.
	own bool
}

func (h *Handler) newResponse(ctx context.Context, call *gateway.Call, up gateway.Upstream, resp *http.Response) (*response, error) {
	r := &response{h: h, ctx: ctx, call: call, up: up, resp: resp}
	switch {
	case resp.StatusCode == http.StatusAccepted:
		resp.Body.Close()
		r.done = true
	case isSSE(resp.Header):
		r.sse = eventstream.NewReader(resp.Body, h.maxMessage)
	case isJSON(resp.Header):
	default:
		resp.Body.Close()
		// Its Content-Type is not quoted: the upstream writes it, and no
		// policy inspects it.
		return nil, &upstreamError{kind: kindUnavailable, sent: true,
			msg: "the upstream answered with a Content-Type that is neither application/json nor text/event-stream"}
	}
	return r, nil
}

// rejectedResponse is the JSON body of an upstream's 4xx answer, read like
// any other answer: strictly, and only as the response to id.
func (h *Handler) rejectedResponse(ctx context.Context, call *gateway.Call, up gateway.Upstream, err error, id []byte) (*response, mcpmsg.Message, bool) {
	ue, ok := errors.AsType[*upstreamError](err) // no allocation, unlike errors.As: every call passes here
	if !ok || ue.kind != kindRejected || ue.body == nil {
		return nil, mcpmsg.Message{}, false
	}
	msg, perr := mcpmsg.Parse(normalizeCR(ue.body), h.limits)
	if perr == nil {
		msg, perr = h.redactCredential(call, msg)
	}
	if perr != nil || !isResponseTo(msg, id) {
		return nil, mcpmsg.Message{}, false
	}
	return &response{h: h, ctx: ctx, call: call, up: up, body: msg.Raw, status: ue.status}, msg, true
}

// next returns the next JSON-RPC message from the upstream, read once and
// strictly (what toolgate inspects is what the runner reads), with the
// call's credential redacted wherever the upstream wrote it, resuming a
// dropped SSE stream with Last-Event-ID when the upstream offered event
// ids. io.EOF means the stream ended.
func (r *response) next() (mcpmsg.Message, error) {
	data, err := r.nextData()
	if err != nil {
		return mcpmsg.Message{}, err
	}
	if r.sessionOver() {
		// Ended while the message was on its way (connecting again, a
		// DELETE, a reload): the cancellation that stops this exchange
		// runs on a goroutine of its own and may come late, but once the
		// session is ended nothing of it reaches the runner.
		if r.resp != nil {
			r.resp.Body.Close()
		}
		return mcpmsg.Message{}, errSessionEnded
	}
	msg, err := r.h.parseRedacted(r.call, normalizeCR(data))
	for i, c := range r.sent {
		if err != nil {
			break
		}
		if secret := secretOf(c); secret != "" && secret != secretOf(r.call.Credential) &&
			!slices.ContainsFunc(r.sent[:i], func(o *gateway.Credential) bool { return secretOf(o) == secret }) {
			other := *r.call
			other.Credential = c
			msg, err = r.h.redactCredential(&other, msg)
		}
	}
	if errors.Is(err, errSecretsUnread) {
		r.h.logger.Warn("an upstream message was not relayed", zap.String("service", r.call.Service.ID), zap.Error(err))
		// The runner gets toolgate's words only: the storage's and the
		// cipher's name paths, hosts and keys (the log has them).
		return msg, &upstreamError{kind: kindUnavailable, sent: true, msg: errSecretsUnread.Error() + "; try again once storage and the cipher answer"}
	}
	if err != nil {
		// Neither the runner nor the log gets the upstream's own words (a
		// key it quotes): no policy inspected them, and they can be the
		// credential toolgate sent it.
		why := err.Error()
		se, ok := errors.AsType[*mcpmsg.SyntaxError](err)
		if ok {
			why = se.Redacted()
		}
		r.h.logger.Warn("an upstream sent a malformed message", zap.String("service", r.call.Service.ID), zap.String("error", why))
		if ok && se.OverLimit {
			// Retrying would run the request again: it ran.
			return msg, &upstreamError{kind: kindOverLimit, sent: true,
				msg: fmt.Sprintf("the upstream answered with %s (max_response_values); toolgate does not relay it, and the request did run upstream", se.Msg)}
		}
		return msg, unavailable("the upstream sent a malformed message (%s)", why)
	}
	return msg, nil
}

// sessionOver reports whether the exchange's MCP session ended, or, for
// a stateless runner's subscriptions/listen, was retired (the caller
// connected again: a call in progress runs to its end, a listen would
// relay the old connection's upstream session for as long as the runner
// keeps it). Toolgate's own requests read on (own).
func (r *response) sessionOver() bool {
	ms := r.call.MCPSession
	if ms == nil || r.own {
		return false
	}
	if r.call.Stateless != nil && r.call.Method == "subscriptions/listen" {
		return ms.Retiring().Err() != nil
	}
	return ms.Closed()
}

// normalizeCR turns each CR of a JSON text into a space. In a JSON text a
// CR can only be whitespace (strings cannot hold one unescaped), so the
// message reads the same, and the bytes the policy inspects are the bytes
// every runner reads, whether the runner gets them as JSON or in SSE data
// lines, where a CR would end the line.
func normalizeCR(data []byte) []byte {
	i := bytes.IndexByte(data, '\r')
	if i < 0 {
		return data
	}
	out := bytes.Clone(data)
	for ; i >= 0; i = bytes.IndexByte(out, '\r') {
		out[i] = ' '
	}
	return out
}

// lastEventID is the upstream's last event id on this stream, "" when it
// gave none.
func (r *response) lastEventID() string {
	if r.sse == nil {
		return ""
	}
	return r.sse.LastID()
}

// nextData returns the text of the next message.
func (r *response) nextData() ([]byte, error) {
	if r.sse == nil {
		if r.done {
			return nil, io.EOF
		}
		r.done = true
		if r.body != nil {
			return r.body, nil
		}
		defer r.resp.Body.Close()
		data, err := readBody(r.resp.Body, r.resp.ContentLength, r.h.maxMessage)
		switch {
		case errors.Is(err, errBodyTooLarge):
			return nil, &upstreamError{kind: kindUnavailable, sent: true, msg: "the upstream response exceeds max_response_size"}
		case errors.Is(err, errBodyLength):
			return nil, &upstreamError{kind: kindUnavailable, sent: true, msg: "the upstream response is longer than its Content-Length"}
		case err != nil && r.ctx.Err() != nil:
			return nil, &upstreamError{kind: kindUnavailable, sent: true, msg: "the upstream did not answer in time"}
		case err != nil:
			return nil, &upstreamError{kind: kindUnavailable, sent: true, msg: "reading the upstream response failed"}
		}
		return data, nil
	}
	for {
		before := r.sse.LastID()
		ev, err := r.sse.Next()
		if r.sse.LastID() != before {
			r.progress = true
		}
		if err == nil {
			r.progress = true
			switch {
			case len(ev.Data) == 0: // a priming event (SEP-1699), or one that only sets retry
				if r.onPrime != nil && r.sse.LastID() != "" {
					r.onPrime(r.sse.LastID())
				}
				continue
			case ev.Type != "" && ev.Type != "message":
				continue // not a message: SSE clients dispatch other types elsewhere
			}
			return ev.Data, nil
		}
		r.resp.Body.Close()
		switch {
		case errors.Is(err, eventstream.ErrEventTooLarge):
			return nil, &upstreamError{kind: kindUnavailable, sent: true, msg: "an upstream event exceeds max_response_size"}
		case r.ctx.Err() != nil:
			return nil, &upstreamError{kind: kindUnavailable, sent: true, msg: "the upstream did not answer in time"}
		}
		// The stream ended or broke. Resume it if the upstream gave event
		// ids (the 2025-11-25 polling pattern, or a dropped connection),
		// for as long as resumptions bring something new.
		if r.progress {
			r.stalls = 0
		} else {
			r.stalls++
		}
		if r.sse.LastID() == "" || r.stalls >= r.call.Service.ResumeAttempts {
			if err == io.EOF {
				return nil, io.EOF
			}
			return nil, &upstreamError{kind: kindUnavailable, sent: true, msg: "the upstream stream broke"}
		}
		if err := r.resume(); err != nil {
			return nil, err
		}
	}
}

// defaultResumeDelay is the wait before resuming a stream whose upstream
// set no retry field.
const defaultResumeDelay = 100 * time.Millisecond

// resume reconnects with GET and Last-Event-ID after the upstream's retry
// delay (at most the service's max_resume_delay).
func (r *response) resume() error {
	delay := r.sse.RetryDelay()
	if delay <= 0 {
		delay = defaultResumeDelay
	}
	delay = min(delay, time.Duration(r.call.Service.MaxResumeDelay))
	if deadline, ok := r.ctx.Deadline(); ok && time.Until(deadline) < delay {
		return &upstreamError{kind: kindUnavailable, sent: true,
			msg: "the upstream asked to resume its stream later than the service timeout allows"}
	}
	t := time.NewTimer(delay)
	select {
	case <-r.ctx.Done():
		t.Stop()
		return &upstreamError{kind: kindUnavailable, sent: true, msg: "the upstream did not answer in time"}
	case <-t.C:
	}
	resp, err := r.h.exchange(r.ctx, r.call, r.up, http.MethodGet, nil, r.sse.LastID())
	if err != nil {
		var ue *upstreamError
		if errors.As(err, &ue) {
			ue.sent = true
		}
		return err
	}
	if !isSSE(resp.Header) {
		resp.Body.Close()
		return &upstreamError{kind: kindUnavailable, sent: true, msg: "the upstream did not resume its stream"}
	}
	r.resp = resp
	r.sse = r.sse.Resumed(resp.Body)
	r.progress = false
	return nil
}

// streamEndWait bounds how long toolgate waits for an upstream to end an
// SSE stream whose answer it has read. The Streamable HTTP transport says a
// server should end the stream right after the response; one that keeps it
// open costs its connection, not the runner's time beyond this.
const streamEndWait = 100 * time.Millisecond

// awaitEnd reads what is left of an SSE stream whose answer was the last
// message toolgate needed from it (at most drainLimit bytes, for at most
// streamEndWait), so that the HTTP client puts the connection back in its
// pool: a response body closed before its end closes the connection, and
// the next call would dial a new one.
func (r *response) awaitEnd() {
	if r.sse == nil || r.resp == nil {
		return
	}
	if r.sse.Ended() { // the reader saw the end already
		return
	}
	body, ok := r.resp.Body.(*cancelOnClose)
	if !ok {
		return
	}
	t := time.AfterFunc(streamEndWait, body.cancel)
	_, _ = io.Copy(io.Discard, io.LimitReader(body.ReadCloser, drainLimit))
	t.Stop()
}

func (r *response) close() {
	if r.resp != nil && !r.done {
		r.resp.Body.Close()
	}
	if r.sse != nil {
		r.sse.Release()
	}
}

// roundTrip sends a request the gateway itself makes (initialize, tools/list)
// and returns the upstream's response headers and its JSON-RPC response to
// it, skipping anything else on the stream. An upstream's 4xx answer with
// a JSON-RPC response to the request is that response.
func (h *Handler) roundTrip(ctx context.Context, call *gateway.Call, up gateway.Upstream, id, body []byte) (http.Header, mcpmsg.Message, error) {
	ctx, body = ownRequest(ctx, up, body)
	httpResp, err := h.exchange(ctx, call, up, http.MethodPost, body, "")
	if _, msg, ok := h.rejectedResponse(ctx, call, up, err, id); ok {
		return http.Header{}, msg, nil
	}
	if err != nil {
		return nil, mcpmsg.Message{}, err
	}
	r, err := h.newResponse(ctx, call, up, httpResp)
	if err != nil {
		return nil, mcpmsg.Message{}, err
	}
	r.own = true
	defer r.close()
	for {
		msg, err := r.next()
		if err == io.EOF {
			return nil, msg, unavailable("the upstream ended its stream without answering")
		}
		if err != nil {
			return nil, msg, err
		}
		if isResponseTo(msg, id) {
			r.awaitEnd()
			return httpResp.Header, msg, nil
		}
	}
}

// isResponseTo reports whether msg is the JSON-RPC response to the request
// with the given id (JSON text), however either spells it.
func isResponseTo(msg mcpmsg.Message, id []byte) bool {
	if msg.Kind != mcpmsg.Response {
		return false
	}
	key := mcpmsg.IDKey(id)
	return key != "" && mcpmsg.IDKey(msg.ID) == key
}

func isSSE(h http.Header) bool { return mediaTypeIs(h, "text/event-stream") }

func isJSON(h http.Header) bool { return mediaTypeIs(h, "application/json") }

// mediaTypeIs reports whether the media type of h's Content-Type, its
// parameters aside, is want (lower case), read as mime.ParseMediaType reads
// it (which allocates a map of the parameters for every response).
func mediaTypeIs(h http.Header, want string) bool {
	base, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	base = strings.TrimSpace(base)
	if len(base) != len(want) {
		return false
	}
	for i := 0; i < len(base); i++ {
		c := base[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != want[i] {
			return false
		}
	}
	return true
}
