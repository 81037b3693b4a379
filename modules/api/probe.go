package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
	"github.com/toolgate/toolgate/modules/mcpproxy"
)

// probeTimeout bounds a connection test.
const probeTimeout = 15 * time.Second

// testResult is the answer of POST /v1/connections/{service}/test. Error
// never holds the upstream's URL, its answer or a credential.
type testResult struct {
	OK          bool   `json:"ok"`
	Error       string `json:"error,omitempty"`
	Retryable   bool   `json:"retryable,omitempty"`
	NeedsSignIn bool   `json:"needs_sign_in,omitempty"`
	ConnectURL  string `json:"connect_url,omitempty"`
}

// testConnection: POST /v1/connections/{service}/test checks the caller's
// credential against the upstream: an MCP initialize sent with it (the
// OAuth token refreshed first if needed), then the upstream session it
// opened is ended.
func (h *Handler) testConnection(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	svc := h.connectable(w, r, caller)
	if svc == nil {
		return
	}
	cred, err := h.app.CredentialFor(r.Context(), svc, caller.User)
	if err != nil {
		res := testResult{Error: "no usable credential: " + credentialProblem(err)}
		if gateway.IsSignInError(err) {
			res.NeedsSignIn = true
			res.ConnectURL, _ = h.app.NeedsSignInFor(r, svc, caller.User)["connect_url"].(string)
		} else {
			res.Retryable = true
			h.logger.Warn("connection test: no credential", zap.String("service", svc.ID), zap.Error(err))
		}
		gateway.WriteJSON(w, http.StatusOK, res)
		return
	}
	timeout := min(time.Duration(svc.Timeout), probeTimeout)
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	res := testResult{OK: true}
	if err := mcpproxy.Probe(ctx, h.app, svc, caller.User, cred); err != nil {
		res = testResult{Error: err.Error(), Retryable: mcpproxy.IsRetryable(err)}
	}
	gateway.WriteJSON(w, http.StatusOK, res)
}

func credentialProblem(err error) string {
	switch {
	case errors.Is(err, gateway.ErrNotConnected):
		return "not connected"
	case errors.Is(err, gateway.ErrGrantExpired):
		return "the sign-in expired"
	case errors.Is(err, gateway.ErrGrantRejected):
		return "the provider rejected the sign-in"
	case errors.Is(err, gateway.ErrProviderUnavailable):
		return "the OAuth provider is unavailable"
	case errors.Is(err, gateway.ErrCipherUnavailable):
		return "the cipher is unavailable"
	case errors.Is(err, gateway.ErrStorageUnavailable):
		return "the storage is unavailable"
	}
	return "internal error"
}
