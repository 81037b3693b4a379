package integration

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/toolgate/toolgate/modules/ciphers/vaulttransit/vaulttest"
)

// Failing peers: an OAuth provider or a Vault that is slow or refuses.
// Calls fail retryably with a message that says which peer, the stored
// grant is never lost or half-written, and everything recovers by itself.
// Also covered elsewhere: TestOAuthProviderDownKeepsTheGrant,
// TestOAuthRejectedRefreshNeedsSignIn (invalid_grant),
// TestOAuthRefusedTokenIsRefreshedOnce, TestOAuthSealedVaultIsRetryable,
// TestOAuthKMSStoppedIsRetryable, TestAdversarialStorage (full and
// read-only storage), and PostgreSQL going away in modules/storage/postgres.

// A runner that gives up while a slow provider refreshes its grant: the
// refresh finishes anyway and its rotated refresh token is stored, so the
// grant is neither lost nor refreshed twice.
func TestAdversarialSlowOAuthProvider(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	waitExpiry(time.Second)

	release := p.holdTokens()
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		resp, err := m.send(ctx, "POST", "application/json, text/event-stream",
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"impatient"}}}`, "")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		gaveUp <- err
	}()
	waitFor(t, "the refresh to reach the provider", func() bool { return p.heldTokenRequests() == 1 })
	cancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("the runner's call finished although the provider held the refresh")
	}
	release()
	waitFor(t, "the refresh to be answered", func() bool { return len(p.refreshes()) == 1 })

	// The next call uses the stored result of that refresh.
	m.mustEcho(t, "patient")
	if n := len(p.refreshes()); n != 1 {
		t.Errorf("%d refreshes, want the one the impatient call started", n)
	}
	p.checkRotation(t)
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "connected" || s.Connection == nil || s.Connection.RefreshCount != 1 {
		t.Errorf("catalog: %+v; want connected, refreshed once", s)
	}
}

// stallingProxy relays TCP connections to a peer, and while stalled holds
// every byte the peer sends back.
type stallingProxy struct {
	Addr   string
	target string

	mu      sync.Mutex
	stalled chan struct{} // closed when not stalled
}

func startStallingProxy(t *testing.T, target string) *stallingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallingProxy{Addr: l.Addr().String(), target: target, stalled: make(chan struct{})}
	close(p.stalled)
	var conns sync.WaitGroup
	t.Cleanup(func() { l.Close(); p.stall(false); conns.Wait() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				p.relay(c)
			}()
		}
	}()
	return p
}

func (p *stallingProxy) stall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stalled:
		if on {
			p.stalled = make(chan struct{})
		}
	default:
		if !on {
			close(p.stalled)
		}
	}
}

func (p *stallingProxy) relay(c net.Conn) {
	defer c.Close()
	peer, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer peer.Close()
	go func() { _, _ = io.Copy(peer, c); peer.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := peer.Read(buf)
		if n > 0 {
			p.mu.Lock()
			wait := p.stalled
			p.mu.Unlock()
			<-wait
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A Vault that answers too slowly or refuses toolgate's token: calls that
// need the credential fail retryably within the cipher's timeout, the
// stored grant stays as it was, and calls work again once Vault does.
func TestAdversarialVault(t *testing.T) {
	v := vaulttest.Start(t)
	key := v.NewKey(t)
	slow := startStallingProxy(t, strings.TrimPrefix(v.Addr, "http://"))
	// A token of its own, which the test can revoke.
	secret, err := v.Client().Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{"root"}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	token := secret.Auth.ClientToken
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{Extra: "cache_ttl 1ms", Cipher: `vault_transit {
			address http://` + slow.Addr + `
			token ` + token + `
			key ` + key + `
			timeout 300ms
		}`})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.mustEcho(t, "before")
	stored := g.connectionFiles(t, "svc")

	unavailable := func(what, says string) {
		t.Helper()
		a, err := m.callEcho(what)
		if err != nil {
			t.Fatal(err)
		}
		if a.Error == nil || a.Error.Code != -32011 || !a.Error.Data.Retryable || !strings.Contains(a.Error.Message, says) {
			t.Errorf("%s: result %s, error %+v; want -32011 retryable saying %q", what, a.Result, a.Error, says)
		}
		if strings.Contains(a.Error.Message, slow.Addr) || strings.Contains(a.Error.Message, token) {
			t.Errorf("%s: the error names Vault's address or token: %q", what, a.Error.Message)
		}
		for k, b := range g.connectionFiles(t, "svc") {
			if !bytes.Equal(stored[k], b) {
				t.Errorf("%s: the stored grant changed", what)
			}
		}
	}

	slow.stall(true)
	unavailable("Vault slow", "cipher unavailable")
	slow.stall(false)
	m.mustEcho(t, "Vault fast again")

	if err := v.Client().Auth().Token().RevokeTree(token); err != nil {
		t.Fatal(err)
	}
	unavailable("token revoked", "the cipher refused toolgate: an administrator must check its configuration")
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "unavailable" {
		t.Errorf("catalog while Vault refuses: %+v, want unavailable", s)
	}
}
