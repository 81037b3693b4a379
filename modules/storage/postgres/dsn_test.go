package postgres

import (
	"strings"
	"testing"
)

// A dsn pgx refuses is refused naming the option and what it takes, never
// repeating the dsn (its password here: s3cret).
func TestDSNRefusalSaysWhatTheOptionTakes(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://u:s3cret@localhost/db?pool_max_conns=abc":        "cannot parse pool_max_conns: it takes a whole number of connections",
		"postgres://u:s3cret@localhost/db?pool_max_conns=0":          "pool_max_conns too small: it takes a whole number of connections, at least 1",
		"postgres://u:s3cret@localhost/db?pool_max_conn_lifetime=5":  "cannot parse pool_max_conn_lifetime: it takes a duration, such as 30s",
		"postgres://u:s3cret@localhost/db?pool_health_check_period=": "cannot parse pool_health_check_period: it takes a duration",
		"postgres://u:s3cret@localhost:abc/db":                       "invalid port: a port is a number from 1 to 65535",
		"host=localhost user=u password=s3cret connect_timeout=soon": "invalid connect_timeout: it takes a whole number of seconds",
		"host=localhost user=u password=s3 cret":                     "failed to parse as keyword/value: quote a value with spaces as 'a b'",
		"postgres://u:s3cret@localhost/db?sslmode=bogus":             "failed to configure TLS: sslmode takes disable, allow, prefer",
	} {
		_, err := openDatabase(dsn)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3") {
			t.Errorf("%s: %v; want %q, without the password", strings.ReplaceAll(dsn, "s3", "…"), err, want)
		}
	}
}
