package gateway

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"time"

	"go.uber.org/zap"
)

// A save whose key a reset replaced while it was on its way is undone
// (see checkKeyAfterSealing): what it stored is deleted, or what its store
// replaced is put back. Here is how, and what it takes from the storage.

// undoSealed deletes user's connection to service, which this gateway
// has just stored as sealed (see checkKeyAfterSealing), when what is
// stored there now is what it stored, or any other record that opens
// with its key, the replaced one, whoever stored it (another replica
// still on it too). A record that does not open with it, or that the
// cipher cannot tell now, was stored since by another replica (one with
// the new key, its person connecting again there, perhaps with another
// cipher) and stays. One that cannot be read now is deleted: nothing
// tells it from the one just stored (on a valueDeleter, only if it is the
// one just stored).
//
// What the save's store replaced (prev, see storeSealed) is put back
// instead when it is such a record of another replica, stored since the
// last reset (see restorable): the person connected again there while
// this save was on its way, and deleting would lose that connection.
// That is done only when the canary refused this gateway's key (prev is
// nil otherwise: one that could not be read does not tell whether this
// key is the replaced one or the new one), and only on a storage that
// writes by value (valueReplacer: the postgres storage), where the save's
// store replaced prev itself and the putting back replaces only what the
// save stored: elsewhere a connection deleted meanwhile (its person
// disconnecting) could come back. Two replicas on the replaced key saving
// at once can still lose it (the second's undo deletes what the first
// stored over it, and the first then finds nothing to put back over).
//
// On a storage that deletes a key only while it holds a value
// (valueDeleter), a record another replica stores between the read and
// the delete is kept too; on another, that moment's window remains.
//
// Other replicas are told of the change (the cache's announcement), and
// so is what holds the credential on this one (maybeGone), so that none
// goes on using what was undone.
func (s *ConnectionStore) undoSealed(ctx context.Context, service, user string, sealed []byte, prev *priorRecord) {
	key := ConnectionKey(service, user)
	s.cache.Forget(key)
	now, err := s.storage.Load(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err == nil && !bytes.Equal(now, sealed) {
		plain, err := s.cipher.Decrypt(ctx, now, CipherContext(service, user))
		clear(plain)
		if err != nil {
			return
		}
	}
	vr, replaces := s.storage.(valueReplacer)
	ours := err != nil || bytes.Equal(now, sealed) // unreadable: taken for what this gateway stored
	if replaces && ours && s.restorable(ctx, service, user, prev) {
		_, perr := vr.ReplaceIfValue(ctx, key, sealed, prev.value)
		if perr == nil {
			s.changedByUndo(ctx, key)
			return
		}
		if s.logger != nil {
			s.logger.Error("cannot put back a connection another replica stored, which a connection just sealed with a key that no longer opens the cipher's canary replaced; deleting what was sealed instead (its person connects again)",
				zap.String("key", key), zap.Error(perr))
		}
	}
	deleteIt := s.storage.Delete
	if vd, ok := s.storage.(valueDeleter); ok {
		if err != nil {
			now = sealed // not read: what this gateway stored, and only that
		}
		deleteIt = func(ctx context.Context, key string) error {
			_, err := vd.DeleteIfValue(ctx, key, now)
			return err
		}
	}
	if err := deleteIt(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		if s.logger != nil {
			s.logger.Error("cannot delete a connection just sealed with a key that no longer opens the cipher's canary, or while the canary could not be read; its person connects again once it is deleted",
				zap.String("key", key), zap.Error(err))
		}
		return
	}
	s.changedByUndo(ctx, key)
}

// changedByUndo tells the other replicas and this one's holders of the
// credential that an undo changed key.
func (s *ConnectionStore) changedByUndo(ctx context.Context, key string) {
	s.cache.Deleted(ctx, key)
	s.maybeGone(key)
}

// priorRecord is what a connection's key held before a save stored over
// it, and when it was stored.
type priorRecord struct {
	value    []byte
	modified time.Time
}

// storeSealed stores sealed at key, and returns what it replaced when an
// undo may put that back (see undoSealed): on a storage that writes by
// value, the record read just before, replaced only while it is still
// there (read again when another write came in between, a few times).
// Otherwise it returns nil, and the store is unconditional, as ever: on
// another storage, when there was no record (one stored between that
// read and the store is replaced unseen), or when it could not be read.
// The record's time is read before it: one stored between the two reads
// is taken for an older one, and is not put back (see restorable).
func (s *ConnectionStore) storeSealed(ctx context.Context, key string, sealed []byte) (*priorRecord, error) {
	vr, ok := s.storage.(valueReplacer)
	if !ok {
		return nil, s.storage.Store(ctx, key, sealed)
	}
	for range storeSealedTries {
		info, err := s.storage.Stat(ctx, key)
		if err != nil {
			break
		}
		value, err := s.storage.Load(ctx, key)
		if err != nil {
			break
		}
		replaced, err := vr.ReplaceIfValue(ctx, key, value, sealed)
		if err != nil {
			return nil, err
		}
		if replaced {
			return &priorRecord{value: value, modified: info.Modified}, nil
		}
	}
	return nil, s.storage.Store(ctx, key, sealed)
}

// storeSealedTries bounds storeSealed's reads of a record other writes
// keep replacing.
const storeSealedTries = 3

// restorable reports whether prev, what an undone save stored over, is to
// be put back: a record stored since the last reset that this gateway's
// key does not open (the cipher says so: ErrCipherMismatch), stored by a
// replica with the new key. One stored before the reset is the replaced
// key's (see sealedWithOldKey), and put back now it would no longer be
// taken for one; one that opens with this gateway's key, stored since,
// no replica opens; one the cipher cannot tell now (a fault) may be
// either, and is not put back.
func (s *ConnectionStore) restorable(ctx context.Context, service, user string, prev *priorRecord) bool {
	if prev == nil {
		return false
	}
	reset, known := s.lastReset(ctx)
	if !known || !prev.modified.After(reset) {
		return false
	}
	plain, err := s.cipher.Decrypt(ctx, prev.value, CipherContext(service, user))
	clear(plain)
	return errors.Is(err, ErrCipherMismatch)
}

// valueDeleter is storage that deletes a key only while it holds value,
// in one step, and reports whether it did (the postgres storage).
type valueDeleter interface {
	DeleteIfValue(ctx context.Context, key string, value []byte) (bool, error)
}

// valueReplacer is storage that stores value at key only while key holds
// old, in one step, and reports whether it did (the postgres storage):
// a save stores over what it read with it, and its undo puts that back
// with it (see undoSealed).
type valueReplacer interface {
	ReplaceIfValue(ctx context.Context, key string, old, value []byte) (bool, error)
}
