package stdio

import (
	"os"
	"testing"

	"github.com/toolgate/toolgate/internal/stdioserver"
)

// TestMain makes the test binary the program the tests run when a service
// starts it in a test server mode.
func TestMain(m *testing.M) {
	if mode := stdioserver.Mode(); mode != "" {
		os.Exit(stdioserver.Main(mode))
	}
	os.Exit(m.Run())
}
