package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	jose "github.com/go-jose/go-jose/v4"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// An issuer's verification keys: those configured, and its JWKS, fetched
// and refreshed while the gateway runs (shared by the configurations that
// name one URL, and kept across reloads).

// jwksPool holds fetched JWKS by URL so a config reload keeps them.
var jwksPool = caddy.NewUsagePool()

// keySet holds an issuer's verification keys: static ones and, in shared,
// the JWKS fetched from url.
type keySet struct {
	url    string
	static []jose.JSONWebKey
	client *http.Client
	shared *keySet

	mu        sync.RWMutex
	fetched   jose.JSONWebKeySet
	fetchedAt time.Time     // of the last fetch that succeeded (see age)
	lastFetch time.Time     // of the last fetch started (at most one a minute)
	fetching  chan struct{} // closed when the running refetch ends; nil when none runs
	logger    *zap.Logger
}

// Destruct implements caddy.Destructor.
func (*keySet) Destruct() error { return nil }

const (
	jwksMinRefresh   = time.Minute
	jwksMaxAge       = 15 * time.Minute
	jwksStaleWait    = time.Second
	jwksFetchTimeout = 10 * time.Second
)

// lookup returns the keys that may have signed a token naming kid. A kid
// no key has triggers a JWKS refetch, at most once per jwksMinRefresh, and
// the callers that need it wait for the same fetch. Keys are trusted for
// jwksMaxAge after the set was fetched, so that a key the issuer stopped
// publishing verifies no new token for longer than that (were the set
// refetched only for unknown key ids, traffic whose tokens all name a
// current key would keep a retired one trusted for as long as the process
// runs): the set is fetched again in the background from two thirds of
// that age, and a token verified past it waits for the fetch up to
// jwksStaleWait — an issuer that does not answer in that time delays
// callers no longer, and its set as it was still verifies. A fetch that
// fails leaves the set as it was, and is tried again a minute later.
func (ks *keySet) lookup(ctx context.Context, kid string) ([]any, error) {
	keys, exact := ks.find(kid)
	if ks.shared == nil || ks.client == nil {
		return found(keys)
	}
	age := ks.shared.age()
	var wait time.Duration
	switch {
	case !exact && (kid != "" || len(keys) == 0):
		wait = jwksFetchTimeout
	case age > jwksMaxAge:
		wait = jwksStaleWait
	case age <= jwksMaxAge*2/3:
		return found(keys)
	}
	done := ks.shared.startFetch(ks.client)
	if done == nil || wait == 0 {
		return found(keys)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		keys, _ = ks.find(kid)
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return found(keys)
}

func found(keys []any) ([]any, error) {
	if len(keys) == 0 {
		return nil, errors.New("unknown key id")
	}
	return keys, nil
}

// age is how long ago the shared key set ks was last fetched
// successfully: a fetch that failed makes the keys held no younger.
func (ks *keySet) age() time.Duration {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	return now().Sub(ks.fetchedAt)
}

// fetchTried reports whether a fetch of the shared key set ks was started.
func (ks *keySet) fetchTried() bool {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	return !ks.lastFetch.IsZero()
}

// startFetch, on a shared key set, starts a refetch of the JWKS unless one
// ran less than jwksMinRefresh ago, and returns a channel closed when the
// running fetch ends (nil when none is due). The fetch is detached from any request: a
// caller that gives up (a client hanging up right after sending a token
// with an unknown key id) neither cancels it nor uses up the minute for
// everyone else.
func (ks *keySet) startFetch(client *http.Client) <-chan struct{} {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.fetching != nil {
		return ks.fetching
	}
	if now().Sub(ks.lastFetch) < jwksMinRefresh {
		return nil
	}
	ks.lastFetch = now()
	done := make(chan struct{})
	ks.fetching = done
	logger := ks.logger
	go func() {
		err := ks.fetch(context.Background(), client)
		ks.mu.Lock()
		ks.fetching = nil
		ks.mu.Unlock()
		close(done)
		if err != nil && logger != nil {
			logger.Warn("cannot refetch JWKS", zap.String("jwks_url", caddyopt.RedactURL(ks.url)), zap.Error(err))
		}
	}()
	return done
}

// find returns the signing keys that may verify a token naming kid: those
// with that key id first, then those without one (PEM files carry none);
// every key when the token names none. exact reports a key with that id.
func (ks *keySet) find(kid string) (keys []any, exact bool) {
	var unnamed []any
	add := func(set []jose.JSONWebKey) {
		for i := range set {
			switch k := &set[i]; {
			case k.Use == "enc":
			case kid != "" && k.KeyID == kid:
				keys = append(keys, k.Key)
			case kid == "" || k.KeyID == "":
				unnamed = append(unnamed, k.Key)
			}
		}
	}
	add(ks.static)
	if sh := ks.shared; sh != nil {
		sh.mu.RLock()
		add(sh.fetched.Keys)
		sh.mu.RUnlock()
	}
	return append(keys, unnamed...), len(keys) > 0
}

func (ks *keySet) refresh(ctx context.Context, client *http.Client) error {
	sh := ks.shared
	sh.mu.Lock()
	sh.lastFetch = now()
	sh.mu.Unlock()
	return sh.fetch(ctx, client)
}

// fetch reads the JWKS at ks.url into ks, a shared key set.
func (ks *keySet) fetch(ctx context.Context, client *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, jwksFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ks.url, nil)
	if err != nil {
		return caddyopt.URLError(err) // the URL may hold a password
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("JWKS answered HTTP %d", resp.StatusCode) // the status's text is the server's
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&set); err != nil {
		return fmt.Errorf("JWKS: %v", err)
	}
	ks.mu.Lock()
	ks.fetched, ks.fetchedAt = set, now()
	ks.mu.Unlock()
	return nil
}

// loadKeyFile reads public keys from a PEM file or a JWKS JSON file.
func loadKeyFile(path string) ([]jose.JSONWebKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if trimmed := strings.TrimSpace(string(data)); strings.HasPrefix(trimmed, "{") {
		var set jose.JSONWebKeySet
		if err := json.Unmarshal(data, &set); err != nil {
			return nil, err
		}
		return set.Keys, nil
	}
	var keys []jose.JSONWebKey
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		var key any
		switch block.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				key = cert.PublicKey
			}
		default:
			return nil, fmt.Errorf("PEM block %q is not a public key or certificate", block.Type)
		}
		if err != nil {
			return nil, err
		}
		keys = append(keys, jose.JSONWebKey{Key: key})
	}
	if len(keys) == 0 {
		return nil, errors.New("no public key found")
	}
	return keys, nil
}
