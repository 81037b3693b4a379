package gateway

import "slices"

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
