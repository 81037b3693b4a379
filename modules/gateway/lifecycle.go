package gateway

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/internal/storecache"
)

// The app's life after Provision: Start (with the start gate of
// starting.go), the background work it runs until Stop (housekeeping, the
// ending of upstream sessions), and Cleanup.

// Start starts the app's background work and the I/O Provision must not
// do. Requests taken meanwhile wait for it (Started).
func (a *App) Start() error {
	err := a.start()
	if a.starting != nil {
		a.starting.end(err == nil)
	}
	return err
}

func (a *App) start() error {
	ctx := context.Background()
	for _, s := range a.Services {
		if s.Auth.Kind == AuthOAuth && !a.console {
			// Only now is every handler provisioned: people connect oauth
			// services in a browser signed in to the console.
			return fmt.Errorf("service %q uses oauth: its users connect their accounts in the console; add toolgate_console to the site that serves public_url", s.ID)
		}
		if s.Auth.Kind == AuthOAuth && !a.api {
			return fmt.Errorf("service %q uses oauth: its provider sends people back to %s/v1/connections/%s/callback, which toolgate_api serves; add toolgate_api to the site that serves public_url", s.ID, a.PublicURL, s.ID)
		}
	}
	for _, s := range a.Services {
		if s.Auth.Kind == AuthHeader {
			serviceHeaders.serve(s.ID, &Credential{Header: s.Auth.Header, Value: s.Auth.Value})
		}
		if u, err := url.Parse(s.URL); err == nil && u.Scheme == "http" && !caddyopt.LoopbackHost(u.Hostname()) {
			a.logger.Warn("a service is reached over plain http across the network (allow_http): whoever is on the path reads and changes its calls and results, and its credential; use https, and keep allow_http for an upstream on this machine",
				zap.String("service", s.ID), zap.String("host", u.Hostname()), zap.String("auth", s.Auth.Kind))
		}
	}
	if s, ok := a.cipher.(CipherStarter); ok {
		if err := s.Start(ctx); err != nil {
			return fmt.Errorf("starting cipher: %w", err)
		}
	}
	if fsys, ok := a.storage.(*fileSystemStorage); ok {
		if err := fsys.checkWritable(); err != nil {
			return err
		}
	}
	if sc, ok := a.storage.(StorageChecker); ok {
		if err := sc.CheckAtStart(ctx); err != nil {
			return err
		}
	}
	if err := a.checkCipherKey(ctx); err != nil {
		return err
	}
	if err := a.sessions.start(a.logger); err != nil {
		return fmt.Errorf("following session changes in storage: %w", err)
	}
	if a.connections != nil {
		if err := a.connections.start(a.logger); err != nil {
			return fmt.Errorf("following credential changes in storage: %w", err)
		}
	}
	a.Auth.start(ctx, a.httpClient, a.logger)
	if a.Auth.Anonymous != "" {
		a.logger.Warn("ANONYMOUS CALLERS ENABLED: requests from loopback addresses without a bearer token act as this user and may use every service without a session; never use this on a shared gateway",
			zap.String("user", a.Auth.Anonymous))
	}
	for _, hook := range a.startHooks {
		hook()
	}
	if err := a.mcpSessions.Attach(a.mcpConfig); err != nil {
		return fmt.Errorf("following MCP session changes in storage: %w", err)
	}
	if a.StateSecret == "" {
		if _, ok := a.storage.(storecache.Notifier); ok {
			a.logger.Warn("no state_secret: MCP session ids are sealed with a key of this process only; replicas sharing the storage cannot continue each other's sessions, and a restart ends them. Give every replica the same state_secret")
		}
	}
	go a.housekeeping()
	a.startedNow()
	return nil
}

// OnMCPSessionEnd registers fn to end the upstream session of an MCP
// session that ended without its runner's DELETE: it expired, its
// toolgate session ended, or it was over (see EndUpstream). The proxy
// sends DELETE upstream where that hands nothing to an upstream that is
// not the session's, and no credential but the one the session was
// opened with. It runs in the background, never under a request.
func (a *App) OnMCPSessionEnd(fn func(EndedMCPSession)) { a.endMCP = fn }

// OnConnectionGone registers fn, called with the storage key of a
// caller's connection to a service (ConnectionKey) when it may be gone:
// deleted through this replica (the caller disconnected, or the provider
// refused the grant), or changed through another (with a storage that
// announces changes; GrantFor with fresh tells whether it is gone), or
// with "" when any may be gone (the listening connection to the storage
// was lost, and changes announced meanwhile with it). What
// holds a caller's credential itself — a program per user that got it in
// its environment — lets go of it then, not at its idle timeout. fn must
// return quickly (it runs on the storage's listener goroutine). Register
// it while provisioning; services without per-user credentials have no
// connections to lose.
func (a *App) OnConnectionGone(fn func(key string)) {
	if a.connections != nil {
		a.connections.onGone(fn)
	}
}

// endingConcurrency bounds the upstream DELETEs of ended sessions in
// flight at once.
const endingConcurrency = 16

var endingSlots = make(chan struct{}, endingConcurrency)

// EndUpstream ends, in the background, the upstream session of e, an MCP
// session ended without its runner's DELETE (see OnMCPSessionEnd).
func (a *App) EndUpstream(e EndedMCPSession) {
	if a.endMCP == nil {
		return
	}
	go func() {
		endingSlots <- struct{}{}
		defer func() { <-endingSlots }()
		a.endMCP(e)
	}()
}

// OnStart registers fn to run when the app starts, after every module is
// provisioned: the place for a guest part's network I/O and background
// work, which Provision must not start (`caddy validate` runs Provision).
func (a *App) OnStart(fn func()) { a.startHooks = append(a.startHooks, fn) }

// OnStop registers fn to run when the app stops: after a newer config
// started, or when Caddy abandons this config's load because another app
// failed to start (then the config before it goes on running, and what
// an OnStart hook made process-wide must be given back to it).
func (a *App) OnStop(fn func()) { a.stopHooks = append(a.stopHooks, fn) }

// housekeeping expires idle MCP sessions and sweeps expired sessions and
// unfinished OAuth sign-ins from storage until the app stops.
func (a *App) housekeeping() {
	mcpTick := time.NewTicker(time.Duration(a.MCPSessionSweepInterval))
	sweepTick := time.NewTicker(15 * time.Minute)
	orphanTick := time.NewTicker(SessionCheckEvery)
	defer mcpTick.Stop()
	defer sweepTick.Stop()
	defer orphanTick.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-orphanTick.C:
			a.mcpSessions.EndOrphans(context.Background(), a.sessions.Ended)
		case <-mcpTick.C:
			a.mcpSessions.Housekeep(context.Background())
		case <-sweepTick.C:
			n, err := a.sessions.sweep(context.Background())
			if err != nil {
				a.logger.Warn("sweeping expired sessions", zap.Error(err))
			} else if n > 0 {
				a.logger.Debug("removed expired sessions", zap.Int("count", n))
			}
			n, err = a.sweepPending(context.Background())
			if err != nil {
				a.logger.Warn("sweeping expired oauth sign-ins", zap.Error(err))
			} else if n > 0 {
				a.logger.Debug("removed expired oauth sign-ins", zap.Int("count", n))
			}
		}
	}
}

// Stop stops background work.
func (a *App) Stop() error {
	a.stopOnce.Do(func() { close(a.stop) })
	a.stoppedNow()
	for i := len(a.stopHooks) - 1; i >= 0; i-- {
		a.stopHooks[i]()
	}
	if caddy.Exiting() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		a.mcpSessions.Leaving(ctx)
		cancel()
	}
	a.mcpSessions.Detach(a.mcpConfig)
	a.sessions.stop()
	if a.connections != nil {
		a.connections.stop()
	}
	return nil
}

// Cleanup releases state shared across config reloads.
func (a *App) Cleanup() error {
	if a.starting != nil {
		a.starting.end(false) // unloaded before Start: requests waiting for it are refused
	}
	for _, release := range a.releasePools {
		release()
	}
	if a.Auth != nil {
		for _, j := range a.Auth.JWT {
			j.cleanup()
		}
	}
	return nil
}
