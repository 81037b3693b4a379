package vaulttransit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// The cipher's Vault token: checked before the first use, renewed or
// replaced (a new AppRole login, a token file read again) before it
// expires, and replaced at once when Vault refuses it.

// prepare makes sure the cipher can be used: an AppRole token is present and
// fresh, and the key has been checked. On the steady path it costs two
// atomic loads.
func (c *Cipher) prepare(ctx context.Context) error {
	if c.client == nil {
		return errors.New("vault_transit: not provisioned")
	}
	if c.st.ready.Load() && !c.needsRefresh() {
		return nil
	}
	waitStart := time.Now()
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	// Whoever held the lock just found Vault unavailable; share that
	// rather than queueing another full timeout behind it.
	if c.st.lastErr != nil && c.st.lastErrAt.After(waitStart) {
		return c.st.lastErr
	}
	err := c.prepareLocked(ctx)
	if errors.Is(err, gateway.ErrCipherUnavailable) {
		c.st.lastErr, c.st.lastErrAt = err, time.Now()
	} else {
		c.st.lastErr = nil
	}
	return err
}

func (c *Cipher) prepareLocked(ctx context.Context) error {
	if c.needsRefresh() {
		if err := c.refreshTokenLocked(ctx); err != nil {
			return err
		}
	}
	if !c.st.ready.Load() {
		if err := c.checkKey(ctx); err != nil {
			return err
		}
		c.st.ready.Store(true)
	}
	return nil
}

func (c *Cipher) needsRefresh() bool {
	at := c.st.refreshAt.Load()
	return at == 0 || time.Now().UnixNano() >= at
}

// checkKey reads the key's settings and rejects a key that is missing, not
// derived, or cannot encrypt.
func (c *Cipher) checkKey(ctx context.Context) error {
	gen := c.st.tokenGen.Load()
	secret, err := c.client.Logical().ReadWithContext(ctx, c.pathOf(opReadKey))
	if err != nil && c.AppRole != nil && statusOf(err) == http.StatusForbidden {
		if lerr := c.loginLocked(ctx, gen); lerr != nil {
			return lerr
		}
		secret, err = c.client.Logical().ReadWithContext(ctx, c.pathOf(opReadKey))
	}
	if err != nil {
		return c.classify(opReadKey, err)
	}
	create := fmt.Sprintf("vault write -f %s/keys/%s derived=true", c.mount, c.key)
	if secret == nil || secret.Data == nil {
		return fmt.Errorf("vault transit at %s has no key %q under mount %q: enable the engine if needed (vault secrets enable -path=%s transit) and create the key: %s",
			c.address, c.key, c.mount, c.mount, create)
	}
	if derived, _ := secret.Data["derived"].(bool); !derived {
		return fmt.Errorf("vault transit key %q under mount %q is not derived, so it cannot bind records to their (service, user) context; "+
			"derivation cannot be turned on for an existing key: create a derived one with `vault write -f %s/keys/<name> derived=true` "+
			"under a new name and set key to it (or delete this key first if nothing was ever encrypted with it)",
			c.key, c.mount, c.mount)
	}
	if enc, ok := secret.Data["supports_encryption"].(bool); ok && !enc {
		typ, _ := secret.Data["type"].(string)
		return fmt.Errorf("vault transit key %q under mount %q (type %s) does not support encryption; create a derived aes256-gcm96 key: %s",
			c.key, c.mount, typ, create)
	}
	return nil
}

// reloginAfter logs in again unless another goroutine already did so after
// generation gen was current.
func (c *Cipher) reloginAfter(ctx context.Context, gen uint64) error {
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	return c.loginLocked(ctx, gen)
}

func (c *Cipher) loginLocked(ctx context.Context, gen uint64) error {
	if c.st.tokenGen.Load() != gen {
		return nil
	}
	return c.login(ctx)
}

// refreshTokenLocked renews the AppRole token if it can still be renewed
// usefully, and logs in again otherwise. If Vault is unavailable but the
// current token is still valid, the token is kept and the error dropped.
func (c *Cipher) refreshTokenLocked(ctx context.Context) error {
	if !c.needsRefresh() {
		return nil // refreshed while we waited for the lock
	}
	if c.AppRole == nil {
		return c.refreshStaticLocked(ctx)
	}
	if c.st.refreshAt.Load() != 0 && c.st.renewable {
		ttl, err := c.renewSelf(ctx)
		if err == nil && ttl >= c.st.loginTTL/2 {
			c.schedule(ttl)
			return nil
		}
		if err != nil && errors.Is(err, gateway.ErrCipherUnavailable) && c.stillValid() {
			c.logger.Warn("could not renew vault token; keeping the current one", zap.Error(err))
			c.retryRefreshSoon()
			return nil
		}
		// Renewal refused, or the token is close to its max TTL: log in.
	}
	err := c.login(ctx)
	if err != nil && errors.Is(err, gateway.ErrCipherUnavailable) && c.st.refreshAt.Load() != 0 && c.stillValid() {
		c.logger.Warn("could not log in to vault again; keeping the current token", zap.Error(err))
		c.retryRefreshSoon()
		return nil
	}
	return err
}

// refreshStaticLocked keeps a static token alive: at first use it looks up
// the token's TTL, and a renewable token with one is renewed after two
// thirds of it, as Vault lets it be until its max TTL. A token that
// cannot be renewed, or whose TTL cannot be read (its policy lacks
// auth/token/lookup-self), is used as it is, with a warning.
func (c *Cipher) refreshStaticLocked(ctx context.Context) error {
	if c.st.refreshAt.Load() == 0 {
		secret, err := c.client.Auth().Token().LookupSelfWithContext(ctx)
		if err != nil {
			err = c.classifyAuth("look up its token", "auth/token/lookup-self", err)
			if errors.Is(err, gateway.ErrCipherUnavailable) {
				return err
			}
			c.logger.Warn("cannot read the vault token's TTL; it is not renewed, so replace it before it expires", zap.Error(err))
			c.schedule(0)
			return nil
		}
		ttl, _ := secret.TokenTTL()
		renewable, _ := secret.TokenIsRenewable()
		c.st.renewable, c.st.loginTTL = renewable, ttl
		if ttl > 0 && !renewable {
			c.logger.Warn("the vault token expires and cannot be renewed: replace it before then",
				zap.Time("expires_at", time.Now().Add(ttl)))
			c.schedule(0)
			c.st.expiresAt = time.Now().Add(ttl)
			return nil
		}
		c.schedule(ttl)
		return nil
	}
	ttl, err := c.renewSelf(ctx)
	switch {
	case err == nil:
		if ttl < c.st.loginTTL/2 {
			c.logger.Warn("the vault token nears its max TTL and cannot be renewed much longer: replace it",
				zap.Time("expires_at", time.Now().Add(ttl)))
		}
		c.schedule(ttl)
		return nil
	case errors.Is(err, gateway.ErrCipherUnavailable) && c.stillValid():
		c.logger.Warn("could not renew vault token; keeping the current one", zap.Error(err))
		c.retryRefreshSoon()
		return nil
	}
	return err
}

// retryRefreshSoon postpones the next refresh attempt a little, so an outage
// does not cost a failed renewal on every call.
func (c *Cipher) retryRefreshSoon() {
	c.st.refreshAt.Store(time.Now().Add(refreshRetry).UnixNano())
}

// refreshRetry is how long a token refresh that failed because Vault was
// unavailable waits before it is tried again, while the token is still valid.
const refreshRetry = 5 * time.Second

func (c *Cipher) stillValid() bool {
	return c.st.expiresAt.IsZero() || time.Now().Before(c.st.expiresAt)
}

// schedule sets when a token with the given TTL should be refreshed: after
// two thirds of it.
func (c *Cipher) schedule(ttl time.Duration) {
	now := time.Now()
	if ttl <= 0 {
		c.st.expiresAt = time.Time{}
		c.st.refreshAt.Store(now.Add(100 * 365 * 24 * time.Hour).UnixNano())
		return
	}
	c.st.expiresAt = now.Add(ttl)
	c.st.refreshAt.Store(now.Add(ttl * 2 / 3).UnixNano())
}

func (c *Cipher) renewSelf(ctx context.Context) (time.Duration, error) {
	secret, err := c.client.Auth().Token().RenewSelfWithContext(ctx, 0)
	if err != nil {
		return 0, c.classifyAuth("renew its token", "auth/token/renew-self", err)
	}
	if secret == nil || secret.Auth == nil {
		return 0, errors.New("vault token renewal returned no auth data")
	}
	c.st.renewable = secret.Auth.Renewable
	return time.Duration(secret.Auth.LeaseDuration) * time.Second, nil
}

// login performs an AppRole login and installs the new token.
func (c *Cipher) login(ctx context.Context) error {
	path := "auth/" + c.approleMount + "/login"
	data := map[string]any{"role_id": c.roleID}
	if c.secretID != "" {
		data["secret_id"] = c.secretID
	}
	secret, err := c.loginClient.Logical().WriteWithContext(ctx, path, data)
	if err != nil {
		return c.classifyAuth("log in with approle", path, err)
	}
	if secret == nil || secret.Auth == nil || secret.Auth.ClientToken == "" {
		return fmt.Errorf("vault at %s: approle login at %s returned no token (is the approle auth method enabled at %q?)",
			c.address, path, c.approleMount)
	}
	c.client.SetToken(secret.Auth.ClientToken)
	c.st.tokenGen.Add(1)
	c.st.renewable = secret.Auth.Renewable
	c.st.loginTTL = time.Duration(secret.Auth.LeaseDuration) * time.Second
	c.schedule(c.st.loginTTL)
	c.logger.Debug("logged in to vault with approle",
		zap.String("address", c.address), zap.Duration("ttl", c.st.loginTTL), zap.Bool("renewable", c.st.renewable))
	return nil
}
