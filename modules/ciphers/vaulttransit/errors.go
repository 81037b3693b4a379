package vaulttransit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hashicorp/vault/api"

	"github.com/toolgate/toolgate/modules/gateway"
)

// What a failed exchange with Vault means for the gateway (the cipher
// unavailable, refused or misconfigured), in words an operator can act
// on, with no secret in them.

// unavailable reports that Vault cannot be used right now (see
// gateway.CipherUnavailable).
func unavailable(format string, args ...any) error {
	return gateway.CipherUnavailable(format, args...)
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
