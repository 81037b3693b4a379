package gateway

import (
	"context"
	"slices"
	"testing"

	"github.com/caddyserver/certmagic"
)

// Holds: the digits-only skip hides regular files only. mcpstate's
// windows (directories named by digits) and what is in them are listed,
// recursively or not, as FileStorage lists them. A value stored under a
// key whose last element is all digits would be hidden too — no toolgate
// key is named so (ids are 32 base64url characters, refs 32 hex digits,
// hashes 64, activity keys "<stamp>-<hex>"), which this pins.
func TestReviewHoldsDigitsSkipHidesOnlyTemporaryFiles(t *testing.T) {
	ctx := context.Background()
	fsys := &certmagic.FileStorage{Path: t.TempDir()}
	s := SafeListing(fsys)
	const ref = "0123456789abcdef0123456789abcdef"
	for _, k := range []string{
		"toolgate/mcp/active/1700000000000/" + ref,
		"toolgate/mcp/active/1700000060000/" + ref,
		"toolgate/activity/u/00000001700000000000000-ab12",
	} {
		if err := s.Store(ctx, k, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, recursive := range []bool{false, true} {
		want, err := fsys.List(ctx, "toolgate/mcp/active", recursive)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.List(ctx, "toolgate/mcp/active", recursive)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("recursive %v: SafeListing lists %q, FileStorage %q", recursive, got, want)
		}
	}
	got, err := s.List(ctx, "toolgate/activity/u", false)
	if err != nil || len(got) != 1 {
		t.Errorf("an activity key: %q %v", got, err)
	}
	if err := s.Store(ctx, "toolgate/x/12345", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.List(ctx, "toolgate/x", false); len(got) != 0 {
		t.Errorf("a digits-named value listed: %q (the skip changed)", got)
	}
}
