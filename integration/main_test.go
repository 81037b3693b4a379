package integration

import (
	"os"
	"testing"

	"github.com/toolgate/toolgate/internal/pgtest"
	"github.com/toolgate/toolgate/internal/stdioserver"
)

// TestMain makes the test binary the MCP server program that stdio
// services run in the tests (see internal/stdioserver), and removes what
// the tests shared when they end: the toolgate binary replicas run and the
// PostgreSQL cluster.
func TestMain(m *testing.M) {
	if mode := stdioserver.Mode(); mode != "" {
		os.Exit(stdioserver.Main(mode))
	}
	code := m.Run()
	removeToolgateBinary()
	pgtest.StopShared()
	os.Exit(code)
}
