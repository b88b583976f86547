package leasehold

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Event is a lock event: Kind is "acquired", "released", "expired" or
// "checkpoint" (Data holds the bytes saved). Index and Seq place it in the
// deployment's history, the same on every node.
type Event struct {
	Kind     string
	Key      string
	Fence    uint64
	Lease    uint64
	Holder   string
	Index    uint64
	Seq      uint32
	AtUnixMs uint64
	Data     []byte
}

// Position is where a watch stands: just after the event at Index, Seq.
type Position struct {
	Index uint64
	Seq   uint32
}

// WatchItem is what a watch channel carries: an event, or the error that
// ended the watch (the channel is closed after it).
type WatchItem struct {
	Event *Event
	Err   error
}

// resumeFor is how long a broken watch looks for a node to go on at.
const resumeFor = 30 * time.Second

// Watch streams lock events under prefix from now on, or every one after
// `after` when it is not nil, until ctx is done (the channel is closed
// then). The watch outlives the node it streams from: when its stream
// breaks it goes on at another endpoint after the last event delivered,
// losing and repeating nothing. If no node still has those events, the
// last item's Err is ErrWatchBehind: list again, then watch again.
func (c *Client) Watch(ctx context.Context, prefix string, after *Position) <-chan WatchItem {
	out := make(chan WatchItem, 64)
	go func() {
		defer close(out)
		w := &watching{c: c, prefix: prefix, after: after, out: out}
		w.run(ctx, nil)
	}()
	return out
}

type watching struct {
	c      *Client
	prefix string
	after  *Position
	out    chan<- WatchItem
}

// run keeps a stream open, resuming after the last event; `opened` (if
// set) is told each time a stream opens, before its first event.
func (w *watching) run(ctx context.Context, opened func() error) {
	var brokenSince time.Time
	pause := 50 * time.Millisecond
	for {
		base := w.c.endpoints.get()
		_, err := w.stream(ctx, base, func() error {
			brokenSince, pause = time.Time{}, 50*time.Millisecond
			if opened != nil {
				return opened()
			}
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		var e *Error
		resumable := err == nil || (errors.As(err, &e) && (e.Code == "unavailable" || e.Code == "not_leader" || e.Code == "outcome_unknown") && e.Details["final"] != true)
		if !resumable {
			w.send(ctx, WatchItem{Err: err})
			return
		}
		w.c.endpoints.next(base)
		if brokenSince.IsZero() {
			brokenSince = time.Now()
		} else if time.Since(brokenSince) > resumeFor {
			w.send(ctx, WatchItem{Err: errorf("unavailable", "watch on %q: no node took it for %s: %v", w.prefix, resumeFor, err)})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		if pause < time.Second {
			pause *= 2
		}
	}
}

func (w *watching) send(ctx context.Context, item WatchItem) bool {
	select {
	case w.out <- item:
		return true
	case <-ctx.Done():
		return false
	}
}

// stream opens one stream at base and reads it until it ends; the error
// that ended it, and whether it had opened.
func (w *watching) stream(ctx context.Context, base string, onOpen func() error) (bool, error) {
	q := url.Values{"prefix": {w.prefix}}
	if w.after != nil {
		q.Set("after_index", strconv.FormatUint(w.after.Index, 10))
		q.Set("after_seq", strconv.FormatUint(uint64(w.after.Seq), 10))
	}
	u := base + "/v1/watch?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return false, errorf("invalid_argument", "%s: %v", u, err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if w.c.token != "" {
		req.Header.Set("Authorization", "Bearer "+w.c.token)
	}
	resp, err := w.c.http.Do(req)
	if err != nil {
		return false, w.c.transportError(u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var answer map[string]interface{}
		dec := json.NewDecoder(resp.Body)
		dec.UseNumber()
		if dec.Decode(&answer) != nil {
			return false, errorf("unavailable", "%s: HTTP %d", u, resp.StatusCode)
		}
		return false, fromBody(resp.StatusCode, answer)
	}
	if err := onOpen(); err != nil {
		return true, err
	}
	scanner := bufio.NewScanner(resp.Body)
	// A checkpoint event carries up to 64 KiB, in base64.
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	var kind string
	var data []string
	for scanner.Scan() {
		line := scanner.Text()
		switch {
		case strings.HasPrefix(line, "event:"):
			kind = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(line[len("data:"):], " "))
		case line == "" && kind != "":
			payload := strings.Join(data, "\n")
			k := kind
			kind, data = "", nil
			if k == "error" {
				var answer map[string]interface{}
				dec := json.NewDecoder(strings.NewReader(payload))
				dec.UseNumber()
				if dec.Decode(&answer) != nil {
					return true, errorf("internal", "an error event that is not JSON: %s", payload)
				}
				return true, fromBody(0, answer)
			}
			event, err := parseEvent(k, payload)
			if err != nil {
				return true, err
			}
			if event.Index > 0 {
				w.after = &Position{Index: event.Index, Seq: event.Seq}
			}
			if !w.send(ctx, WatchItem{Event: event}) {
				return true, nil
			}
		}
	}
	if err := scanner.Err(); err != nil && ctx.Err() == nil {
		return true, errorf("unavailable", "%s: the stream broke: %v", u, err)
	}
	return true, errorf("unavailable", "%s: the node closed the stream", u)
}

func parseEvent(kind, payload string) (*Event, error) {
	var raw watchEvent
	if err := json.Unmarshal([]byte(payload), &raw); err != nil {
		return nil, errorf("internal", "a %s event that is not the event expected: %v", kind, err)
	}
	e := &Event{Kind: kind, Key: raw.Key, Fence: raw.Fence, Lease: raw.Lease, Holder: raw.Holder,
		Index: raw.Index, Seq: raw.Seq, AtUnixMs: raw.AtUnixMs}
	if raw.DataBase64 != "" {
		data, err := base64.StdEncoding.DecodeString(raw.DataBase64)
		if err != nil {
			return nil, errorf("internal", "a checkpoint event's data is not base64: %v", err)
		}
		e.Data = data
	}
	return e, nil
}

// String reads as a log line: "acquired jobs/1 fence=7 holder=host-a".
func (e *Event) String() string {
	return fmt.Sprintf("%s %s fence=%d holder=%s", e.Kind, e.Key, e.Fence, e.Holder)
}
