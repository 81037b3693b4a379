package integration

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// getStreams is a test upstream's open standalone GET streams, by MCP
// session: what push sends is written on the session's stream.
type getStreams struct {
	mu sync.Mutex
	m  map[string]chan string
}

// serve holds r open as session's stream, writing each message pushed to
// it, until the request ends.
func (s *getStreams) serve(w http.ResponseWriter, r *http.Request, session string) {
	c := make(chan string, 16)
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]chan string{}
	}
	s.m[session] = c
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.m[session] == c {
			delete(s.m, session)
		}
		s.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for {
		select {
		case m := <-c:
			fmt.Fprintf(w, "event: message\ndata: %s\n\n", m)
			w.(http.Flusher).Flush()
		case <-r.Context().Done():
			return
		}
	}
}

// push sends msg on session's stream; false when it has none, or it took
// nothing within 2 s.
func (s *getStreams) push(session, msg string) bool {
	s.mu.Lock()
	c := s.m[session]
	s.mu.Unlock()
	return c != nil && send(c, msg)
}

// pushAll sends msg on every open stream; how many took it.
func (s *getStreams) pushAll(msg string) int {
	s.mu.Lock()
	var cs []chan string
	for _, c := range s.m {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	n := 0
	for _, c := range cs {
		if send(c, msg) {
			n++
		}
	}
	return n
}

func send(c chan string, msg string) bool {
	select {
	case c <- msg:
		return true
	case <-time.After(2 * time.Second):
		return false
	}
}

// has reports whether session has a stream open.
func (s *getStreams) has(session string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[session] != nil
}

// count is how many streams are open.
func (s *getStreams) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
