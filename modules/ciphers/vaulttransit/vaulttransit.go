// Package vaulttransit provides the toolgate.ciphers.vault_transit cipher: it
// encrypts credential records with a derived key of HashiCorp Vault's Transit
// secrets engine, so the gateway never holds the key material itself.
package vaulttransit

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/hashicorp/vault/api"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Cipher{})
}

// Default values of optional settings.
const (
	DefaultMount        = "transit"
	DefaultAppRoleMount = "approle"
	DefaultTimeout      = 5 * time.Second
)

// Cipher encrypts and decrypts credential records with a key of Vault's Transit
// secrets engine. The key must be derived (created with derived=true): every
// record is encrypted under its context (service and user), so a record copied
// into another user's slot cannot be decrypted.
//
// The gateway authenticates to Vault either with a static token or with an
// AppRole login. Its policy needs:
//
//	path "<mount>/encrypt/<key>" { capabilities = ["update"] }
//	path "<mount>/decrypt/<key>" { capabilities = ["update"] }
//	path "<mount>/keys/<key>"    { capabilities = ["read"] }
//
// Provision builds the client without contacting Vault. Start (called by the
// toolgate app when it starts) logs in and checks that the key exists and is
// derived. A definite misconfiguration (key missing or not derived, permission
// denied, AppRole credentials refused) fails Start. A Vault that is
// unreachable, sealed or overloaded at that moment does not: Start logs a
// warning and returns, so a transient outage does not crash-loop the gateway;
// calls then fail with errors wrapping gateway.ErrCipherUnavailable (reported
// to runners as retryable) and the first call after Vault comes back performs
// the check before anything is encrypted.
//
// Key rotation (vault write -f <mount>/keys/<key>/rotate) needs nothing here:
// records encrypted under older versions still decrypt, new ones use the
// newest version.
//
// Caddyfile syntax (inside the toolgate global option):
//
//	cipher vault_transit {
//		address   <url>
//		token     <token>
//		approle {
//			role_id   <role_id>
//			secret_id <secret_id>
//			mount     <path>
//		}
//		namespace <namespace>
//		mount     <path>
//		key       <name>
//		timeout   <duration>
//		tls {
//			ca_file     <path>
//			server_name <name>
//		}
//	}
//
// Exactly one of token and approle is required, as are address and key.
type Cipher struct {
	// Address is the URL of the Vault server, for example
	// https://vault.example.com:8200. It is required. Placeholders such as
	// {env.VAULT_ADDR} are expanded when the module is provisioned.
	Address string `json:"address,omitempty"`

	// Token is a static Vault token used for every request. Exactly one of
	// Token and AppRole must be set. Write it as a placeholder such as
	// {env.VAULT_TOKEN} to keep it out of the config file.
	Token string `json:"token,omitempty"`

	// AppRole logs in with Vault's AppRole auth method instead of a static
	// token. The resulting token is renewed (or the login repeated) before
	// it expires, and a request refused with 403 logs in again once.
	AppRole *AppRole `json:"approle,omitempty"`

	// Namespace is the Vault Enterprise namespace to work in. Empty means the
	// root namespace.
	Namespace string `json:"namespace,omitempty"`

	// Mount is the path where the Transit secrets engine is enabled. The
	// default is "transit".
	Mount string `json:"mount,omitempty"`

	// Key is the name of the Transit key. It is required, and the key must
	// have been created with derived=true, for example with
	// `vault write -f transit/keys/toolgate derived=true`.
	Key string `json:"key,omitempty"`

	// Timeout bounds each request to Vault. The default is 5s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// TLS configures how the Vault server's certificate is verified. Without
	// it, the system's root certificates are used.
	TLS *TLS `json:"tls,omitempty"`

	logger *zap.Logger

	// Settings after placeholder expansion and defaults.
	address      string
	token        string
	roleID       string
	secretID     string
	approleMount string
	namespace    string
	mount        string
	key          string
	timeout      time.Duration

	httpClient  *http.Client
	client      *api.Client // carries the token used for transit requests
	loginClient *api.Client // carries no token; used for AppRole logins

	// st is the mutable runtime state, behind a pointer so the module value
	// can be copied (CaddyModule has a value receiver).
	st *state
}

// state is the cipher's mutable runtime state.
type state struct {
	// ready is set once the key has been found to exist and be derived.
	ready atomic.Bool
	// refreshAt is when the AppRole token should be renewed or replaced, in
	// Unix nanoseconds; 0 means a login is needed now. Unused with a static
	// token.
	refreshAt atomic.Int64
	// tokenGen counts AppRole logins, so a request refused with 403 logs in
	// again only if nobody else has done so since the request started.
	tokenGen atomic.Uint64

	mu sync.Mutex // serializes logins and the key check; guards the fields below
	// loginTTL is the TTL the last AppRole login granted.
	loginTTL time.Duration
	// renewable reports whether the current AppRole token can be renewed.
	renewable bool
	// expiresAt is when the current AppRole token expires; zero if it never does.
	expiresAt time.Time
	// lastErr and lastErrAt remember the last preparation that found Vault
	// unavailable, so callers that queued behind it share its result instead
	// of waiting in turn.
	lastErr   error
	lastErrAt time.Time
}

// AppRole holds the credentials of a Vault AppRole login.
type AppRole struct {
	// RoleID is the role's role_id. It is required. Placeholders are expanded.
	RoleID string `json:"role_id,omitempty"`

	// SecretID is a secret_id issued for the role. It is required unless the
	// role does not bind secret IDs. Placeholders are expanded; write it as
	// {env.VAULT_SECRET_ID} or {file./path/to/secret_id}.
	SecretID string `json:"secret_id,omitempty"`

	// Mount is the path where the AppRole auth method is enabled. The default
	// is "approle".
	Mount string `json:"mount,omitempty"`
}

// TLS configures verification of the Vault server's certificate.
type TLS struct {
	// CAFile is a PEM file of CA certificates trusted to sign the Vault
	// server's certificate, instead of the system's roots.
	CAFile string `json:"ca_file,omitempty"`

	// ServerName is the name expected in the Vault server's certificate (and
	// sent as SNI) when it differs from the host in Address.
	ServerName string `json:"server_name,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Cipher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "toolgate.ciphers.vault_transit",
		New: func() caddy.Module { return new(Cipher) },
	}
}

// Provision expands placeholders, applies defaults and builds the Vault
// client. It does not contact Vault.
func (c *Cipher) Provision(ctx caddy.Context) error {
	c.logger = ctx.Logger()
	c.st = new(state)

	repl := caddy.NewReplacer()
	expand := func(s string) string { return strings.TrimSpace(repl.ReplaceKnown(s, "")) }

	c.address = strings.TrimRight(expand(c.Address), "/")
	secret := func(what, raw string) (string, error) {
		v, err := caddyopt.Secret(repl, raw)
		if err != nil {
			return "", fmt.Errorf("vault_transit: %s %w", what, err)
		}
		return strings.TrimSpace(v), nil
	}
	var err error
	if c.token, err = secret("token", c.Token); err != nil {
		return err
	}
	c.namespace = strings.Trim(expand(c.Namespace), "/")
	c.mount = strings.Trim(expand(c.Mount), "/")
	if c.mount == "" {
		c.mount = DefaultMount
	}
	c.key = expand(c.Key)
	c.timeout = time.Duration(c.Timeout)
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.AppRole != nil {
		c.roleID = expand(c.AppRole.RoleID)
		if c.secretID, err = secret("approle secret_id", c.AppRole.SecretID); err != nil {
			return err
		}
		c.approleMount = strings.Trim(expand(c.AppRole.Mount), "/")
		if c.approleMount == "" {
			c.approleMount = DefaultAppRoleMount
		}
	}

	if c.address == "" {
		return nil // Validate reports it
	}
	if err := c.buildClients(); err != nil {
		return err
	}
	c.client.SetToken(c.token) // empty with AppRole until the first login
	return nil
}

// buildClients builds the Vault API clients from the module's settings only:
// the VAULT_* environment variables the API package reads are overridden, so
// the Caddy config alone decides where and how to connect.
func (c *Cipher) buildClients() error {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	c.httpClient = &http.Client{
		Transport: transport,
		// Vault's client follows redirects itself.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	newConfig := func() *api.Config {
		return &api.Config{
			Address:    c.address,
			HttpClient: c.httpClient,
			Timeout:    c.timeout,
			// Failures reach the caller at once, as retryable errors,
			// instead of being retried here behind its back.
			MaxRetries: 0,
		}
	}
	cfg := newConfig()
	if c.TLS != nil {
		repl := caddy.NewReplacer()
		// Configures the shared transport.
		err := cfg.ConfigureTLS(&api.TLSConfig{
			CACert:        repl.ReplaceKnown(c.TLS.CAFile, ""),
			TLSServerName: repl.ReplaceKnown(c.TLS.ServerName, ""),
		})
		if err != nil {
			return fmt.Errorf("vault_transit: tls: %v", err)
		}
	}
	var err error
	if c.client, err = c.newClient(cfg); err != nil {
		return err
	}
	c.loginClient, err = c.newClient(newConfig())
	return err
}

func (c *Cipher) newClient(cfg *api.Config) (*api.Client, error) {
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("vault_transit: address %q: %v", caddyopt.RedactURL(c.address),
			strings.ReplaceAll(caddyopt.URLError(err).Error(), c.address, caddyopt.RedactURL(c.address)))
	}
	client.ClearToken() // set from VAULT_TOKEN by NewClient
	client.ClearNamespace()
	if c.namespace != "" {
		client.SetNamespace(c.namespace)
	}
	return client, nil
}

// Validate checks the provisioned configuration.
func (c *Cipher) Validate() error {
	if c.address == "" {
		if c.Address != "" {
			return fmt.Errorf("vault_transit: address %q is empty once placeholders are replaced", caddyopt.RedactURL(c.Address))
		}
		return errors.New("vault_transit: address is required")
	}
	if !strings.HasPrefix(c.address, "https://") && !strings.HasPrefix(c.address, "http://") && !strings.HasPrefix(c.address, "unix://") {
		return fmt.Errorf("vault_transit: address %q must start with https://, http:// or unix://", caddyopt.RedactURL(c.address))
	}
	if caddyopt.RedactURL(c.address) != c.address {
		// Vault authenticates with the token; a user and password in the
		// address would reach every message that names it.
		return fmt.Errorf("vault_transit: address %q must not carry a user or password (Vault is reached with the token)", caddyopt.RedactURL(c.address))
	}
	if !strings.HasPrefix(c.address, "unix://") {
		// The token, and every credential toolgate seals, cross the
		// connection: in plain text only on this machine.
		if err := caddyopt.FetchURL(c.address); err != nil {
			return fmt.Errorf("vault_transit: address %w (or unix://)", err)
		}
	}
	if c.key == "" {
		return errors.New("vault_transit: key is required")
	}
	if strings.Contains(c.key, "/") {
		return fmt.Errorf("vault_transit: key %q must not contain '/'", c.key)
	}
	switch {
	case c.Token != "" && c.AppRole != nil:
		return errors.New("vault_transit: set either token or approle, not both")
	case c.Token == "" && c.AppRole == nil:
		return errors.New("vault_transit: one of token or approle is required")
	case c.AppRole == nil && c.token == "":
		// Only placeholders can expand to nothing, so printing c.Token
		// reveals no secret.
		return fmt.Errorf("vault_transit: token %q is empty once placeholders are replaced", c.Token)
	case c.AppRole != nil && c.roleID == "":
		return errors.New("vault_transit: approle role_id is required (or empty once placeholders are replaced)")
	}
	if c.Timeout < 0 {
		return errors.New("vault_transit: timeout must not be negative")
	}
	return nil
}

// Start logs in (with AppRole) and checks that the key exists and is derived.
// It fails on a definite misconfiguration; if Vault is merely unavailable it
// logs a warning and returns nil, and the check happens on first use.
func (c *Cipher) Start(ctx context.Context) error {
	if c.client == nil {
		return errors.New("vault_transit: not provisioned")
	}
	err := c.prepare(ctx)
	switch {
	case err == nil:
		c.logger.Info("vault transit ready",
			zap.String("address", c.address), zap.String("mount", c.mount), zap.String("key", c.key))
		return nil
	case errors.Is(err, gateway.ErrCipherUnavailable):
		c.logger.Warn("vault transit unavailable at startup; credential calls fail as retryable until it is back",
			zap.String("address", c.address), zap.Error(err))
		return nil
	default:
		return err
	}
}

// Cleanup closes idle connections to Vault.
func (c *Cipher) Cleanup() error {
	if c.httpClient != nil {
		c.httpClient.CloseIdleConnections()
	}
	return nil
}

// Encrypt encrypts plaintext under context with the Transit key and returns
// Vault's ciphertext ("vault:vN:…").
func (c *Cipher) Encrypt(ctx context.Context, plaintext, context []byte) ([]byte, error) {
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	b64 := base64.StdEncoding.EncodeToString(plaintext)
	secret, err := c.write(ctx, opEncrypt, map[string]any{
		"plaintext": b64,
		"context":   base64.StdEncoding.EncodeToString(context),
	}, b64)
	if err != nil {
		return nil, err
	}
	ct, _ := secretString(secret, "ciphertext")
	if !strings.HasPrefix(ct, "vault:v") {
		return nil, fmt.Errorf("vault transit at %s returned no ciphertext for key %q", c.address, c.key)
	}
	return []byte(ct), nil
}

// Decrypt decrypts a ciphertext produced by Encrypt with the same context.
func (c *Cipher) Decrypt(ctx context.Context, ciphertext, context []byte) ([]byte, error) {
	if !strings.HasPrefix(string(ciphertext), "vault:v") {
		return nil, errors.New("vault transit: not a vault transit ciphertext")
	}
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	ct := string(ciphertext)
	secret, err := c.write(ctx, opDecrypt, map[string]any{
		"ciphertext": ct,
		"context":    base64.StdEncoding.EncodeToString(context),
	}, ct)
	if err != nil {
		return nil, err
	}
	b64, ok := secretString(secret, "plaintext")
	if !ok {
		return nil, fmt.Errorf("vault transit at %s returned no plaintext for key %q", c.address, c.key)
	}
	pt, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("vault transit at %s returned a plaintext that is not base64", c.address)
	}
	return pt, nil
}

// op names a transit operation: what it does and the path it uses.
type op struct {
	name       string // for messages: "encrypt"
	path       string // path under the mount, without the key: "encrypt"
	capability string // capability the policy must grant on the path
}

var (
	opEncrypt = op{name: "encrypt", path: "encrypt", capability: "update"}
	opDecrypt = op{name: "decrypt", path: "decrypt", capability: "update"}
	opReadKey = op{name: "read", path: "keys", capability: "read"}
)

func (c *Cipher) pathOf(o op) string { return c.mount + "/" + o.path + "/" + c.key }

// write performs a transit write. With AppRole, a 403 (the token may have
// been revoked or expired early) triggers one new login and one retry.
// secrets are redacted from any error message.
func (c *Cipher) write(ctx context.Context, o op, data map[string]any, secrets ...string) (*api.Secret, error) {
	gen := c.st.tokenGen.Load()
	secret, err := c.client.Logical().WriteWithContext(ctx, c.pathOf(o), data)
	if err != nil && c.AppRole != nil && statusOf(err) == http.StatusForbidden {
		if lerr := c.reloginAfter(ctx, gen); lerr != nil {
			return nil, lerr
		}
		secret, err = c.client.Logical().WriteWithContext(ctx, c.pathOf(o), data)
	}
	if err != nil {
		return nil, c.classify(o, err, secrets...)
	}
	if secret == nil {
		return nil, fmt.Errorf("vault transit at %s: %s on key %q returned nothing (is the transit engine enabled at %q?)",
			c.address, o.name, c.key, c.mount)
	}
	return secret, nil
}

func secretString(s *api.Secret, field string) (string, bool) {
	if s == nil || s.Data == nil {
		return "", false
	}
	v, ok := s.Data[field].(string)
	return v, ok
}

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

// unavailableError reports that Vault cannot be used right now; it wraps
// gateway.ErrCipherUnavailable.
type unavailableError struct{ msg string }

func (e *unavailableError) Error() string { return e.msg }
func (e *unavailableError) Unwrap() error { return gateway.ErrCipherUnavailable }

func unavailable(format string, args ...any) error {
	return &unavailableError{msg: fmt.Sprintf(format, args...)}
}

func statusOf(err error) int {
	var re *api.ResponseError
	if errors.As(err, &re) {
		return re.StatusCode
	}
	return 0
}

// classify turns an error of a transit request into one that says what to
// do. It never includes request bodies; secrets are redacted from Vault's own
// messages as a precaution.
func (c *Cipher) classify(o op, err error, secrets ...string) error {
	path := c.pathOf(o)
	secrets = c.secrets(secrets...)
	if uerr := c.classifyTransport(o.name, err, secrets); uerr != nil {
		return uerr
	}
	var re *api.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("vault transit at %s: %s on key %q failed: %s", c.address, o.name, c.key, redact(err.Error(), secrets))
	}
	vaultMsg := redact(strings.Join(re.Errors, "; "), secrets)
	switch re.StatusCode {
	case http.StatusForbidden:
		hint := "the token is invalid or expired, or its policy does not allow"
		if c.AppRole != nil {
			hint = "the approle's token policies must allow"
		}
		return fmt.Errorf("vault transit at %s denied %s on key %q (permission denied): %s path %q { capabilities = [%q] }",
			c.address, o.name, c.key, hint, path, o.capability)
	case http.StatusBadRequest:
		if o == opDecrypt {
			return fmt.Errorf("vault transit could not decrypt with key %q: %w: it was encrypted for another context or key, or is damaged (%s)", c.key, gateway.ErrCipherMismatch, vaultMsg)
		}
		return fmt.Errorf("vault transit at %s refused %s on key %q: %s", c.address, o.name, c.key, vaultMsg)
	case http.StatusNotFound:
		return fmt.Errorf("vault transit at %s: %s on key %q found no handler at %q: is the transit engine enabled at %q? (%s)",
			c.address, o.name, c.key, path, c.mount, vaultMsg)
	}
	return fmt.Errorf("vault transit at %s: %s on key %q failed with HTTP %d: %s", c.address, o.name, c.key, re.StatusCode, vaultMsg)
}

// classifyAuth is classify for login and renewal requests.
func (c *Cipher) classifyAuth(what, path string, err error) error {
	secrets := c.secrets()
	if uerr := c.classifyTransport(what, err, secrets); uerr != nil {
		return uerr
	}
	var re *api.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("vault at %s: could not %s: %s", c.address, what, redact(err.Error(), secrets))
	}
	vaultMsg := redact(strings.Join(re.Errors, "; "), secrets)
	switch re.StatusCode {
	case http.StatusBadRequest, http.StatusForbidden:
		if strings.HasPrefix(path, "auth/token/") {
			return fmt.Errorf("vault at %s refused to %s (HTTP %d): %s", c.address, what, re.StatusCode, vaultMsg)
		}
		return fmt.Errorf("vault at %s refused to %s at %s (HTTP %d: %s): check role_id and secret_id (secret IDs expire and may be single-use), and that the approle auth method is enabled at %q",
			c.address, what, path, re.StatusCode, vaultMsg, c.approleMount)
	case http.StatusNotFound:
		return fmt.Errorf("vault at %s: could not %s: no handler at %s; is the approle auth method enabled at %q?",
			c.address, what, path, c.approleMount)
	}
	return fmt.Errorf("vault at %s: could not %s: HTTP %d: %s", c.address, what, re.StatusCode, vaultMsg)
}

// classifyTransport returns an unavailable error for failures that may pass
// by themselves (sealed, overloaded, unreachable, slow), and nil otherwise.
func (c *Cipher) classifyTransport(what string, err error, secrets []string) error {
	var re *api.ResponseError
	if errors.As(err, &re) {
		vaultMsg := redact(strings.Join(re.Errors, "; "), secrets)
		switch {
		case re.StatusCode == http.StatusServiceUnavailable && strings.Contains(strings.ToLower(vaultMsg), "sealed"):
			return unavailable("vault transit at %s is sealed: unseal it (vault operator unseal)", c.address)
		case re.StatusCode == http.StatusTooManyRequests:
			return unavailable("vault transit at %s is rate limiting requests (HTTP 429) to %s: retry later or raise its rate limit quota", c.address, what)
		case re.StatusCode >= 500:
			return unavailable("vault transit at %s failed to %s (HTTP %d: %s): check the Vault server's health and logs",
				c.address, what, re.StatusCode, vaultMsg)
		}
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("vault transit %s: %w", what, context.Canceled)
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return unavailable("vault transit at %s did not answer %s within %s: check that Vault is up and reachable",
			c.address, what, c.timeout)
	}
	return unavailable("vault transit at %s is unreachable for %s (%s): check that Vault is running and the address is right",
		c.address, what, redact(err.Error(), secrets))
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// redact removes each non-empty secret from s.
// secrets are what an error of Vault's must not repeat: the call's own
// (plaintexts), the secret ID, the configured token, and the token the
// client holds now (with AppRole, the one the last login gave, which a
// proxy in front of Vault could quote).
func (c *Cipher) secrets(call ...string) []string {
	return append(call, c.secretID, c.token, c.client.Token())
}

func redact(s string, secrets []string) string {
	for _, sec := range secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
	}
	return s
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Cipher)(nil)
	_ caddy.Validator       = (*Cipher)(nil)
	_ caddy.CleanerUpper    = (*Cipher)(nil)
	_ gateway.Cipher        = (*Cipher)(nil)
	_ gateway.CipherStarter = (*Cipher)(nil)
)
