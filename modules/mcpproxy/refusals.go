package mcpproxy

import (
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// refusals counts the refusals of server→client requests in flight, by MCP
// session: an upstream asking what the runner cannot get, request after
// request, and never acknowledging the refusals, would otherwise hold a
// goroutine and a connection for each until the service's timeout. One
// count for the process: an MCP session outlives the handlers of a
// configuration a reload replaced.
type refusals struct {
	mu sync.Mutex
	n  map[*gateway.MCPSession]int
}

var inFlight refusals

// maxRefusals bounds the refusals in flight of one MCP session. Past it a
// request is dropped unanswered: the upstream waits for it until its own
// timeout, as it would for a runner that never answers.
const maxRefusals = 8

func (r *refusals) start(ms *gateway.MCPSession) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[*gateway.MCPSession]int{}
	}
	if r.n[ms] >= maxRefusals {
		return false
	}
	r.n[ms]++
	return true
}

func (r *refusals) done(ms *gateway.MCPSession) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n[ms]--; r.n[ms] <= 0 {
		delete(r.n, ms)
	}
}

// refuseServerRequest answers a server→client request the runner cannot
// get with a JSON-RPC error at once, so the upstream does not wait for it
// until its timeout: in the upstream session from, which asked it (never
// in one that replaced it, whose request of the same id is another). At
// most maxRefusals of an MCP session are in flight; past them a request
// is dropped.
func (h *Handler) refuseServerRequest(call *gateway.Call, from gateway.Upstream, msg mcpmsg.Message, why string) {
	ms := call.MCPSession
	method := mcpmsg.LoggedMethod(msg.Method)
	if !inFlight.start(ms) {
		h.logger.Debug("dropped a server request: too many refusals in flight", zap.String("service", call.Service.ID), zap.String("method", method))
		return
	}
	h.logger.Warn("refused a server request", zap.String("service", call.Service.ID), zap.String("method", method),
		zap.String("reason", strings.ReplaceAll(why, msg.Method, method)))
	h.background(call, from, gateway.RPCError(msg.ID, gateway.CodeMethodNotFound, why, nil), func() { inFlight.done(ms) })
}
