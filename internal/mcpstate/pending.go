package mcpstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"github.com/toolgate/toolgate/internal/seal"
)

// What a session's upstream is waiting for, kept beside its record for
// every replica: the server→client requests the runner has yet to answer,
// and the calls the upstream made tasks of (sealed, since they hold the
// call's arguments).

// pendingKey is where a pending server→client request the runner knows
// by the id whose key is idKey (see mcpmsg.IDKey) waits for its answer.
func pendingKey(ref, idKey string) string {
	return path.Join(sessionsPrefix, ref, "pending", hashText(idKey)[:32])
}

// requestKey is where versions before PendingRequest recorded a pending
// request: its method's text, under the upstream's id (which the runner
// then knew the request by). Such records are still answered, read as
// methods whatever their text; this version writes none there, so that a
// replica of an earlier version, during a rolling upgrade, finds no
// record of this one to misread (it refuses the answer). Reading them can
// go once no replica of those versions is left.
func requestKey(ref, idKey string) string {
	return path.Join(sessionsPrefix, ref, "requests", hashText(idKey)[:32])
}

// PendingRequest is a server→client request relayed to the runner and
// waiting for its answer: the method it asks, and the id the upstream gave
// it, which its answer carries upstream (the runner knows the request by
// an id of toolgate's own).
type PendingRequest struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	// Generation is the upstream session's (Upstream.Generation) the
	// request came from: an answer goes to no other.
	Generation uint64 `json:"generation,omitempty"`
	// Upstream names that upstream session (Upstream.Ref; "" when it has
	// no id, or recorded by an earlier version): a later generation of the
	// same upstream session (a stdio program's bridge keeps its id) still
	// takes the answer.
	Upstream string `json:"upstream,omitempty"`
}

// ServerRequestSent records a server→client request relayed to the runner
// under the id whose key is idKey, so that its answer is recognised on any
// replica. It is stored before the request is relayed; a session that
// ended is ErrNotFound.
func (s *Store) ServerRequestSent(ctx context.Context, ref, idKey string, req PendingRequest) error {
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("recording the server request: %w", err)
	}
	if err := s.storeBelow(ctx, ref, pendingKey(ref, idKey), data); err != nil {
		return fmt.Errorf("recording the server request: %w", err)
	}
	return nil
}

// ServerRequestsPending reports which of the requests the runner knows by
// the ids whose keys are idKeys still wait for their answer, with one
// listing: those whose answer a replica took are not in pending.
func (s *Store) ServerRequestsPending(ctx context.Context, ref string, idKeys []string) (pending map[string]bool, err error) {
	dir := path.Dir(pendingKey(ref, ""))
	names, err := s.storage.List(ctx, dir, false)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("listing the pending server requests: %w", err)
	}
	stored := make(map[string]bool, len(names))
	for _, name := range names {
		stored[path.Base(name)] = true
	}
	pending = make(map[string]bool, len(idKeys))
	for _, k := range idKeys {
		if stored[path.Base(pendingKey(ref, k))] {
			pending[k] = true
		}
	}
	return pending, nil
}

// ServerRequestAnswered returns the pending request the runner's answer
// with id key idKey answers, and forgets the request. ok is false when
// none is pending, or when the session has ended: its requests may
// outlive its record for a while (see ended), and an answer taken would be
// relayed upstream. An answer sent to several replicas at once is taken by
// one: the request is read and deleted under its own storage lock (a
// Delete of a key gone already succeeds, so without it each would relay
// the answer upstream). A request an earlier version recorded (see
// requestKey) has no ID: its answer goes upstream as the runner sent it.
func (s *Store) ServerRequestAnswered(ctx context.Context, ref, idKey string) (req PendingRequest, ok bool, err error) {
	key := pendingKey(ref, idKey)
	data, ok, err := s.takeBelow(ctx, ref, key, "toolgate_mcp_"+ref+"_pending_"+path.Base(key))
	switch {
	case err != nil:
		return PendingRequest{}, false, fmt.Errorf("reading the server request: %w", err)
	case ok:
		if err := json.Unmarshal(data, &req); err != nil {
			return PendingRequest{}, false, fmt.Errorf("reading the server request: %w", err)
		}
		return req, true, nil
	}
	key = requestKey(ref, idKey)
	data, ok, err = s.takeBelow(ctx, ref, key, "toolgate_mcp_"+ref+"_request_"+path.Base(key)) // the earlier versions' lock
	if err != nil {
		return PendingRequest{}, false, fmt.Errorf("reading the server request: %w", err)
	}
	return PendingRequest{Method: string(data)}, ok, nil
}

// takeBelow reads and deletes key, below the session ref, under the key's
// own storage lock (named lock); ok is false when there is nothing to take
// there, or the session has ended.
func (s *Store) takeBelow(ctx context.Context, ref, key, lock string) (data []byte, ok bool, err error) {
	err = s.LockedAs(ctx, lock, func() error {
		found, err := s.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		switch ended, err := s.ended(ctx, ref); {
		case err != nil:
			return err
		case ended:
			_ = s.storage.Delete(ctx, key) // should ended's removal have failed
			return nil
		}
		if err := s.storage.Delete(ctx, key); err != nil {
			return err
		}
		data, ok = found, true
		return nil
	})
	return data, ok, err
}

// taskKey is where the call that created the task id is kept.
func taskKey(ref, id string) string {
	return path.Join(sessionsPrefix, ref, "tasks", hashText(id)[:32])
}

// TaskCall is the call an upstream created a task for.
type TaskCall struct {
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// sealedTask marks a task record sealed under the session keys; a record
// without it is the clear JSON that versions before sealing wrote.
const sealedTask = "sealed:"

// taskAD binds a sealed task record to its session and task id, so that a
// record copied elsewhere in storage does not open there.
func taskAD(ref, id string) []byte {
	return []byte("toolgate mcp task\x00" + ref + "\x00" + id)
}

// TaskCreated records the call that created the task id, so that what the
// task yields is decided as that call's result on any replica. The record
// is sealed with keys (the keys of the session ids: every replica that can
// open the session can read it), as a call's arguments are the runner's
// data and storage is not the place to read them. A session that ended is
// ErrNotFound.
func (s *Store) TaskCreated(ctx context.Context, keys *seal.Keyring, ref, id string, t TaskCall) error {
	data, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("recording the task: %v", err)
	}
	data = append([]byte(sealedTask), keys.Seal(data, taskAD(ref, id))...)
	if err := s.storeBelow(ctx, ref, taskKey(ref, id), data); err != nil {
		return fmt.Errorf("recording the task: %w", err)
	}
	return nil
}

// Task returns the call that created the task id; ok is false when no
// replica recorded it, or when the session has ended: its tasks may
// outlive its record for a while (see ended), and what a task of an ended
// session yields is no call's result. A record that does not open with
// keys (sealed under a secret no longer configured, or not this task's) is
// an error.
func (s *Store) Task(ctx context.Context, keys *seal.Keyring, ref, id string) (t TaskCall, ok bool, err error) {
	data, err := s.storage.Load(ctx, taskKey(ref, id))
	if errors.Is(err, fs.ErrNotExist) {
		return t, false, nil
	}
	if err != nil {
		return t, false, fmt.Errorf("reading the task: %w", err)
	}
	if sealed, ok := bytes.CutPrefix(data, []byte(sealedTask)); ok {
		if data, err = keys.Open(sealed, taskAD(ref, id)); err != nil {
			return t, false, fmt.Errorf("reading the task: %w", err)
		}
	}
	if err := json.Unmarshal(data, &t); err != nil {
		return t, false, fmt.Errorf("reading the task: %v", err)
	}
	// Checked last, so that a record that is not this task's is an error
	// whether or not its session still exists.
	switch ended, err := s.ended(ctx, ref); {
	case err != nil:
		return TaskCall{}, false, fmt.Errorf("reading the task: %w", err)
	case ended:
		return TaskCall{}, false, nil
	}
	return t, true, nil
}

// TaskForgotten removes the task id's call (best effort: ending the
// session removes it too).
func (s *Store) TaskForgotten(ctx context.Context, ref, id string) {
	_ = s.storage.Delete(ctx, taskKey(ref, id))
}
