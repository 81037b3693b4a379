package api

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
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
	res := h.probe(ctx, svc, cred)
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

// probe initializes an MCP session at svc's upstream with cred and ends
// it again.
func (h *Handler) probe(ctx context.Context, svc *gateway.Service, cred *gateway.Credential) testResult {
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + gateway.LatestProtocolVersion +
		`","capabilities":{},"clientInfo":{"name":"toolgate-connection-test","version":"1"}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, svc.URL, strings.NewReader(body))
	if err != nil {
		return testResult{Error: "the service's URL is invalid"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("User-Agent", "toolgate")
	if cred != nil {
		req.Header.Set(cred.Header, cred.Value)
	}
	resp, err := h.app.HTTPClient().Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return testResult{Error: "the upstream did not answer in time", Retryable: true}
		}
		return testResult{Error: "the upstream is unreachable", Retryable: true}
	}
	defer resp.Body.Close()
	switch s := resp.StatusCode; {
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return testResult{Error: fmt.Sprintf("the upstream refused the credential (HTTP %d)", s)}
	case s >= 300 && s < 400:
		return testResult{Error: fmt.Sprintf("the upstream answered with a redirect (HTTP %d); toolgate does not follow redirects", s)}
	case s >= 500:
		return testResult{Error: fmt.Sprintf("the upstream failed (HTTP %d)", s), Retryable: true}
	case s < 200 || s >= 300:
		return testResult{Error: fmt.Sprintf("the upstream rejected the initialize request (HTTP %d)", s)}
	}
	msg, err := firstMessage(resp, h.app.MaxResponseBytes)
	if err != nil {
		return testResult{Error: "the upstream's answer was unreadable: " + err.Error(), Retryable: true}
	}
	if !gjson.GetBytes(msg, "result.protocolVersion").Exists() {
		if m := gjson.GetBytes(msg, "error.message"); m.Exists() {
			return testResult{Error: "the upstream refused to initialize an MCP session"}
		}
		return testResult{Error: "the upstream did not answer like an MCP server"}
	}
	h.endProbeSession(svc, cred, resp.Header.Get("Mcp-Session-Id"), gjson.GetBytes(msg, "result.protocolVersion").String())
	return testResult{OK: true}
}

// firstMessage reads the JSON-RPC response to the probe's initialize from
// a JSON body or an SSE stream.
func firstMessage(resp *http.Response, limit int64) ([]byte, error) {
	body := io.LimitReader(resp.Body, limit)
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch mt {
	case "application/json":
		return io.ReadAll(body)
	case "text/event-stream":
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 0, 64<<10), int(min(limit, 16<<20)))
		var data []byte
		for sc.Scan() {
			line := sc.Bytes()
			switch {
			case bytes.HasPrefix(line, []byte("data:")):
				data = append(data, bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))...)
			case len(line) == 0 && len(data) > 0:
				if gjson.GetBytes(data, "id").Raw == "1" {
					return data, nil
				}
				data = data[:0]
			}
		}
		if len(data) > 0 && gjson.GetBytes(data, "id").Raw == "1" {
			return data, nil
		}
		return nil, errors.New("the stream ended without an answer")
	}
	return nil, fmt.Errorf("unexpected Content-Type %q", mt)
}

// endProbeSession ends the upstream session a probe opened. Best effort.
func (h *Handler) endProbeSession(svc *gateway.Service, cred *gateway.Credential, sessionID, version string) {
	if sessionID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, svc.URL, nil)
	if err != nil {
		return
	}
	req.Header.Set("Mcp-Session-Id", sessionID)
	req.Header.Set("Mcp-Protocol-Version", version)
	req.Header.Set("User-Agent", "toolgate")
	if cred != nil {
		req.Header.Set(cred.Header, cred.Value)
	}
	if resp, err := h.app.HTTPClient().Do(req); err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
	}
}
