package gateway

import (
	"slices"
	"sync"
)

// refusedTokens remembers, for each service and user, the secrets of the
// OAuth tokens the service's upstream refused before toolgate refreshed
// them (CredentialRefused): the upstream had them, and a hostile one
// refuses a token only to quote it in a later answer — of this call, of
// another MCP session, of a stateless runner's next call —, when it may
// still be valid at the provider. What the upstream sends is searched for
// them (RefusedSecrets). The newest maxRefused of each pair are kept, on
// this replica, for as long as it runs (across reloads).
type refusedTokens struct {
	mu     sync.Mutex
	byPair map[[2]string][]string
}

var refusedTokensOf refusedTokens

// maxRefused bounds the secrets kept for one service and user (a refresh
// after a refusal comes at most once a minute: refusedRefreshInterval).
const maxRefused = 16

func (r *refusedTokens) add(service, user string, c *Credential) {
	var secrets []string
	c.EachSecret(func(s string) bool { secrets = append(secrets, s); return true })
	if len(secrets) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byPair == nil {
		r.byPair = map[[2]string][]string{}
	}
	k := [2]string{service, user}
	// A secret remembered already moves to the newest end: a burst of
	// calls refused with one token must not push older tokens out.
	next := make([]string, 0, len(r.byPair[k])+len(secrets)) // readers keep the old slice
	for _, old := range r.byPair[k] {
		if !slices.Contains(secrets, old) {
			next = append(next, old)
		}
	}
	next = append(next, secrets...)
	if len(next) > maxRefused {
		next = next[len(next)-maxRefused:]
	}
	r.byPair[k] = next
}

func (r *refusedTokens) of(service, user string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byPair[[2]string{service, user}]
}

// RefusedSecrets are the secrets of the tokens the service's upstream
// refused for user (see refusedTokens); the slice is not to be changed.
func (a *App) RefusedSecrets(service, user string) []string {
	return refusedTokensOf.of(service, user)
}
