package integration

import (
	"os"
	"testing"

	"github.com/toolgate/toolgate/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	removeToolgateBinary()
	pgtest.StopShared()
	os.Exit(code)
}
