package policy

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/modules/gateway"
)

func callerOf(t *testing.T, call *gateway.Call) *ast.Term {
	t.Helper()
	in, err := requestInput(call, toolTerm(call.Tool, call.Message.Name), false)
	if err != nil {
		t.Fatal(err)
	}
	return in.Get(keyCaller)
}

// The caller term of a session's previous call is reused only when the
// caller is the same in every detail.
func TestCallerTermsAreReusedOnlyWhenEqual(t *testing.T) {
	call := benchCall(t, benchTool, `{}`)
	call.Session = &gateway.Session{ID: "s-memo", Services: []string{"tracker"}}
	first := callerOf(t, call)

	same := *call.Caller // a new caller (as authentication makes one per request), equal in every detail
	same.Groups = append([]string(nil), call.Caller.Groups...)
	same.Claims = jsonCopy(call.Caller.Claims).(map[string]any)
	call.Caller = &same
	if again := callerOf(t, call); again != first {
		t.Error("an equal caller got a new term")
	}

	for name, change := range map[string]func(c *gateway.Caller){
		"user":         func(c *gateway.Caller) { c.User = "bob@example.com" },
		"groups":       func(c *gateway.Caller) { c.Groups = []string{"eng", "admins"} },
		"claim value":  func(c *gateway.Caller) { c.Claims["exp"] = json.Number("1796040001") },
		"nested claim": func(c *gateway.Caller) { c.Claims["groups"] = []any{"eng"} },
		"new claim":    func(c *gateway.Caller) { c.Claims["scope"] = "admin" },
		"no claims":    func(c *gateway.Caller) { c.Claims = nil },
	} {
		c := *call.Caller
		c.Claims = jsonCopy(call.Caller.Claims).(map[string]any)
		change(&c)
		call.Caller = &c
		got := callerOf(t, call)
		if want := callerTerm(&c); got.Value.Compare(want.Value) != 0 {
			t.Errorf("%s: caller term %v, want %v", name, got, want)
		}
		call.Caller = &same
		if callerOf(t, call).Value.Compare(first.Value) != 0 {
			t.Errorf("%s: back to the first caller, the term differs", name)
		}
	}
}

func TestLongLivedTermsAreShared(t *testing.T) {
	call := benchCall(t, benchTool, `{}`)
	a, _ := requestInput(call, toolTerm(call.Tool, call.Message.Name), false)
	b, _ := requestInput(call, toolTerm(call.Tool, call.Message.Name), false)
	for _, k := range []*ast.Term{keySession, keyService, keyTool, keyRequest, keyTime} {
		if a.Get(k) != b.Get(k) {
			t.Errorf("%v is built for every call", k)
		}
	}
	other := *call.Service
	other.ID = "wiki"
	call.Service = &other
	c, _ := requestInput(call, toolTerm(call.Tool, call.Message.Name), false)
	if c.Get(keyService).Value.Compare(serviceTerm(&other).Value) != 0 {
		t.Errorf("service term %v for service wiki", c.Get(keyService))
	}
	call.Started = call.Started.Add(time.Second)
	d, _ := requestInput(call, toolTerm(call.Tool, call.Message.Name), false)
	if d.Get(keyTime).Value.Compare(ast.String("2026-11-30T10:00:01Z")) != 0 {
		t.Errorf("time %v", d.Get(keyTime))
	}
}
