package mcpproxy

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Multi round-trip requests translated for a stateless runner (2026-07-28)
// in front of an upstream of an earlier revision. Such an upstream asks
// its client things during a call with server→client requests on the
// call's stream; a stateless runner takes none. toolgate holds the
// upstream's stream instead, answers the runner with input_required — the
// upstream's request as an input request, and a requestState toolgate
// sealed that names the held call — and, when the runner retries with its
// input response, answers the upstream's request with it and reads on.
// The upstream session and the call stay where they are between rounds,
// bounded by the service timeout from the first round (the call's own
// deadline); a held call expires with it (the upstream is told to stop),
// continues once, and only for the caller, toolgate session and service it
// was held for. It lives in this process: a retry must reach the replica
// that holds it.

// heldCall is an upstream call toolgate holds between rounds.
type heldCall struct {
	h      *Handler
	call   *gateway.Call // the first round: the upstream knows the call by its id
	up     gateway.Upstream
	rs     *response
	cancel context.CancelFunc // ends the exchange
	// detach stops the current runner request's end from ending the
	// exchange; it reports false when the runner went away already.
	detach func() bool
	asked  []asked // the upstream's requests the runner has not answered
	seq    int
	// slot is the caller's stream place the held call keeps (its upstream
	// stream stays open): held calls count against max_streams_per_caller
	// and max_streams like the runner's open requests. room is the room
	// of the request bodies it keeps (max_request_bytes_in_flight).
	slot func()
	room *gateway.RequestBytes
	// unwatch stops giving the call up when its MCP session ends, once a
	// retry took it.
	unwatch func() bool
}

// streamPlace is the caller's stream place (gateway.App.OpenStream) a
// stateless runner request holds, in its context: given back when the
// request ends, unless a call held between rounds took it over.
type streamPlace struct {
	mu   sync.Mutex
	done func()
}

type streamPlaceKey struct{}

// take hands the place over (nil when it was handed over or given back).
func (p *streamPlace) take() func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	done := p.done
	p.done = nil
	return done
}

// give gives the place back, unless it was handed over.
func (p *streamPlace) give() {
	if done := p.take(); done != nil {
		done()
	}
}

// placeOf takes over the stream place of the request r.
func placeOf(r *http.Request) func() {
	if p, ok := r.Context().Value(streamPlaceKey{}).(*streamPlace); ok {
		return p.take()
	}
	return nil
}

// freeSlot gives the held call's stream place and body room back.
func (hc *heldCall) freeSlot() {
	if hc.slot != nil {
		hc.slot()
		hc.slot = nil
	}
	hc.room.Release()
	hc.room = nil
}

// handOver gives the held call's stream place to the request r that
// continues it: given back when r ends, unless the call is held again.
// The room of the first round's body stays with the call, which keeps
// that body until it ends (a retry's own body is the retry's).
func (hc *heldCall) handOver(r *http.Request) {
	p, ok := r.Context().Value(streamPlaceKey{}).(*streamPlace)
	if !ok {
		if hc.slot != nil {
			hc.slot()
		}
		hc.slot = nil
		return
	}
	p.mu.Lock()
	p.done, hc.slot = hc.slot, nil
	p.mu.Unlock()
}

// asked is an upstream request sent to the runner as an input request.
type asked struct {
	input mcp2026.InputRequest
	id    []byte // the upstream request's JSON-RPC id
}

// Release gives the held call up: the stream is closed and the upstream
// told to stop the call.
func (hc *heldCall) Release(why string) {
	hc.freeSlot()
	hc.rs.close()
	hc.cancel()
	hc.h.cancelUpstream(hc.call, hc.up, why)
}

// letGo stops the end of the runner's current request from ending the
// exchange, and forgets that request: what watched it holds its context,
// and so its call and body, whose room is given back as the request ends
// (a retry holding the call again kept its body for as long as the call
// was held, uncounted). It reports false when the runner went away already.
func (hc *heldCall) letGo() bool {
	detach := hc.detach
	if detach == nil {
		return true // let go already
	}
	hc.detach = nil
	return detach()
}

// roundsContext bounds a call that may be held between rounds: by the
// service timeout and the MCP session's life, and by the runner's request
// until the call is held (detach).
func roundsContext(r *http.Request, call *gateway.Call) (context.Context, context.CancelFunc, func() bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Duration(call.Service.Timeout))
	stopSession := context.AfterFunc(call.MCPSession.Context(), cancel)
	detach := context.AfterFunc(r.Context(), cancel)
	return ctx, func() { stopSession(); cancel() }, detach
}

// isRoundMethod reports whether a stateless call to an upstream of an
// earlier revision may be held between rounds.
func isRoundMethod(method string) bool { return slices.Contains(mcp2026.RoundMethods, method) }

// rounds relays the held call's stream to cur, the runner's current
// request (the first round, or a retry): notifications on the runner's
// stream, the first server→client request as input_required (the call is
// then held), or the answer, renumbered to cur's id.
func (h *Handler) rounds(w http.ResponseWriter, r *http.Request, cur *gateway.Call, hc *heldCall) {
	held := false
	defer func() {
		if !held {
			hc.rs.close()
			hc.cancel()
			hc.room.Release() // the first round's body, kept while the call was held
			hc.room = nil
		}
	}()
	var out *sseWriter
	if hc.rs.sse != nil && acceptsSSE(r) {
		out = newSSEWriter(w)
		defer h.keepAlive(out, cur.Service)()
	}
	for {
		msg, err := hc.rs.next()
		if err != nil {
			why := "the upstream ended its stream without answering"
			var ue *upstreamError
			switch {
			case hc.call.MCPSession.Closed():
				why = "the MCP session was ended while the request was in progress"
			case r.Context().Err() != nil:
				why = "the client went away"
			case errors.As(err, &ue):
				why = ue.msg
			}
			code, text, data := streamFailure(err, why)
			h.finalStateless(w, out, message{gateway.RPCError(cur.Message.ID, code, text, data)}, 0)
			h.cancelUpstream(hc.call, hc.up, why)
			return
		}
		switch {
		case isResponseTo(msg, hc.call.Message.ID):
			if cur != hc.call {
				if msg, err = mcpmsg.Parse(mcpmsg.ReplaceMember(msg.Raw, "id", cur.Message.ID), h.limits); err != nil {
					cur.Unavailable(w, "toolgate could not renumber the upstream's answer")
					return
				}
			}
			h.finalStateless(w, out, h.deliver(hc.rs.ctx, cur, hc.rs.up, msg, false), hc.rs.status)
			hc.rs.awaitEnd()
			return
		case msg.Kind == mcpmsg.Request:
			var done bool
			if held, done = h.askRunner(w, r, cur, hc, msg, out); done {
				return
			}
		case msg.Kind == mcpmsg.Notification && out == nil:
			h.noted(cur, msg)
		default:
			data := h.deliver(hc.rs.ctx, cur, hc.rs.up, msg, false)
			if !data.none() && out != nil && out.send("", data.parts()...) != nil {
				h.cancelUpstream(hc.call, hc.up, "the runner went away")
				return
			}
		}
	}
}

// askRunner turns the upstream's server→client request msg into an input
// request for the runner and holds the call (held). A request the runner
// could not answer — a method the revision has no input request for, one
// the policy withheld — is refused to the upstream, which may go on
// (neither held nor done); one that needs a capability the runner did not
// declare ends the call, and the runner gets MissingRequiredClientCapability
// (done).
func (h *Handler) askRunner(w http.ResponseWriter, r *http.Request, cur *gateway.Call, hc *heldCall, msg mcpmsg.Message, out *sseWriter) (held, done bool) {
	if !slices.Contains(mcp2026.InputMethods, msg.Method) {
		h.refuseServerRequest(hc.call, hc.up, msg, "toolgate has no input request of protocol "+mcp2026.Version+" for "+msg.Method)
		return false, false
	}
	undeclared := func(params []byte) bool {
		need, declared := mcp2026.RequiredCapability(cur.Stateless.Capabilities, msg.Method, gjson.ParseBytes(params))
		if declared {
			return false
		}
		h.refuseServerRequest(hc.call, hc.up, msg, "the client did not declare the capability "+msg.Method+" needs")
		h.cancelUpstream(hc.call, hc.up, "the client cannot answer "+msg.Method)
		h.finalStateless(w, out, message{gateway.RPCError(cur.Message.ID, mcp2026.CodeMissingRequiredClientCapability,
			"the server needs client capabilities this request did not declare", mcp2026.MissingCapability(need))}, 0)
		return true
	}
	// Checked before the policy sees the request, and again on what the
	// policy made of it.
	if undeclared(msg.Params) {
		return false, true
	}
	raw, ok := h.inspect(hc.rs.ctx, cur, msg, gateway.ChannelServerRequest)
	if !ok {
		h.refuseServerRequest(hc.call, hc.up, msg, "toolgate's policy withheld "+msg.Method+" from the client")
		return false, false
	}
	params := mcpmsg.MemberOf(raw, "params")
	if params == nil {
		params = []byte("{}") // clients decode an input request's params (a roots/list may have none)
	}
	if undeclared(params) {
		return false, true
	}
	hc.seq++
	hc.asked = append(hc.asked, asked{id: msg.ID,
		input: mcp2026.InputRequest{Key: "upstream-" + strconv.Itoa(hc.seq), Method: msg.Method, Params: params}})
	if !hc.letGo() {
		h.refuseServerRequest(hc.call, hc.up, msg, "the client went away")
		h.cancelUpstream(hc.call, hc.up, "the client went away")
		return false, true
	}
	return h.hold(w, r, cur, hc, out), true
}

// hold holds the call for the runner's retry and answers cur (the request
// r) with the input requests still unanswered. It reports whether the call
// is held. The held call takes r's stream place over.
func (h *Handler) hold(w http.ResponseWriter, r *http.Request, cur *gateway.Call, hc *heldCall, out *sseWriter) bool {
	deadline, _ := hc.rs.ctx.Deadline()
	fail := func(why string) bool {
		h.logger.Warn("cannot hold a call for its client's input", zap.String("service", cur.Service.ID), zap.String("reason", why))
		for _, a := range hc.asked {
			h.refuseServerRequest(hc.call, hc.up, mcpmsg.Message{ID: a.id, Method: a.input.Method}, why)
		}
		h.cancelUpstream(hc.call, hc.up, why)
		h.finalStateless(w, out, message{gateway.RPCError(cur.Message.ID, gateway.CodeUnavailable, why, gateway.Retryable)}, 0)
		return false
	}
	owner := mcp2026.Owner(cur)
	hc.slot = placeOf(r)
	if hc.room == nil { // the first round: the call keeps this body
		hc.room = cur.Room.Handover()
	}
	if hc.slot == nil {
		slot, err := h.app.OpenStream(cur.Caller.User)
		if err != nil {
			hc.freeSlot()
			return fail(err.Error())
		}
		hc.slot = slot
	}
	id, err := h.stateless.Hold(owner, hc, deadline)
	if err != nil {
		hc.freeSlot()
		return fail(err.Error())
	}
	// Its MCP session ending (with the toolgate session it was made in)
	// gives it up at once: no retry can continue it any more.
	hc.unwatch = context.AfterFunc(hc.call.MCPSession.Context(), func() {
		if x := h.stateless.Take(id, owner); x != nil {
			x.Release("the client's session ended")
		}
	})
	held := mcp2026.StateOf(cur.Caller.User, gateway.SessionRef(cur.Session.ID), cur.Service.ID, cur.Message)
	held.Held = id
	held.Inputs = make(map[string]string, len(hc.asked))
	for _, a := range hc.asked {
		held.Inputs[a.input.Key] = a.input.Method
	}
	state, err := h.stateless.Seal(held, time.Until(deadline))
	if err != nil {
		h.stateless.Take(id, owner)
		hc.freeSlot()
		return fail("toolgate could not seal the requestState")
	}
	inputs := make([]mcp2026.InputRequest, len(hc.asked))
	for i, a := range hc.asked {
		inputs[i] = a.input
	}
	h.finalStateless(w, out, message{gateway.RPCResult(cur.Message.ID, mcp2026.InputRequired(inputs, state))}, 0)
	return true
}

// continueHeld serves a retry whose requestState names a held call: the
// runner's input responses answer the upstream's requests, and the call's
// stream is relayed on (rounds).
func (h *Handler) continueHeld(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	hc, _ := h.stateless.Take(call.Stateless.Held, mcp2026.Owner(call)).(*heldCall)
	if hc == nil {
		gateway.WriteRPCError(w, http.StatusBadRequest, call.Message.ID, gateway.CodeInvalidParams,
			"requestState refused: the call it continues is no longer held (it timed out, or another replica of the gateway holds it); send the call again without it", nil)
		return
	}
	if hc.unwatch != nil {
		hc.unwatch()
		hc.unwatch = nil
	}
	if !bytes.Equal(decidedArguments(call), decidedArguments(hc.call)) {
		// The policy decides the retry otherwise than the call it would
		// continue (its rewrite changed since, as after a reload): the
		// upstream must not go on with arguments the policy no longer
		// decides.
		hc.Release("toolgate's policy now rewrites the call's arguments otherwise")
		gateway.WriteRPCError(w, http.StatusBadRequest, call.Message.ID, gateway.CodeInvalidParams,
			"requestState refused: toolgate's policy now decides other arguments for this call than those it was sent upstream with; send the call again without it", nil)
		return
	}
	hc.handOver(r) // the retry holds the call's place from now on
	hc.detach = context.AfterFunc(r.Context(), hc.cancel)
	c := *hc.call
	c.Credential = call.Credential // the current one: an OAuth token may have been refreshed
	hc.call = &c
	hc.rs.sent = append(hc.rs.sent, call.Credential) // the runner's input goes upstream with it
	responses := call.Message.InputResponses
	left := hc.asked[:0]
	for _, a := range hc.asked {
		answer := mcpmsg.MemberOf(responses, a.input.Key)
		if answer == nil {
			left = append(left, a) // asked again below
			continue
		}
		if answer[0] != '{' {
			hc.Release("the client's input response is not an object")
			gateway.WriteRPCError(w, http.StatusBadRequest, call.Message.ID, gateway.CodeInvalidParams,
				"inputResponses."+a.input.Key+" must be the result of "+a.input.Method+" (an object)", nil)
			return
		}
		msg := upstreamAnswer(a.id, answer)
		if call.Stateless.Withheld[a.input.Key] {
			// The request policy withheld this answer: the upstream learns
			// so at once, and gets nothing of the runner's.
			msg = gateway.RPCError(a.id, gateway.CodePolicyDenied, "the client's answer was withheld by toolgate's policy", nil)
		}
		resp, err := h.exchange(hc.rs.ctx, hc.call, hc.up, http.MethodPost, msg, "")
		if hc.call.Credential != call.Credential {
			// Refreshed after the upstream refused the token: what the
			// upstream sends from now on is searched for the fresh one
			// too, on the call's stream and in what the retry answers
			// (the refused one its connection keeps as retired).
			hc.rs.sent = append(hc.rs.sent, hc.call.Credential)
			call.Credential = hc.call.Credential
		}
		if err != nil {
			hc.Release("toolgate could not pass the client's input on")
			h.answerError(w, r, call, err)
			return
		}
		drain(resp)
	}
	hc.asked = left
	if len(left) > 0 {
		if !hc.letGo() {
			hc.Release("the client went away")
		} else if !h.hold(w, r, call, hc, nil) {
			hc.rs.close()
			hc.cancel()
		}
		return
	}
	h.rounds(w, r, call, hc)
}

// decidedArguments are the arguments of a tools/call as the request policy
// decided them: its rewrite, or the runner's own.
func decidedArguments(call *gateway.Call) []byte {
	if call.Arguments != nil {
		return call.Arguments
	}
	return call.Message.Arguments
}

// upstreamAnswer is the JSON-RPC response to the upstream's request id.
func upstreamAnswer(id, result []byte) []byte {
	b := make([]byte, 0, 40+len(id)+len(result))
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	return append(b, '}')
}

// finalStateless writes the answer to a stateless runner's request: as an
// event when the runner gets a stream (out), else as a JSON body with the
// upstream's HTTP status (status, 0 for 200). MissingRequiredClientCapability
// goes out with HTTP 400, as the revision says, unless the stream has
// started already.
func (h *Handler) finalStateless(w http.ResponseWriter, out *sseWriter, data message, status int) {
	missing := data[1] == nil && gjson.GetBytes(data[0], "error.code").Int() == mcp2026.CodeMissingRequiredClientCapability
	if out != nil && (!missing || out.hasStarted()) {
		_ = out.sendLast("", data.parts()...)
		return
	}
	if status == 0 {
		status = http.StatusOK
		if missing {
			status = http.StatusBadRequest
		}
	}
	gateway.WriteRPC(w, status, data.parts()...)
	_ = http.NewResponseController(w).Flush()
}
