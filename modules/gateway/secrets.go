package gateway

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"
)

// The secrets an upstream may quote to a call, and the search of what
// toolgate hands out or keeps for them outside the proxy's relay.

// EachCallSecret calls f with each secret an upstream may quote to the
// call, until f returns false: its credential's (Credential.EachSecret:
// the token sent, and those its connection sent before), then, for a
// per-user credential, those of the caller's connection as it stands now
// when its token is another — refreshed or replaced since the call's
// credential was read (a stream open for hours, a listen, a call answered
// on another replica than the one that refreshed it). The connection is
// read as CredentialFor reads it (cached, else from storage within
// secretsReadTimeout); an error says it could not be read, and then what
// the upstream sent is not to be relayed: a newer token may be in it.
func (a *App) EachCallSecret(call *Call, f func(secret string) bool) error {
	more := true
	call.Credential.EachSecret(func(s string) bool { more = f(s); return more })
	if !more || a == nil || a.connections == nil || call.Credential.GrantName() == "" || call.Service == nil || call.Caller == nil {
		return nil
	}
	key := ConnectionKey(call.Service.ID, call.Caller.User)
	conn, ok := a.connections.cache.Get(key)
	if !ok {
		ctx, cancel := context.WithTimeout(context.Background(), secretsReadTimeout)
		defer cancel()
		var err error
		conn, err = a.connections.Load(ctx, call.Service.ID, call.Caller.User)
		switch {
		case errors.Is(err, ErrNotConnected):
			return nil // forgotten: nothing newer was sent
		case err != nil:
			return err
		}
	}
	if conn == nil || strings.TrimPrefix(call.Credential.Value, "Bearer ") == conn.AccessToken {
		return nil
	}
	credentialOf(conn).EachSecret(func(s string) bool {
		if hasSecret(call.Credential, s) {
			return true // looked for already
		}
		more = f(s)
		return more
	})
	return nil
}

// secretsReadTimeout bounds the read of a connection EachCallSecret makes
// when the replica holds no fresh copy of it.
const secretsReadTimeout = 10 * time.Second

// hasSecret reports whether secret is one of c's (EachSecret).
func hasSecret(c *Credential, secret string) bool {
	found := false
	c.EachSecret(func(s string) bool { found = s == secret; return !found })
	return found
}

// AnswerSearch is raw, a JSON-RPC message toolgate is about to hand to a
// runner or keep for one, with the secrets of call (EachCallSecret)
// replaced wherever a runner would read them, as in everything an
// upstream sends; false when it cannot be read or searched, and must be
// withheld. toolgate_proxy provides it (SetAnswerSearch).
type AnswerSearch func(call *Call, raw []byte) ([]byte, bool)

// SetAnswerSearch registers the search SearchAnswer uses; toolgate_proxy
// registers its own while provisioning.
func (a *App) SetAnswerSearch(f AnswerSearch) { a.answerSearch = f }

// SearchAnswer is raw searched for call's secrets (AnswerSearch), for
// what a step hands out without the proxy's relay: a result an approver
// released, and the copies of it an approval keeps. Without a search
// registered, only a call with no secret passes.
func (a *App) SearchAnswer(call *Call, raw []byte) ([]byte, bool) {
	if a != nil && a.answerSearch != nil {
		return a.answerSearch(call, raw)
	}
	return raw, !call.Credential.HasSecret()
}

// serviceHeaders remembers, for each service with a service-wide header
// (auth header), the secrets of the values a reload replaced: its upstream
// was sent them, and may quote one after the reload, while it may still be
// valid where it was issued. They are searched for as a per-user
// connection's retired tokens are (Credential.EachSecret), the newest
// maxRetired per service, on this replica, for as long as it runs.
var serviceHeaders headerHistory

type headerHistory struct {
	mu      sync.Mutex
	current map[string][]string       // service id → the secrets of the value served
	old     map[string][]RetiredToken // service id → the secrets of values replaced
}

// serve records that c is the service's header now (a config that
// started); the secrets of the one it replaces are retired.
func (h *headerHistory) serve(service string, c *Credential) {
	var secrets []string
	c.eachSecretOfValue(func(s string) bool { secrets = append(secrets, s); return true })
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.current == nil {
		h.current, h.old = map[string][]string{}, map[string][]RetiredToken{}
	}
	if was, ok := h.current[service]; ok && !slices.Equal(was, secrets) {
		var replaced []RetiredToken
		for _, s := range was {
			replaced = append(replaced, RetiredToken{Token: s})
		}
		h.old[service] = retire(h.old[service], replaced, secrets...)
	}
	h.current[service] = secrets
}

// retired is the secrets of the service's replaced header values; the
// slice is not to be changed.
func (h *headerHistory) retired(service string) []RetiredToken {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.old[service]
}
