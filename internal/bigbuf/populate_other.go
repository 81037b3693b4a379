//go:build !linux

package bigbuf

// populate does nothing here: the pages fault in as they are written.
func populate([]byte) {}
