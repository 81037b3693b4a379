package mcpproxy

import (
	"context"
	"net/http"
	"time"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Cancellations: the runner's, sent where its request went, and
// toolgate's own, for a request it gave up on; and the other messages
// toolgate posts upstream in the background.

// cancelInProgress sends the runner's notifications/cancelled of a
// request of its in progress here to the upstream session the request
// went to (mcpsession.Session.SentIn), whatever replaced it since, and
// reports whether it did: a cancellation of anything else takes the
// ordinary way. A runner that reused the id of a request in progress
// (JSON-RPC forbids it) has it sent to each session one of them went to.
func (h *Handler) cancelInProgress(ctx context.Context, call *gateway.Call) bool {
	if call.Method != "notifications/cancelled" {
		return false
	}
	_, id := mcpmsg.MemberFold(call.Message.Params, "requestId")
	sentIn := call.MCPSession.RequestsSentIn(id)
	for _, sent := range sentIn {
		h.cancelIn(ctx, call, id, sent)
	}
	return len(sentIn) > 0
}

// cancelIn sends the runner's cancellation of its request id to sent, the
// upstream session the request went to. A session gone (404) runs
// nothing: the request, which it never processed, is re-sent into the
// session replacing it, or is on its way there. It is then kept from it,
// or, if it went there already, the cancellation follows it (CancelGone).
// Best effort, as the protocol has it: an upstream that cannot be reached
// is not told.
func (h *Handler) cancelIn(ctx context.Context, call *gateway.Call, id []byte, sent gateway.Upstream) {
	for range 2 { // the session the request went to, then the one it went to after
		resp, err := h.exchange(ctx, call, sent, http.MethodPost, call.Message.Raw, "")
		if err == nil {
			drain(resp)
			return
		}
		if !isKind(err, kindSessionGone) {
			return
		}
		next, err := h.reinitialize(ctx, call, sent)
		if err != nil {
			return
		}
		var ok bool
		if sent, ok = call.MCPSession.CancelGone(id, sent, next); !ok {
			return
		}
	}
}

// cancelUpstream tells the upstream to stop working on the runner's request,
// which toolgate gave up on (timeout, broken stream, malformed answer, or a
// runner gone for good). Best effort, in the background.
func (h *Handler) cancelUpstream(call *gateway.Call, up gateway.Upstream, why string) {
	if !call.IsRequest() || call.Method == "initialize" || call.MCPSession.Closed() {
		return
	}
	if up.ProtocolVersion == mcp2026.Version {
		return // closing the request's stream, done already, is the cancellation
	}
	body := make([]byte, 0, 128)
	body = append(body, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":`...)
	body = append(body, call.Message.ID...)
	body = append(body, `,"reason":`...)
	body = mcpmsg.AppendQuote(body, "toolgate gave up on the request: "+why)
	body = append(body, `}}`...)
	h.background(call, up, body, nil)
}

// background posts a message of toolgate's own upstream, within the
// service timeout, without waiting for it; then calls done, if not nil.
func (h *Handler) background(call *gateway.Call, up gateway.Upstream, body []byte, done func()) {
	c := *call // exchange may replace the credential
	call = &c
	go func() {
		if done != nil {
			defer done()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(call.Service.Timeout))
		defer cancel()
		if resp, err := h.exchange(ctx, call, up, http.MethodPost, body, ""); err == nil {
			drain(resp)
		}
	}()
}
