package federation

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/modules/gateway"
)

// A service the federated endpoint could not reach is a gap whose message
// a runner reads: a storage failure says so, not what the storage said
// (its host, its user, the keys it was asked for); any other failure says
// what it was.
func TestUnreachableGapKeepsTheStoragesWordsOut(t *testing.T) {
	storage := fmt.Errorf("%w: failed to connect to `user=toolgate database=toolgate`: 10.0.4.7:5432: mcp_session/8f3a… dial error", gateway.ErrStorageUnavailable)
	g := unreachable("tracker", storage)
	for _, leak := range []string{"10.0.4.7", "user=toolgate", "mcp_session/"} {
		if strings.Contains(g.Message, leak) {
			t.Errorf("the gap's message holds %q: %s", leak, g.Message)
		}
	}
	if !strings.Contains(g.Message, gateway.StorageUnavailableText) || g.Code != gateway.CodeUnavailable {
		t.Errorf("the gap does not say the storage failed: %+v", g)
	}
	other := unreachable("tracker", errors.New("notifications/initialized answered HTTP 500"))
	if !strings.HasSuffix(other.Message, "notifications/initialized answered HTTP 500") {
		t.Errorf("another failure is not named: %s", other.Message)
	}
}
