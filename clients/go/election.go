package leasehold

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"time"
)

// Election is a leader election on a key: candidates wait in its FIFO
// queue, the one holding it leads for as long as its lease lives, and its
// fencing token is the leadership's term. The leader's value is the key's
// checkpoint, saved under the leader's own token, so an observer never
// takes the previous leader's value for the new one's.
type Election struct {
	c    *Client
	name string
}

// Leader is who leads an election: the value it proclaimed, its token and
// its holder name.
type Leader struct {
	Value  []byte
	Fence  uint64
	Holder string
}

// Leadership is this process leading: the lease on the election's key.
// Work as the leader under its Context, with its Token.
type Leadership struct {
	*Lease
}

// Election is the election name.
func (c *Client) Election(name string) *Election { return &Election{c: c, name: name} }

// Name is the election's key.
func (e *Election) Name() string { return e.name }

// Campaign waits in line until this candidate leads (however long it takes,
// until ctx is done), then proclaims value. If the proclaim fails, the key
// is released and the error returned: observers never see a leader
// without a value.
func (e *Election) Campaign(ctx context.Context, value []byte, o LockOptions) (*Leadership, error) {
	if o.Wait <= 0 {
		o.Wait = time.Hour
	}
	for {
		lease, err := e.c.Acquire(ctx, e.name, o)
		if errors.Is(err, ErrWaitTimeout) && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := lease.SaveCheckpoint(ctx, value); err != nil {
			_ = lease.Release(context.Background())
			return nil, err
		}
		return &Leadership{lease}, nil
	}
}

// Proclaim changes the value observers see, without a new election.
func (l *Leadership) Proclaim(ctx context.Context, value []byte) error {
	return l.SaveCheckpoint(ctx, value)
}

// Resign steps down: the next candidate in line leads.
func (l *Leadership) Resign(ctx context.Context) error { return l.Release(ctx) }

// Leader is who leads now, or nil if nobody does (or has proclaimed).
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	lock, err := e.c.Describe(ctx, e.name)
	if err != nil {
		return nil, err
	}
	return leaderOf(lock), nil
}

func leaderOf(lock *Lock) *Leader {
	if lock.Holder == nil || lock.CheckpointBase64 == "" || lock.CheckpointFence != lock.Holder.Fence {
		return nil
	}
	value, err := base64.StdEncoding.DecodeString(lock.CheckpointBase64)
	if err != nil {
		return nil
	}
	return &Leader{Value: value, Fence: lock.Holder.Fence, Holder: lock.Holder.Holder}
}

// Observation is what Observe's channel carries: the leader (nil when
// nobody leads), or the error that ended the observation (the channel is
// closed after it).
type Observation struct {
	Leader *Leader
	Err    error
}

// Observe sends the leader now, then every change: a leader that
// proclaims (a new one, or a new value), and nil when the leader goes,
// until ctx is done (the channel is closed then). It outlives the node it
// streams from (the watch goes on elsewhere, missing nothing); should
// events be lost all the same, it reads the election again and sends the
// leader then, if it changed.
func (e *Election) Observe(ctx context.Context) <-chan Observation {
	out := make(chan Observation, 16)
	go func() {
		defer close(out)
		var o observing
		send := func(x Observation) bool {
			select {
			case out <- x:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for ctx.Err() == nil {
			events := make(chan WatchItem, 64)
			w := &watching{c: e.c, prefix: e.name, out: events}
			opened := func() error {
				// A stream opened: read the state now, so no change
				// falls between (first, and after events were lost).
				if o.read && !o.stale {
					return nil
				}
				lock, err := e.c.Describe(ctx, e.name)
				if err != nil {
					return err
				}
				if change, ok := o.readState(lock); ok {
					send(Observation{Leader: change})
				}
				return nil
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer close(events)
				w.run(ctx, opened)
			}()
			behind := false
			for item := range events {
				if item.Err != nil {
					if errors.Is(item.Err, ErrWatchBehind) {
						behind = true
						continue
					}
					send(Observation{Err: item.Err})
					<-done
					return
				}
				if change, ok := o.event(e.name, item.Event); ok {
					if !send(Observation{Leader: change}) {
						break
					}
				}
			}
			<-done
			if !behind {
				return
			}
			o.stale = true
		}
	}()
	return out
}

// observing follows one election's key. Tokens only grow, so an event
// older than what is known (from before the state was read) changes
// nothing.
type observing struct {
	read   bool
	stale  bool
	holder uint64 // 0: nobody
	last   *Leader
}

func (o *observing) readState(lock *Lock) (*Leader, bool) {
	first := !o.read
	o.read, o.stale = true, false
	o.holder = 0
	if lock.Holder != nil {
		o.holder = lock.Holder.Fence
	}
	leader := leaderOf(lock)
	if !first && sameLeader(leader, o.last) {
		return nil, false
	}
	o.last = leader
	return leader, true
}

func (o *observing) event(name string, e *Event) (*Leader, bool) {
	if e.Key != name || !o.read {
		return nil, false
	}
	var change *Leader
	switch {
	case e.Kind == "acquired" && (o.holder == 0 || e.Fence > o.holder):
		o.holder = e.Fence
	case (e.Kind == "released" || e.Kind == "expired") && e.Fence == o.holder:
		o.holder = 0
	case e.Kind == "checkpoint" && e.Fence == o.holder && len(e.Data) > 0:
		change = &Leader{Value: e.Data, Fence: e.Fence, Holder: e.Holder}
	default:
		return nil, false
	}
	if sameLeader(change, o.last) {
		return nil, false
	}
	o.last = change
	return change, true
}

func sameLeader(a, b *Leader) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Fence == b.Fence && bytes.Equal(a.Value, b.Value) && a.Holder == b.Holder
}
