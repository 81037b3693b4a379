package mcp2026

import (
	"sync"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// A runner of an earlier revision in front of an upstream of the stateless
// revision only: toolgate speaks the stateless revision upstream for it.
// The upstream's era is learned once per service (Era), as the revision
// asks of clients that speak both: from the first discovery a
// server/discover probe gets (any other answer may be the upstream's to
// one caller only, and is not kept), for the configuration's life. The upstream's input_required
// results become server→client requests on the runner's stream, whose
// answers (responses the runner posts in its MCP session) toolgate awaits
// here (Expect, Answer) to retry the upstream request with them.

// eras caches what each service's upstream speaks.
type eras struct {
	mu sync.Mutex
	m  map[string]bool // service → the upstream speaks only the stateless revision
}

// Era returns what toolgate learned of the service's upstream: whether it
// speaks only the stateless revision (modernOnly), and whether it was
// learned yet (known).
func (rt *Runtime) Era(service string) (modernOnly, known bool) {
	rt.eras.mu.Lock()
	defer rt.eras.mu.Unlock()
	modernOnly, known = rt.eras.m[service]
	return modernOnly, known
}

// SetEra records what the service's upstream speaks.
func (rt *Runtime) SetEra(service string, modernOnly bool) {
	rt.eras.mu.Lock()
	defer rt.eras.mu.Unlock()
	if rt.eras.m == nil {
		rt.eras.m = map[string]bool{}
	}
	rt.eras.m[service] = modernOnly
}

// answers routes a runner's responses to the requests toolgate made of it.
type answers struct {
	mu sync.Mutex
	m  map[string]chan []byte
}

func answerKey(session string, id []byte) string { return session + "\x00" + mcpmsg.IDKey(id) }

// Expect prepares for the runner's response to the request with id that
// toolgate sends it in MCP session session. The response arrives on the
// channel; done forgets the request.
func (rt *Runtime) Expect(session string, id []byte) (answer <-chan []byte, done func()) {
	ch := make(chan []byte, 1)
	key := answerKey(session, id)
	rt.answers.mu.Lock()
	if rt.answers.m == nil {
		rt.answers.m = map[string]chan []byte{}
	}
	rt.answers.m[key] = ch
	rt.answers.mu.Unlock()
	return ch, func() {
		rt.answers.mu.Lock()
		delete(rt.answers.m, key)
		rt.answers.mu.Unlock()
	}
}

// Answer hands the runner's response msg (JSON text) to the request with
// id it answers, and reports whether toolgate was waiting for it.
func (rt *Runtime) Answer(session string, id, msg []byte) bool {
	key := answerKey(session, id)
	rt.answers.mu.Lock()
	ch := rt.answers.m[key]
	delete(rt.answers.m, key)
	rt.answers.mu.Unlock()
	if ch == nil {
		return false
	}
	ch <- msg
	return true
}

// LegacyMeta is the _meta of the stateless revision for a request toolgate
// sends for a runner of an earlier revision: the capabilities and the
// identity the runner declared in its initialize (params, JSON text).
func LegacyMeta(initParams []byte) [][2][]byte {
	caps := mcpmsg.MemberOf(initParams, "capabilities")
	if caps == nil || caps[0] != '{' {
		caps = []byte("{}")
	}
	out := [][2][]byte{
		{[]byte(MetaProtocolVersion), mcpmsg.Quote(Version)},
		{[]byte(MetaClientCapabilities), caps},
	}
	if info := mcpmsg.MemberOf(initParams, "clientInfo"); info != nil && info[0] == '{' {
		out = append(out, [2][]byte{[]byte(MetaClientInfo), info})
	}
	return out
}

// WithMeta returns params (JSON text of an object, or nil) with the
// members of meta set in its _meta, for a request toolgate sends for a
// runner of an earlier revision. The runner's own members of the
// revision's namespace (io.modelcontextprotocol/…, such as a logLevel,
// which stands for a logging/setLevel the policy did not decide) are
// left out: they are toolgate's to set.
func WithMeta(params []byte, meta [][2][]byte) []byte {
	if params == nil || params[0] != '{' {
		params = []byte("{}")
	}
	m := mcpmsg.MemberOf(params, "_meta")
	if m == nil || m[0] != '{' {
		m = []byte("{}")
	}
	m = mcpmsg.RemoveMembersWithPrefix(m, metaNamespace)
	for _, kv := range meta {
		m = mcpmsg.ReplaceMember(m, string(kv[0]), kv[1])
	}
	return mcpmsg.ReplaceMember(params, "_meta", m)
}
