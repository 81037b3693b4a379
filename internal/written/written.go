// Package written tells a value another writer is still creating from one
// left behind. toolgate's stores write an index entry and the record it
// names one after the other (on any replica, often without a lock a
// reader takes), so a reader finding an entry whose record is missing
// cannot tell a creation under way from litter: deleting it then lost the
// new record's index (a session never listed, counted or ended by its
// person). A reader deletes such an entry only once it is older than
// Grace.
package written

import (
	"context"
	"time"

	"github.com/caddyserver/certmagic"
)

// Grace is how long after its write an entry whose record is missing is
// taken for a creation under way: far longer than a store's writes take.
const Grace = time.Minute

// Recently reports whether key was written within Grace. A key the
// storage cannot say about counts as recent: nothing is deleted on a
// guess.
func Recently(ctx context.Context, storage certmagic.Storage, key string) bool {
	info, err := storage.Stat(ctx, key)
	return err != nil || time.Since(info.Modified) < Grace
}
