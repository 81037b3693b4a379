package integration

import (
	"encoding/json"
	"strings"
	"testing"
)

// endedPendingAtReload checks that a held call's stream ended, at a
// reload, with the pending answer naming its approval (id), not a refusal:
// the hold hands the call over to the runner's retry, which the
// configuration in force decides (and which finds the approval).
func endedPendingAtReload(t *testing.T, msgs []json.RawMessage, id string) {
	t.Helper()
	last := idattackLast(msgs)
	if !strings.Contains(last, `"code":-32012`) || !strings.Contains(last, id) {
		t.Errorf("a call held across a reload did not end with the pending answer of its approval %s: %s", id, last)
	}
	for _, msg := range msgs {
		if strings.Contains(string(msg), "no longer") {
			t.Errorf("refused as if the reload had taken something away: %s", idattackLast([]json.RawMessage{msg}))
		}
	}
}
