package mcpbridge

import (
	"context"
	"errors"
	"io"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
)

// ConnLink starts a link over conn, a connection of the MCP Go SDK (whose
// transports speak in decoded messages), for the tests, which run the
// bridge against the SDK's servers over its in-memory transport: messages
// are decoded for conn.Write and encoded again from conn.Read. sendErr,
// when set, says what a failed Write means. When reading ends, the link closes with endErr and
// conn is closed; ctx bounds the reading.
func (b *Bridge) ConnLink(ctx context.Context, conn mcp.Connection, cfg LinkConfig, sendErr func(error) error, endErr error) *Link {
	cfg.Send = func(ctx context.Context, msg []byte) error {
		m, err := jsonrpc.DecodeMessage(msg)
		if err != nil {
			return err
		}
		if err := conn.Write(ctx, m); err != nil {
			if sendErr != nil {
				return sendErr(err)
			}
			return err
		}
		return nil
	}
	link := b.NewLink(cfg)
	go func() {
		defer conn.Close()
		skipped := 0
		for {
			m, err := conn.Read(ctx)
			// The SDK's connection answers io.EOF itself once its stream
			// ended; a message it cannot decode is another error (which may
			// wrap io.EOF: an event with empty data).
			if err != nil && (ctx.Err() != nil || err == io.EOF || errors.Is(err, context.Canceled)) {
				link.Close(endErr)
				return
			}
			if err != nil {
				// An event that holds no message (a heartbeat event some
				// servers send, or another endpoint event, which is never
				// followed): skipped, not the end of every call on the
				// stream. Its text is not logged: it is the server's.
				if skipped++; skipped == 1 {
					b.log().Warn("skipped an event of the server's stream that holds no JSON-RPC message (logged once per stream)",
						zap.String("service", b.service))
				}
				continue
			}
			if data, err := jsonrpc.EncodeMessage(m); err == nil {
				link.Receive(data)
			}
		}
	}()
	return link
}
