package mcpproxy

import (
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/modules/gateway"
)

// testHandler is a Handler for tests that call its steps directly, with
// the stateless runtime of an app of its own (which seals with a key of
// the process).
func testHandler() *Handler {
	rt, err := mcp2026.For(&gateway.App{})
	if err != nil {
		panic(err)
	}
	return &Handler{logger: zap.NewNop(), stateless: rt}
}
