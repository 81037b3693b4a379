package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"golang.org/x/oauth2"
	"golang.org/x/sync/singleflight"
)

// Keeping OAuth grants usable: access tokens refreshed by the gateway, one
// refresh per grant at a time across every replica that shares the
// storage (a process-wide single flight, then the grant's storage lock);
// storing a new grant under that lock; and the credential each upstream
// request carries, with the grant it came from.
//
// Nothing here logs or returns a token.

// refreshes makes concurrent refreshes of one grant inside this process
// share a single attempt; the storage lock does the same across replicas.
// It is process-wide so that it spans config reloads and every handler.
var refreshes singleflight.Group

// refreshSkew is how long before its expiry c's access token is renewed:
// skew, but at most half the lifetime the provider gave the token.
func (c *Connection) refreshSkew(skew time.Duration) time.Duration {
	obtained := c.RefreshedAt
	if obtained.IsZero() {
		obtained = c.ConnectedAt
	}
	if life := c.Expiry.Sub(obtained); !obtained.IsZero() && life > 0 && skew > life/2 {
		return life / 2
	}
	return skew
}

// NeedsRefresh reports whether c's access token should be renewed before
// use, given the service's refresh_skew.
func (c *Connection) NeedsRefresh(skew time.Duration) bool {
	return c.Expired(c.refreshSkew(skew))
}

// applyToken copies what a token response holds into c. A response without
// a refresh token keeps the current one; without a scope, the scopes stay
// (or become the requested ones); with one, they are the requested scopes
// it grants (grantedScopes).
func (c *Connection) applyToken(tok *oauth2.Token, requested []string) {
	c.AccessToken = tok.AccessToken
	c.TokenType = tok.TokenType
	c.Expiry = tok.Expiry.UTC()
	if tok.Expiry.IsZero() {
		c.Expiry = time.Time{}
	}
	if tok.RefreshToken != "" {
		c.RefreshToken = tok.RefreshToken
	}
	if scope, _ := tok.Extra("scope").(string); scope != "" {
		c.Scopes = grantedScopes(scope, requested)
	} else if c.Scopes == nil {
		c.Scopes = requested
	}
}

// grantedScopes is the scopes of requested that a token response's scope
// names, in requested's order: what the catalog and the console show of
// a grant. Nothing else of it is kept — the provider, or what answers in
// its place, writes that member, and it reaches every person's catalog
// (a token endpoint writing the tokens and the client secret it was sent
// into scope showed them there).
func grantedScopes(scope string, requested []string) []string {
	named := strings.Fields(scope)
	granted := []string{}
	for _, r := range requested {
		if slices.Contains(named, r) {
			granted = append(granted, r)
		}
	}
	return granted
}

// OAuthConnection returns user's grant for the oauth service svc with an
// access token that is not about to expire. The steady state costs no
// provider or cipher round trip (the decrypted grant is cached); when the
// token is within refresh_skew of expiry it is refreshed first, once per
// grant however many calls wait for it, here or on other replicas.
//
// Errors: ErrNotConnected, ErrGrantExpired and ErrGrantRejected mean the
// user must connect (again); anything else (ErrProviderUnavailable,
// ErrCipherUnavailable, ErrStorageUnavailable) is worth retrying.
func (a *App) OAuthConnection(ctx context.Context, svc *Service, user string) (*Connection, error) {
	o, err := a.oauthConfig(svc)
	if err != nil {
		return nil, err
	}
	conn, err := a.connections.Load(ctx, svc.ID, user)
	if err != nil {
		return nil, err
	}
	if !conn.issuedBy(o) {
		return nil, ErrGrantElsewhere
	}
	if !conn.NeedsRefresh(time.Duration(o.RefreshSkew)) {
		return conn, nil
	}
	if conn.RefreshToken == "" {
		return nil, ErrGrantExpired
	}
	return a.refreshShared(ctx, svc, user, "")
}

// refreshShared refreshes user's grant for svc once however many callers
// ask at the same time. refused, when set, is an access token an upstream
// refused: the grant is refreshed even though it is not near expiry,
// unless the stored token is already another one.
func (a *App) refreshShared(ctx context.Context, svc *Service, user, refused string) (*Connection, error) {
	ch := refreshes.DoChan(ConnectionKey(svc.ID, user), func() (any, error) {
		conn, outcome, err := a.refresh(svc, user, refused)
		if outcome != "" {
			countRefresh(svc.ID, outcome)
		}
		return refreshed{conn, outcome}, err
	})
	select {
	case res := <-ch:
		r := res.Val.(refreshed)
		trace.SpanFromContext(ctx).AddEvent("oauth refresh", trace.WithAttributes(attribute.String("outcome", r.outcome)))
		if res.Err != nil {
			return nil, res.Err
		}
		return r.conn, nil
	case <-ctx.Done():
		return nil, &ProviderError{kind: ErrProviderUnavailable, Reason: "timeout"}
	}
}

// refreshed is what one refresh gave all who waited for it.
type refreshed struct {
	conn    *Connection
	outcome string // as toolgate_oauth_refreshes_total counts it; "" when not counted
}

// refreshLockName is the storage lock serializing refreshes of user's
// grant for service, derived from the grant's storage key. Connecting and
// disconnecting take it too, so that a refresh on its way never writes
// back a grant that was replaced or forgotten meanwhile.
func refreshLockName(service, user string) string {
	return "toolgate_refresh_" + hashKey(ConnectionKey(service, user))
}

// withGrantLock runs fn holding user's grant lock for service (see
// refreshLockName).
func (a *App) withGrantLock(ctx context.Context, service, user string, fn func() error) error {
	lock := refreshLockName(service, user)
	if err := a.storage.Lock(ctx, lock); err != nil {
		return fmt.Errorf("%w: waiting for the credential's lock: %v", ErrStorageUnavailable, err)
	}
	defer a.unlock(lock)
	return fn()
}

// Connect stores user's new credential for service (see
// ConnectionStore.Connect), after any refresh of the old one on its way.
// The old one's tokens are kept as retired (Connection.Retired), and those
// of a grant the provider rejected since (ConnectionStore.Reject): its
// upstreams had them.
func (a *App) Connect(ctx context.Context, service, user string, conn *Connection) error {
	err := a.withGrantLock(ctx, service, user, func() error {
		next := *conn
		old, err := a.connections.LoadFresh(ctx, service, user)
		switch {
		case err == nil:
			next.Retired = next.retiring(old)
		case errors.Is(err, ErrNotConnected):
			next.Retired = next.retiring(a.connections.rejected(ctx, service, user))
		} // else a record that cannot be read: connecting again is its remedy
		return a.connections.Connect(ctx, service, user, &next)
	})
	if err != nil {
		return err
	}
	a.connections.settle(ctx, service, user)
	return nil
}

// refresh renews user's grant for svc under the grant's storage lock, and
// says how it went (the outcome toolgate_oauth_refreshes_total counts). It
// re-reads the grant first: another replica may have refreshed it while
// this one waited, and then no provider call is made. A rotated refresh
// token is stored before the new access token is returned.
func (a *App) refresh(svc *Service, user, refused string) (*Connection, string, error) {
	o := svc.Auth.OAuth
	ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	lock := refreshLockName(svc.ID, user)
	if err := a.storage.Lock(ctx, lock); err != nil {
		return nil, "failed", fmt.Errorf("%w: waiting for the refresh lock: %v", ErrStorageUnavailable, err)
	}
	defer a.unlock(lock)

	cur, err := a.connections.LoadFresh(ctx, svc.ID, user)
	if err != nil {
		if errors.Is(err, ErrNotConnected) {
			return nil, "", err
		}
		return nil, "failed", err
	}
	if !cur.issuedBy(o) {
		return nil, "", ErrGrantElsewhere // its refresh token is not the current provider's to see
	}
	if !cur.NeedsRefresh(time.Duration(o.RefreshSkew)) && (refused == "" || cur.AccessToken != refused) {
		return cur, "already_refreshed", nil
	}
	if cur.RefreshToken == "" {
		return nil, "", ErrGrantExpired
	}

	tctx, tcancel := a.tokenContext(providerTimeout)
	defer tcancel()
	// golang.org/x/oauth2 has no refresh request that takes parameters,
	// and the RFC 8707 resource belongs on every token request; Exchange
	// with the grant type replaced sends one. Its empty "code" parameter
	// counts as absent (RFC 6749 section 3.2: "Parameters sent without a
	// value MUST be treated as if they were omitted from the request").
	tok, err := o.refreshConfig.Exchange(tctx, "",
		oauth2.SetAuthURLParam("grant_type", "refresh_token"),
		oauth2.SetAuthURLParam("refresh_token", cur.RefreshToken),
		oauth2.SetAuthURLParam("resource", o.Resource))
	if err != nil {
		pe := classifyTokenError(err)
		fields := []zap.Field{zap.String("service", svc.ID), zap.String("user", user),
			zap.Int("status", pe.Status), zap.String("error_code", pe.Code), zap.String("reason", pe.Reason)}
		if errors.Is(pe, ErrGrantRejected) {
			if err := a.connections.Reject(ctx, svc.ID, user, cur); err != nil {
				a.logger.Error("deleting a rejected oauth grant failed", zap.String("service", svc.ID), zap.Error(err))
			}
			a.logger.Warn("the provider rejected the refresh token; the grant is deleted and the user must connect again", fields...)
			return nil, "rejected", pe
		}
		a.logger.Warn("oauth token refresh failed; the grant is kept", fields...)
		return nil, "failed", pe
	}
	if err := checkBearer(tok); err != nil {
		a.logger.Warn("oauth token refresh gave a token toolgate cannot present; the grant is kept", zap.String("service", svc.ID),
			zap.String("user", user), zap.Error(err))
		return nil, "failed", err
	}
	next := *cur
	next.Issuer = o.issuer() // a grant of an earlier version is bound from its first refresh
	next.applyToken(tok, o.Scopes)
	next.Retired = next.retiring(cur)
	next.RefreshedAt = now().UTC()
	next.RefreshCount++
	if err := a.connections.Save(ctx, svc.ID, user, &next); err != nil {
		a.logger.Error("storing a refreshed oauth grant failed; if the provider rotated the refresh token, the user must connect again",
			zap.String("service", svc.ID), zap.String("user", user), zap.Error(err))
		return nil, "failed", err
	}
	a.logger.Debug("oauth token refreshed", zap.String("service", svc.ID), zap.String("user", user),
		zap.Int("refresh_count", next.RefreshCount), zap.Time("expiry", next.Expiry))
	stored := next
	return &stored, "refreshed", nil
}

// unlock releases a storage lock, logging a failure (the lock then expires
// by itself).
func (a *App) unlock(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.storage.Unlock(ctx, name); err != nil {
		a.logger.Warn("releasing a storage lock failed", zap.String("lock", name), zap.Error(err))
	}
}

// CredentialFor returns what toolgate attaches to svc's upstream requests
// for user: nil for auth none, the configured header, the user's personal
// token, or the user's OAuth access token (refreshed when near expiry).
// See [App.OAuthConnection] for the errors; [IsSignInError] tells which
// mean the user must connect.
func (a *App) CredentialFor(ctx context.Context, svc *Service, user string) (*Credential, error) {
	switch svc.Auth.Kind {
	case AuthNone:
		return nil, nil
	case AuthHeader:
		return &Credential{Header: svc.Auth.Header, Value: svc.Auth.Value, retired: serviceHeaders.retired(svc.ID)}, nil
	case AuthBearer:
		if a.connections == nil {
			return nil, errors.New("no cipher is configured")
		}
		conn, err := a.connections.Load(ctx, svc.ID, user)
		if err != nil {
			return nil, err
		}
		if !conn.UsableFor(svc) {
			return nil, ErrGrantElsewhere
		}
		return credentialOf(conn), nil
	case AuthOAuth:
		conn, err := a.OAuthConnection(ctx, svc, user)
		if err != nil {
			return nil, err
		}
		return credentialOf(conn), nil
	}
	return nil, fmt.Errorf("service %s: unknown auth kind %q", svc.ID, svc.Auth.Kind)
}

// credentialOf is the credential of a per-user connection.
func credentialOf(conn *Connection) *Credential {
	return &Credential{Header: "Authorization", Value: "Bearer " + conn.AccessToken, Grant: conn.Grant(), retired: conn.Retired}
}

// GrantFor names user's connection to svc as it stands (Connection.Grant),
// without refreshing anything: "" for a service without per-user
// credentials, or when the user has none (the credentials step reports
// that). It is read from the cache, or with fresh from storage (and the
// cache updated: the credential of the caller's next request is the one
// read). An error says the connection could not be read.
func (a *App) GrantFor(ctx context.Context, svc *Service, user string, fresh bool) (string, error) {
	if !svc.PerUserCredentials() || a.connections == nil {
		return "", nil
	}
	load := a.connections.Load
	if fresh {
		load = a.connections.LoadFresh
	}
	conn, err := load(ctx, svc.ID, user)
	switch {
	case errors.Is(err, ErrNotConnected):
		return "", nil
	case err != nil:
		return "", err
	}
	return conn.Grant(), nil
}

// CredentialRefused is called when the upstream answered 401 or 403 to a
// request carrying refused, the credential CredentialFor gave for user. It
// returns a credential worth one more try, or an error. The stored grant is
// read again first: another replica may have refreshed it (and the
// provider revoked the token this replica had cached). An OAuth grant whose
// stored token is the refused one is refreshed now, whatever its expiry.
// A personal bearer token or a service-wide header gets no second try.
func (a *App) CredentialRefused(ctx context.Context, svc *Service, user string, refused *Credential) (*Credential, error) {
	if refused == nil || (svc.Auth.Kind != AuthOAuth && svc.Auth.Kind != AuthBearer) {
		return nil, errors.New("no other credential to try")
	}
	conn, err := a.connections.LoadFresh(ctx, svc.ID, user)
	if err != nil {
		return nil, err
	}
	if !conn.UsableFor(svc) {
		return nil, ErrGrantElsewhere
	}
	fresh := credentialOf(conn)
	if fresh.Value != refused.Value {
		return fresh, nil // the refused one is retired (Connection.Retired)
	}
	if svc.Auth.Kind != AuthOAuth || conn.RefreshToken == "" {
		return nil, ErrGrantRejected
	}
	if !conn.RefreshedAt.IsZero() && now().Sub(conn.RefreshedAt) < refusedRefreshInterval {
		// Refreshed a moment ago, and refused all the same: a new token
		// would be refused too, and each refusal must not cost a token
		// request (a runner could make every call one).
		return nil, ErrGrantRejected
	}
	conn, err = a.refreshShared(ctx, svc, user, conn.AccessToken)
	if err != nil {
		return nil, err
	}
	if fresh = credentialOf(conn); fresh.Value == refused.Value {
		return nil, ErrGrantRejected
	}
	return fresh, nil
}

// refusedRefreshInterval is how long after a refresh an upstream's refusal
// of the token makes no new refresh: the person is asked to connect again.
const refusedRefreshInterval = time.Minute

// IsSignInError reports whether err (from CredentialFor) means the user
// must connect the service (again), as opposed to a failure worth retrying.
func IsSignInError(err error) bool {
	return errors.Is(err, ErrNotConnected) || errors.Is(err, ErrGrantExpired) || errors.Is(err, ErrGrantRejected) ||
		errors.Is(err, ErrSealedWithOtherKey)
}
