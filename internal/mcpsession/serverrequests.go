package mcpsession

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/internal/mcpstate"
)

// The upstream's server→client requests relayed to the runner: the ids the
// runner knows them by, and those still waiting for the runner's answer
// (bounded per session, and shared with the other replicas, so that an
// answer through any of them finds its request).

// MaxPendingServerRequests bounds the server→client requests of one MCP
// session waiting for the runner's answer (on this replica).
const MaxPendingServerRequests = 256

// ServerRequestPrefix starts the id the runner knows an upstream's
// server→client request by (see ServerRequestID).
const ServerRequestPrefix = "toolgate-request:"

// ServerRequestID is the id under which the runner gets a server→client
// request whose own id is upstreamID, asked by the upstream session of the
// generation gen (the one whose exchange carried it, which another call
// may have replaced since): ServerRequestPrefix and 128 bits of an HMAC of
// the generation and the id's value under the session's ref. The upstream's id is text no policy
// reads, so it never reaches the runner; this one says nothing of it. The
// ref is sealed in the Mcp-Session-Id, so the runner cannot compute it
// either. It is the same on every replica and for every spelling of the
// id: a request replayed on a resumed stream, and the upstream's
// cancellation of it, name it alike. A re-initialized upstream, whose ids
// start again, names another request by an id of the one it replaced: the
// runner knows the two apart.
func (s *Session) ServerRequestID(gen uint64, upstreamID []byte) []byte {
	mac := hmac.New(sha256.New, []byte(s.Ref))
	mac.Write(binary.BigEndian.AppendUint64(nil, gen))
	mac.Write([]byte(mcpmsg.IDKey(upstreamID)))
	return mcpmsg.Quote(ServerRequestPrefix + hex.EncodeToString(mac.Sum(nil)[:16]))
}

// relayedRequest is a server→client request relayed here, waiting for the
// runner's answer.
type relayedRequest struct {
	mcpstate.PendingRequest
	// stored is when its record was written (zero while it is being
	// written): forgetAnsweredElsewhere forgets only what was stored before
	// it listed the storage.
	stored time.Time
}

// pendingRequest records a server→client request relayed to the runner
// here; false when the session has too many pending already (unless
// force).
func (s *Session) pendingRequest(key string, req mcpstate.PendingRequest, force bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serverRequests == nil {
		s.serverRequests = make(map[string]relayedRequest)
	}
	if _, dup := s.serverRequests[key]; !dup && !force && len(s.serverRequests) >= MaxPendingServerRequests {
		return false
	}
	r := relayedRequest{PendingRequest: req}
	if s.local {
		r.stored = now()
	}
	s.serverRequests[key] = r
	return true
}

// storedRequest marks the request as stored in the storage.
func (s *Session) storedRequest(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.serverRequests[key]; ok {
		r.stored = now()
		s.serverRequests[key] = r
	}
}

func (s *Session) answeredRequest(key string) {
	s.mu.Lock()
	delete(s.serverRequests, key)
	s.mu.Unlock()
}

// forgetAnsweredElsewhere forgets the requests relayed here whose answer
// another replica took, which only that replica knows: they would hold
// places of MaxPendingServerRequests for as long as the session lives. A
// request whose record was not written before the storage was listed is
// kept. It asks the storage at most once per pendingRecount, and reports
// whether it did.
func (s *Session) forgetAnsweredElsewhere(ctx context.Context) bool {
	s.mu.Lock()
	listed := now()
	if listed.Sub(s.pendingCounted) < pendingRecount {
		s.mu.Unlock()
		return false
	}
	s.pendingCounted = listed
	keys := make([]string, 0, len(s.serverRequests))
	for key := range s.serverRequests {
		keys = append(keys, key)
	}
	s.mu.Unlock()
	pending, err := s.m.state().ServerRequestsPending(ctx, s.Ref, keys)
	if err != nil {
		s.m.logger().Warn("cannot read the pending server requests in storage", zap.String("service", s.Service), zap.Error(err))
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, key := range keys {
		if r, ok := s.serverRequests[key]; ok && !pending[key] && !r.stored.IsZero() && r.stored.Before(listed) {
			delete(s.serverRequests, key)
		}
	}
	return true
}

// pendingRecount is how often a session whose pending server requests
// reached their bound asks the storage which of them are still pending.
const pendingRecount = time.Second

// ServerRequestSent records a server→client request of the upstream
// session from relayed to the runner under the id id (see
// ServerRequestID), in the shared storage, so that the runner's answer is
// attributed to its method, and goes upstream under upstreamID into the
// session that asked, on whichever replica it arrives. It reports false, recording
// nothing, when the session has too many pending already or the storage
// is unavailable; the request must then be refused rather than relayed.
func (s *Session) ServerRequestSent(ctx context.Context, from Upstream, id, upstreamID []byte, method string) bool {
	req := mcpstate.PendingRequest{Method: method, ID: bytes.Clone(upstreamID), Generation: from.Generation, Upstream: from.Ref()}
	return s.serverRequestSent(ctx, id, req, false)
}

// ServerRequestWaitsAgain records again a request whose answer the runner
// sent (ServerRequestAnswered) and is told to send again, as the answer
// never reached the upstream: the request had its place, which it keeps
// whatever came meanwhile. It reports false when the storage is
// unavailable.
func (s *Session) ServerRequestWaitsAgain(ctx context.Context, id []byte, req mcpstate.PendingRequest) bool {
	return s.serverRequestSent(ctx, id, req, true)
}

func (s *Session) serverRequestSent(ctx context.Context, id []byte, req mcpstate.PendingRequest, force bool) bool {
	key := mcpmsg.IDKey(id)
	if !s.pendingRequest(key, req, force) && (s.local || !s.forgetAnsweredElsewhere(ctx) || !s.pendingRequest(key, req, force)) {
		return false
	}
	if s.local {
		return true
	}
	if err := s.m.state().ServerRequestSent(ctx, s.Ref, key, req); err != nil {
		s.answeredRequest(key)
		s.m.logger().Warn("cannot record a server request in storage", zap.String("service", s.Service), zap.Error(err))
		return false
	}
	s.storedRequest(key)
	return true
}

// ServerRequestAnswered returns the pending server→client request that id
// (however the runner spelled it) answers, and forgets it, whichever
// replica relayed the request: its method, and the id its answer carries
// upstream. ok is false when no such request is pending; err, when the
// storage cannot tell.
func (s *Session) ServerRequestAnswered(ctx context.Context, id []byte) (req mcpstate.PendingRequest, ok bool, err error) {
	key := mcpmsg.IDKey(id)
	if s.local {
		s.mu.Lock()
		defer s.mu.Unlock()
		r, ok := s.serverRequests[key]
		delete(s.serverRequests, key)
		return r.PendingRequest, ok, nil
	}
	req, ok, err = s.m.state().ServerRequestAnswered(ctx, s.Ref, key)
	if err != nil {
		return mcpstate.PendingRequest{}, false, fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
	}
	if ok && req.ID == nil {
		req.ID = bytes.Clone(id) // recorded by an earlier version, under the upstream's id
	}
	s.answeredRequest(key)
	return req, ok, nil
}
