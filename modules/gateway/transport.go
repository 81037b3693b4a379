package gateway

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// The upstream client's transport is shared by every config, like the MCP
// sessions: a reload keeps its pooled connections warm instead of starting
// cold with a new pool and stranding the old one's idle connections. It is
// closed when the last config using it is cleaned up.
var transportPool = caddy.NewUsagePool()

const transportPoolKey = "upstream-transport"

type sharedTransport struct{ *http.Transport }

// Destruct closes the idle connections (caddy.Destructor).
func (t sharedTransport) Destruct() error {
	t.CloseIdleConnections()
	return nil
}

// DefaultDialTimeout bounds connecting to an upstream or provider when no
// dial timeout is given.
const DefaultDialTimeout = 10 * time.Second

type dialTimeoutKey struct{}

// WithDialTimeout returns ctx telling the upstream client to give up
// opening a TCP connection after d.
func WithDialTimeout(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	return context.WithValue(ctx, dialTimeoutKey{}, d)
}

func sharedUpstreamClient() (*http.Client, error) {
	v, _, err := transportPool.LoadOrNew(transportPoolKey, func() (caddy.Destructor, error) {
		return sharedTransport{newUpstreamTransport()}, nil
	})
	if err != nil {
		return nil, err
	}
	return &http.Client{
		Transport: v.(sharedTransport).Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}, nil
}

func releaseUpstreamClient() { _, _ = transportPool.Delete(transportPoolKey) }

func newUpstreamTransport() *http.Transport {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = 512
	transport.MaxIdleConnsPerHost = 128
	transport.IdleConnTimeout = 90 * time.Second
	transport.ResponseHeaderTimeout = 0 // per service, by the proxy
	dialer := &net.Dialer{KeepAlive: 30 * time.Second}
	transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		d, ok := ctx.Value(dialTimeoutKey{}).(time.Duration)
		if !ok {
			d = DefaultDialTimeout
		}
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return dialer.DialContext(ctx, network, addr)
	}
	return transport
}
