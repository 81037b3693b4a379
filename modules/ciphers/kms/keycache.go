package kms

import (
	"container/list"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"time"
)

// keyCache keeps unwrapped data keys (as ready AES-GCM ciphers) in memory,
// so reading the same record again does not ask KMS to unwrap its key
// again. It holds at most size keys. A key serves reads for ttl after KMS
// generated or unwrapped it, however often it is used, so a key revoked in
// KMS stops working here within ttl. Nothing in it is ever written
// anywhere.
//
// It also remembers the data key each record was last read with, for
// staleGrace beyond ttl: when KMS cannot generate a new data key, the next
// value of that same record may be sealed under it, once (see
// Cipher.Encrypt), so an OAuth refresh that read the grant just before KMS
// became unavailable does not lose the rotated refresh token.
type keyCache struct {
	ttl  time.Duration
	size int

	mu       sync.Mutex
	entries  map[cacheKey]*list.Element
	byRecord map[recordKey]*list.Element // the entry each record last used
	order    *list.List                  // of *cacheEntry, oldest first
}

// staleGrace is how long after its ttl a record's latest data key may still
// seal a new value of that record while KMS is unavailable. It covers the
// gateway's OAuth refresh (read, ask the provider, store) of 30s at most.
const staleGrace = time.Minute

// cacheKey names one wrapped data key as unwrapped for one record: a
// digest, so the map keys hold neither the wrapped key nor the record.
type cacheKey [sha256.Size]byte

// recordKey names a record (a cipher context).
type recordKey [sha256.Size]byte

type cacheEntry struct {
	key     cacheKey
	record  recordKey
	keyID   string
	wrapped []byte
	aead    cipher.AEAD
	expires time.Time
	// read is set when the key opened a value and cleared when it sealed
	// one: only a key just read with may stand in for a fresh one.
	read bool
}

func newKeyCache(ttl time.Duration, size int) *keyCache {
	return &keyCache{
		ttl: ttl, size: size,
		entries:  make(map[cacheKey]*list.Element),
		byRecord: make(map[recordKey]*list.Element),
		order:    list.New(),
	}
}

// keyOf is the cache key of a data key wrapped by keyID for record.
func keyOf(keyID string, wrapped, record []byte) cacheKey {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(keyID), wrapped, record} {
		h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(part))))
		h.Write(part)
	}
	var k cacheKey
	h.Sum(k[:0])
	return k
}

func recordOf(record []byte) recordKey { return sha256.Sum256(record) }

// get returns the cipher cached under k while it serves reads, as used for
// a read of its record.
func (c *keyCache) get(k cacheKey) (cipher.AEAD, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	if !now().Before(e.expires) {
		return nil, false
	}
	e.read = true
	c.byRecord[e.record] = el
	return e.aead, true
}

// lastRead returns the data key record was last read with (its key id,
// wrapped form and cipher) if no value of the record was sealed since and
// it is less than staleGrace past its ttl, and marks it used for sealing.
func (c *keyCache) lastRead(record []byte) (keyID string, wrapped []byte, aead cipher.AEAD, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, found := c.byRecord[recordOf(record)]
	if !found {
		return "", nil, nil, false
	}
	e := el.Value.(*cacheEntry)
	if !e.read || !now().Before(e.expires.Add(staleGrace)) {
		return "", nil, nil, false
	}
	e.read = false
	return e.keyID, e.wrapped, e.aead, true
}

// put caches aead, the data key keyID wrapped as wrapped for record, as the
// key the record last used, for a read or not. It first drops keys past
// their grace and then, if the cache is full, the oldest.
func (c *keyCache) put(keyID string, wrapped, record []byte, aead cipher.AEAD, read bool) {
	k := keyOf(keyID, wrapped, record)
	c.mu.Lock()
	defer c.mu.Unlock()
	t := now()
	if el, ok := c.entries[k]; ok {
		c.remove(el)
	}
	// Every entry lives for the same ttl, so insertion order is expiry
	// order: the ones to drop are at the front.
	for el := c.order.Front(); el != nil && !t.Before(el.Value.(*cacheEntry).expires.Add(staleGrace)); el = c.order.Front() {
		c.remove(el)
	}
	for c.order.Len() >= c.size {
		c.remove(c.order.Front())
	}
	e := &cacheEntry{key: k, record: recordOf(record), keyID: keyID, wrapped: wrapped, aead: aead, expires: t.Add(c.ttl), read: read}
	el := c.order.PushBack(e)
	c.entries[k] = el
	c.byRecord[e.record] = el
}

// len returns how many keys are held.
func (c *keyCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// purge forgets every key.
func (c *keyCache) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
	clear(c.byRecord)
	c.order.Init()
}

func (c *keyCache) remove(el *list.Element) {
	e := el.Value.(*cacheEntry)
	delete(c.entries, e.key)
	if c.byRecord[e.record] == el {
		delete(c.byRecord, e.record)
	}
	c.order.Remove(el)
}

// now is the clock; tests replace it.
var now = time.Now
