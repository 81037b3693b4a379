package gateway

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// holdTakeoverExclusive takes the takeover file marker by creating it
// exclusively, where there is no flock. One outliving its replica (which
// died within the microseconds it holds one) is removed once it is stale,
// and then taken; two replicas finding it stale at once can both take it
// (also when the other holds it by flock), which flock alone rules out.
// It reports false when another replica holds it.
func holdTakeoverExclusive(marker string) (release func(), ok bool, err error) {
	for range 2 {
		f, err := os.OpenFile(marker, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
		if err == nil {
			_ = f.Close()
			return func() { _ = os.Remove(marker) }, true, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, false, err
		}
		info, err := os.Stat(marker)
		if err != nil || time.Since(info.ModTime()) <= lockStale {
			return nil, false, nil
		}
		if err := os.Remove(marker); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, false, err
		}
	}
	return nil, false, nil
}
