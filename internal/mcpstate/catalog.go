package mcpstate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Tool is a tool as the upstream published it in tools/list.
type Tool struct {
	Name string
	Raw  []byte // the tool object's JSON text

	memo atomic.Pointer[toolMemo]
}

type toolMemo struct {
	key   any
	value any
}

// Memo returns the value make computes from the definition and key,
// computing it once per key: again only when called with another key (the
// policy step keeps the tool's policy input here, keyed on the service
// whose configuration it reflects, which a config reload replaces).
// Catalogs are shared between sessions, and so is the memo.
func (t *Tool) Memo(key any, make func() any) any {
	if m := t.memo.Load(); m != nil && m.key == key {
		return m.value
	}
	v := make()
	t.memo.Store(&toolMemo{key: key, value: v})
	return v
}

// Catalog is a set of tool definitions, immutable, named by the SHA-256
// of its stored form: sessions whose upstreams list the same tools share
// one catalog in storage and in memory.
type Catalog struct {
	Hash  string
	Tools map[string]*Tool
}

type storedTool struct {
	Name string `json:"name"`
	Raw  string `json:"raw"` // kept as text, byte for byte
}

func catalogKey(hash string) string { return path.Join(catalogsPrefix, hash) }

// NewCatalog makes the catalog of tools.
func NewCatalog(tools map[string][]byte) (*Catalog, []byte) {
	stored := make([]storedTool, 0, len(tools))
	for name, raw := range tools {
		stored = append(stored, storedTool{Name: name, Raw: string(raw)})
	}
	slices.SortFunc(stored, func(a, b storedTool) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	data, _ := json.Marshal(stored)
	sum := sha256.Sum256(data)
	return decodeCatalog(hex.EncodeToString(sum[:]), stored), data
}

// With returns the catalog with the tools defined as they are in defined
// (added or replaced, by name): a new catalog, since catalogs never
// change. c may be nil.
func (c *Catalog) With(defined map[string][]byte) *Catalog {
	tools := make(map[string][]byte, len(defined))
	if c != nil {
		for n, t := range c.Tools {
			tools[n] = t.Raw
		}
	}
	maps.Copy(tools, defined)
	next, _ := NewCatalog(tools)
	return next
}

func decodeCatalog(hash string, stored []storedTool) *Catalog {
	c := &Catalog{Hash: hash, Tools: make(map[string]*Tool, len(stored))}
	for _, t := range stored {
		c.Tools[t.Name] = &Tool{Name: t.Name, Raw: []byte(t.Raw)}
	}
	return c
}

// catalogRefresh is how old a catalog may be before a session that starts
// using it stores it again, so that the sweep (which deletes catalogs
// older than the longest session life plus this) never deletes one in use.
func (s *Store) catalogRefresh() time.Duration { return s.maxAge/2 + time.Minute }

// catalogsLock is the storage lock the sweep deletes catalogs under, and
// an old catalog is stored again under.
const catalogsLock = "toolgate_mcp_catalogs"

// PutCatalog stores tools as a catalog, unless the same catalog is stored
// already (and recent), and returns it. The catalog is kept in memory.
// An old one stored already is returned even when storing it again fails:
// other replicas find it, and the next session using it tries again.
func (s *Store) PutCatalog(ctx context.Context, tools map[string][]byte) (*Catalog, error) {
	c, data := NewCatalog(tools)
	if known := s.catalogs.get(c.Hash); known != nil {
		c = known
	}
	key := catalogKey(c.Hash)
	info, err := s.storage.Stat(ctx, key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// No sweep can delete it once stored: it deletes only what it
		// found old under the lock (see sweepCatalogs).
		if err := s.storage.Store(ctx, key, data); err != nil {
			return nil, fmt.Errorf("storing the tool catalog: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("storing the tool catalog: %w", err)
	case s.now().Sub(info.Modified) > s.catalogRefresh():
		// A sweep may have found it old and be about to delete it: stored
		// again under the sweep's lock, it is either deleted before (and
		// stored anew) or found recent.
		_ = s.LockedAs(ctx, catalogsLock, func() error { return s.storage.Store(ctx, key, data) })
	}
	s.catalogs.put(c)
	return c, nil
}

// Catalog returns the catalog named hash, from memory when it was read
// before (catalogs never change).
func (s *Store) Catalog(ctx context.Context, hash string) (*Catalog, error) {
	if c := s.catalogs.get(hash); c != nil {
		return c, nil
	}
	data, err := s.storage.Load(ctx, catalogKey(hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading the tool catalog: %w", err)
	}
	var stored []storedTool
	if err := json.Unmarshal(data, &stored); err != nil {
		return nil, fmt.Errorf("reading the tool catalog: %v", err)
	}
	c := decodeCatalog(hash, stored)
	s.catalogs.put(c)
	return c, nil
}

// sweepCatalogs deletes catalogs that no live session can use any more.
// Those that look old are looked at again under the lock PutCatalog
// stores an old catalog again under, and deleted under it: one a session
// started using meanwhile stays. Without the lock nothing is deleted.
func (s *Store) sweepCatalogs(ctx context.Context) error {
	keys, err := s.storage.List(ctx, catalogsPrefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var old []string
	for _, k := range keys {
		if s.catalogExpired(ctx, k) {
			old = append(old, k)
		}
	}
	if len(old) == 0 {
		return nil
	}
	err = s.LockedAs(ctx, catalogsLock, func() error {
		for _, k := range old {
			if s.catalogExpired(ctx, k) {
				_ = s.storage.Delete(ctx, k)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sweeping tool catalogs: %w", err)
	}
	return nil
}

// catalogExpired tells whether the catalog at key is older than any live
// session that uses it could have refreshed it.
func (s *Store) catalogExpired(ctx context.Context, key string) bool {
	info, err := s.storage.Stat(ctx, key)
	return err == nil && s.now().Sub(info.Modified) > s.maxAge+s.catalogRefresh()
}

// catalogCache keeps catalogs read or made, at most maxCatalogs.
type catalogCache struct {
	mu sync.Mutex
	m  map[string]*Catalog
}

const maxCatalogs = 10_000

func newCatalogCache() *catalogCache { return &catalogCache{m: make(map[string]*Catalog)} }

func (c *catalogCache) get(hash string) *Catalog {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[hash]
}

func (c *catalogCache) put(cat *Catalog) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[cat.Hash]; !ok && len(c.m) >= maxCatalogs {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[cat.Hash] = cat
}
