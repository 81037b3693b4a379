package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"
)

// Change f78627d (modules/gateway/sealedwith.go checkKeyAfterSealing):
// a replica on the key a reset replaced deletes the connection record it
// just stored only when Load gives back exactly the bytes it stored
// (bytes.Equal); anything else is taken for another replica's newer
// record and kept.
//
// Attack: a storage whose Load gives back something other than what was
// stored (a trailing byte trimmed, NULs, an empty value as NULL, a value
// read through another pool's connection before it sees the write) would
// make every such undo keep the record sealed with the replaced key: one
// stored after the reset, which no replica opens and none takes for the
// old key's (a retryable error for good instead of "connect again").
//
// Held: this storage keeps values as bytea and gives back, through
// another pool (another replica's process) right after Store returned,
// exactly the bytes stored: sealed-like random values of several sizes,
// values with NULs and high bytes, and an empty one. Severity: none.
// (The file_system storage reads back the file it wrote, also exactly;
// SafeListing does not change Load.)
func TestR10LoadReturnsTheStoredBytes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	table := newTableName()
	writer := newStorage(t, sharedDSN(t, "r10_writer"), table, 0)
	reader := newStorage(t, sharedDSN(t, "r10_reader"), table, 0)
	values := [][]byte{{}, {0}, {0, 0, 0}, []byte("ends with a newline\n"), []byte(" spaces "), {0xff, 0xfe, 0x00, 0x80}}
	for _, n := range []int{12, 28, 29, 200, 4096, 1 << 20} {
		v := make([]byte, n)
		_, _ = rand.Read(v)
		values = append(values, v)
	}
	for i, v := range values {
		key := "toolgate/connections/personal/r10-" + string(rune('a'+i))
		for round := range 3 {
			if err := writer.Store(ctx, key, v); err != nil {
				t.Fatalf("storing %d bytes: %v", len(v), err)
			}
			for _, s := range []*Storage{writer, reader} {
				got, err := s.Load(ctx, key)
				if err != nil || !bytes.Equal(got, v) {
					t.Fatalf("round %d, %d bytes: Load gave %d bytes (%v), not the bytes stored", round, len(v), len(got), err)
				}
			}
			v = append(v[:len(v):len(v)], byte(round))
		}
	}
}
