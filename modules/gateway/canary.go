package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
)

// cipherCanaryKey is where a value the cipher sealed is kept. A cipher
// whose key does not open it was not the one the storage's records were
// sealed with: a lost local key file that Start replaced with a new one, a
// key file copied from elsewhere, another Vault or KMS key. Going on would
// make every stored credential and approval unreadable, retry after retry,
// and seal new records with a key the old ones do not share.
const cipherCanaryKey = "toolgate/cipher-canary"

// cipherCanary is the canary's plaintext and context.
var cipherCanary, cipherCanaryContext = []byte("toolgate's cipher canary"), []byte("toolgate/v1/cipher-canary")

// isCanary reports whether plain is the canary's plaintext.
func isCanary(plain []byte) bool { return string(plain) == string(cipherCanary) }

// canaryReset is what an operator stores in place of the canary to go on
// with a cipher whose key does not open the records (see App.open):
// the next start seals a new canary with its key, and looks at no record
// sealed before.
const canaryReset = "reset"

// canaryTimeout bounds the check at start: a storage or cipher backend
// that does not answer leaves it undone (and says so), as the gateway
// serves what it can without them.
const canaryTimeout = 10 * time.Second

// maxConnectionWitnesses bounds the stored connections tried at start on a
// storage without a canary: any one that opens will do.
const maxConnectionWitnesses = 16

// sealedWitness is a record another step seals under a fixed context (the
// approvals' key): on a storage sealed before it had a canary, it tells
// whether the cipher opens the records already there.
type sealedWitness struct {
	name    string
	context []byte
}

// AddSealedWitness registers name, a record sealed under context by the
// cipher and kept in storage, as a witness of the key the storage's
// records are sealed with (see checkCipherKey). Register it while
// provisioning.
func (a *App) AddSealedWitness(name string, context []byte) {
	a.witnesses = append(a.witnesses, sealedWitness{name: name, context: context})
}

// checkCipherKey checks at start that the cipher opens the canary in
// storage, and seals one when there is none (after a record sealed before
// it, if there is one, opened) or when the operator reset it. It refuses
// to start with a key that does not open them, or a cipher that refuses
// to; a storage or cipher that cannot be reached now leaves the check
// undone, logged.
func (a *App) checkCipherKey(ctx context.Context) error {
	if a.cipher == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, canaryTimeout)
	defer cancel()
	sealed, err := a.storage.Load(ctx, cipherCanaryKey)
	switch {
	case errors.Is(err, fs.ErrNotExist) || err == nil && isCanaryReset(sealed):
		return a.sealCanary(ctx)
	case err != nil:
		a.logger.Warn("cannot read the cipher's canary now: whether the cipher's key opens the stored records was not checked", zap.Error(err))
		return nil
	}
	_, err = a.open(ctx, cipherCanaryKey, sealed, cipherCanaryContext)
	return err
}

// isCanaryReset reports whether stored is the operator's reset.
func isCanaryReset(stored []byte) bool {
	return strings.TrimSpace(string(stored)) == canaryReset
}

// sealCanary seals the canary, under a lock: replicas starting at once on
// a new storage agree on one, and one whose key does not open it is
// refused. On a storage sealed before it had a canary, a record already
// there must open first; when none could be read, no canary is sealed
// now. A canary the operator reset is sealed again without looking.
func (a *App) sealCanary(ctx context.Context) error {
	const lock = "toolgate_cipher_canary"
	if err := a.storage.Lock(ctx, lock); err != nil {
		a.logger.Warn("cannot lock the storage to seal the cipher's canary now: whether the cipher's key opens the stored records was not checked", zap.Error(err))
		return nil
	}
	defer func() {
		if err := a.storage.Unlock(context.WithoutCancel(ctx), lock); err != nil {
			a.logger.Warn("unlocking the cipher's canary", zap.Error(err))
		}
	}()
	sealed, err := a.storage.Load(ctx, cipherCanaryKey)
	afterReset := err == nil && isCanaryReset(sealed)
	switch {
	case afterReset:
		a.logger.Warn("the cipher's canary was reset: a new one is sealed with this key, and records sealed with another key stay unreadable (people connect again)")
	case err == nil: // another replica sealed it meanwhile
		_, err = a.open(ctx, cipherCanaryKey, sealed, cipherCanaryContext)
		return err
	case !errors.Is(err, fs.ErrNotExist):
		a.logger.Warn("cannot read the cipher's canary now: whether the cipher's key opens the stored records was not checked", zap.Error(err))
		return nil
	default:
		checked, err := a.checkWitness(ctx)
		if err != nil || !checked {
			return err
		}
	}
	if afterReset {
		a.dropWitnessesOfOldKey(ctx)
	}
	if sealed, err = a.cipher.Encrypt(ctx, cipherCanary, cipherCanaryContext); err == nil {
		err = a.storage.Store(ctx, cipherCanaryKey, sealed)
	}
	if err != nil {
		a.logger.Warn("cannot seal the cipher's canary now: a key that does not open the stored records is not caught at start until it is", zap.Error(err))
		return nil
	}
	if afterReset {
		a.markReset(ctx)
	}
	return nil
}

// checkWitness checks that the cipher opens a record sealed before the
// storage had a canary: a registered witness (the approvals' key), else a
// stored connection of a user the configuration names. checked is false
// when records exist that could not be read or opened now (logged).
func (a *App) checkWitness(ctx context.Context) (checked bool, err error) {
	for _, w := range a.witnesses {
		sealed, err := a.storage.Load(ctx, w.name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			a.logger.Warn("cannot read a sealed record now: whether the cipher's key opens the stored records was not checked", zap.String("record", w.name), zap.Error(err))
			return false, nil
		}
		return a.open(ctx, w.name, sealed, w.context)
	}
	return a.checkConnections(ctx)
}

// checkConnections checks that the cipher opens a stored connection. Its
// context names its user, whom the storage keeps only as a hash: only the
// connections of users the configuration names (API keys') can be opened
// here. Any one that opens will do (a record damaged, or gone meanwhile,
// is passed over); the start is refused when those tried all were sealed
// with another key. With none to try, it goes on, and says what it could
// not check.
func (a *App) checkConnections(ctx context.Context) (checked bool, err error) {
	keys, err := a.storage.List(ctx, connectionPrefix, true)
	switch {
	case errors.Is(err, fs.ErrNotExist) || err == nil && len(keys) == 0:
		return true, nil
	case err != nil:
		a.logger.Warn("cannot list the stored connections now: whether the cipher's key opens the stored records was not checked", zap.Error(err))
		return false, nil
	}
	byUser := make(map[string][]string) // the services of connections, by their user's hash
	stored := 0
	for _, k := range keys {
		if service, user, ok := strings.Cut(strings.TrimPrefix(k, connectionPrefix+"/"), "/"); ok && isHashKey(user) {
			byUser[user] = append(byUser[user], service)
			stored++
		}
	}
	var mismatch error
	tried, unread := 0, 0
	for _, user := range a.Auth.users() {
		for _, service := range byUser[hashKey(user)] {
			if tried == maxConnectionWitnesses {
				break
			}
			tried++
			key := ConnectionKey(service, user)
			sealed, err := a.storage.Load(ctx, key)
			if errors.Is(err, fs.ErrNotExist) {
				continue // disconnected meanwhile
			}
			if err != nil {
				unread++
				continue
			}
			opened, err := a.open(ctx, key, sealed, CipherContext(service, user))
			switch {
			case opened:
				return true, nil
			case errors.Is(err, ErrCipherMismatch):
				mismatch = cmp.Or(mismatch, err)
			case err != nil:
				return false, err // the cipher refuses: its words
			default:
				unread++
			}
		}
	}
	switch {
	case unread > 0:
		a.logger.Warn("cannot read or open the stored connections now: whether the cipher's key opens the stored records was not checked, and no canary is sealed until it is")
		return false, nil
	case mismatch != nil:
		return false, mismatch
	case tried == 0 && stored > 0:
		// Sealed now, a canary would vouch for a key nothing checked, and
		// turn away the right one were it restored.
		a.logger.Warn("the storage holds connections but no cipher canary (it was stored before there were canaries, or the canary was deleted), none of a user this configuration names: whether the cipher's key opens them was not checked, and no canary is sealed; once people's connections work, seal one: "+a.resetAdvice(),
			zap.Int("connections", stored))
		return false, nil
	}
	return true, nil
}

// StorageChecker is implemented by a storage that can tell, at start, a
// configuration that will never work (a database refusing the role or
// password it was given) from one that cannot be reached now: the start is
// refused for the former, saying why, and goes on for the latter, whose
// storage connects once it is back.
type StorageChecker interface {
	CheckAtStart(ctx context.Context) error
}

// StoreCommand is implemented by a storage that can say how an operator
// stores a value in it by hand (the SQL of a database storage): toolgate's
// messages then give the command instead of naming the storage's tools.
type StoreCommand interface {
	StoreCommand(key, value string) string
}

// resetAdvice says how the operator stores canaryReset as the canary, in
// the storage this gateway uses.
func (a *App) resetAdvice() string {
	what := fmt.Sprintf("store the word %q as %s in the storage", canaryReset, cipherCanaryKey)
	switch s := a.storage.(type) {
	case *fileSystemStorage:
		return what + ": printf " + canaryReset + " > " + shellQuote(filepath.Join(s.Path, filepath.FromSlash(cipherCanaryKey)))
	case StoreCommand:
		return what + ": " + s.StoreCommand(cipherCanaryKey, canaryReset)
	}
	return what + ", with the storage's own tools"
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// open reports whether the cipher opens name, a record it sealed under
// context. A key that does not open it is an error wrapping
// ErrCipherMismatch, which refuses the start, as does a cipher that
// refuses to open it (a permission, a token: its error says what); a
// cipher that cannot be reached now leaves it unchecked, logged.
func (a *App) open(ctx context.Context, name string, sealed, context []byte) (bool, error) {
	plain, err := a.cipher.Decrypt(ctx, sealed, context)
	switch {
	case errors.Is(err, ErrCipherUnavailable):
		a.logger.Warn("cannot open a sealed record now: whether the cipher's key opens the stored records was not checked", zap.String("record", name), zap.Error(err))
		return false, nil
	case err == nil && name == cipherCanaryKey && !isCanary(plain):
		err = fmt.Errorf("%w: it holds another value", ErrCipherMismatch)
		fallthrough
	case errors.Is(err, ErrCipherMismatch):
		return false, fmt.Errorf("the cipher's key does not open the records in storage, which were sealed with another key (%s does not open: %w): "+
			"restore the key they were sealed with (for cipher local, the key file from a backup, in place of the one now there; for vault_transit or kms, the key the configuration named), "+
			"or, to go on with this key, %s. Every credential and approval sealed with the old key then stays unreadable, and people connect again",
			name, err, a.resetAdvice())
	case err != nil:
		return false, fmt.Errorf("the cipher cannot open %s, a record it sealed in storage: %w: fix what it says (its key is not in question), then start again", name, err)
	}
	return true, nil
}
