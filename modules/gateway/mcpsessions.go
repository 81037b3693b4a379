package gateway

import (
	"context"
	"errors"
	"sync"

	"github.com/toolgate/toolgate/internal/mcpsession"
	"github.com/toolgate/toolgate/internal/mcpstate"
)

// The runners' MCP sessions live in internal/mcpsession, which keeps them
// so that any replica continues any session; the pipeline's steps know
// them by these names.
type (
	// MCPSession is a runner's MCP session with one service.
	MCPSession = mcpsession.Session
	// MCPSessions holds the MCP sessions this replica knows.
	MCPSessions = mcpsession.Sessions
	// Upstream is the state of the upstream session behind an MCPSession.
	Upstream = mcpsession.Upstream
	// ToolDefinition is a tool as the upstream published it in tools/list.
	ToolDefinition = mcpstate.Tool
	// MCPSessionLimitError reports an initialize refused by a bound.
	MCPSessionLimitError = mcpsession.LimitError
	// EndedMCPSession is a session ended by idle expiry, with the
	// upstream session to end.
	EndedMCPSession = mcpsession.Ended
	// Task is the call a task of an MCP session was created by.
	Task = mcpsession.Task
)

// Errors of MCP sessions.
var (
	ErrMCPSessionNotFound = mcpsession.ErrNotFound
	ErrMCPSessionForeign  = mcpsession.ErrForeign
	ErrMCPSessionClosed   = mcpsession.ErrClosed
)

// An UpstreamRenewer opens a new upstream session for call's MCP session
// with the caller's connection to the service as it stands, and lists the
// upstream's tools through it: toolgate_proxy's. The registry has it run
// when the caller connected again since the upstream session was opened
// (Upstream.Grant): the runner's session goes on, and nothing the
// upstream said through the old connection decides calls made through
// the new one.
type UpstreamRenewer func(ctx context.Context, call *Call) error

// RenewUpstreamWith installs toolgate_proxy's renewer. Call it during
// Provision.
func (a *App) RenewUpstreamWith(f UpstreamRenewer) {
	if a.sharedMu == nil {
		a.sharedMu = new(sync.Mutex)
	}
	a.sharedMu.Lock()
	a.renewer = f
	a.sharedMu.Unlock()
}

// errNoRenewer: no toolgate_proxy in the configuration.
var errNoRenewer = errors.New("no toolgate_proxy to open upstream sessions")

// RenewUpstream runs the renewer (see UpstreamRenewer).
func (a *App) RenewUpstream(ctx context.Context, call *Call) error {
	if a.sharedMu == nil {
		return errNoRenewer
	}
	a.sharedMu.Lock()
	f := a.renewer
	a.sharedMu.Unlock()
	if f == nil {
		return errNoRenewer
	}
	return f(ctx, call)
}
