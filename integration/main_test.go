package integration

import (
	"os"
	"testing"

	"github.com/toolgate/toolgate/internal/stdioserver"
)

// TestMain makes the test binary the MCP server program that stdio
// services run in the tests (see internal/stdioserver).
func TestMain(m *testing.M) {
	if mode := stdioserver.Mode(); mode != "" {
		os.Exit(stdioserver.Main(mode))
	}
	os.Exit(m.Run())
}
