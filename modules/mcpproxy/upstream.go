package mcpproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/tidwall/gjson"

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
}

type errorKind uint8

const (
	kindUnavailable  errorKind = iota // network error, timeout, 5xx, malformed: retryable
	kindSessionGone                   // 404 for a known session: re-initialize
	kindUnauthorized                  // 401/403: the credential was refused
	kindRejected                      // another 4xx: relayed to the runner as is
)

func (e *upstreamError) Error() string { return e.msg }

func unavailable(format string, args ...any) *upstreamError {
	return &upstreamError{kind: kindUnavailable, msg: fmt.Sprintf(format, args...)}
}

// exchange sends one HTTP request to the call's upstream, as attempt does,
// and tries once more when the upstream refused the caller's OAuth or
// personal credential and a fresh one exists (another replica refreshed the
// grant, or the provider revoked the token early). A refused request was not
// processed, so sending it again is safe.
func (h *Handler) exchange(ctx context.Context, call *gateway.Call, up gateway.Upstream, method string, body []byte, lastEventID string) (*http.Response, error) {
	resp, err := h.attempt(ctx, call, up, method, body, lastEventID)
	if !isKind(err, kindUnauthorized) || call.Credential == nil {
		return resp, err
	}
	fresh, ferr := h.app.CredentialRefused(ctx, call.Service, call.Caller.User, call.Credential)
	if ferr != nil {
		return resp, err
	}
	call.Credential = fresh
	return h.attempt(ctx, call, up, method, body, lastEventID)
}

// attempt sends one HTTP request to the call's upstream. method is POST
// (body set), GET (opens a stream) or DELETE. A 2xx response is returned
// open; anything else is an *upstreamError.
func (h *Handler) attempt(ctx context.Context, call *gateway.Call, up gateway.Upstream, method string, body []byte, lastEventID string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, call.Service.URL, rd)
	if err != nil {
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
	if up.SessionID != "" {
		hdr["Mcp-Session-Id"] = []string{up.SessionID}
	}
	if up.ProtocolVersion != "" {
		hdr["Mcp-Protocol-Version"] = []string{up.ProtocolVersion}
	}
	if lastEventID != "" {
		hdr["Last-Event-Id"] = []string{lastEventID}
	}
	if c := call.Credential; c != nil {
		hdr.Set(c.Header, c.Value)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, unavailable("the upstream did not answer in time")
		}
		return nil, unavailable("the upstream is unreachable")
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	e := &upstreamError{status: resp.StatusCode}
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
			e.body, _ = io.ReadAll(io.LimitReader(resp.Body, h.maxMessage))
		}
	default:
		e.kind, e.msg = kindUnavailable, fmt.Sprintf("the upstream failed (HTTP %d)", s)
	}
	return nil, e
}

// response is a stream of messages answering one upstream request: either
// a single JSON body or an SSE stream that may resume.
type response struct {
	h      *Handler
	ctx    context.Context
	call   *gateway.Call
	up     gateway.Upstream
	resp   *http.Response
	sse    *sseReader
	done   bool // the single JSON message was returned
	lastID string
	retry  time.Duration
	// resumes counts reconnections of this stream.
	resumes int
}

const maxResumes = 5

func (h *Handler) newResponse(ctx context.Context, call *gateway.Call, up gateway.Upstream, resp *http.Response) (*response, error) {
	r := &response{h: h, ctx: ctx, call: call, up: up, resp: resp}
	switch {
	case resp.StatusCode == http.StatusAccepted:
		resp.Body.Close()
		r.done = true
	case isSSE(resp.Header):
		r.sse = newSSEReader(resp.Body, h.maxMessage)
	case isJSON(resp.Header):
	default:
		resp.Body.Close()
		return nil, unavailable("the upstream answered with Content-Type %q", resp.Header.Get("Content-Type"))
	}
	return r, nil
}

// next returns the next JSON-RPC message from the upstream, read once and
// strictly (what toolgate inspects is what the runner reads), resuming a
// dropped SSE stream with Last-Event-ID when the upstream offered event
// ids. io.EOF means the stream ended.
func (r *response) next() (mcpmsg.Message, error) {
	data, err := r.nextData()
	if err != nil {
		return mcpmsg.Message{}, err
	}
	msg, err := mcpmsg.Parse(data, r.h.limits)
	if err != nil {
		return msg, unavailable("the upstream sent a malformed message (%v)", err)
	}
	return msg, nil
}

// nextData returns the text of the next message.
func (r *response) nextData() ([]byte, error) {
	if r.sse == nil {
		if r.done {
			return nil, io.EOF
		}
		r.done = true
		defer r.resp.Body.Close()
		data, err := io.ReadAll(io.LimitReader(r.resp.Body, r.h.maxMessage+1))
		switch {
		case err != nil:
			return nil, unavailable("reading the upstream response failed")
		case int64(len(data)) > r.h.maxMessage:
			return nil, unavailable("the upstream response exceeds max_response_size")
		}
		return data, nil
	}
	for {
		ev, err := r.sse.next()
		if err == nil {
			if ev.ID != "" {
				r.lastID = ev.ID
			}
			if ev.Retry > 0 {
				r.retry = ev.Retry
			}
			if len(ev.Data) == 0 { // a priming or retry-only event
				continue
			}
			return ev.Data, nil
		}
		r.resp.Body.Close()
		if errors.Is(err, errEventTooLarge) {
			return nil, unavailable("an upstream event exceeds max_response_size")
		}
		if r.ctx.Err() != nil {
			return nil, unavailable("the upstream did not answer in time")
		}
		// The stream ended or broke. Resume it if the upstream gave event
		// ids (the 2025-11-25 polling pattern, or a dropped connection).
		if r.lastID == "" || r.resumes >= maxResumes {
			if err == io.EOF {
				return nil, io.EOF
			}
			return nil, unavailable("the upstream stream broke")
		}
		if err := r.resume(); err != nil {
			return nil, err
		}
	}
}

// resume reconnects with GET and Last-Event-ID after the upstream's retry
// delay.
func (r *response) resume() error {
	r.resumes++
	delay := r.retry
	if delay <= 0 {
		delay = 100 * time.Millisecond
	}
	if delay > 30*time.Second {
		delay = 30 * time.Second
	}
	t := time.NewTimer(delay)
	select {
	case <-r.ctx.Done():
		t.Stop()
		return unavailable("the upstream did not answer in time")
	case <-t.C:
	}
	resp, err := r.h.exchange(r.ctx, r.call, r.up, http.MethodGet, nil, r.lastID)
	if err != nil {
		return err
	}
	if !isSSE(resp.Header) {
		resp.Body.Close()
		return unavailable("the upstream did not resume its stream")
	}
	r.resp = resp
	r.sse = newSSEReader(resp.Body, r.h.maxMessage)
	return nil
}

func (r *response) close() {
	if r.resp != nil && !r.done {
		r.resp.Body.Close()
	}
}

// roundTrip sends a request the gateway itself makes (initialize, tools/list)
// and returns the upstream's JSON-RPC response to it, skipping anything else
// on the stream.
func (h *Handler) roundTrip(ctx context.Context, call *gateway.Call, up gateway.Upstream, id, body []byte) (*http.Response, mcpmsg.Message, error) {
	httpResp, err := h.exchange(ctx, call, up, http.MethodPost, body, "")
	if err != nil {
		return nil, mcpmsg.Message{}, err
	}
	r, err := h.newResponse(ctx, call, up, httpResp)
	if err != nil {
		return nil, mcpmsg.Message{}, err
	}
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
			return httpResp, msg, nil
		}
	}
}

// isResponseTo reports whether msg is the JSON-RPC response to the request
// with the given id (JSON text).
func isResponseTo(msg mcpmsg.Message, id []byte) bool {
	if msg.Kind != mcpmsg.Response {
		return false
	}
	got, want := gjson.ParseBytes(msg.ID), gjson.ParseBytes(id)
	if got.Type != want.Type {
		return false
	}
	if got.Type == gjson.String {
		return got.Str == want.Str
	}
	return got.Raw == want.Raw
}

func isSSE(h http.Header) bool {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt == "text/event-stream"
}

func isJSON(h http.Header) bool {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt == "application/json"
}
