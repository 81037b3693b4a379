package mcpproxy

import (
	"context"
	"errors"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Probe checks that svc's upstream accepts user's credential cred: it
// initializes an MCP session with it, the way toolgate_proxy does, and ends
// that session again. The error's text is safe to show the user (no URL,
// no credential); IsRetryable tells a passing failure from a refusal.
func Probe(ctx context.Context, app *gateway.App, svc *gateway.Service, user string, cred *gateway.Credential) error {
	h := &Handler{app: app, maxMessage: app.MaxResponseBytes,
		limits: mcpmsg.Limits{MaxDepth: app.MaxJSONDepth, MaxValues: app.MaxResponseValues}, logger: app.Logger().Named("probe")}
	call := &gateway.Call{Caller: &gateway.Caller{User: user}, Service: svc, Credential: cred}
	id := gatewayRequestID()
	params := []byte(`{"protocolVersion":"` + gateway.LatestProtocolVersion +
		`","capabilities":{},"clientInfo":{"name":"toolgate-connection-test","version":"1"}}`)
	hdr, msg, err := h.roundTrip(ctx, call, gateway.Upstream{}, id, initializeRequest(id, params))
	if err != nil {
		return err
	}
	version := gjson.GetBytes(msg.Result, "protocolVersion")
	if !version.Exists() {
		return &upstreamError{kind: kindRejected, msg: "the upstream refused to initialize an MCP session"}
	}
	h.endUpstream(ctx, call, stamped(call, gateway.Upstream{SessionID: hdr.Get("Mcp-Session-Id"), ProtocolVersion: version.String()}))
	h.logger.Debug("connection test passed", zap.String("service", svc.ID))
	return nil
}

// IsRetryable reports whether a Probe error is a passing failure (the
// upstream unreachable, slow or failing) rather than a refusal.
func IsRetryable(err error) bool {
	var ue *upstreamError
	return errors.As(err, &ue) && ue.kind == kindUnavailable
}

// IsCredentialRefused reports whether a Probe error is the upstream
// refusing the credential it was sent (401 or 403).
func IsCredentialRefused(err error) bool {
	var ue *upstreamError
	return errors.As(err, &ue) && ue.kind == kindUnauthorized
}
