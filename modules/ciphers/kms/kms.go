// Package kms provides the toolgate.ciphers.kms cipher: envelope encryption
// with a key kept in AWS Key Management Service (or a server that speaks its
// API). For every value it asks KMS for a fresh 256-bit data key
// (GenerateDataKey), encrypts the value locally with AES-256-GCM and stores
// the data key only as KMS wrapped it; reading a value asks KMS to unwrap
// that key (Decrypt). The gateway never holds the KMS key itself, and since
// only the 32-byte data key goes to KMS, values of any size can be stored
// (KMS's own Encrypt stops at 4,096 bytes).
//
// Each record is bound to its (service, user) twice: the data key is
// wrapped under a KMS encryption context naming the record, so KMS refuses
// to unwrap it for another record (and CloudTrail shows whose record each
// request was for), and the same context is AES-GCM additional data. A
// value copied into another user's slot does not decrypt.
//
// # Why the AWS SDK and not gocloud.dev/secrets
//
// gocloud.dev/secrets opens AWS KMS, GCP Cloud KMS, Azure Key Vault and
// Vault Transit by URL, but its Keeper has only Encrypt and Decrypt of the
// value itself: no GenerateDataKey, so no envelope as KMS offers it (AWS KMS
// would cap values at 4,096 bytes, or the gateway would have to make data
// keys itself and wrap them with kms:Encrypt). Its encryption context (AWS)
// or additional data (GCP) is fixed when a Keeper is opened, and Azure's
// keeper has none, so binding every wrapped key to its own record, where
// KMS enforces and audits it, would take a Keeper per record and still hold
// on some clouds only. The portable layer would also bring the GCP and
// Azure SDKs into the gateway for code paths that the project's tests
// cannot exercise against a real server. So this cipher uses the AWS SDK for Go v2's KMS
// client directly: GenerateDataKey and Decrypt with a per-record encryption
// context, which is envelope encryption as AWS documents it. It speaks to
// AWS KMS and to KMS-compatible servers (set endpoint); GCP Cloud KMS and
// Azure Key Vault are not supported. key_url uses the awskms:// form of
// gocloud.dev's URLs, so that other schemes can be added without changing
// the syntax.
//
// # Caching
//
// Unwrapped data keys are kept in memory (as AES-GCM ciphers) for
// cache_ttl, at most cache_size of them, so reading a record again within
// that time costs no KMS request; they are never written anywhere. A fresh
// data key is generated for every value written, except that a record just
// read may be written once more under the data key it was read with while
// KMS cannot generate one (see Cipher.Encrypt), so an OAuth refresh caught
// by an outage does not lose the provider's rotated refresh token.
//
// # Rotation
//
// Each stored value names the ARN of the KMS key that wrapped its data key.
// Pointing key_url at another key (or an alias at another key) makes new
// values use that key, while older values still decrypt with the key they
// name, as long as the gateway may still call kms:Decrypt on it. AWS's own
// automatic rotation keeps the key id and needs nothing here.
package kms

import (
	"context"
	"crypto/cipher"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	awskms "github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/kms/types"
	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Cipher{})
}

// Default values of optional settings.
const (
	DefaultTimeout   = 5 * time.Second
	DefaultCacheTTL  = 5 * time.Minute
	DefaultCacheSize = 1000
)

// Cipher encrypts credential records by envelope encryption under a key of
// AWS KMS (see the package documentation for the design).
//
// The gateway's AWS identity needs kms:GenerateDataKey and kms:Decrypt on
// the key, and kms:Decrypt on every earlier key whose values must still be
// read. Credentials come from the AWS SDK's default chain: environment
// variables, the shared config and credentials files (AWS_PROFILE), web
// identity (EKS), the container's or the instance's role.
//
// Provision reads the AWS configuration without contacting anything, so
// `caddy validate` works offline. Start (called by the toolgate app when it
// starts) generates and unwraps one data key to prove that the key exists,
// can encrypt, and that both permissions are granted. A key that does not
// exist or cannot encrypt fails Start. KMS unreachable, slow, throttling,
// denying access or a disabled key do not: Start logs a warning and returns,
// and calls fail with errors wrapping gateway.ErrCipherUnavailable
// (reported to runners as retryable) until the fault is fixed. Nothing is
// stored unless it was encrypted completely.
//
// Caddyfile syntax (inside the toolgate global option):
//
//	cipher kms {
//		key_url    awskms://<key>[?region=<region>]
//		region     <region>
//		endpoint   <url>
//		timeout    <duration>
//		cache_ttl  <duration>
//		cache_size <count>
//	}
//
// key_url is required; every option takes exactly one argument and may
// appear at most once.
type Cipher struct {
	// KeyURL names the KMS key that wraps new data keys, as
	// awskms://<key id>, awskms://alias/<name>, or awskms:///<ARN> (three
	// slashes) for a key or alias ARN, optionally followed by
	// ?region=<region>. Placeholders are expanded at provisioning.
	KeyURL string `json:"key_url,omitempty"`

	// Region is the AWS region of the key. It may be left out when the
	// key_url is an ARN, carries ?region=, or the AWS configuration names a
	// region (AWS_REGION, or the shared config profile); when several of
	// these are given they must agree.
	Region string `json:"region,omitempty"`

	// Endpoint replaces the regional AWS KMS endpoint, for a VPC or FIPS
	// endpoint or a KMS-compatible server. It must be https://, except on a
	// loopback address (a local test server), where http:// is allowed.
	// Without it, the SDK's standard resolution applies (including
	// AWS_ENDPOINT_URL_KMS).
	Endpoint string `json:"endpoint,omitempty"`

	// Timeout bounds each request to KMS. Failed requests are not retried
	// behind the caller's back: they fail at once as retryable errors. The
	// default is 5s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// CacheTTL is how long a data key serves reads from memory after KMS
	// generated or unwrapped it, however often it is used; a key revoked in
	// KMS stops working here within this time. While KMS cannot generate
	// data keys, the key a record was just read with may still seal the
	// next value of that same record, for up to one minute more (so an
	// OAuth token refreshed just as KMS became unavailable is not lost);
	// then it is dropped. The default is 5m.
	CacheTTL caddy.Duration `json:"cache_ttl,omitempty"`

	// CacheSize is how many unwrapped data keys are kept in memory at most;
	// beyond it the oldest is dropped. The default is 1000.
	CacheSize int `json:"cache_size,omitempty"`

	logger *zap.Logger

	// Settings after placeholder expansion and defaults.
	keyID     string // as in key_url: key id, alias name or ARN
	region    string
	endpoint  string
	timeout   time.Duration
	cacheTTL  time.Duration
	cacheSize int

	client  kmsAPI
	cache   *keyCache
	unwraps *singleflight.Group
}

// kmsAPI is the part of the KMS client the cipher uses.
type kmsAPI interface {
	GenerateDataKey(context.Context, *awskms.GenerateDataKeyInput, ...func(*awskms.Options)) (*awskms.GenerateDataKeyOutput, error)
	Decrypt(context.Context, *awskms.DecryptInput, ...func(*awskms.Options)) (*awskms.DecryptOutput, error)
}

// CaddyModule returns the Caddy module information.
func (Cipher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "toolgate.ciphers.kms",
		New: func() caddy.Module { return new(Cipher) },
	}
}

// Provision expands placeholders, applies defaults, reads the AWS
// configuration and builds the KMS client. It contacts nothing.
func (c *Cipher) Provision(ctx caddy.Context) error {
	c.logger = ctx.Logger()
	repl := caddy.NewReplacer()
	expand := func(s string) string { return strings.TrimSpace(repl.ReplaceKnown(s, "")) }

	c.region = expand(c.Region)
	c.endpoint = strings.TrimRight(expand(c.Endpoint), "/")
	c.timeout = defaultDuration(c.Timeout, DefaultTimeout)
	c.cacheTTL = defaultDuration(c.CacheTTL, DefaultCacheTTL)
	c.cacheSize = c.CacheSize
	if c.cacheSize == 0 {
		c.cacheSize = DefaultCacheSize
	}
	c.cache = newKeyCache(c.cacheTTL, max(c.cacheSize, 1))
	c.unwraps = new(singleflight.Group)

	keyURL := expand(c.KeyURL)
	if keyURL == "" {
		return nil // Validate reports it
	}
	keyID, urlRegion, err := parseKeyURL(keyURL)
	if err != nil {
		return err
	}
	c.keyID = keyID
	if c.region, err = agreeOnRegion(c.region, urlRegion, arnRegion(keyID)); err != nil {
		return err
	}

	// The SDK's own HTTP client (TLS 1.2 at least, AWS_CA_BUNDLE honoured);
	// its idle connections close by themselves.
	opts := []func(*config.LoadOptions) error{
		// Failures reach the caller at once, as retryable errors.
		config.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
	}
	if c.region != "" {
		opts = append(opts, config.WithRegion(c.region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return fmt.Errorf("kms: reading the AWS configuration: %v", err)
	}
	c.region = cfg.Region
	c.client = awskms.NewFromConfig(cfg, func(o *awskms.Options) {
		if c.endpoint != "" {
			o.BaseEndpoint = aws.String(c.endpoint)
		}
	})
	return nil
}

func defaultDuration(d caddy.Duration, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}

// parseKeyURL reads awskms://<key>[?region=<region>] and returns the key id
// (a key id, alias/<name>, or an ARN) and the region parameter.
func parseKeyURL(s string) (keyID, region string, err error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return "", "", fmt.Errorf("kms: key_url %q must look like awskms://<key id>, awskms://alias/<name> or awskms:///<key ARN>", s)
	}
	switch scheme {
	case "awskms":
	case "gcpkms", "azurekeyvault", "hashivault", "base64key":
		return "", "", fmt.Errorf("kms: key_url %q: %s:// is not supported; this cipher speaks the AWS KMS API only (AWS KMS, or a KMS-compatible server with endpoint); use vault_transit or local otherwise", s, scheme)
	default:
		return "", "", fmt.Errorf("kms: key_url %q: unknown scheme %q, want awskms://", s, scheme)
	}
	rest, query, _ := strings.Cut(rest, "?")
	keyID = strings.TrimPrefix(rest, "/")
	if keyID == "" || strings.ContainsAny(keyID, " \t") || strings.HasSuffix(keyID, "/") {
		return "", "", fmt.Errorf("kms: key_url %q names no key: give a key id, alias/<name>, or a key ARN after three slashes", s)
	}
	if strings.HasPrefix(keyID, "arn:") {
		if parts := strings.SplitN(keyID, ":", 6); len(parts) != 6 || parts[2] != "kms" || parts[3] == "" ||
			!(strings.HasPrefix(parts[5], "key/") || strings.HasPrefix(parts[5], "alias/")) {
			return "", "", fmt.Errorf("kms: key_url %q: %q is not a KMS key or alias ARN (arn:<partition>:kms:<region>:<account>:key/<id>)", s, keyID)
		}
	}
	values, err := url.ParseQuery(query)
	if err != nil {
		return "", "", fmt.Errorf("kms: key_url %q: bad query: %v", s, err)
	}
	for name, vs := range values {
		if name != "region" {
			return "", "", fmt.Errorf("kms: key_url %q: unknown parameter %q (only region is known)", s, name)
		}
		if len(vs) != 1 || vs[0] == "" {
			return "", "", fmt.Errorf("kms: key_url %q: give region once, with a value", s)
		}
		region = vs[0]
	}
	return keyID, region, nil
}

// arnRegion is the region in a KMS ARN, "" for other key ids.
func arnRegion(keyID string) string {
	if !strings.HasPrefix(keyID, "arn:") {
		return ""
	}
	return strings.SplitN(keyID, ":", 6)[3]
}

// agreeOnRegion returns the one region the option, the key_url parameter
// and the ARN name, or an error if they differ. It may return "".
func agreeOnRegion(option, param, fromARN string) (string, error) {
	region := ""
	for _, r := range []struct{ where, region string }{{"region", option}, {"key_url's ?region=", param}, {"the key ARN", fromARN}} {
		if r.region == "" {
			continue
		}
		if region != "" && r.region != region {
			return "", fmt.Errorf("kms: %s says %q but an earlier setting says %q: give the key's region once", r.where, r.region, region)
		}
		region = r.region
	}
	return region, nil
}

// Validate checks the provisioned configuration.
func (c *Cipher) Validate() error {
	if c.keyID == "" {
		if c.KeyURL != "" {
			return fmt.Errorf("kms: key_url %q is empty once placeholders are replaced", c.KeyURL)
		}
		return errors.New("kms: key_url is required, for example awskms://alias/toolgate")
	}
	if c.region == "" {
		return errors.New("kms: no region: set region, use a key ARN in key_url, or give the gateway AWS_REGION")
	}
	if c.endpoint != "" {
		if err := checkEndpoint(c.endpoint); err != nil {
			return err
		}
	}
	switch {
	case c.Timeout < 0:
		return errors.New("kms: timeout must be positive")
	case c.CacheTTL < 0:
		return errors.New("kms: cache_ttl must be positive")
	case c.CacheSize < 0:
		return errors.New("kms: cache_size must be positive")
	}
	return nil
}

// checkEndpoint accepts https:// URLs, and http:// ones on loopback
// addresses: data keys travel in KMS's answers.
func checkEndpoint(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("kms: endpoint %q must be a URL like https://kms.example.com (without user or password)", caddyopt.RedactURL(s))
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if caddyopt.LoopbackHost(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("kms: endpoint %q: http:// is allowed only on a loopback address (KMS answers carry data keys); use https://", s)
	}
	return fmt.Errorf("kms: endpoint %q must start with https://", s)
}

// Start proves the key usable by generating and unwrapping one data key. It
// fails on a definite misconfiguration; if KMS is merely unavailable (or
// still denies access) it logs a warning and returns nil.
func (c *Cipher) Start(ctx context.Context) error {
	if c.client == nil {
		return errors.New("kms: not provisioned")
	}
	err := c.check(ctx)
	switch {
	case err == nil:
		c.logger.Info("kms cipher ready", zap.String("key", c.keyID), zap.String("region", c.region), zap.String("endpoint", c.endpoint))
		return nil
	case errors.Is(err, gateway.ErrCipherUnavailable):
		c.logger.Warn("kms unavailable at startup; credential calls fail as retryable until it is back", zap.Error(err))
		return nil
	}
	return err
}

// check generates a data key and has KMS unwrap it again, without caching.
func (c *Cipher) check(ctx context.Context) error {
	ec := map[string]string{contextKey: "toolgate/startup-check"}
	keyID, wrapped, plain, err := c.generate(ctx, ec)
	if err != nil {
		return err
	}
	clear(plain)
	_, err = c.unwrap(ctx, keyID, wrapped, ec)
	return err
}

// Cleanup forgets the cached data keys.
func (c *Cipher) Cleanup() error {
	if c.cache != nil {
		c.cache.purge()
	}
	return nil
}

// contextKey is the KMS encryption context key under which each data key
// is bound to its record (gateway.CipherContext).
const contextKey = "toolgate_record"

// encryptionContext is KMS's encryption context for a record.
func encryptionContext(record []byte) (map[string]string, error) {
	if len(record) == 0 || !utf8.Valid(record) {
		return nil, errors.New("kms cipher: the record context must be non-empty UTF-8")
	}
	return map[string]string{contextKey: string(record)}, nil
}

// Encrypt encrypts plaintext for the record named by the cipher context
// record, under a fresh data key, and returns the stored form (see
// envelope.go). If KMS cannot give a data key right now but this record
// was just read (see keyCache), the value is sealed under the data key of
// the value read instead, as safely bound as the value it replaces, so a
// write that follows a read (an OAuth refresh) is not lost to an outage
// that began in between.
func (c *Cipher) Encrypt(ctx context.Context, plaintext, record []byte) ([]byte, error) {
	if c.client == nil {
		return nil, errors.New("kms: not provisioned")
	}
	ec, err := encryptionContext(record)
	if err != nil {
		return nil, err
	}
	keyID, wrapped, key, err := c.generate(ctx, ec)
	if err != nil {
		if !errors.Is(err, gateway.ErrCipherUnavailable) {
			return nil, err
		}
		keyID, wrapped, aead, ok := c.cache.lastRead(record)
		if !ok {
			return nil, err
		}
		c.logger.Warn("kms unavailable; sealed the record under the data key it was just read with", zap.String("key", keyID), zap.Error(err))
		return seal(aead, envelopeHeader(keyID, wrapped), plaintext, record)
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	stored, err := seal(aead, envelopeHeader(keyID, wrapped), plaintext, record)
	if err != nil {
		return nil, err
	}
	c.cache.put(keyID, wrapped, record, aead, false)
	return stored, nil
}

// Decrypt opens a value Encrypt stored for the same record, with the key
// it names.
func (c *Cipher) Decrypt(ctx context.Context, stored, record []byte) ([]byte, error) {
	if c.client == nil {
		return nil, errors.New("kms: not provisioned")
	}
	env, err := parseEnvelope(stored)
	if err != nil {
		return nil, err
	}
	ec, err := encryptionContext(record)
	if err != nil {
		return nil, err
	}
	k := keyOf(env.keyID, env.wrapped, record)
	aead, ok := c.cache.get(k)
	if !ok {
		// Callers reading the same record at once share one KMS request,
		// so it must not end when the first of them gives up; it has its
		// own timeout.
		v, err, _ := c.unwraps.Do(string(k[:]), func() (any, error) {
			if aead, ok := c.cache.get(k); ok {
				return aead, nil
			}
			aead, err := c.unwrap(context.WithoutCancel(ctx), env.keyID, env.wrapped, ec)
			if err != nil {
				return nil, err
			}
			c.cache.put(env.keyID, env.wrapped, record, aead, true)
			return aead, nil
		})
		if err != nil {
			return nil, err
		}
		aead = v.(cipher.AEAD)
	}
	return env.open(aead, record)
}

// generate asks KMS for a data key bound to ec and returns the wrapping
// key's ARN, the wrapped key and the plaintext key (the caller clears it).
func (c *Cipher) generate(ctx context.Context, ec map[string]string) (keyID string, wrapped, key []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	out, err := c.client.GenerateDataKey(ctx, &awskms.GenerateDataKeyInput{
		KeyId:             aws.String(c.keyID),
		KeySpec:           types.DataKeySpecAes256,
		EncryptionContext: ec,
	})
	if err != nil {
		return "", nil, nil, c.classify(opGenerate, c.keyID, err)
	}
	if len(out.CiphertextBlob) == 0 || len(out.CiphertextBlob) > maxWrappedLen || len(out.Plaintext) != dataKeySize {
		clear(out.Plaintext)
		return "", nil, nil, fmt.Errorf("%s returned a malformed data key for key %s", c.endpointName(), c.keyID)
	}
	keyID = aws.ToString(out.KeyId)
	if keyID == "" || len(keyID) > maxKeyIDLen {
		keyID = c.keyID
	}
	return keyID, out.CiphertextBlob, out.Plaintext, nil
}

// unwrap asks KMS to decrypt a wrapped data key bound to ec and returns it
// as an AES-GCM cipher.
func (c *Cipher) unwrap(ctx context.Context, keyID string, wrapped []byte, ec map[string]string) (cipher.AEAD, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	out, err := c.client.Decrypt(ctx, &awskms.DecryptInput{
		CiphertextBlob:    wrapped,
		KeyId:             aws.String(keyID),
		EncryptionContext: ec,
	})
	if err != nil {
		return nil, c.classify(opDecrypt, keyID, err)
	}
	return newAEAD(out.Plaintext)
}

// endpointName says which KMS is meant, for messages.
func (c *Cipher) endpointName() string {
	if c.endpoint != "" {
		return "the KMS at " + c.endpoint
	}
	return "AWS KMS in " + c.region
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Cipher)(nil)
	_ caddy.Validator       = (*Cipher)(nil)
	_ caddy.CleanerUpper    = (*Cipher)(nil)
	_ gateway.Cipher        = (*Cipher)(nil)
	_ gateway.CipherStarter = (*Cipher)(nil)
)
