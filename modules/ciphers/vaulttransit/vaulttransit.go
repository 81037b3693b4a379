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

// Interface guards
var (
	_ caddy.Provisioner     = (*Cipher)(nil)
	_ caddy.Validator       = (*Cipher)(nil)
	_ caddy.CleanerUpper    = (*Cipher)(nil)
	_ gateway.Cipher        = (*Cipher)(nil)
	_ gateway.CipherStarter = (*Cipher)(nil)
)
