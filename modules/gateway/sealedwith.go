package gateway

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// After the operator's reset (see canaryReset), the stored connections
// sealed with the old key never open again: their people are asked to
// connect again (ErrSealedWithOtherKey) rather than told to retry for
// ever. The start that seals the new canary also stores cipherResetKey,
// whose modified time says when. A connection that does not open is
// taken for one of the old key only when it was stored before that, and
// the cipher opens the canary now (a backend that lost the key for a
// while refuses every record alike, and the right key would open them
// again); otherwise it stays the cipher's error, for an administrator to
// see (one stored since that does not open was changed: damaged, or moved
// from another record). Nothing of this is learnt at start: a gateway that
// started while the cipher was unreachable, or before the reset, answers
// alike.
//
// A gateway whose key does not open the canary (another replica started
// with a new key after a reset, or the backend lost the key) seals no
// connection: it would be unreadable to the others, and stored after the
// reset, never taken for the old key's.
//
// The reset's record is kept apart from the canary, whose plaintext
// stays what every release seals and opens.

// cipherResetKey is stored, in plain text (the time), when a canary is
// sealed after the operator's reset.
const cipherResetKey = "toolgate/cipher-canary-reset"

// markReset records that the canary was just sealed after a reset.
func (a *App) markReset(ctx context.Context) {
	if err := a.storage.Store(ctx, cipherResetKey, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
		a.logger.Warn("cannot record the cipher's reset: connections sealed with the old key answer a retryable error, not a sign-in", zap.Error(err))
	}
}

// dropWitnessesOfOldKey deletes, at a reset, the sealed witnesses (the
// approvals' key) the cipher's key does not open: their owners seal new
// ones when they find none, and the old ones would refuse their work for
// good. What they signed is void with them (pending approvals are asked
// again).
func (a *App) dropWitnessesOfOldKey(ctx context.Context) {
	for _, w := range a.witnesses {
		sealed, err := a.storage.Load(ctx, w.name)
		if err != nil {
			continue
		}
		plain, err := a.cipher.Decrypt(ctx, sealed, w.context)
		clear(plain)
		if !errors.Is(err, ErrCipherMismatch) {
			continue
		}
		if err := a.storage.Delete(ctx, w.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			a.logger.Warn("cannot delete a record sealed with the key the reset replaced; delete it by hand", zap.String("record", w.name), zap.Error(err))
			continue
		}
		a.logger.Warn("a record sealed with the key the reset replaced was deleted; a new one is made when needed", zap.String("record", w.name))
	}
}

// canaryState is what the cipher makes of the canary now.
type canaryState uint8

const (
	canaryUnknown canaryState = iota // none, reset, or not opened now
	canaryOpens
	canaryRefuses // sealed with another key: the cipher's key is not the storage's
)

// canaryNow opens the canary in storage with cipher.
func canaryNow(ctx context.Context, storage certmagic.Storage, cipher Cipher) canaryState {
	sealed, err := storage.Load(ctx, cipherCanaryKey)
	if err != nil || isCanaryReset(sealed) {
		return canaryUnknown
	}
	plain, err := cipher.Decrypt(ctx, sealed, cipherCanaryContext)
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
	reset, err := s.storage.Stat(ctx, cipherResetKey)
	if err != nil {
		return false
	}
	info, err := s.storage.Stat(ctx, key)
	return err == nil && info.Modified.Before(reset.Modified) && canaryNow(ctx, s.storage, s.cipher) == canaryOpens
}

// checkKeyBeforeSealing refuses to seal a connection with a key that does
// not open the canary.
func (s *ConnectionStore) checkKeyBeforeSealing(ctx context.Context) error {
	if canaryNow(ctx, s.storage, s.cipher) != canaryRefuses {
		return nil
	}
	return s.sealingRefused()
}

// checkKeyAfterSealing deletes user's connection to service just stored
// when the canary no longer opens with the key that sealed it: a new one
// was sealed after a reset while this one was on its way (it would be
// newer than the reset, and never taken for the old key's). Its person
// connects again. What is deleted is whatever record there opens with
// this key, the replaced one, whoever stored it (another replica still on
// it too); one that does not open with it was stored since by a replica
// with the new key, its person connecting again there, and stays.
// (Storage has no compare-and-delete: a write landing between the read
// and the delete still goes, a moment's window where it was the whole
// check.)
func (s *ConnectionStore) checkKeyAfterSealing(ctx context.Context, service, user string) error {
	if canaryNow(ctx, s.storage, s.cipher) != canaryRefuses {
		return nil
	}
	key := ConnectionKey(service, user)
	s.cache.Forget(key)
	now, err := s.storage.Load(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return s.sealingRefused()
	}
	if err == nil {
		plain, err := s.cipher.Decrypt(ctx, now, CipherContext(service, user))
		clear(plain)
		if errors.Is(err, ErrCipherMismatch) {
			return s.sealingRefused()
		}
	}
	if err := s.storage.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) && s.logger != nil {
		s.logger.Error("cannot delete a connection just sealed with a key that no longer opens the cipher's canary; its person connects again once it is deleted",
			zap.String("key", key), zap.Error(err))
	}
	return s.sealingRefused()
}

func (s *ConnectionStore) sealingRefused() error {
	if s.logger != nil {
		s.logger.Error("the cipher's canary in storage does not open with this gateway's key: another replica started with a new key after a reset, or the cipher's backend lost the key; no connection is sealed with it. Restart this gateway with the key the canary was sealed with (or restore the key in the backend)")
	}
	return fmt.Errorf("%w: the cipher's canary does not open with this gateway's key (see the log)", ErrCipherRefused)
}
