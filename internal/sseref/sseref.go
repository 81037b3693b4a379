// Package sseref is a reference reading of server-sent events, written
// from the WHATWG HTML standard's text (section 9.2.6, "Interpreting an
// event stream") and from nothing else, line by line, for tests: toolgate's
// own SSE reader and writer are checked against it, and integration tests
// read what toolgate sends runners with it, as standard-conforming clients
// (the TypeScript SDK, browsers) do.
package sseref

import "strings"

// Event is one dispatched event.
type Event struct {
	Type, Data, LastEventID string
}

// Stream is what a parser knows at the end of a stream.
type Stream struct {
	Events      []Event
	LastEventID string // the event source's last event ID string at the end
	Retry       string // the last valid retry value (ASCII digits), "" if none
}

// Parse interprets an event stream exactly as the standard describes it.
// The stream is taken as already decoded (valid UTF-8).
func Parse(stream string) Stream {
	// "One leading U+FEFF BYTE ORDER MARK character must be ignored if any
	// are present."
	stream = strings.TrimPrefix(stream, "\uFEFF")
	var out Stream
	var data, eventType, lastIDBuffer string
	for {
		// end-of-line = ( cr lf / cr / lf ); a line without one at the end of
		// the stream is not a line.
		i := strings.IndexAny(stream, "\r\n")
		if i < 0 {
			break // "any pending data must be discarded"
		}
		line := stream[:i]
		if stream[i] == '\r' && i+1 < len(stream) && stream[i+1] == '\n' {
			stream = stream[i+2:]
		} else {
			stream = stream[i+1:]
		}
		switch {
		case line == "": // dispatch the event
			out.LastEventID = lastIDBuffer
			if data == "" {
				data, eventType = "", ""
				continue
			}
			data = strings.TrimSuffix(data, "\n")
			typ := "message"
			if eventType != "" {
				typ = eventType
			}
			out.Events = append(out.Events, Event{Type: typ, Data: data, LastEventID: out.LastEventID})
			data, eventType = "", ""
		case line[0] == ':':
			// a comment: ignore
		default:
			field, value := line, ""
			if i := strings.Index(line, ":"); i >= 0 {
				field, value = line[:i], line[i+1:]
				value = strings.TrimPrefix(value, " ")
			}
			switch field {
			case "event":
				eventType = value
			case "data":
				data += value + "\n"
			case "id":
				if !strings.Contains(value, "\x00") {
					lastIDBuffer = value
				}
			case "retry":
				if value != "" && strings.Trim(value, "0123456789") == "" {
					out.Retry = value
				}
			}
		}
	}
	return out
}
