package policy

import (
	"bytes"
	"encoding/base64"
	"slices"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The blobs of embedded resources: read decoded, as a runner may, and
// withheld when toolgate cannot read them as it would (their mimeType,
// charset or byte-order mark).

// plainBlob reports whether blob is valid base64 whose decoded bytes hold
// no marker and, when they are text (see textBlob), no invisible
// character, and whose resource toolgate can read (see unreadableBlob);
// mime is the resource's mimeType, if it has one. text is how many bytes
// of text the blob holds (0 unless it is text).
func (sc *scanner) plainBlob(blob string, mime *ast.Term) (plain bool, text int) {
	b, err := base64.StdEncoding.DecodeString(blob)
	if err != nil {
		return false, 0
	}
	m, ok := blobMIME(mime)
	if !ok || unreadableBlob(m, b) {
		return false, 0
	}
	s := unsafe.String(unsafe.SliceData(b), len(b))
	if textBlob(m, b) {
		text = len(b)
	}
	return !sc.hasMarker(s) && !(text > 0 && sc.hasInvisible(s)), text
}

// longBlob is how many bytes of text a payload's blobs may hold together
// before the policy looks at them (they may be over its limit, which it
// then withholds; its long_blob).
const longBlob = 4096

// blobMIME is a blob's mimeType as the policy reads it (its blob_types):
// in lower case, "" when there is none or it is null (decoders read null
// as none); ok is false when it is another value, which the policy
// withholds.
func blobMIME(mime *ast.Term) (m string, ok bool) {
	if mime == nil {
		return "", true
	}
	switch v := mime.Value.(type) {
	case ast.Null:
		return "", true
	case ast.String:
		return strings.ToLower(string(v)), true
	}
	return "", false
}

// textBlob reports whether a blob decoded to b is text a runner may show
// as such (the policy's text_blob): valid UTF-8, of a resource whose
// mimeType m (see blobMIME) is none or one of text (see textMIME) in UTF-8.
func textBlob(m string, b []byte) bool {
	return textMIME(m) && !foreignCharset(m) && utf8.Valid(b)
}

// unreadableBlob reports whether a blob decoded to b, whose resource has
// the mimeType m (see blobMIME), is one the policy withholds (its
// unreadable_blobs): text in a charset other than UTF-8, labelled with a
// type of text and not valid UTF-8, or without a type and opening with a
// byte-order mark of UTF-16 or UTF-32 (see foreignBOM).
func unreadableBlob(m string, b []byte) bool {
	if !textMIME(m) {
		return false
	}
	base := mimeBase(m)
	return foreignCharset(m) || base != "" && !utf8.Valid(b) || base == "" && foreignBOM(b)
}

// foreignBOM reports whether b opens with a byte-order mark of UTF-16
// (FF FE, FE FF) or UTF-32 (FF FE 00 00, 00 00 FE FF), which a runner
// reading a blob without a mimeType as text sniffs and decodes by (the
// policy's foreign_bom).
func foreignBOM(b []byte) bool {
	return bytes.HasPrefix(b, []byte{0xFF, 0xFE}) || bytes.HasPrefix(b, []byte{0xFE, 0xFF}) ||
		bytes.HasPrefix(b, []byte{0, 0, 0xFE, 0xFF})
}

// mimeBase is the type of a mimeType, without its parameters.
func mimeBase(m string) string {
	base, _, _ := strings.Cut(m, ";")
	return strings.TrimSpace(base)
}

// foreignCharset reports whether a mimeType (in lower case) has a charset
// parameter naming an encoding other than UTF-8 or US-ASCII (the policy's
// foreign_charset).
func foreignCharset(m string) bool {
	params := strings.Split(m, ";")
	for _, p := range params[1:] {
		name, value, _ := strings.Cut(p, "=")
		if strings.TrimSpace(name) == "charset" && !slices.Contains(utf8Charsets, strings.Trim(strings.TrimSpace(value), `"`)) {
			return true
		}
	}
	return false
}

// utf8Charsets are the charsets whose text is UTF-8 (the policy's
// utf8_charsets).
var utf8Charsets = []string{"utf-8", "utf8", "us-ascii", "ascii"}

// textMIME reports whether a mimeType (in lower case) is of text (the
// policy's text_mime): empty, text/*, JSON, XML, YAML (also as a +json,
// +xml or +yaml suffix) or another language written as text. Other types
// are binary data, whose bytes are not touched even when they happen to be
// valid UTF-8 (a protocol buffer's).
func textMIME(m string) bool {
	base := mimeBase(m)
	if base == "" || strings.HasPrefix(base, "text/") || slices.Contains(textApplications, base) {
		return true
	}
	return strings.HasSuffix(base, "+json") || strings.HasSuffix(base, "+xml") || strings.HasSuffix(base, "+yaml")
}

// textApplications are the application/ types of text (the policy's
// text_applications).
var textApplications = []string{"application/json", "application/xml", "application/yaml", "application/x-yaml",
	"application/javascript", "application/ecmascript", "application/x-ndjson", "application/toml", "application/sql",
	"application/graphql", "application/x-sh"}

// mimeAt is the mimeType beside the blob at path, nil when there is none.
func mimeAt(result *ast.Term, path []pathStep) *ast.Term {
	return termAt(result, append(path[:len(path)-1:len(path)-1], pathStep{key: keyMimeType}))
}
