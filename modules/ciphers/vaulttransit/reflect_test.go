package vaulttransit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/modules/ciphers/vaulttransit/vaulttest"
)

// A proxy in front of Vault (or a Vault behind a broken frontend) that
// quotes the token of the request it refuses: with AppRole, the token is
// the one toolgate logged in for, which it holds only in its client. No
// error toolgate returns (its callers log them) may carry it.
func TestErrorsCarryNoTokenAVaultQuotes(t *testing.T) {
	srv := vaulttest.Shared(t)
	key := srv.NewKey(t)
	mount, roleID, secretID := appRole(t, srv, key)
	target, err := url.Parse(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/transit/") || strings.HasSuffix(r.URL.Path, "/renew-self") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]any{"errors": []string{"request with token " + r.Header.Get("X-Vault-Token") + " refused"}})
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	c := &Cipher{Address: front.URL, AppRole: &AppRole{RoleID: roleID, SecretID: secretID, Mount: mount}, Key: key}
	logs := provision(t, c)
	_ = c.Start(t.Context()) // the key check may be refused too
	if err := c.login(t.Context()); err != nil {
		t.Fatalf("login: %v", err)
	}
	token := c.client.Token()
	if token == "" {
		t.Fatal("control: no token after the login")
	}
	_, err = c.Encrypt(t.Context(), []byte("plaintext"), ctxAlice)
	if err == nil {
		t.Fatal("control: the refused encryption succeeded")
	}
	assertClean(t, "the error of a refused encryption", err.Error(), token, secretID)
	if _, err := c.renewSelf(t.Context()); err != nil {
		assertClean(t, "the error of a refused renewal", err.Error(), token, secretID)
	} else {
		t.Error("control: the refused renewal succeeded")
	}
	assertLogsClean(t, logs, token, secretID)
}
