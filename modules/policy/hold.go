package policy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/modules/gateway"
)

// The hold (approval_wait): a call that needs an approval stays open on an
// SSE answer while a person decides, and goes on the moment it is approved.

const (
	maxApprovalWait = time.Hour
	// holdPoll is how often a held call reads its approval again, for a
	// decision made on another replica (one made here wakes it at once).
	holdPoll = time.Second
	// holdKeepAlive is how often a held stream gets an SSE comment, so
	// that proxies and clients do not take it for dead.
	holdKeepAlive = 15 * time.Second
)

// acceptsSSE reports whether the runner's request accepts an SSE answer.
func acceptsSSE(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "text/event-stream") {
			return true
		}
	}
	return false
}

// hold keeps a call with a pending approval open until the approval is
// decided or the wait ends. An approved call continues through the rest of
// the pipeline on the same stream — decided again first, as its retry
// would be, when the policy that asked (revision) is no longer the one in
// force: the approver judged the call under a policy that may since have
// learnt to deny or rewrite it; refused when its session ended, or its
// tool's pin no longer holds; and ended with the pending answer when a
// reload came while it waited (its retry is the new configuration's).
func (h *RequestHandler) hold(w http.ResponseWriter, r *http.Request, call *gateway.Call, d *gateway.Decision, a *approval.Approval, revision string, next caddyhttp.Handler) error {
	// A held call counts as a call in progress (max_streams_per_caller,
	// max_streams). Past the limit it is not held: the runner is told
	// where to approve at once, as without approval_wait.
	done, err := h.app.OpenStream(call.Caller.User)
	if err != nil {
		status, msg := h.pending(call, d, a, h.app.BaseURL(r))
		gateway.WriteRPC(w, status, msg)
		h.completeWhenDecided(call, a)
		return nil
	}
	defer done()
	stream := newHeldStream(w)
	page := approval.URL(h.app.BaseURL(r), a)
	elicited := h.tellRunner(r.Context(), stream, call, a, page)
	if token := gjsonProgressToken(call); token != nil {
		stream.event(notification("notifications/progress", map[string]any{
			"progressToken": token, "progress": 0, "message": "waiting for an approval at " + page,
		}))
	}
	ctx := r.Context()
	until := time.Now().Add(time.Duration(h.ApprovalWait))
	keepAlive := time.NewTicker(holdKeepAlive)
	defer keepAlive.Stop()
	for {
		wait := min(h.approvals.Poll(holdPoll), time.Until(until))
		if wait <= 0 {
			stream.final(h.pendingFinal(call, d, a, h.app.BaseURL(r)))
			return nil
		}
		h.approvals.Wait(ctx, a.ID, wait)
		if ctx.Err() != nil {
			return nil // the runner went away; the approval stays pending
		}
		select {
		case <-keepAlive.C:
			stream.comment()
		default:
		}
		var res approval.Resolution
		if !h.app.WhileInForce(func() { res, err = h.approvals.Decided(ctx, a.ID, d.ID) }) {
			// A reload came while the call waited: the policy, the
			// registry and the steps after this one are another
			// configuration's now, and this handler's are not. The call
			// ends as without approval_wait; the approval stays (it is
			// taken only in force), and the runner's retry, made under the
			// configuration in force, is decided by it (and finds the
			// approval once it is given).
			stream.final(h.pendingFinal(call, d, a, h.app.BaseURL(r)))
			return nil
		}
		switch {
		case err != nil:
			h.logger.Warn("a held call cannot read its approval", zap.String("approval_id", a.ID), zap.Error(err))
		case res.Kind == approval.Allow:
			elicited()
			why := h.sessionEnded(ctx, call)
			if why == "" {
				why = h.app.StillAuthorized(r, call) // a reload may have come since the check above
			}
			if why != "" {
				gateway.AuditRefused(call, gateway.StepPolicy, why) // after its approval's consumed entry
				stream.final(refusal(call, d, why))
				return nil
			}
			if call.Method == "tools/call" && !h.pinStillHolds(stream, r, call) {
				stream.Flush()
				return nil
			}
			done() // the call goes on, counted by the proxy
			var err error
			if h.engine.Revision() == revision {
				err = h.allow(stream, r, call, next)
			} else {
				call.Arguments, call.RequestInput, call.Decision = nil, nil, nil // the runner's call, undecided
				err = h.judge(stream, r, call, next, res.Approval)
			}
			stream.Flush()
			return err
		case res.Kind == approval.Denied:
			elicited()
			stream.final(refusal(call, d, deniedBy(res.Approval)))
			return nil
		case res.Kind == approval.Pending:
		default: // expired, or used by another retry
			stream.final(h.pendingFinal(call, d, a, h.app.BaseURL(r)))
			return nil
		}
	}
}

// pinStillHolds checks the called tool's pin again, as the registry did
// before the call was held: the upstream may have changed the tool while
// the call waited, and a call of a tool whose change waits is refused
// (toolpin.Pins.AllowCall answers the runner then).
func (h *RequestHandler) pinStillHolds(w http.ResponseWriter, r *http.Request, call *gateway.Call) bool {
	pins, err := toolpin.For(h.app)
	if err != nil {
		gateway.AuditRefused(call, gateway.StepPolicy, "the tool's pin could not be read")
		call.Unavailable(w, "toolgate could not read the tool's pin; try again")
		return false
	}
	return pins.AllowCall(w, r, call)
}

// sessionEnded says why call's toolgate session no longer authorizes it,
// "" while it does: a held call runs only if its session is still live
// when its approval comes (it may have expired, or been ended because its
// runner misbehaved, while the call waited).
func (h *RequestHandler) sessionEnded(ctx context.Context, call *gateway.Call) string {
	s := call.Session
	switch {
	case s == nil:
		return ""
	case !s.ExpiresAt.IsZero() && time.Now().After(s.ExpiresAt):
		return "the toolgate session expired while the call waited for its approval"
	case !s.Stored():
		return "" // implied, or an anonymous caller's: nothing ends it but its expiry
	}
	if _, err := h.app.Sessions().Get(ctx, s.ID); err != nil {
		if errors.Is(err, gateway.ErrSessionNotFound) {
			return "the toolgate session ended while the call waited for its approval"
		}
		h.logger.Warn("a held call cannot check its toolgate session", zap.Error(err))
		return "toolgate cannot check the toolgate session right now (its storage is unavailable); send the call again"
	}
	return ""
}

// tellRunner says on the held call's stream where its approval is
// decided, in the way the runner's client understands best: an in_band
// approval as a form elicitation (the person approves in the client), else
// a URL elicitation naming the approval page, else a log message. It
// returns what to send once the approval is decided (the completion of a
// URL elicitation).
func (h *RequestHandler) tellRunner(ctx context.Context, stream *heldStream, call *gateway.Call, a *approval.Approval, page string) (decided func()) {
	decided = func() {}
	switch {
	case a.InBand && formElicitation(call):
		params := map[string]any{"message": h.inBandQuestion(ctx, call, a), "requestedSchema": approval.FormSchema}
		if call.MCPSession.Upstream().ProtocolVersion >= "2025-11-25" {
			params["mode"] = approval.ModeForm
		}
		stream.event(request(approval.ElicitationID(a, approval.ModeForm), "elicitation/create", params))
	case urlElicitation(call):
		stream.event(request(approval.ElicitationID(a, approval.ModeURL), "elicitation/create", map[string]any{
			"mode": approval.ModeURL, "elicitationId": a.ID, "url": page,
			"message": approval.Visible("This call waits for an approval: " + a.Reason + ". Open the page to see it decided."),
		}))
		decided = func() {
			stream.event(notification("notifications/elicitation/complete", map[string]any{"elicitationId": a.ID}))
		}
	default:
		stream.event(notification("notifications/message", map[string]any{
			"level": "warning", "logger": "toolgate",
			"data": approval.Visible("this call waits for an approval: "+a.Reason) + " — approve it at " + page,
		}))
	}
	return decided
}

// inBandQuestion is what the client shows its person for an in-band
// approval: the tool, the reason and the arguments as approvers see them,
// with invisible and bidirectional control characters written as \u
// escapes (approval.Visible, as on the console and in the webhook), so that
// none hides text or shows it reordered.
func (h *RequestHandler) inBandQuestion(ctx context.Context, call *gateway.Call, a *approval.Approval) string {
	q := "Approve " + a.Tool + " on " + a.Service + "? " + a.Reason
	if c, err := h.approvals.Store.Open(ctx, a); err == nil && len(c.Masked) > 0 {
		q += "\nArguments: " + string(c.Masked)
	}
	return approval.Visible(q)
}

// formElicitation reports whether the runner declared form elicitation
// when it initialized (2025-06-18's elicitation capability, or 2025-11-25's
// form mode, which an empty elicitation capability also means).
func formElicitation(call *gateway.Call) bool {
	if call.MCPSession == nil {
		return false
	}
	up := call.MCPSession.Upstream()
	el := gjson.GetBytes(up.InitializeParams, "capabilities.elicitation")
	if up.ProtocolVersion < "2025-06-18" || !el.IsObject() {
		return false
	}
	return el.Get("form").IsObject() || !el.Get("url").Exists()
}

func gjsonProgressToken(call *gateway.Call) any {
	var params struct {
		Meta struct {
			ProgressToken any `json:"progressToken"`
		} `json:"_meta"`
	}
	if json.Unmarshal(call.Message.Params, &params) != nil {
		return nil
	}
	return params.Meta.ProgressToken
}

// request is a JSON-RPC request of toolgate's own to the runner.
func request(id, method string, params map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	return b
}

func notification(method string, params map[string]any) []byte {
	p, _ := json.Marshal(params)
	b := append([]byte(`{"jsonrpc":"2.0","method":`), mcpmsg.Quote(method)...)
	b = append(b, `,"params":`...)
	b = append(b, p...)
	return append(b, '}')
}

// heldStream is the SSE answer of a held call. It also serves as the
// ResponseWriter of the rest of the pipeline once the call is approved: an
// SSE answer from there goes on as it is; a JSON answer becomes one more
// event of the stream.
type heldStream struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	header http.Header // what the rest of the pipeline sets
	mode   int         // 0: not decided yet; 1: pass SSE through; 2: wrap JSON
	body   bytes.Buffer
}

func newHeldStream(w http.ResponseWriter) *heldStream {
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &heldStream{w: w, rc: http.NewResponseController(w), header: http.Header{}}
	_ = s.rc.Flush()
	return s
}

// event writes one message event. JSON text has no line breaks but as
// white space, which becomes spaces, so the event is one data line and
// every SSE parser reads the same message.
func (s *heldStream) event(msg []byte) {
	line := bytes.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, msg)
	_, _ = s.w.Write(append(append([]byte("event: message\ndata: "), line...), "\n\n"...))
	_ = s.rc.Flush()
}

func (s *heldStream) comment() {
	_, _ = s.w.Write([]byte(": waiting for an approval\n\n"))
	_ = s.rc.Flush()
}

// final writes the last message of a stream that does not go on.
func (s *heldStream) final(msg []byte) { s.event(msg) }

// Header is what the rest of the pipeline sets; only its choice of
// answer (SSE or JSON) matters, the stream's headers are sent.
func (s *heldStream) Header() http.Header { return s.header }

func (s *heldStream) WriteHeader(int) {
	if s.mode == 0 {
		s.mode = 2
		if strings.HasPrefix(s.header.Get("Content-Type"), "text/event-stream") {
			s.mode = 1
		}
	}
}

func (s *heldStream) Write(b []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	if s.mode == 1 {
		return s.w.Write(b)
	}
	return s.body.Write(b) // one JSON message: written as an event when the handler is done
}

// Flush sends what an SSE answer wrote, or the JSON message as an event.
func (s *heldStream) Flush() {
	if s.mode == 2 && s.body.Len() > 0 {
		s.event(s.body.Bytes())
		s.body.Reset()
	}
	_ = s.rc.Flush()
}

// FlushError is Flush for http.ResponseController.
func (s *heldStream) FlushError() error {
	s.Flush()
	return nil
}

// Unwrap gives http.ResponseController the connection's writer, for
// deadlines.
func (s *heldStream) Unwrap() http.ResponseWriter { return s.w }

// Hijack is refused: a held stream is an SSE answer already.
func (s *heldStream) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, http.ErrNotSupported
}
