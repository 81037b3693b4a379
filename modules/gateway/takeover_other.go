//go:build !unix

package gateway

// holdTakeover takes the takeover file marker (see holdTakeoverExclusive).
func holdTakeover(marker string) (release func(), ok bool, err error) {
	return holdTakeoverExclusive(marker)
}
