// Package impliedsession gives a runner that sends no toolgate session
// header a session all the same, so that a client that can only be given a
// URL and a bearer token (most desktop and IDE clients, hosted agents)
// works. The implied session is the caller's, for the service in the URL
// (or, on the federated endpoint, every service the caller may use), and
// belongs to one MCP session: it starts with the runner's initialize, gets
// its own id then, and ends with the MCP session. Two clients of the same
// person therefore have two sessions, as they would with explicit ones;
// what is decided per session (an approval for the session) stays within
// one client.
//
// Nothing about an implied session is stored: it is derived from the MCP
// session (which records the implied session's id, like an explicit
// session's) on every request. It passes the same checks as an explicit
// session — the MCP session must be the caller's and must have been
// started without a session header — and appears in the policy input and
// the audit log like one (session.implied is true).
//
// An administrator who wants every runner to create its session first
// sets require_session in the toolgate global option.
package impliedsession

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	gateway.RegisterOption(requireOption, func(d *caddyfile.Dispenser) (bool, error) {
		return true, caddyopt.NoArgs(d)
	})
}

// requireOption is the toolgate global option that turns implied sessions
// off:
//
//	toolgate {
//		require_session
//	}
const requireOption = "require_session"

// Required reports whether the configuration requires explicit toolgate
// sessions (require_session).
func Required(app *gateway.App) bool {
	var on bool
	raw := app.Extension(requireOption)
	return raw != nil && json.Unmarshal(raw, &on) == nil && on
}

// idPrefix starts every implied session's id. A colon is not in the
// alphabet of explicit session ids (base64url), so no explicit session
// can pass for an implied one.
const idPrefix = "implied:"

// IsImplied reports whether the session id names an implied session.
func IsImplied(id string) bool { return strings.HasPrefix(id, idPrefix) }

// New returns a new implied session for caller, before its MCP session
// exists (the runner's initialize): every service the caller may use; the
// step that knows the service narrows it (Narrow).
func New(app *gateway.App, caller *gateway.Caller) *gateway.Session {
	return &gateway.Session{ID: idPrefix + gateway.NewID(), User: caller.User, Services: callerServices(app, caller),
		CreatedAt: time.Now(), Implied: true}
}

// ForStateless returns the implied session of caller's requests of the
// stateless revision (2026-07-28). Those start no MCP session a runner
// could name, so the session is the same on every request (and every
// replica): one per caller, derived from who they are, and the MCP session
// toolgate implies for them is found again instead of made anew each time.
// What is decided for the session covers all of the caller's stateless
// clients.
func ForStateless(app *gateway.App, caller *gateway.Caller) *gateway.Session {
	sum := sha256.Sum256([]byte("toolgate stateless implied session\x00" + caller.User))
	return &gateway.Session{ID: idPrefix + "stateless:" + base64.RawURLEncoding.EncodeToString(sum[:18]), User: caller.User,
		Services: callerServices(app, caller), Implied: true}
}

// Of returns the implied session of ms, an MCP session of caller. It
// reports false when ms was started in an explicit session, whose id the
// runner must then send. The session is made once per MCP session and
// configuration and then shared (as the session store shares explicit
// sessions), so that what later steps build from it is built once.
func Of(app *gateway.App, caller *gateway.Caller, ms *gateway.MCPSession) (*gateway.Session, bool) {
	if ms.User != caller.User || !IsImplied(ms.SessionID) {
		return nil, false
	}
	reg := app.Registry()
	if v, ok := made.Load(ms); ok {
		if m := v.(madeSession); m.registry == reg {
			return m.session, true
		}
	}
	services := []string{ms.Service}
	if reg.Lookup(ms.Service) == nil {
		// Not one service's MCP session: the federated endpoint's, which
		// shows every service the caller may use.
		services = callerServices(app, caller)
	}
	sess := &gateway.Session{ID: ms.SessionID, User: caller.User, Services: services, CreatedAt: ms.Created, Implied: true}
	if _, loaded := made.Swap(ms, madeSession{registry: reg, session: sess}); !loaded {
		context.AfterFunc(ms.Context(), func() { made.Delete(ms) })
	}
	return sess, true
}

// made holds the implied session of each open MCP session, with the
// registry (the configuration) it was made for: a reload makes it again.
var made sync.Map // *gateway.MCPSession → madeSession

type madeSession struct {
	registry *gateway.Registry
	session  *gateway.Session
}

// Narrow returns sess for one service: an implied session made before the
// service was known (New) is for the service in the URL only. Any other
// session is returned as it is.
func Narrow(sess *gateway.Session, service string) *gateway.Session {
	if !sess.Implied || len(sess.Services) == 1 && sess.Services[0] == service {
		return sess
	}
	n := *sess
	n.Services = []string{service}
	return &n
}

func callerServices(app *gateway.App, caller *gateway.Caller) []string {
	var ids []string
	for _, s := range app.Registry().Services() {
		if s.AllowsUser(caller.User) {
			ids = append(ids, s.ID)
		}
	}
	return ids
}
