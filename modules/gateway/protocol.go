package gateway

import (
	"context"
	"slices"
)

// ProtocolVersions are the MCP protocol versions toolgate speaks with
// runners, newest first. Upstreams may speak any of them; toolgate passes
// the negotiated version through.
var ProtocolVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26"}

// LatestProtocolVersion is what toolgate offers a runner that asks for a
// version it does not know.
const LatestProtocolVersion = "2025-11-25"

// DefaultProtocolVersion is assumed when a runner sends no
// MCP-Protocol-Version header after initialize (as the 2025-06-18
// specification requires).
const DefaultProtocolVersion = "2025-03-26"

// SupportsProtocolVersion reports whether toolgate speaks v with runners.
func SupportsProtocolVersion(v string) bool { return slices.Contains(ProtocolVersions, v) }

// StatelessProtocolVersion is the revision without initialize and without
// MCP sessions: every request carries its protocol version and the
// client's capabilities in _meta (see internal/mcp2026).
const StatelessProtocolVersion = "2026-07-28"

// AllProtocolVersions are every version toolgate speaks with runners,
// newest first: the stateless revision and the ones that initialize.
func AllProtocolVersions() []string {
	return append([]string{StatelessProtocolVersion}, ProtocolVersions...)
}

// Stateless is what a request of the stateless revision declares about
// its client in _meta, checked by toolgate_registry before any policy
// sees the request.
type Stateless struct {
	// Capabilities is the JSON text of the client's capabilities for this
	// request (io.modelcontextprotocol/clientCapabilities).
	Capabilities []byte
	// ClientInfo is the JSON text of io.modelcontextprotocol/clientInfo,
	// nil when the client sent none.
	ClientInfo []byte
	// OwnState is set when the request is the retry of toolgate's own
	// input_required answer (an approval): its requestState was sealed by
	// toolgate and verified, and it and toolgate's input response are not
	// sent upstream.
	OwnState bool
	// Held names the upstream exchange toolgate holds for this retry, when
	// its requestState is one toolgate issued for an upstream's
	// server→client request (an upstream of an earlier revision asked the
	// client something during the call); empty otherwise.
	Held string
	// Refused is why a step refused the retry of a Held exchange (the
	// request policy's reason), for toolgate_registry, which releases the
	// exchange when nothing took it on; empty when no step said why.
	Refused string
	// Inputs are, for a retry of a held exchange or of an upstream's
	// input_required result (Relayed), the methods of the upstream's
	// requests its input responses answer, by key (from the sealed
	// requestState).
	Inputs map[string]string
	// Relayed is set when the retry's requestState stands for an upstream
	// of the stateless revision's (UpstreamState, its JSON text; "" when
	// it sent none), which goes upstream in its place.
	Relayed       bool
	UpstreamState string
	// Withheld are the keys of the input responses the request policy
	// withheld: their requests are answered upstream with toolgate's
	// error instead.
	Withheld map[string]bool
	// Gate decides, before it is sent, the initialize toolgate sends an
	// upstream of an earlier revision to open the implied MCP session
	// (Route.DecideOpening, set by toolgate_registry); nil allows it.
	Gate func(ctx context.Context, call *Call, params []byte) error
}
