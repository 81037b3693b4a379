package gateway

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4/jwt"
)

// A refused claim is named in a runner's words, not the JWT library's
// ("go-jose/go-jose/jwt: validation failed, …").
func TestClaimsProblemNamesTheClaim(t *testing.T) {
	for err, want := range map[error]string{
		jwt.ErrInvalidAudience:   "(aud)",
		jwt.ErrInvalidIssuer:     "(iss)",
		jwt.ErrExpired:           "(exp)",
		jwt.ErrNotValidYet:       "(nbf)",
		jwt.ErrIssuedInTheFuture: "(iat)",
		errors.New("other"):      "claims are refused",
	} {
		got := claimsProblem(err)
		if !strings.Contains(got, want) || strings.Contains(got, "jose") {
			t.Errorf("claimsProblem(%v) = %q, want it to say %s", err, got, want)
		}
	}
}
