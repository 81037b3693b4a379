package kms

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
			name: "alias and region",
			input: `kms {
				key_url awskms://alias/toolgate
				region  eu-west-1
			}`,
			want: Cipher{KeyURL: "awskms://alias/toolgate", Region: "eu-west-1"},
		},
		{
			name: "all options",
			input: `kms {
				key_url    {env.TOOLGATE_KMS_KEY}
				region     {env.AWS_REGION}
				endpoint   https://vpce-0123.kms.eu-west-1.vpce.amazonaws.com
				timeout    2500ms
				cache_ttl  1m
				cache_size 50
			}`,
			want: Cipher{
				KeyURL:    "{env.TOOLGATE_KMS_KEY}",
				Region:    "{env.AWS_REGION}",
				Endpoint:  "https://vpce-0123.kms.eu-west-1.vpce.amazonaws.com",
				Timeout:   caddy.Duration(2500 * time.Millisecond),
				CacheTTL:  caddy.Duration(time.Minute),
				CacheSize: 50,
			},
		},
		{name: "empty block", input: lines("kms {", "}"), want: Cipher{}},
		{name: "no block", input: "kms", want: Cipher{}},
		{name: "argument on the module", input: lines("kms awskms://alias/a {", "}"), err: "wrong argument count"},
		{name: "unknown option", input: lines("kms {", "key_id abc", "}"), err: `kms: unknown option "key_id"`},
		{name: "duplicate option", input: lines("kms {", "key_url awskms://a", "key_url awskms://b", "}"), err: "kms: key_url given twice"},
		{name: "missing argument", input: lines("kms {", "region", "}"), err: "wrong argument count"},
		{name: "too many arguments", input: lines("kms {", "endpoint https://a https://b", "}"), err: "wrong argument count"},
		{name: "block after an argument", input: lines("kms {", "region r {", "}", "}"), err: `unknown option "{"`},
		{name: "bad timeout", input: lines("kms {", "timeout soon", "}"), err: `timeout: invalid duration "soon"`},
		{name: "zero cache_ttl", input: lines("kms {", "cache_ttl 0s", "}"), err: `cache_ttl: invalid duration "0s": must be positive`},
		{name: "cache_size not a number", input: lines("kms {", "cache_size many", "}"), err: `cache_size "many" must be a whole number`},
		{name: "cache_size zero", input: lines("kms {", "cache_size 0", "}"), err: `cache_size "0" must be a whole number of keys, at least 1`},
		{name: "cache_size negative", input: lines("kms {", "cache_size -3", "}"), err: "at least 1"},
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
	d := caddyfile.NewTestDispenser(`cipher kms {
		key_url awskms:///arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab
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
	if c.KeyURL != "awskms:///arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab" {
		t.Errorf("got %+v", c)
	}
	if !d.Next() || d.Val() != "next_option" {
		t.Errorf("the dispenser is at %q, want the next option", d.Val())
	}
}
