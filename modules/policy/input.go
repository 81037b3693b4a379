package policy

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
	"weak"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Input documents are built straight into OPA's AST from the raw JSON the
// runner sent (already checked by mcpmsg: no duplicate keys, one reading),
// without an intermediate map[string]any (see json.go). Per call only what
// changes per call is built: the caller, the request, the time, the
// arguments, once for both stages (see requestMembers); the service,
// session and tool definition terms are built once and shared (OPA only
// reads its input).

var (
	keyCaller    = ast.StringTerm("caller")
	keySession   = ast.StringTerm("session")
	keyService   = ast.StringTerm("service")
	keyMethod    = ast.StringTerm("method")
	keyTool      = ast.StringTerm("tool")
	keyToolKnown = ast.StringTerm("tool_known")
	keyArguments = ast.StringTerm("arguments")
	keyParams    = ast.StringTerm("params")
	keyListing   = ast.StringTerm("listing")
	keyRequest   = ast.StringTerm("request")
	keyTime      = ast.StringTerm("time")
	keyResult    = ast.StringTerm("result")
	keyError     = ast.StringTerm("error")
	keyScan      = ast.StringTerm("scan")
	keyUser      = ast.StringTerm("user")
	keyGroups    = ast.StringTerm("groups")
	keyClaims    = ast.StringTerm("claims")
	keyID        = ast.StringTerm("id")
	keyServices  = ast.StringTerm("services")
	keyImplied   = ast.StringTerm("implied")
	keyAuth      = ast.StringTerm("auth")
	keyTools     = ast.StringTerm("tools")
	keyName      = ast.StringTerm("name")
	keyRemoteIP  = ast.StringTerm("remote_ip")
	keyProtocol  = ast.StringTerm("protocol_version")
)

// requestInput builds the request-stage input for call. tool is the tool
// definition for tools/call (nil when unknown); listing marks the
// evaluation of a tool's visibility in tools/list (no arguments then).
func requestInput(call *gateway.Call, tool *ast.Term, listing bool) (ast.Object, error) {
	return inputFor(commonItems(call), call, tool, listing)
}

// requestMembers are the members of a request-stage input, kept on the
// call (gateway.Call.RequestInput) for its result stage, whose input has
// the same members besides its own (channel, result, scan): the caller,
// session, service, tool and arguments terms are looked up and built once
// per call instead of twice. They are what the request stage saw: a
// result stage that sees other arguments (a policy's rewrite) or a tool
// definition found since builds its own.
type requestMembers struct {
	of    *gateway.Call // the call they were built for (not a copy of it)
	items [][2]*ast.Term
	args  []byte                  // the arguments the items hold
	tool  *gateway.ToolDefinition // the definition the tool term was built from
}

// recordRequestInput builds the request-stage input for a runner's
// request and keeps its members on call for the result stage.
func recordRequestInput(call *gateway.Call, tool *ast.Term) (ast.Object, error) {
	items, err := inputItems(commonItems(call), call, tool, false)
	if err != nil {
		return nil, err
	}
	if len(call.Message.Params)+len(call.Arguments) <= keepMembersMax { // the runner's text and a rewrite's
		call.RequestInput = &requestMembers{of: call, items: items, args: argumentsOf(call), tool: call.Tool}
	}
	return ast.NewObject(items...), nil
}

// keepMembersMax bounds the text whose terms the request stage keeps for
// the whole call (the upstream's work, an approval's wait): larger
// arguments are parsed again for the result stage rather than held. Terms
// take up to about 45 times the text they are built from (an array of
// empty arrays), so the members of a call hold at most about 200 KiB
// (TestKeptMembersAreBoundedInMemory); the small calls whose decisions
// the reuse speeds up send far less.
const keepMembersMax = 4 << 10

// requestMembersOf are the members the request stage kept on call, when
// they still describe it; nil otherwise.
func requestMembersOf(call *gateway.Call) *requestMembers {
	m, _ := call.RequestInput.(*requestMembers)
	if m == nil || m.of != call || !sameBytes(m.args, argumentsOf(call)) || call.Method == "tools/call" && m.tool != call.ToolDefinition() {
		return nil
	}
	return m
}

// sameBytes reports whether a and b are the same slice of memory (not
// merely equal text: a rewrite is a new slice).
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// argumentsOf are the arguments of a tools/call as they go upstream: a
// rewrite (seen by the result stage) or the runner's own.
func argumentsOf(call *gateway.Call) []byte {
	if call.Arguments != nil {
		return call.Arguments
	}
	return call.Message.Arguments
}

// commonItems are the members every input of call has, whatever is
// evaluated: caller, session, service, request and time. The caller,
// session and service terms are built once per Caller, Session and Service
// (authentication shares one Caller per API key or JWT; the session store
// and the registry share theirs) and reused while those live.
func commonItems(call *gateway.Call) [][2]*ast.Term {
	items := make([][2]*ast.Term, 5, 10)
	items[0] = ast.Item(keyCaller, callerTerms.get(call.Caller, callerTerm))
	items[1] = ast.Item(keySession, sessionTerms.get(call.Session, sessionTerm))
	items[2] = ast.Item(keyService, serviceTerms.get(call.Service, serviceTerm))
	items[3] = ast.Item(keyRequest, requestTerm(call.RemoteIP, call.ProtocolVersion))
	items[4] = ast.Item(keyTime, timeTerm(call.Started))
	return items
}

// inputFor completes common (which it does not change) for one evaluation.
func inputFor(common [][2]*ast.Term, call *gateway.Call, tool *ast.Term, listing bool) (ast.Object, error) {
	items, err := inputItems(common, call, tool, listing)
	if err != nil {
		return nil, err
	}
	return ast.NewObject(items...), nil
}

// inputItems are the members of inputFor.
func inputItems(common [][2]*ast.Term, call *gateway.Call, tool *ast.Term, listing bool) ([][2]*ast.Term, error) {
	items := append(common[:len(common):len(common)], ast.Item(keyListing, ast.InternedTerm(listing)))
	switch {
	case listing:
		items = append(items, ast.Item(keyMethod, toolsCall), ast.Item(keyTool, tool), ast.Item(keyToolKnown, ast.InternedTerm(true)))
	case call.Method == "tools/call":
		// tool_known tells a definition from a bare name: the upstream's
		// tools could not be listed (in time) before this call.
		known := call.ToolDefinition() != nil
		items = append(items, ast.Item(keyMethod, toolsCall), ast.Item(keyTool, tool), ast.Item(keyToolKnown, ast.InternedTerm(known)))
		args := ast.InternedEmptyObject
		if raw := argumentsOf(call); raw != nil {
			var err error
			if args, err = jsonTerm(raw); err != nil {
				return nil, fmt.Errorf("arguments: %w", err)
			}
		}
		items = append(items, ast.Item(keyArguments, args))
		var err error
		if items, err = roundItems(items, call); err != nil {
			return nil, err
		}
	default:
		items = append(items, ast.Item(keyMethod, ast.StringTerm(call.Method)))
		if call.Message.Params != nil {
			params, err := jsonTerm(call.Message.Params)
			if err != nil {
				return nil, fmt.Errorf("params: %w", err)
			}
			items = append(items, ast.Item(keyParams, params))
		}
		if call.Message.Kind == mcpmsg.Request {
			var err error
			if items, err = roundItems(items, call); err != nil {
				return nil, err
			}
		}
		// A runner's answer to a server→client request (method is the
		// request's): what it hands the upstream — form values, roots,
		// a sampled message — under result, or its error under error.
		for _, m := range [...]struct {
			key *ast.Term
			raw []byte
		}{{keyResult, call.Message.Result}, {keyError, call.Message.Error}} {
			if call.Message.Kind != mcpmsg.Response || m.raw == nil {
				continue
			}
			v, err := jsonTerm(m.raw)
			if err != nil {
				return nil, fmt.Errorf("the answer: %w", err)
			}
			items = append(items, ast.Item(m.key, v))
		}
	}
	return items, nil
}

var toolsCall = ast.StringTerm("tools/call")

func callerTerm(c *gateway.Caller) *ast.Term {
	groups := make([]*ast.Term, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = ast.StringTerm(g)
	}
	claims := ast.InternedEmptyObject
	if len(c.Claims) > 0 {
		if v, err := ast.InterfaceToValue(c.Claims); err == nil {
			claims = ast.NewTerm(v)
		}
	}
	return ast.ObjectTerm(
		ast.Item(keyUser, ast.StringTerm(c.User)),
		ast.Item(keyGroups, ast.ArrayTerm(groups...)),
		ast.Item(keyClaims, claims),
	)
}

func sessionTerm(s *gateway.Session) *ast.Term {
	services := make([]*ast.Term, len(s.Services))
	for i, id := range s.Services {
		services[i] = ast.StringTerm(id)
	}
	return ast.ObjectTerm(
		ast.Item(keyID, ast.StringTerm(s.ID)),
		ast.Item(keyServices, ast.ArrayTerm(services...)),
		ast.Item(keyImplied, ast.InternedTerm(s.Implied)),
	)
}

// timeTerm is t in RFC 3339, UTC, whole seconds; calls within one second
// share it.
func timeTerm(t time.Time) *ast.Term {
	sec := t.Unix()
	if last := lastTime.Load(); last != nil && last.sec == sec {
		return last.term
	}
	next := &timeMemo{sec: sec, term: ast.StringTerm(t.UTC().Format(time.RFC3339))}
	lastTime.Store(next)
	return next.term
}

// requestTerm is input.request: the runner's address and protocol
// version. Calls from one runner share it (the last one built is kept;
// terms are only read).
func requestTerm(remoteIP, protocol string) *ast.Term {
	if last := lastRequest.Load(); last != nil && last.remoteIP == remoteIP && last.protocol == protocol {
		return last.term
	}
	next := &requestMemo{remoteIP: remoteIP, protocol: protocol, term: ast.ObjectTerm(
		ast.Item(keyRemoteIP, ast.StringTerm(remoteIP)),
		ast.Item(keyProtocol, ast.StringTerm(protocol)),
	)}
	lastRequest.Store(next)
	return next.term
}

type requestMemo struct {
	remoteIP, protocol string
	term               *ast.Term
}

var lastRequest atomic.Pointer[requestMemo]

type timeMemo struct {
	sec  int64
	term *ast.Term
}

var lastTime atomic.Pointer[timeMemo]

func serviceTerm(s *gateway.Service) *ast.Term {
	tools := make([]*ast.Term, len(s.Tools))
	for i, t := range s.Tools {
		tools[i] = ast.StringTerm(t)
	}
	auth := gateway.AuthNone
	if s.Auth != nil {
		auth = s.Auth.Kind
	}
	return ast.ObjectTerm(
		ast.Item(keyID, ast.StringTerm(s.ID)),
		ast.Item(keyAuth, ast.StringTerm(auth)),
		ast.Item(keyTools, ast.ArrayTerm(tools...)),
	)
}

// Registry services live as long as their configuration, sessions as long
// as the session store caches them, callers as long as their API key's
// configuration or their JWT's verdict; a call points at them. What is built
// from them is built once and dropped with them.
var (
	serviceTerms weakCache[gateway.Service, *ast.Term]
	sessionTerms weakCache[gateway.Session, *ast.Term]
	callerTerms  weakCache[gateway.Caller, *ast.Term]
)

// weakCache keeps what was built from a long-lived value for as long as
// the value lives. The value must not change after that; terms are only
// read, so one term serves concurrent evaluations.
type weakCache[K, V any] struct{ m sync.Map } // weak.Pointer[K] → V

func (c *weakCache[K, V]) get(k *K, build func(*K) V) V {
	wk := weak.Make(k)
	if v, ok := c.m.Load(wk); ok {
		return v.(V)
	}
	v, loaded := c.m.LoadOrStore(wk, build(k))
	if !loaded {
		runtime.AddCleanup(k, func(wk weak.Pointer[K]) { c.m.Delete(wk) }, wk)
	}
	return v.(V)
}
