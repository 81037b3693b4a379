package vaulttransit

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  Cipher
		err   string // substring of the error; "" means success
	}{
		{
			name: "token",
			input: `vault_transit {
				address {env.VAULT_ADDR}
				token   {env.VAULT_TOKEN}
				mount   transit
				key     toolgate
			}`,
			want: Cipher{Address: "{env.VAULT_ADDR}", Token: "{env.VAULT_TOKEN}", Mount: "transit", Key: "toolgate"},
		},
		{
			name: "all options",
			input: `vault_transit {
				address   https://vault.example.com:8200
				approle {
					role_id   {env.ROLE_ID}
					secret_id {file./run/secrets/secret_id}
					mount     auth-approle
				}
				namespace team/a
				mount     kms
				key       toolgate
				timeout   2500ms
				tls {
					ca_file     /etc/vault/ca.pem
					server_name vault.internal
				}
			}`,
			want: Cipher{
				Address:   "https://vault.example.com:8200",
				AppRole:   &AppRole{RoleID: "{env.ROLE_ID}", SecretID: "{file./run/secrets/secret_id}", Mount: "auth-approle"},
				Namespace: "team/a",
				Mount:     "kms",
				Key:       "toolgate",
				Timeout:   caddy.Duration(2500 * time.Millisecond),
				TLS:       &TLS{CAFile: "/etc/vault/ca.pem", ServerName: "vault.internal"},
			},
		},
		{name: "empty block", input: lines("vault_transit {", "}"), want: Cipher{}},
		{name: "no block", input: "vault_transit", want: Cipher{}},
		{name: "argument on the module", input: lines("vault_transit http://vault {", "key k", "}"), err: "wrong argument count"},
		{name: "unknown option", input: lines("vault_transit {", "adress http://vault", "}"), err: `vault_transit: unknown option "adress"`},
		{name: "unknown approle option", input: lines("vault_transit {", "approle {", "role r", "}", "}"), err: `approle: unknown option "role"`},
		{name: "unknown tls option", input: lines("vault_transit {", "tls {", "insecure", "}", "}"), err: `tls: unknown option "insecure"`},
		{name: "duplicate option", input: lines("vault_transit {", "key a", "key b", "}"), err: "vault_transit: key given twice"},
		{name: "duplicate approle", input: lines("vault_transit {", "approle {", "role_id a", "}", "approle {", "role_id b", "}", "}"), err: "vault_transit: approle given twice"},
		{name: "duplicate approle option", input: lines("vault_transit {", "approle {", "role_id a", "role_id b", "}", "}"), err: "approle: role_id given twice"},
		{name: "missing argument", input: lines("vault_transit {", "key", "}"), err: "wrong argument count"},
		{name: "missing approle argument", input: lines("vault_transit {", "approle {", "secret_id", "}", "}"), err: "wrong argument count"},
		{name: "too many arguments", input: lines("vault_transit {", "address http://a http://b", "}"), err: "wrong argument count"},
		{name: "argument on approle", input: lines("vault_transit {", "approle r s", "}"), err: "wrong argument count"},
		{name: "block after an argument", input: lines("vault_transit {", "key k {", "}", "}"), err: `unknown option "{"`},
		{name: "bad timeout", input: lines("vault_transit {", "timeout soon", "}"), err: `timeout: invalid duration "soon"`},
		{name: "zero timeout", input: lines("vault_transit {", "timeout 0s", "}"), err: `timeout: invalid duration "0s": must be positive`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got Cipher
			err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v; want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// lines joins Caddyfile lines.
func lines(l ...string) string { return strings.Join(l, "\n") }

// TestUnmarshalModule parses the cipher the way the toolgate app's
// Caddyfile does: through caddyfile.UnmarshalModule, positioned at the
// module name, with the rest of the enclosing block left for the caller.
func TestUnmarshalModule(t *testing.T) {
	d := caddyfile.NewTestDispenser(`cipher vault_transit {
		address http://127.0.0.1:8200
		token   {env.VAULT_TOKEN}
		key     toolgate
	}
	next_option x`)
	d.Next() // "cipher"
	if !d.NextArg() {
		t.Fatal("no module name")
	}
	unm, err := caddyfile.UnmarshalModule(d, "toolgate.ciphers."+d.Val())
	if err != nil {
		t.Fatal(err)
	}
	c := unm.(*Cipher)
	if c.Address != "http://127.0.0.1:8200" || c.Token != "{env.VAULT_TOKEN}" || c.Key != "toolgate" {
		t.Errorf("got %+v", c)
	}
	if !d.Next() || d.Val() != "next_option" {
		t.Errorf("dispenser after the module is at %q; want next_option", d.Val())
	}
}
