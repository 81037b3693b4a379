package gateway

import (
	"context"
	"errors"
	"fmt"
)

// After the operator's reset (see canaryReset), the stored connections
// sealed with the old key never open again: their people are asked to
// connect again (ErrSealedWithOtherKey) rather than told to retry for
// ever. A record is taken for one of the old key only when all of these
// hold, and otherwise stays the cipher's error, for an administrator to
// see: the canary this start opened or sealed was sealed after a reset;
// the record was stored before it (one stored since that does not open
// was changed: damaged, or moved from another record); and the cipher
// opens the canary now (a backend that lost the key for a while refuses
// every record alike, and the right key would open them again).
//
// A gateway whose key no longer opens the canary (another replica started
// with a new key after a reset, or the backend lost the key) seals no
// connection: it would be unreadable to the others, and stored after the
// reset, never taken for the old key's.

// keyVerified records that the canary vouches for the cipher's key, and,
// for one sealed after a reset, since when.
func (a *App) keyVerified(ctx context.Context, afterReset bool) {
	if a.connections == nil {
		return
	}
	a.connections.canary, a.connections.logger = a.canaryNow, a.logger // before the flags that tell they are set
	a.connections.verified.Store(true)
	if !afterReset {
		return
	}
	info, err := a.storage.Stat(ctx, cipherCanaryKey)
	if err != nil {
		return // such connections then stay the cipher's error
	}
	a.connections.resetAt.Store(&info.Modified)
}

// canaryState is what the cipher makes of the canary now.
type canaryState uint8

const (
	canaryUnknown canaryState = iota // not read or not opened now
	canaryOpens
	canaryRefuses // sealed with another key now: the cipher's key is not the storage's
)

// canaryNow opens the canary in storage.
func (a *App) canaryNow(ctx context.Context) canaryState {
	sealed, err := a.storage.Load(ctx, cipherCanaryKey)
	if err != nil || isCanaryReset(sealed) {
		return canaryUnknown
	}
	plain, err := a.cipher.Decrypt(ctx, sealed, cipherCanaryContext)
	opens := err == nil && isCanary(plain)
	clear(plain)
	switch {
	case opens:
		return canaryOpens
	case err == nil || errors.Is(err, ErrCipherMismatch):
		return canaryRefuses
	}
	return canaryUnknown
}

// sealedWithOldKey reports whether the record under key, which does not
// open with the cipher's key, was sealed with the key a reset replaced.
func (s *ConnectionStore) sealedWithOldKey(ctx context.Context, key string) bool {
	since := s.resetAt.Load()
	if since == nil {
		return false
	}
	info, err := s.storage.Stat(ctx, key)
	return err == nil && info.Modified.Before(*since) && s.canary(ctx) == canaryOpens
}

// checkKeyBeforeSealing refuses to seal a connection with a key that no
// longer opens the canary a start of this gateway opened.
func (s *ConnectionStore) checkKeyBeforeSealing(ctx context.Context) error {
	if !s.verified.Load() || s.canary(ctx) != canaryRefuses {
		return nil
	}
	s.logger.Error("the cipher's canary in storage no longer opens with this gateway's key: another replica started with a new key after a reset, or the cipher's backend lost the key; no connection is sealed with it. Restart this gateway with the key the canary was sealed with (or restore the key in the backend)")
	return fmt.Errorf("%w: the cipher's canary no longer opens with this gateway's key (see the log)", ErrCipherRefused)
}
