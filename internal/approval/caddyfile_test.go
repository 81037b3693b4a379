package approval

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// parse reads an approvals block as the toolgate option does (the
// dispenser on the option's name).
func parse(block string) (any, error) {
	d := caddyfile.NewTestDispenser(block)
	d.Next()
	return parseCaddyfile(d)
}

func TestParseMaxPendingPerUser(t *testing.T) {
	got, err := parse("approvals {\n max_pending_per_user 7\n}")
	if err != nil || got.(Config).MaxPendingPerUser != 7 {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	for _, bad := range []string{"0", "-1", "many", "1.5"} {
		_, err := parse("approvals {\n max_pending_per_user " + bad + "\n}")
		if err == nil || !strings.Contains(err.Error(), "positive whole number") {
			t.Errorf("max_pending_per_user %s: %v", bad, err)
		}
	}
}
