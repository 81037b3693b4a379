package approval

import (
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/modules/gateway"
)

func TestParseSpec(t *testing.T) {
	def, err := ParseSpec(nil)
	if err != nil || !def.RequesterMayApprove || def.TTL != DefaultTTL || strings.Join(def.Scopes, ",") != "once,session" {
		t.Fatalf("the defaults: %+v, %v", def, err)
	}
	full, err := ParseSpec([]byte(`{"approvers":{"groups":["secops"],"users":["carol"]},"requester_may_approve":false,"ttl":"15m","scopes":["once","tool"]}`))
	if err != nil || full.RequesterMayApprove || full.TTL != 15*time.Minute || full.Approvers.Groups[0] != "secops" ||
		full.Approvers.Users[0] != "carol" || strings.Join(full.Scopes, ",") != "once,tool" {
		t.Fatalf("a full spec: %+v, %v", full, err)
	}
	for name, raw := range map[string]string{
		"ttl over a day":           `{"ttl":"25h"}`,
		"ttl not a duration":       `{"ttl":"soon"}`,
		"negative ttl":             `{"ttl":"-1m"}`,
		"unknown scope":            `{"scopes":["forever"]}`,
		"no scopes":                `{"scopes":[]}`,
		"unknown field":            `{"approver":"bob"}`,
		"nobody may approve":       `{"requester_may_approve":false}`,
		"in band with approvers":   `{"in_band":true,"approvers":{"users":["carol"]}}`,
		"scopes of the wrong type": `{"scopes":"once"}`,
	} {
		if _, err := ParseSpec([]byte(raw)); err == nil {
			t.Errorf("%s: %s was accepted", name, raw)
		}
	}
}

func TestCanonicalArgumentsMatchHoweverSpelled(t *testing.T) {
	a := Call{Requester: "alice", Session: "s", Service: "svc", Method: "tools/call", Tool: "t", Arguments: []byte(`{"b":[1,2.50,"x"],"a":{"z":null,"y":true}}`)}
	b := a
	b.Arguments = []byte(" {\n \"a\" : {\"y\":true,\"z\":null}, \"b\":[1, 2.50, \"\\u0078\"]} ")
	ka, ta, da := a.Keys()
	kb, tb, db := b.Keys()
	if ka != kb || ta != tb || da != db {
		t.Fatal("the same arguments spelled differently have different keys")
	}
	for name, change := range map[string]func(*Call){
		"arguments": func(c *Call) { c.Arguments = []byte(`{"b":[1,2.5,"x"],"a":{"z":null,"y":true}}`) },
		"requester": func(c *Call) { c.Requester = "bob" },
		"session":   func(c *Call) { c.Session = "other" },
		"service":   func(c *Call) { c.Service = "other" },
		"tool":      func(c *Call) { c.Tool = "u" },
	} {
		c := a
		change(&c)
		if k, _, _ := c.Keys(); k == ka {
			t.Errorf("another %s has the same call key", name)
		}
	}
	c := a
	c.Arguments = []byte(`{}`)
	if _, tk, _ := c.Keys(); tk != ta {
		t.Error("the tool key depends on the arguments")
	}
}

func TestWhoMayDecide(t *testing.T) {
	a := &Approval{Requester: "alice", RequesterMayApprove: false, Approvers: []string{"carol"}, ApproverGroups: []string{"secops"}}
	for _, c := range []struct {
		caller *gateway.Caller
		may    bool
	}{
		{&gateway.Caller{User: "alice"}, false},
		{&gateway.Caller{User: "alice", Groups: []string{"secops"}}, false}, // four eyes: not even as an approver
		{&gateway.Caller{User: "carol"}, true},
		{&gateway.Caller{User: "dave", Groups: []string{"eng", "secops"}}, true},
		{&gateway.Caller{User: "eve", Groups: []string{"eng"}}, false},
	} {
		if got := a.MayDecide(c.caller); got != c.may {
			t.Errorf("%s %v: MayDecide = %v", c.caller.User, c.caller.Groups, got)
		}
	}
	a.RequesterMayApprove = true
	if !a.MayDecide(&gateway.Caller{User: "alice"}) {
		t.Error("the requester may approve when the policy lets them")
	}
}

func TestDecidedUnder(t *testing.T) {
	selfApproved := &Approval{Requester: "alice", DecidedBy: "alice"}
	byAdmin := &Approval{Requester: "alice", DecidedBy: "carol", DecidedGroups: []string{"admins"}}
	fourEyes, _ := ParseSpec([]byte(`{"approvers":{"groups":["admins"]},"requester_may_approve":false}`))
	byDefault, _ := ParseSpec(nil)
	for _, c := range []struct {
		a    *Approval
		spec Spec
		want bool
	}{
		{selfApproved, byDefault, true},
		{selfApproved, fourEyes, false},
		{byAdmin, fourEyes, true},
		{byAdmin, byDefault, false}, // carol could not have decided it
		{&Approval{Requester: "alice", DecidedBy: "dave", DecidedGroups: []string{"eng"}}, fourEyes, false},
	} {
		if got := c.a.DecidedUnder(c.spec); got != c.want {
			t.Errorf("decided by %s %v under %+v: %v, want %v", c.a.DecidedBy, c.a.DecidedGroups, c.spec, got, c.want)
		}
	}
}

// An approval covers later asks only on the terms the policy gives each of
// them: a scope the ask does not offer, or an age past its ttl, does not
// cover it — under the same policy revision as under another.
func TestCovers(t *testing.T) {
	created := now().Add(-30 * time.Minute)
	session := &Approval{Requester: "alice", DecidedBy: "alice", Scope: ScopeSession, CreatedAt: created, Revision: "r1"}
	tool := &Approval{Requester: "alice", DecidedBy: "alice", Scope: ScopeTool, CreatedAt: created, Revision: "r1"}
	if tool.Covers(Spec{Scopes: []string{ScopeOnce}, TTL: time.Hour, RequesterMayApprove: true}) {
		t.Error("a tool approval covers a call whose ask offers only once")
	}
	spec := func(js string) Spec {
		s, err := ParseSpec([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		a    *Approval
		spec Spec
		want bool
	}{
		{session, spec(`{"ttl":"1h","scopes":["once","session"]}`), true},
		{session, spec(`{"ttl":"1h","scopes":["once"]}`), false},            // session scope no longer offered
		{session, spec(`{"ttl":"10m","scopes":["once","session"]}`), false}, // older than the ttl now
		{tool, spec(`{"ttl":"1h","scopes":["once","tool"]}`), true},
		{tool, spec(`{"ttl":"1h","scopes":["once","session"]}`), false},
		{session, spec(`{"ttl":"1h","scopes":["once","session"],"approvers":{"groups":["admins"]},"requester_may_approve":false}`), false},
	} {
		if got := c.a.Covers(c.spec); got != c.want {
			t.Errorf("%s approval under %+v: covers %v, want %v", c.a.Scope, c.spec, got, c.want)
		}
	}
}
