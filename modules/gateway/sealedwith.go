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
// taken for one of the old key only when it was stored before that (or
// in the same tick of the storage's clock), and
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
// reset, never taken for the old key's. Nor does one that cannot read the
// canary or the reset's record now, and a save the canary could not vouch
// for after its store is undone when a reset was recorded meanwhile (see
// checkKeyAfterSealing).
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
	canaryNone      canaryState = iota
	canaryResetting             // the operator's reset: a new canary is sealed at the next start
	canaryOpens
	canaryRefuses    // sealed with another key: the cipher's key is not the storage's
	canaryUnreadable // the storage or the cipher failed now: the error says which
)

// canaryNow opens the canary in storage with cipher. The error, for
// canaryUnreadable only, is ErrStorageUnavailable's or the cipher's (see
// cipherError): what the person whose connection waits is told.
func canaryNow(ctx context.Context, storage certmagic.Storage, cipher Cipher) (canaryState, error) {
	sealed, err := storage.Load(ctx, cipherCanaryKey)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return canaryNone, nil
	case err != nil:
		return canaryUnreadable, fmt.Errorf("%w: reading the cipher's canary: %v", ErrStorageUnavailable, err)
	case isCanaryReset(sealed):
		return canaryResetting, nil
	}
	plain, err := cipher.Decrypt(ctx, sealed, cipherCanaryContext)
	opens := err == nil && isCanary(plain)
	clear(plain)
	switch {
	case opens:
		return canaryOpens, nil
	case err == nil || errors.Is(err, ErrCipherMismatch):
		return canaryRefuses, nil
	}
	return canaryUnreadable, cipherError("opening the cipher's canary", err)
}

// sealedWithOldKey reports whether the record under key, which does not
// open with the cipher's key, was sealed with the key a reset replaced:
// it was stored before the reset was recorded, or in the same tick of the
// storage's clock (the record of the reset follows the new canary, which
// follows any record of the replaced key the reset left).
func (s *ConnectionStore) sealedWithOldKey(ctx context.Context, key string) bool {
	reset, err := s.storage.Stat(ctx, cipherResetKey)
	if err != nil {
		return false
	}
	info, err := s.storage.Stat(ctx, key)
	if err != nil || info.Modified.After(reset.Modified) {
		return false
	}
	state, _ := canaryNow(ctx, s.storage, s.cipher)
	return state == canaryOpens
}

// lastReset is cipherResetKey's modified time (zero when there is none),
// and whether it could be read.
func (s *ConnectionStore) lastReset(ctx context.Context) (time.Time, bool) {
	info, err := s.storage.Stat(ctx, cipherResetKey)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return time.Time{}, true
	case err != nil:
		return time.Time{}, false
	}
	return info.Modified, true
}

// checkKeyBeforeSealing refuses to seal a connection with a key that does
// not open the canary, or while the canary or the record of the last
// reset cannot be read (a fault of the storage or the cipher: the error
// says which, and is retryable when the fault is): a replica still on a
// key a reset replaced would otherwise seal, unseen, a record stored
// after the reset, which no replica opens nor takes for the old key's. It
// returns the time of the last reset (zero: none), for
// checkKeyAfterSealing.
func (s *ConnectionStore) checkKeyBeforeSealing(ctx context.Context) (time.Time, error) {
	switch state, err := canaryNow(ctx, s.storage, s.cipher); state {
	case canaryRefuses:
		return time.Time{}, s.sealingRefused()
	case canaryUnreadable:
		return time.Time{}, err
	}
	reset, known := s.lastReset(ctx)
	if !known {
		return time.Time{}, fmt.Errorf("%w: reading the record of the cipher's last reset", ErrStorageUnavailable)
	}
	return reset, nil
}

// checkKeyAfterSealing undoes the store of sealed, user's connection to
// service, when the canary no longer opens with the key that sealed it: a
// new one was sealed after a reset while this one was on its way (it
// would be newer than the reset, and never taken for the old key's). Its
// person connects again: undoSealed deletes what was stored, or puts back
// prev, what the store replaced (see storeSealed), when that is another
// replica's newer connection.
//
// A canary that cannot be read now (twice: a passing fault is read
// again) cannot say whose key it is. The record of the last reset then
// decides: one made since the check before sealing (resetBefore), earlier
// than the record just stored, means a new canary was sealed before the
// store, perhaps with another key — what was stored is undone, and the
// person is told to try again (the fault's retryable error). Otherwise
// the record is kept: it opens, or it was stored before a reset recorded
// later and is taken for the old key's (sealedWithOldKey), and a fault
// loses no connection. (A record of the reset that cannot be read now
// tells nothing, and the record is kept: that, a reset completed during
// the save and the canary unreadable twice would keep one of the
// replaced key.)
func (s *ConnectionStore) checkKeyAfterSealing(ctx context.Context, service, user string, sealed []byte, prev *priorRecord, resetBefore time.Time) error {
	after, err := canaryNow(ctx, s.storage, s.cipher)
	if after == canaryUnreadable { // a passing fault: once more
		after, err = canaryNow(ctx, s.storage, s.cipher)
	}
	switch {
	case after == canaryRefuses:
		s.undoSealed(ctx, service, user, sealed, prev)
		return s.sealingRefused()
	case after == canaryUnreadable && s.resetBeforeStore(ctx, ConnectionKey(service, user), resetBefore):
		// Whose key this gateway's is cannot be told now: nothing is put
		// back (see undoSealed).
		s.undoSealed(ctx, service, user, sealed, nil)
		if s.logger != nil {
			s.logger.Warn("the cipher's canary could not be read after a connection was sealed, and a reset was recorded since the save began: the connection was not kept (its person tries again)",
				zap.String("service", service), zap.Error(err))
		}
		return err
	}
	return nil
}

// resetBeforeStore reports whether a reset was recorded since
// resetBefore, before the record under key was stored (or when the
// record's time cannot be read).
func (s *ConnectionStore) resetBeforeStore(ctx context.Context, key string, resetBefore time.Time) bool {
	reset, known := s.lastReset(ctx)
	if !known || reset.Equal(resetBefore) {
		return false
	}
	info, err := s.storage.Stat(ctx, key)
	return err != nil || info.Modified.After(reset)
}

func (s *ConnectionStore) sealingRefused() error {
	if s.logger != nil {
		s.logger.Error("the cipher's canary in storage does not open with this gateway's key: another replica started with a new key after a reset, or the cipher's backend lost the key; no connection is sealed with it. Restart this gateway with the key the canary was sealed with (or restore the key in the backend)")
	}
	return fmt.Errorf("%w: the cipher's canary does not open with this gateway's key (see the log)", ErrCipherRefused)
}
