package gateway

import (
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
	// SentRequest records where a runner's request in progress went
	// (MCPSession.SentIn).
	SentRequest = mcpsession.Sent
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
