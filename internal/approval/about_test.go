package approval

import "testing"

// An approval is about the identical call only (the arguments as they
// would go upstream, whatever their spelling), or, for scope tool, any
// call of its tool in its session: never another tool, session or caller.
func TestAboutNamesTheCallOnly(t *testing.T) {
	c := Call{Requester: "alice", Session: "s1", Service: "svc", Method: "tools/call", Tool: "t", Arguments: []byte(`{"a":1,"b":2}`)}
	callKey, toolKey, _ := c.Keys()
	once := &Approval{Scope: ScopeOnce, CallKey: callKey, ToolKey: toolKey}
	tool := &Approval{Scope: ScopeTool, CallKey: callKey, ToolKey: toolKey}
	respelled, rewritten, otherTool, otherSession := c, c, c, c
	respelled.Arguments = []byte(`{ "b": 2, "a": 1 }`)
	rewritten.Arguments = []byte(`{"a":1,"b":3}`)
	otherTool.Tool = "u"
	otherSession.Session = "s2"
	for _, tc := range []struct {
		name      string
		a         *Approval
		c         Call
		wantAbout bool
	}{
		{"once, the identical call", once, c, true},
		{"once, respelled", once, respelled, true},
		{"once, rewritten", once, rewritten, false},
		{"tool, rewritten", tool, rewritten, true},
		{"tool, another tool", tool, otherTool, false},
		{"tool, another session", tool, otherSession, false},
	} {
		if got := tc.a.About(tc.c); got != tc.wantAbout {
			t.Errorf("%s: About = %v, want %v", tc.name, got, tc.wantAbout)
		}
	}
}
