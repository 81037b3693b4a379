package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// JSON-RPC error codes toolgate answers with. The standard ones first, then
// toolgate's own, in the range JSON-RPC reserves for implementations.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternalError  = -32603

	// CodeNeedsSignIn: the caller has no usable credential for the service;
	// data carries needs_sign_in and connect_url.
	CodeNeedsSignIn = -32010
	// CodeUnavailable: the upstream, the OAuth provider, the cipher or the
	// storage failed or timed out; data carries retryable: true.
	CodeUnavailable = -32011
	// CodeApprovalRequired: the policy asked for a human's approval.
	CodeApprovalRequired = -32012
	// CodePolicyDenied: the policy denied a message that is not a tools/call
	// (a denied tools/call is answered with an isError result instead).
	CodePolicyDenied = -32013
	// CodeSessionNotFound: the MCP session is unknown (HTTP 404); the
	// runner should initialize again.
	CodeSessionNotFound = -32001
)

// WriteJSON writes v as a JSON response.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	data, err := marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	if h.Get("Cache-Control") == "" {
		// An API answer is one caller's (sessions, approvals and the
		// results withheld for them, connections): no cache keeps it, a
		// browser's included. What may be cached says so itself.
		h.Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// marshal encodes v as JSON followed by a newline, without escaping &, <
// and > (the answers are never HTML, and URLs such as connect_url stay
// readable and copyable).
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// APIError is the body of every HTTP API error.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteAPIError writes {"error": {"code": …, "message": …}}.
func WriteAPIError(w http.ResponseWriter, status int, code, message string) {
	WriteJSON(w, status, map[string]APIError{"error": {Code: code, Message: message}})
}

// RPCError builds the JSON text of a JSON-RPC error response. id is the JSON
// text of the request id (nil for null); data may be nil.
func RPCError(id []byte, code int, message string, data any) []byte {
	b := make([]byte, 0, 128+len(message))
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	if id == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, id...)
	}
	b = append(b, `,"error":{"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"message":`...)
	b = mcpmsg.AppendQuote(b, message)
	if data != nil {
		d, err := marshal(data)
		if err == nil {
			b = append(b, `,"data":`...)
			b = append(b, bytes.TrimSuffix(d, []byte("\n"))...)
		}
	}
	return append(b, "}}"...)
}

// RPCErrorObject builds the JSON text of a JSON-RPC error object (the
// value of a response's "error"); data may be nil.
func RPCErrorObject(code int, message string, data any) []byte {
	msg := RPCError(nil, code, message, data)
	return msg[len(`{"jsonrpc":"2.0","id":null,"error":`) : len(msg)-1]
}

// RPCResult builds the JSON text of a JSON-RPC result response.
func RPCResult(id []byte, result []byte) []byte {
	b := make([]byte, 0, 40+len(id)+len(result))
	b = appendRPCResultPrefix(b, id)
	b = append(b, result...)
	return append(b, '}')
}

// RPCResultPrefix is the JSON text of a JSON-RPC result response up to
// its result: what RPCResult writes before the result, which is followed
// by '}'. A large result can be written after it without being copied
// into one slice with it.
func RPCResultPrefix(id []byte) []byte {
	return appendRPCResultPrefix(make([]byte, 0, 32+len(id)), id)
}

func appendRPCResultPrefix(b, id []byte) []byte {
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	return append(b, `,"result":`...)
}

// WriteRPC writes a JSON-RPC message as an application/json response: msg,
// or the pieces of msg one after the other.
func WriteRPC(w http.ResponseWriter, status int, msg ...[]byte) {
	n := 0
	for _, p := range msg {
		n += len(p)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(n))
	w.WriteHeader(status)
	for _, p := range msg {
		_, _ = w.Write(p)
	}
}

// AnswerBeforeBody readies a runner's request r to be answered by any step
// before its body is read (a refusal: no credential, another caller's
// session, an MCP session that ended, no room for the body), and returns
// what finishes it once the steps are done with it (nil, which finishes
// nothing, when r has no body). A server that closes a connection with a
// body unread resets it, and a runner still writing its body then gets
// "connection reset by peer", not the 401 that makes it sign in again,
// the 404 that makes it initialize, or the 503 and its Retry-After.
//
// The first step of the runner's route calls it (toolgate_session), before
// anything is written: the answer may then be written while the body is
// unread (net/http's full duplex; HTTP/2 is always so). Full duplex also
// turns off net/http's own guard, which ends the connection after an
// answer written with the body unread or broken (else what the runner
// sends next would be read as its next request, one a proxy in front did
// not send): EarlyAnswer keeps it (see Read and Finish).
func AnswerBeforeBody(w http.ResponseWriter, r *http.Request, max int64) *EarlyAnswer {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	_ = http.NewResponseController(w).EnableFullDuplex()
	// (HTTP/2 and 3 frame bodies in streams: nothing to guard.)
	a := &EarlyAnswer{ReadCloser: r.Body, w: w, max: max, framed: r.ProtoMajor != 1, length: r.ContentLength}
	r.Body = a
	return a
}

// EarlyAnswer is a runner's request body readied by AnswerBeforeBody. It
// notes whether the body was read to its end.
type EarlyAnswer struct {
	io.ReadCloser
	w          http.ResponseWriter
	max        int64
	framed     bool // HTTP/2 or 3
	ended, eof bool // read to an error, which was EOF
	// length is the body's announced length (-1: unknown), read how much
	// of it was read: a body read to its length has ended, though the
	// read that would say EOF was never made (a step reads exactly
	// Content-Length bytes), and its answer is an answer, not a refusal.
	length, read int64
}

func (a *EarlyAnswer) Read(p []byte) (int, error) {
	n, err := a.ReadCloser.Read(p)
	a.read += int64(n)
	if err == nil && !a.ended && a.length >= 0 && a.read >= a.length {
		a.ended, a.eof = true, true
	}
	if err != nil && !a.ended {
		a.ended, a.eof = true, err == io.EOF
		if !a.eof {
			a.CloseAfterAnswer()
		}
	}
	return n, err
}

// CloseAfterAnswer has the answer end its connection when the body was
// not read to its end: a body that broke as it was read (a malformed
// chunk, a runner that paused past read_body_idle), or one a step left
// unread and Caddy answers for (a handler's error). The answer says
// "Connection: close", and net/http closes the connection after it. Only
// before the answer is written.
func (a *EarlyAnswer) CloseAfterAnswer() {
	if a != nil && !a.eof && !a.framed {
		a.w.Header().Set("Connection", "close")
	}
}

// Finish sends the answer when the steps answered without reading the body
// (they refused the request first), and then reads and drops what the
// runner still sends of it, at most max bytes and, sending included, for
// at most refusalDrain, so that a runner still uploading finishes and reads the
// answer, and its connection serves its next request. A body that still
// did not end ends its connection, as net/http ends one: half-closed, and
// closed after rstAvoidance (else the rest of the body would be read as
// the next request). What is dropped is never held: 32 KiB at a time. A
// body read to its end (every call that is not refused) costs nothing
// more.
func (a *EarlyAnswer) Finish() {
	if a == nil || a.ended {
		return
	}
	rc := http.NewResponseController(a.w)
	// The answer's write is bounded too: over HTTP/2 a runner that grants
	// no flow-control window would hold its flush (and the handler) until
	// write_idle. The deadline is lifted once the answer is out: an
	// HTTP/2 stream whose write deadline passes is reset, written to or
	// not.
	deadline := time.Now().Add(refusalDrain)
	_ = rc.SetWriteDeadline(deadline)
	_ = rc.Flush()
	_ = rc.SetWriteDeadline(time.Time{})
	_ = rc.SetReadDeadline(deadline)
	_, _ = io.Copy(io.Discard, io.LimitReader(a, a.max))
	_ = rc.SetReadDeadline(time.Time{})
	if a.eof || a.framed {
		return
	}
	conn, _, err := rc.Hijack()
	if err != nil {
		return
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		time.Sleep(rstAvoidance)
	}
	_ = conn.Close()
}

// rstAvoidance is how long a connection closed with its request's body
// unread stays half-closed first: net/http's own wait (rstAvoidanceDelay).
// Closed with unread bytes, it is reset, and many TCP stacks then drop
// what the runner had not read yet, the answer among it.
const rstAvoidance = 500 * time.Millisecond

// Bodyless reports whether r, a GET of the MCP endpoint (which opens the
// runner's stream), carries no body, and answers 400 when it does: MCP
// gives it none, and a body nothing reads would hold the stream (net/http
// notices a runner that went away only once its request's body was read,
// see AnswerBeforeBody). A body of unknown length that is empty (some
// clients and proxies send an empty chunked body) is read and let
// through. (A DELETE's body is read and dropped after its answer, as a
// refused request's is.)
func Bodyless(w http.ResponseWriter, r *http.Request) bool {
	empty := r.ContentLength == 0
	if r.ContentLength < 0 && r.Body != nil {
		// Its end comes with the head; a body that has not begun after
		// bodylessWait is one (the read's error ends the connection after
		// the answer, see EarlyAnswer.CloseAfterAnswer).
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(bodylessWait))
		var one [1]byte
		_, err := io.ReadFull(r.Body, one[:])
		_ = rc.SetReadDeadline(time.Time{})
		empty = err == io.EOF
	}
	if !empty {
		WriteRPCError(w, http.StatusBadRequest, nil, CodeInvalidRequest,
			"a "+r.Method+" of the MCP endpoint carries no body", nil)
	}
	return empty
}

// bodylessWait bounds how long Bodyless waits for the end of an empty body
// of unknown length.
const bodylessWait = time.Second

// refusalDrain bounds how long EarlyAnswer.Finish reads a refused body.
const refusalDrain = 2 * time.Second

// StorageUnavailableText is what a runner is told when toolgate's storage
// fails: the storage's own words (its host, its user, the keys it was
// asked for) stay in the log.
const StorageUnavailableText = "toolgate's storage is unavailable; retry later"

// RunnerText is err as a runner may read it: a storage failure as
// StorageUnavailableText, anything else as its text.
func RunnerText(err error) string {
	if errors.Is(err, ErrStorageUnavailable) {
		return StorageUnavailableText
	}
	return err.Error()
}

// WriteRPCError writes a JSON-RPC error response with an HTTP status.
func WriteRPCError(w http.ResponseWriter, status int, id []byte, code int, message string, data any) {
	WriteRPC(w, status, RPCError(id, code, message, data))
}

// Retryable is the error data of CodeUnavailable.
var Retryable = map[string]any{"retryable": true}

// ToolError builds a tools/call result that reports a failure to the agent
// (isError: true), with the decision in _meta so it can be traced.
func ToolError(text string, d *Decision) []byte {
	b := make([]byte, 0, 160+len(text))
	b = append(b, `{"content":[{"type":"text","text":`...)
	b = mcpmsg.AppendQuote(b, text)
	b = append(b, `}],"isError":true`...)
	if d != nil {
		b = append(b, `,"_meta":{"toolgate/decision":`...)
		b = AppendDecisionMeta(b, d)
		b = append(b, '}')
	}
	return append(b, '}')
}

// AppendDecisionMeta appends {"id":…,"action":…} for d.
func AppendDecisionMeta(b []byte, d *Decision) []byte {
	b = append(b, `{"id":`...)
	b = mcpmsg.AppendQuote(b, d.ID)
	b = append(b, `,"action":`...)
	b = mcpmsg.AppendQuote(b, d.Action)
	return append(b, '}')
}

// ownCodes are the error codes toolgate answers with itself, whose data
// runners act on (a connect_url to sign in at, an approval_url to open).
var ownCodes = map[int64]bool{CodeNeedsSignIn: true, CodeUnavailable: true, CodeApprovalRequired: true, CodePolicyDenied: true}

// actionMembers are the members of toolgate's own errors' data that
// runners act on (a page to open, a sign-in to start) or that name
// toolgate's own records.
var actionMembers = map[string]bool{"approval_url": true, "approval_id": true, "approval_required": true,
	"decision_id": true, "connect_url": true, "needs_sign_in": true}

// OwnCodeRecoded is an upstream's error object as toolgate relays it. One
// that uses toolgate's own codes becomes code -32603, the upstream's
// message saying so, and none of its data; any other keeps its code and
// message, and its data loses the members toolgate's own errors carry for
// runners to act on (approval_url, connect_url and the like: a protocol
// code such as 2026-07-28's -32021 is the upstream's to use, its approval
// page is not). An upstream must not pose as toolgate asking the runner's
// person to sign in or approve at a page of its choosing. An error that
// needs neither is returned as it is (false).
func OwnCodeRecoded(errObj []byte) ([]byte, bool) {
	code := gjson.GetBytes(errObj, "code")
	message := gjson.GetBytes(errObj, "message")
	if code.Type != gjson.Number || code.Float() != float64(code.Int()) {
		// JSON-RPC codes are integers; lenient decoders read "-32012" as
		// toolgate's own.
		return RPCErrorObject(CodeInternalError, "the upstream answered with an error whose code is not an integer", nil), true
	}
	if ownCodes[code.Int()] {
		text := "(none)"
		if message.Type == gjson.String {
			text = message.Str
		}
		return RPCErrorObject(CodeInternalError, fmt.Sprintf("the upstream answered with error code %d, which is toolgate's own; its message: %s",
			code.Int(), text), nil), true
	}
	data := gjson.GetBytes(errObj, "data")
	if !data.IsObject() {
		return errObj, false
	}
	kept, dropped := []byte{'{'}, false
	data.ForEach(func(k, v gjson.Result) bool {
		if actionMembers[strings.ToLower(k.String())] {
			dropped = true
			return true
		}
		if len(kept) > 1 {
			kept = append(kept, ',')
		}
		kept = append(append(append(kept, k.Raw...), ':'), v.Raw...)
		return true
	})
	if !dropped {
		return errObj, false
	}
	b := append([]byte(`{"code":`), code.Raw...)
	if message.Exists() {
		b = append(append(b, `,"message":`...), message.Raw...)
	}
	b = append(append(b, `,"data":`...), kept...)
	return append(b, "}}"...), true
}

// InEarlyData reports whether r arrived in TLS early data (0-RTT), before
// the handshake that authenticates its connection completed: Caddy's
// HTTP/3 listener accepts it unless the server's allow_0rtt is off. Early
// data has no replay protection: anyone on the path can send a client's
// first flight again, and the requests in it, as often as the ticket
// allows. So toolgate acts on none: its endpoints answer such a request
// 425 Too Early (RFC 8470), which tells the client to send it again once
// the handshake is done (browsers and HTTP/3 clients that send early data
// do). Reads are refused too: a GET of the MCP endpoint takes the
// session's stream, and the sign-in and OAuth callbacks are GETs that act.
func InEarlyData(r *http.Request) bool { return r.TLS != nil && !r.TLS.HandshakeComplete }

// TooEarlyText is what a request refused as early data is told.
const TooEarlyText = "sent in TLS early data (0-RTT), which can be replayed: send it again once the TLS handshake is complete"
