package kms

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/toolgate/toolgate/modules/ciphers/kms/kmstest"
)

// TestProvisionAndValidate checks the settings `caddy validate` accepts
// and refuses, and that it contacts nothing: the endpoint is a listener
// that counts connections.
func TestProvisionAndValidate(t *testing.T) {
	kmstest.Environ(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var dialled atomic.Int64
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			conn.Close()
		}
	}()
	local := "http://" + l.Addr().String()
	const arn = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	t.Setenv("TOOLGATE_TEST_EMPTY", "")
	t.Setenv("TOOLGATE_TEST_KEY", "awskms://alias/from-env")

	for _, tc := range []struct {
		name       string
		c          Cipher
		env        map[string]string
		want       string // substring of the error; "" means valid
		key        string // the key id once valid
		wantRegion string
	}{
		{name: "alias and region", c: Cipher{KeyURL: "awskms://alias/toolgate", Region: "eu-west-1", Endpoint: local}, key: "alias/toolgate", wantRegion: "eu-west-1"},
		{name: "key id", c: Cipher{KeyURL: "awskms://1234abcd-12ab-34cd-56ef-1234567890ab", Region: "us-east-1"}, key: "1234abcd-12ab-34cd-56ef-1234567890ab", wantRegion: "us-east-1"},
		{name: "key ARN gives the region", c: Cipher{KeyURL: "awskms:///" + arn}, key: arn, wantRegion: "eu-west-1"},
		{name: "alias ARN", c: Cipher{KeyURL: "awskms:///arn:aws-cn:kms:cn-north-1:111122223333:alias/tg"}, key: "arn:aws-cn:kms:cn-north-1:111122223333:alias/tg", wantRegion: "cn-north-1"},
		{name: "region parameter", c: Cipher{KeyURL: "awskms://alias/tg?region=ap-south-1"}, key: "alias/tg", wantRegion: "ap-south-1"},
		{name: "region everywhere, agreeing", c: Cipher{KeyURL: "awskms:///" + arn + "?region=eu-west-1", Region: "eu-west-1"}, key: arn, wantRegion: "eu-west-1"},
		{name: "region from AWS_REGION", c: Cipher{KeyURL: "awskms://alias/tg"}, env: map[string]string{"AWS_REGION": "sa-east-1"}, key: "alias/tg", wantRegion: "sa-east-1"},
		{name: "placeholder", c: Cipher{KeyURL: "{env.TOOLGATE_TEST_KEY}", Region: "eu-west-1"}, key: "alias/from-env", wantRegion: "eu-west-1"},
		{name: "https endpoint", c: Cipher{KeyURL: "awskms://alias/tg", Region: "eu-west-1", Endpoint: "https://kms-fips.eu-west-1.amazonaws.com/"}, key: "alias/tg", wantRegion: "eu-west-1"},
		{name: "localhost endpoint", c: Cipher{KeyURL: "awskms://alias/tg", Region: "eu-west-1", Endpoint: "http://localhost:4566"}, key: "alias/tg", wantRegion: "eu-west-1"},

		{name: "no key_url", c: Cipher{Region: "eu-west-1"}, want: "key_url is required"},
		{name: "key_url empty after placeholders", c: Cipher{KeyURL: "{env.TOOLGATE_TEST_EMPTY}", Region: "eu-west-1"}, want: "empty once placeholders"},
		{name: "no scheme", c: Cipher{KeyURL: "alias/toolgate"}, want: "must look like awskms://"},
		{name: "gcp", c: Cipher{KeyURL: "gcpkms://projects/p/locations/global/keyRings/r/cryptoKeys/k"}, want: "gcpkms:// is not supported"},
		{name: "azure", c: Cipher{KeyURL: "azurekeyvault://vault.vault.azure.net/keys/k"}, want: "azurekeyvault:// is not supported"},
		{name: "unknown scheme", c: Cipher{KeyURL: "kms://alias/x"}, want: `unknown scheme "kms"`},
		{name: "no key", c: Cipher{KeyURL: "awskms://?region=eu-west-1"}, want: "names no key"},
		{name: "alias without name", c: Cipher{KeyURL: "awskms://alias/", Region: "eu-west-1"}, want: "names no key"},
		{name: "bad ARN", c: Cipher{KeyURL: "awskms:///arn:aws:s3:::bucket"}, want: "is not a KMS key or alias ARN"},
		{name: "unknown parameter", c: Cipher{KeyURL: "awskms://alias/x?regoin=eu-west-1"}, want: `unknown parameter "regoin"`},
		{name: "region twice in url", c: Cipher{KeyURL: "awskms://alias/x?region=a&region=b"}, want: "give region once"},
		{name: "regions disagree", c: Cipher{KeyURL: "awskms:///" + arn, Region: "us-east-1"}, want: `the key ARN says "eu-west-1"`},
		{name: "no region", c: Cipher{KeyURL: "awskms://alias/x"}, want: "no region"},
		{name: "http endpoint elsewhere", c: Cipher{KeyURL: "awskms://alias/x", Region: "eu-west-1", Endpoint: "http://kms.internal:8080"}, want: "http:// is allowed only on a loopback address"},
		{name: "endpoint without scheme", c: Cipher{KeyURL: "awskms://alias/x", Region: "eu-west-1", Endpoint: "kms.eu-west-1.amazonaws.com"}, want: "must be a URL"},
		{name: "endpoint with credentials", c: Cipher{KeyURL: "awskms://alias/x", Region: "eu-west-1", Endpoint: "https://user:pw@kms.example.com"}, want: "must be a URL"},
		{name: "negative cache_size", c: Cipher{KeyURL: "awskms://alias/x", Region: "eu-west-1", CacheSize: -1}, want: "cache_size must be positive"},
		{name: "negative timeout", c: Cipher{KeyURL: "awskms://alias/x", Region: "eu-west-1", Timeout: -1}, want: "timeout must be positive"},
		{name: "unknown profile", c: Cipher{KeyURL: "awskms://alias/x", Region: "eu-west-1"}, env: map[string]string{"AWS_PROFILE": "nope"}, want: "reading the AWS configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			c := tc.c
			err := c.Provision(ctx)
			if err == nil {
				err = c.Validate()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error = %v; want it to contain %q", err, tc.want)
			}
			if tc.want == "" {
				if c.keyID != tc.key || c.region != tc.wantRegion {
					t.Errorf("key %q region %q; want %q %q", c.keyID, c.region, tc.key, tc.wantRegion)
				}
				if c.timeout != DefaultTimeout || c.cacheTTL != DefaultCacheTTL || c.cacheSize != DefaultCacheSize {
					t.Errorf("defaults: timeout %s cache_ttl %s cache_size %d", c.timeout, c.cacheTTL, c.cacheSize)
				}
			}
		})
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("provisioning dialled the endpoint %d times", n)
	}
}
