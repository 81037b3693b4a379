package gateway

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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

// canaryTimeout bounds the check at start: a storage or cipher backend
// that does not answer leaves it undone (and says so), as the gateway
// serves what it can without them.
const canaryTimeout = 10 * time.Second

// checkCipherKey checks at start that the cipher opens the canary in
// storage, and seals one when there is none. It refuses to start with a
// key that does not open it; a storage or cipher that cannot be reached
// now leaves the check undone, logged.
func (a *App) checkCipherKey(ctx context.Context) error {
	if a.cipher == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, canaryTimeout)
	defer cancel()
	sealed, err := a.storage.Load(ctx, cipherCanaryKey)
	if errors.Is(err, fs.ErrNotExist) {
		if sealed, err = a.cipher.Encrypt(ctx, cipherCanary, cipherCanaryContext); err == nil {
			err = a.storage.Store(ctx, cipherCanaryKey, sealed)
		}
		if err != nil {
			a.logger.Warn("cannot seal the cipher's canary now: a key that does not open the stored records is not caught at start until it is", zap.Error(err))
		}
		return nil
	}
	if err != nil {
		a.logger.Warn("cannot read the cipher's canary now: whether the cipher's key opens the stored records was not checked", zap.Error(err))
		return nil
	}
	plain, err := a.cipher.Decrypt(ctx, sealed, cipherCanaryContext)
	switch {
	case errors.Is(err, ErrCipherUnavailable):
		a.logger.Warn("cannot open the cipher's canary now: whether the cipher's key opens the stored records was not checked", zap.Error(err))
		return nil
	case err != nil || string(plain) != string(cipherCanary):
		return fmt.Errorf("the cipher's key does not open the records in storage, which were sealed with another key (%s does not decrypt): "+
			"restore the key they were sealed with (for cipher local, the key file from a backup, in place of the one now there; for vault_transit or kms, the key the configuration named), "+
			"or, to go on with this key, delete %s from the storage: every credential and approval sealed with the old key then stays unreadable, and people connect again", cipherCanaryKey, cipherCanaryKey)
	}
	return nil
}
