package account

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

// TestResult is the outcome of a connection test. Error never holds the
// upstream's URL, its answer or a credential.
type TestResult struct {
	OK          bool   `json:"ok"`
	Error       string `json:"error,omitempty"`
	Retryable   bool   `json:"retryable,omitempty"`
	NeedsSignIn bool   `json:"needs_sign_in,omitempty"`
	ConnectURL  string `json:"connect_url,omitempty"`
}

// Test checks caller's credential for svc against the upstream: an MCP
// initialize sent with it (an OAuth token refreshed first if needed), then
// the upstream session it opened is ended. r gives the gateway's base URL
// for a connect_url.
//
// A test holds what a call in progress holds (a goroutine, buffers, an
// upstream connection), so it counts against max_streams and
// max_streams_per_caller like one: over them, it is refused, retryable.
func Test(r *http.Request, app *gateway.App, caller *gateway.Caller, svc *gateway.Service) TestResult {
	done, err := app.OpenStream(caller.User)
	if err != nil {
		return TestResult{Error: err.Error(), Retryable: true}
	}
	defer done()
	cred, err := app.CredentialFor(r.Context(), svc, caller.User)
	if err != nil {
		res := TestResult{Error: "no usable credential: " + CredentialProblem(err)}
		if gateway.IsSignInError(err) {
			res.NeedsSignIn = true
			res.ConnectURL = app.ConnectURL(r, svc, caller.User)
		} else {
			res.Retryable = true
			app.Logger().Warn("connection test: no credential", zapService(svc, err)...)
		}
		return res
	}
	timeout := min(time.Duration(svc.Timeout), probeTimeout)
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	if err := mcpproxy.Probe(ctx, app, svc, caller.User, cred); err != nil {
		res := TestResult{Error: err.Error(), Retryable: mcpproxy.IsRetryable(err)}
		if k := svc.Auth.Kind; mcpproxy.IsCredentialRefused(err) && (k == gateway.AuthBearer || k == gateway.AuthOAuth) {
			// The caller's own credential: connecting again mends it, as
			// a call refused so is told (needs_sign_in).
			res.NeedsSignIn, res.ConnectURL = true, app.ConnectURL(r, svc, caller.User)
		}
		return res
	}
	return TestResult{OK: true}
}

// CredentialProblem says in a few words why a credential could not be
// had, without details that may hold secrets.
func CredentialProblem(err error) string {
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

func zapError(err error) []zap.Field { return []zap.Field{zap.Error(err)} }

func zapService(svc *gateway.Service, err error) []zap.Field {
	return []zap.Field{zap.String("service", svc.ID), zap.Error(err)}
}
