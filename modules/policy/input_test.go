package policy

import (
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
