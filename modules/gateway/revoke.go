package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	"go.uber.org/zap"
)

// ErrNotRevoked: the credential is forgotten, but the service's provider
// did not confirm that it revoked the grant (RFC 7009). The grant may
// still be valid there until it expires: the person should revoke
// toolgate's access in their account at the provider.
var ErrNotRevoked = errors.New("the provider did not confirm the revocation of the grant")

// maxRevocationAnswer bounds what toolgate reads of a revocation answer
// (an error code at most).
const maxRevocationAnswer = 64 << 10

// Disconnect forgets user's credential for svc, after any refresh of it on
// its way (which would otherwise store it again). When svc's OAuth
// provider has a revocation_url, the grant is revoked there too once it is
// forgotten: the refresh token, which revokes the grant's access tokens
// with it (RFC 7009 section 2.1), or the access token when there is no
// refresh token. A revocation the provider does not confirm leaves the
// credential forgotten and returns an error wrapping ErrNotRevoked; any
// other error means nothing was forgotten.
func (a *App) Disconnect(ctx context.Context, svc *Service, user string) error {
	var held *Connection
	elsewhere := false
	err := a.withGrantLock(ctx, svc.ID, user, func() error {
		if revocationURL(svc) != "" {
			// What is revoked is read before it is forgotten; a record
			// that cannot be read is forgotten all the same (and reported
			// as not revoked below).
			conn, err := a.connections.LoadFresh(ctx, svc.ID, user)
			switch {
			case err == nil && !conn.UsableFor(svc):
				// Issued by another provider than the service names now, or
				// a personal token: its tokens are not this one's to see.
				// Forgotten only, and reported as not revoked.
				elsewhere = true
			case err == nil:
				held = conn
			case !errors.Is(err, ErrNotConnected):
				held = &Connection{}
				a.logger.Warn("the credential could not be read to revoke it; it is forgotten without revocation",
					zap.String("service", svc.ID), zap.String("user", user), zap.Error(err))
			}
		}
		return a.connections.Delete(ctx, svc.ID, user)
	})
	if err != nil {
		return err
	}
	a.connections.settle(ctx, svc.ID, user)
	if elsewhere {
		a.logger.Warn("the credential was not issued by the service's OAuth provider and client; it is forgotten without revocation",
			zap.String("service", svc.ID), zap.String("user", user))
		oauthMetrics.revocations.WithLabelValues(svc.ID, "failed").Inc()
		return &ProviderError{kind: ErrNotRevoked, Reason: "the credential was issued under another provider or client than the service uses now; revoke it there"}
	}
	if held == nil {
		return nil
	}
	err = a.revoke(svc, held)
	outcome := "revoked"
	if err != nil {
		outcome = "failed"
		a.logger.Warn("the provider did not confirm the revocation of a forgotten grant; the person should revoke it there",
			zap.String("service", svc.ID), zap.String("user", user), zap.Error(err))
	}
	oauthMetrics.revocations.WithLabelValues(svc.ID, outcome).Inc()
	return err
}

// revocationURL is svc's RFC 7009 revocation endpoint, or "".
func revocationURL(svc *Service) string {
	if svc.Auth == nil || svc.Auth.Kind != AuthOAuth || svc.Auth.OAuth == nil {
		return ""
	}
	return svc.Auth.OAuth.RevocationURL
}

// revoke asks svc's provider to revoke conn's grant: its refresh token, or
// its access token when the provider does not revoke refresh tokens or
// there is none.
func (a *App) revoke(svc *Service, conn *Connection) error {
	if conn.RefreshToken == "" && conn.AccessToken == "" {
		return &ProviderError{kind: ErrNotRevoked, Reason: "the credential could not be read"}
	}
	if conn.RefreshToken != "" {
		err := a.revokeToken(svc, conn.RefreshToken, "refresh_token")
		var pe *ProviderError
		if err == nil || conn.AccessToken == "" || !errors.As(err, &pe) || pe.Code != "unsupported_token_type" {
			return err
		}
	}
	return a.revokeToken(svc, conn.AccessToken, "access_token")
}

// revokeToken sends one RFC 7009 revocation request, authenticated as the
// token endpoint's requests are (client credentials in the body). Only a
// 200 confirms it; the answer's body is read for its error code alone.
func (a *App) revokeToken(svc *Service, token, hint string) error {
	o := svc.Auth.OAuth
	form := url.Values{"token": {token}, "token_type_hint": {hint}, "client_id": {o.ClientID}}
	if o.ClientSecret != "" {
		form.Set("client_secret", o.ClientSecret)
	}
	ctx, cancel := a.tokenContext(providerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.RevocationURL, strings.NewReader(form.Encode()))
	if err != nil {
		return &ProviderError{kind: ErrNotRevoked, Reason: "bad revocation_url"}
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := a.httpClient.Do(req)
	if err != nil {
		pe := classifyTokenError(err)
		pe.kind = ErrNotRevoked
		return pe
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxRevocationAnswer))
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var answer struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(body, &answer)
	return &ProviderError{kind: ErrNotRevoked, Status: resp.StatusCode, Code: safeErrorCode(answer.Error)}
}
