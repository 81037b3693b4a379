package mcpbridge

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ConnLink starts a link over conn, a connection of the MCP Go SDK (whose
// transports speak in decoded messages): messages are decoded for
// conn.Write and encoded again from conn.Read. sendErr, when set, says what
// a failed Write means. When reading ends, the link closes with endErr and
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
		for {
			m, err := conn.Read(ctx)
			if err != nil {
				link.Close(endErr)
				return
			}
			if data, err := jsonrpc.EncodeMessage(m); err == nil {
				link.Receive(data)
			}
		}
	}()
	return link
}
