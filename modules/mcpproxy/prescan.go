package mcpproxy

import (
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A large answer (a megabyte of text) waits in toolgate for its strict
// parse and then for the credential search, each a pass over every byte
// while the runner waits for both. The search's passes over the raw
// bytes (the credential's pieces, escapes that can hide them, bytes
// outside ASCII) do not need the parse, so they run on another core while
// the parse does (parseRedacted); what they found is used only for the
// very bytes they read.

// prescanMin is the size from which an answer's raw bytes are searched
// while it is parsed: below it, the goroutine costs more than the overlap
// saves.
const prescanMin = 64 << 10

// rawFacts is what redactedSecret reads of a message's raw bytes alone,
// for one secret.
type rawFacts struct {
	found      uint8 // needleSet.groupsIn
	rawEscapes bool  // hidingEscapes
	ascii      int8  // isASCII: 1 or 0; -1 not read yet
}

func (f *rawFacts) isASCII(raw []byte) bool {
	if f.ascii < 0 {
		f.ascii = 0
		if isASCII(raw) {
			f.ascii = 1
		}
	}
	return f.ascii == 1
}

// factsOf reads the facts of raw for secret, leaving ASCII for when it is
// needed.
func factsOf(needles *credentialNeedles, raw []byte) rawFacts {
	return rawFacts{found: needles.set.groupsIn(raw), rawEscapes: hidingEscapes(raw), ascii: -1}
}

// prescan is the facts of one message's raw bytes for each of a
// credential's secrets, read on a goroutine of their own.
type prescan struct {
	raw     []byte
	secrets []string
	facts   []rawFacts
	done    chan struct{}
}

func startPrescan(c *gateway.Credential, raw []byte) *prescan {
	p := &prescan{raw: raw, done: make(chan struct{})}
	c.EachSecret(func(s string) bool { p.secrets = append(p.secrets, s); return true })
	go func() {
		defer close(p.done)
		p.facts = make([]rawFacts, len(p.secrets))
		shared := rawFacts{rawEscapes: hidingEscapes(raw), ascii: -1}
		shared.isASCII(raw) // here rather than after the parse
		for i, s := range p.secrets {
			p.facts[i] = shared
			p.facts[i].found = needlesOf(s).set.groupsIn(raw)
		}
	}()
	return p
}

// of is the facts read for secret, when they are of raw's very bytes (the
// message not redacted since); nil otherwise.
func (p *prescan) of(secret string, raw []byte) *rawFacts {
	if p == nil || len(raw) != len(p.raw) || len(raw) == 0 || &raw[0] != &p.raw[0] {
		return nil
	}
	for i, s := range p.secrets {
		if s == secret {
			f := p.facts[i]
			return &f
		}
	}
	return nil
}

// parseRedacted is the upstream's message raw parsed strictly, with the
// call's credential redacted (redactCredential); a large one is searched
// while it is parsed.
func (h *Handler) parseRedacted(call *gateway.Call, raw []byte) (mcpmsg.Message, error) {
	var pre *prescan
	if len(raw) >= prescanMin && secretOf(call.Credential) != "" {
		pre = startPrescan(call.Credential, raw)
	}
	msg, err := mcpmsg.Parse(raw, h.limits)
	if pre != nil {
		<-pre.done // raw is not the goroutine's once this returns
	}
	if err != nil {
		return msg, err
	}
	out, changed, err := h.redacted(call, msg, pre)
	h.logRedacted(call, out, changed)
	if err == nil && out.Extra {
		// Members beside JSON-RPC's would reach the runner unseen by
		// the result policy, which reads result, error or params.
		out, err = mcpmsg.Parse(out.WithoutExtra(), h.limits)
	}
	return out, err
}
