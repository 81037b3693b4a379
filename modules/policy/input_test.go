package policy

import (
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/modules/gateway"
)

func callerOf(t *testing.T, call *gateway.Call) *ast.Term {
	t.Helper()
	in, err := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
	if err != nil {
		t.Fatal(err)
	}
	return in.Get(keyCaller)
}

// A Caller's term is built once and reused while the Caller lives;
// another Caller (another key, another token) gets its own.
func TestCallerTermsFollowTheCaller(t *testing.T) {
	call := benchCall(t, benchTool, `{}`)
	first := callerOf(t, call)
	if again := callerOf(t, call); again != first {
		t.Error("the same caller got a new term")
	}
	other := *call.Caller
	other.User, other.Groups = "bob@example.com", []string{"admins"}
	call.Caller = &other
	got := callerOf(t, call)
	if got == first || got.Value.Compare(callerTerm(&other).Value) != 0 {
		t.Errorf("another caller's term is %v, want %v", got, callerTerm(&other))
	}
}

func TestLongLivedTermsAreShared(t *testing.T) {
	call := benchCall(t, benchTool, `{}`)
	a, _ := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
	b, _ := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
	for _, k := range []*ast.Term{keyCaller, keySession, keyService, keyTool, keyTime} {
		if a.Get(k) != b.Get(k) {
			t.Errorf("%v is built for every call", k)
		}
	}
	other := *call.Service
	other.ID = "wiki"
	call.Service = &other
	c, _ := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
	if c.Get(keyService).Value.Compare(serviceTerm(&other).Value) != 0 {
		t.Errorf("service term %v for service wiki", c.Get(keyService))
	}
	call.Started = call.Started.Add(time.Second)
	d, _ := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
	if d.Get(keyTime).Value.Compare(ast.String("2026-11-30T10:00:01Z")) != 0 {
		t.Errorf("time %v", d.Get(keyTime))
	}
}

// The input says whether tool is the upstream's definition or only a name.
func TestInputSaysWhetherTheToolDefinitionIsKnown(t *testing.T) {
	call := benchCall(t, benchTool, `{}`)
	known, err := requestInput(call, toolTerm(call.ToolDefinition(), call.Message.Name, call.Service), false)
	if err != nil {
		t.Fatal(err)
	}
	if got := known.Get(keyToolKnown); got == nil || got.Value.Compare(ast.Boolean(true)) != 0 {
		t.Errorf("tool_known with a definition = %v", got)
	}
	call.Tool = nil
	unknown, err := requestInput(call, toolTerm(nil, call.Message.Name, call.Service), false)
	if err != nil {
		t.Fatal(err)
	}
	if got := unknown.Get(keyToolKnown); got == nil || got.Value.Compare(ast.Boolean(false)) != 0 {
		t.Errorf("tool_known without a definition = %v", got)
	}
}

// input.request is each call's own address and protocol version, shared
// between calls that have the same.
func TestRequestTermIsTheCalls(t *testing.T) {
	request := func(ip, protocol string) *ast.Term {
		call := benchCall(t, benchTool, `{}`)
		call.RemoteIP, call.ProtocolVersion = ip, protocol
		in, err := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
		if err != nil {
			t.Fatal(err)
		}
		return in.Get(keyRequest)
	}
	a := request("10.0.0.1", "2025-11-25")
	if b := request("10.0.0.1", "2025-11-25"); b != a {
		t.Error("the same address and version got a new term")
	}
	for _, c := range []struct{ ip, protocol, want string }{
		{"10.0.0.2", "2025-11-25", `{"protocol_version": "2025-11-25", "remote_ip": "10.0.0.2"}`},
		{"10.0.0.2", "2025-06-18", `{"protocol_version": "2025-06-18", "remote_ip": "10.0.0.2"}`},
		{"10.0.0.1", "2025-11-25", `{"protocol_version": "2025-11-25", "remote_ip": "10.0.0.1"}`},
	} {
		if got := request(c.ip, c.protocol).String(); got != c.want {
			t.Errorf("%s %s: input.request %s, want %s", c.ip, c.protocol, got, c.want)
		}
	}
}

// The result stage decides with the members its request stage built
// (looked up and parsed once per call), unless they no longer describe
// the call: a rewrite of the arguments, a tool definition found since, a
// copy of the call. Either way the input is the same as one built anew.
func TestResultInputReusesTheRequestMembers(t *testing.T) {
	payload := []byte(benchSmallResult)
	resultInput := func(call *gateway.Call) ast.Object {
		t.Helper()
		in, err := (&ResultHandler{}).input(nil, call, subject{channel: channelResult, method: "tools/call", view: call}, payload, map[*ast.Term]string{})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
	want := resultInput(call)
	request, err := recordRequestInput(call, toolTerm(call.ToolDefinition(), call.Message.Name, call.Service))
	if err != nil {
		t.Fatal(err)
	}
	got := resultInput(call)
	if got.Compare(want) != 0 || got.Get(keyArguments) != request.Get(keyArguments) {
		t.Errorf("with the request's members: %v (arguments shared: %t), want %v", got, got.Get(keyArguments) == request.Get(keyArguments), want)
	}

	copied := *call
	if got := resultInput(&copied); got.Compare(want) != 0 || got.Get(keyArguments) == request.Get(keyArguments) {
		t.Errorf("a copy of the call: %v, want its own members equal to %v", got, want)
	}

	call.Arguments = []byte(`{"ticket_id":"TEST-456"}`) // a rewrite
	if got := resultInput(call).Get(keyArguments); got.Value.Compare(ast.MustParseTerm(`{"ticket_id":"TEST-456"}`).Value) != 0 {
		t.Errorf("after a rewrite the result stage sees arguments %v", got)
	}
	call.Arguments = nil

	// The request stage ran before the upstream's tools were known.
	def := call.Tool
	call.Tool = nil
	if _, err := recordRequestInput(call, toolTerm(nil, call.Message.Name, call.Service)); err != nil {
		t.Fatal(err)
	}
	call.Tool = def
	if got := resultInput(call); got.Compare(want) != 0 {
		t.Errorf("with a definition found since: %v, want %v", got, want)
	}
}

// Large arguments are not held for the whole call: the result stage
// parses them again.
func TestLargeArgumentsAreNotKept(t *testing.T) {
	call := benchCall(t, benchTool, `{"ticket_id":"`+strings.Repeat("x", keepMembersMax)+`"}`)
	if _, err := recordRequestInput(call, toolTerm(call.ToolDefinition(), call.Message.Name, call.Service)); err != nil {
		t.Fatal(err)
	}
	if call.RequestInput != nil {
		t.Errorf("the members of %d bytes of arguments were kept", len(call.Message.Arguments))
	}
}

// The members kept for the result stage stay reachable for the whole call
// (the upstream's work, an approval's wait): whatever the arguments' shape
// under the bound, they hold at most 256 KiB.
func TestKeptMembersAreBoundedInMemory(t *testing.T) {
	const calls, most = 32, 256 << 10
	for _, shape := range []struct{ name, elem string }{
		{"short strings", `"a",`}, {"small objects", `{"a":0},`}, {"nested empty arrays", `[[]],`}, {"empty arrays", `[],`},
	} {
		args := `{"x":[` + strings.TrimSuffix(strings.Repeat(shape.elem, (keepMembersMax-200)/len(shape.elem)), ",") + `]}`
		// What the heap holds with the members kept and once they are
		// dropped, a moment later: the least of three tries, as memory
		// that other goroutines of the test binary hold meanwhile can only
		// add to the difference.
		held := make([]*gateway.Call, calls)
		members := int64(math.MaxInt64)
		for range 3 {
			for i := range held {
				call := benchCall(t, benchTool, args)
				if _, err := recordRequestInput(call, toolTerm(call.ToolDefinition(), call.Message.Name, call.Service)); err != nil {
					t.Fatal(err)
				}
				if call.RequestInput == nil {
					t.Fatalf("%s: the members of %d bytes of arguments were not kept", shape.name, len(call.Message.Arguments))
				}
				held[i] = call
			}
			var with, without runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&with)
			for _, call := range held {
				call.RequestInput = nil
			}
			runtime.GC()
			runtime.ReadMemStats(&without)
			members = min(members, (int64(with.HeapAlloc)-int64(without.HeapAlloc))/calls)
		}
		t.Logf("%s: the members of %d bytes of arguments hold %d bytes", shape.name, len(args), members)
		if members > most {
			t.Errorf("%s: the members of %d bytes of arguments hold %d bytes for the whole call, over %d", shape.name, len(args), members, most)
		}
	}
}
