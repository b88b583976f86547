package leasehold

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// ErrReleased is what Err says of a lease this client released.
var ErrReleased = errors.New("leasehold: the lease was released")

// LockOptions say how to take a lock. The zero value is an exclusive
// lock with a 15 s TTL that does not wait.
type LockOptions struct {
	// TTL is the lease's time to live (10 ms to 24 h; default 15 s). The
	// lease renews itself every TTL/3 while held.
	TTL time.Duration
	// Wait is how long Acquire waits in the key's FIFO queue (at most 1 h;
	// default 30 s). The caller's ctx may end the wait sooner; TryAcquire
	// never waits.
	Wait time.Duration
	// LockDelay keeps the key from anyone for this long after this hold
	// expires (not after a release); at most 60 s.
	LockDelay time.Duration
	// Shared takes the key as one of many readers (a plain lock is its
	// writer).
	Shared bool
	// Permits > 0 takes one of Permits permits of a counting semaphore.
	Permits int
}

func (o LockOptions) ttl() time.Duration {
	if o.TTL <= 0 {
		return 15 * time.Second
	}
	return o.TTL
}

// margin is what the client keeps between its deadline and the server's:
// a tenth of the TTL, at least 20 ms and at most 2 s (docs/api.md).
func margin(ttl time.Duration) time.Duration {
	m := ttl / 10
	if m < 20*time.Millisecond {
		m = 20 * time.Millisecond
	}
	if m > 2*time.Second {
		m = 2 * time.Second
	}
	return m
}

// Lease is a held lock (or reader's hold, semaphore permit, or lock set):
// a lease that renews itself every TTL/3 in a goroutine it owns, and its
// fencing token. Call Token right before each write the lock protects and
// send the token with the write. Done is closed, Context cancelled and
// Token fails the moment the lease is lost (or released).
type Lease struct {
	c          *Client
	key        string
	keys       []string
	id         uint64
	fence      uint64
	checkpoint []byte
	ttl        time.Duration

	mu       sync.Mutex
	deadline time.Time
	err      error
	released bool
	// granted is how many keys the lease was granted (one, or a lock
	// set's; 0 while its acquire waits): a renewal that counts fewer
	// learns that one was released by its token elsewhere.
	granted uint64

	done   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	wg     sync.WaitGroup
}

// Key is the key held (the first, sorted, of a lock set).
func (l *Lease) Key() string { return l.key }

// Keys are the keys of a lock set (nil for one key).
func (l *Lease) Keys() []string { return l.keys }

// ID is the lease's id on the server.
func (l *Lease) ID() uint64 { return l.id }

// Fence is the fencing token of the hold, lost or not; write with Token.
func (l *Lease) Fence() uint64 { return l.fence }

// Checkpoint is what the previous holder saved with the key, if anything.
func (l *Lease) Checkpoint() []byte { return l.checkpoint }

// Deadline is when the lease is lost unless renewed before: the send time
// of the last renewal answered, plus the TTL, less the margin.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed the moment the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Context is cancelled the moment the lease is lost or released: run the
// work it protects under it.
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is held; then why it ended: an error that is
// ErrLeaseLost (with the reason), or ErrReleased.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil && !l.deadline.IsZero() && !time.Now().Before(l.deadline) {
		l.loseLocked("the client-side deadline passed without a renewal")
	}
	return l.err
}

// Token is the fencing token while the lease is held; once it is lost, an
// error that is ErrLeaseLost. It checks the deadline itself, so a process
// resumed after a pause sees the loss before its next write.
func (l *Lease) Token() (uint64, error) {
	if err := l.Err(); err != nil {
		if errors.Is(err, ErrReleased) {
			return 0, &Error{Code: "lease_lost", Message: fmt.Sprintf("lease on %q was released", l.key)}
		}
		return 0, err
	}
	return l.fence, nil
}

func (l *Lease) lose(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.loseLocked(reason)
}

func (l *Lease) loseLocked(reason string) {
	l.endLocked(&Error{Code: "lease_lost", Message: fmt.Sprintf("lease on %q lost: %s", l.key, reason)})
}

// end ends the lease with err, once: Done closes and Context is cancelled.
func (l *Lease) end(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(err)
}

func (l *Lease) endLocked(err error) {
	if l.err != nil {
		return
	}
	l.err = err
	close(l.done)
	l.cancel()
}

func (l *Lease) renewed(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	if d := sent.Add(l.ttl - margin(l.ttl)); d.After(l.deadline) {
		l.deadline = d
	}
}

func (l *Lease) grantedKeys() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.granted
}

// grant records the acquire's answer: the token, and the keys held.
func (l *Lease) grant(a acquired) {
	l.fence = a.Fence
	l.checkpoint = decodeCheckpoint(a.CheckpointBase64)
	l.mu.Lock()
	l.granted = 1
	if len(l.keys) > 0 {
		l.granted = uint64(len(l.keys))
	}
	l.mu.Unlock()
}

// newLease starts renewing lease `id` granted by a request sent at `sent`.
func (c *Client) newLease(key string, keys []string, id uint64, ttl time.Duration, sent time.Time) *Lease {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lease{
		c: c, key: key, keys: keys, id: id, ttl: ttl,
		deadline: sent.Add(ttl - margin(ttl)),
		done:     make(chan struct{}), ctx: ctx, cancel: cancel, stop: make(chan struct{}),
	}
	l.wg.Add(1)
	go l.renew()
	return l
}

// renew renews every TTL/3 from when the last renewal was sent. A renewal
// refused loses the lease at once; one not answered is tried again soon,
// until the deadline, which is waited for on its own: the lease is lost
// the moment it passes, whatever a renewal in flight is doing.
func (l *Lease) renew() {
	defer l.wg.Done()
	every := l.ttl / 3
	next := time.Now().Add(every)
	for {
		deadline := l.Deadline()
		select {
		case <-l.stop:
			return
		case <-time.After(time.Until(deadline)):
			l.lose("the client-side deadline passed without a renewal")
			return
		case <-time.After(time.Until(next)):
		}
		sent := time.Now()
		// A node that took the call and does not answer (cut off from its
		// majority, say) is given up after a sixth of the TTL (at least
		// 200 ms) when there are other nodes to try; with one node there is
		// nowhere else, and a slow answer is still a renewal.
		timeout := time.Until(deadline)
		if l.c.endpoints.several() {
			timeout = l.ttl / 6
			if timeout < 200*time.Millisecond {
				timeout = 200 * time.Millisecond
			}
		}
		if left := time.Until(deadline); left < timeout {
			timeout = left
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		go func() {
			select {
			case <-l.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		var renewed renewed
		err := l.c.do(ctx, call{method: "POST", path: fmt.Sprintf("/v1/leases/%d/keepalive", l.id),
			body: map[string]interface{}{}, timeout: timeout, retryFor: -1}, &renewed)
		cancel()
		switch {
		case err == nil && renewed.KeyCount != nil && *renewed.KeyCount < l.grantedKeys():
			l.lose("the lock was released by its token elsewhere while the lease lived")
			return
		case err == nil:
			if l.c.plant == "deadline-from-reply" {
				// Planted for the conformance suite: counts from the answer.
				sent = time.Now()
			}
			l.renewed(sent)
			next = sent.Add(every)
		case errors.Is(err, ErrLeaseExpired), errors.Is(err, ErrLeaseNotFound),
			errors.Is(err, ErrPermissionDenied), errors.Is(err, ErrUnauthenticated):
			l.lose(fmt.Sprintf("renewal refused: %v", err))
			return
		default:
			// Not answered: again soon, until the deadline.
			next = time.Now().Add(minDuration(100*time.Millisecond, every))
		}
	}
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// stopRenewing stops the renewal goroutine and waits for it.
func (l *Lease) stopRenewing() {
	l.mu.Lock()
	first := !l.released
	l.released = true
	l.mu.Unlock()
	if first {
		close(l.stop)
	}
	l.wg.Wait()
}

// Release ends the hold: it releases the key by its token (never anyone
// else's hold, even after this lease was lost and the key granted again)
// and then ends the lease. Calling it again does nothing. It keeps to the
// caller's ctx, and to 5 s at most whatever ctx allows. It answers an
// error that is ErrLeaseLost if the lease was lost before.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	again := l.released
	l.mu.Unlock()
	if again {
		return nil
	}
	lostBefore := l.Err() != nil
	l.stopRenewing()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var firstErr error
	if l.c.plant == "release-by-name" {
		// Planted for the conformance suite: whoever holds the key now.
		var lock Lock
		if l.c.do(ctx, call{method: "GET", path: "/v1/locks/" + escapeKey(l.key)}, &lock) == nil && lock.Holder != nil {
			l.fence = lock.Holder.Fence
		}
	}
	body := map[string]interface{}{"key": l.key, "fence": l.fence, "request_id": requestID()}
	err := l.c.do(ctx, call{method: "POST", path: "/v1/release", body: body, unknownAgain: true}, nil)
	switch {
	case err == nil, errors.Is(err, ErrStaleFence), errors.Is(err, ErrLeaseExpired), errors.Is(err, ErrLeaseNotFound):
		// Released, or nothing of ours was left to release.
		if err != nil {
			lostBefore = true
		}
	default:
		firstErr = err
	}
	err = l.c.do(ctx, call{method: "DELETE", path: fmt.Sprintf("/v1/leases/%d", l.id), unknownAgain: true}, nil)
	if err != nil && !errors.Is(err, ErrLeaseExpired) && !errors.Is(err, ErrLeaseNotFound) && firstErr == nil {
		firstErr = err
	}
	l.end(ErrReleased)
	if firstErr != nil {
		return firstErr
	}
	if lostBefore {
		return &Error{Code: "lease_lost", Message: fmt.Sprintf("lease on %q was lost before its release", l.key)}
	}
	return nil
}

// SaveCheckpoint saves bytes with the lock for the next holder, fenced by
// this lease's token (at most 64 KiB; empty clears it).
func (l *Lease) SaveCheckpoint(ctx context.Context, data []byte) error {
	fence, err := l.Token()
	if err != nil {
		return err
	}
	body := map[string]interface{}{"key": l.key, "fence": fence, "data_base64": base64.StdEncoding.EncodeToString(data)}
	return l.c.do(ctx, call{method: "POST", path: "/v1/checkpoint", body: body, unknownAgain: true}, nil)
}

func escapeKey(key string) string {
	return (&url.URL{Path: key}).EscapedPath()
}

// TryAcquire takes key if it is free, at once: an error that is ErrHeld
// (or ErrLockDelayed) if not, with who holds it in its details.
func (c *Client) TryAcquire(ctx context.Context, key string, o LockOptions) (*Lease, error) {
	return c.acquire(ctx, key, nil, o, false)
}

// Acquire takes key, waiting up to o.Wait (default 30 s) in the server's
// FIFO queue: no polling. Cancelling ctx while it waits withdraws the wait
// from the queue and ends the lease made for it; an error that is
// ErrWaitTimeout if the wait ends without a grant.
func (c *Client) Acquire(ctx context.Context, key string, o LockOptions) (*Lease, error) {
	return c.acquire(ctx, key, nil, o, true)
}

// TryAcquireSet takes every key of keys if all are free, at once, all or
// none, with one token for the set: an error that is ErrHeld if one is
// held.
func (c *Client) TryAcquireSet(ctx context.Context, keys []string, o LockOptions) (*Lease, error) {
	set := sortedSet(keys)
	if len(set) == 0 {
		return nil, errorf("invalid_argument", "a lock set needs at least one key")
	}
	return c.acquire(ctx, set[0], set, o, false)
}

// AcquireSet takes every key of keys at once, all or none, with one token
// for the set, waiting as Acquire does (the server orders sets, so two
// never wait for each other). Releasing the lease releases them all.
func (c *Client) AcquireSet(ctx context.Context, keys []string, o LockOptions) (*Lease, error) {
	set := sortedSet(keys)
	if len(set) == 0 {
		return nil, errorf("invalid_argument", "a lock set needs at least one key")
	}
	return c.acquire(ctx, set[0], set, o, true)
}

func (c *Client) body(key string, keys []string, o LockOptions) (map[string]interface{}, error) {
	b := map[string]interface{}{"request_id": requestID()}
	if keys != nil {
		b["keys"] = keys
	} else {
		b["key"] = key
	}
	if o.LockDelay > 0 {
		b["lock_delay_ms"] = o.LockDelay.Milliseconds()
	}
	switch {
	case o.Permits > 0 && o.Shared:
		return nil, errorf("invalid_argument", "a hold is shared or one of a semaphore's permits, not both")
	case o.Permits > 0:
		b["mode"], b["permits"] = "permit", o.Permits
	case o.Shared:
		b["mode"] = "shared"
	}
	return b, nil
}

func (c *Client) acquire(ctx context.Context, key string, keys []string, o LockOptions, wait bool) (*Lease, error) {
	ttl := o.ttl()
	body, err := c.body(key, keys, o)
	if err != nil {
		return nil, err
	}
	if !wait {
		// One command: the lease and the lock, or neither.
		body["ttl_ms"], body["holder"] = ttl.Milliseconds(), c.holder
		sent := time.Now()
		var a acquired
		if err := c.do(ctx, call{method: "POST", path: "/v1/acquire", body: body, unknownAgain: true}, &a); err != nil {
			return nil, err
		}
		return c.held(key, keys, a, ttl, sent), nil
	}
	// A wait may outlast the TTL: the lease is granted first and renewed
	// while it waits.
	sent := time.Now()
	var granted granted
	grant := map[string]interface{}{"ttl_ms": ttl.Milliseconds(), "holder": c.holder, "request_id": requestID()}
	if err := c.do(ctx, call{method: "POST", path: "/v1/leases", body: grant, unknownAgain: true}, &granted); err != nil {
		return nil, err
	}
	l := c.newLease(key, keys, granted.Lease, ttl, sent)
	waitFor := o.Wait
	if waitFor <= 0 {
		waitFor = 30 * time.Second
	}
	until := time.Now().Add(waitFor)
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	body["lease"] = granted.Lease
	var a acquired
	for {
		left := time.Until(until)
		if left < time.Millisecond {
			left = time.Millisecond
		}
		body["wait_ms"] = left.Milliseconds() + 1
		err = c.do(ctx, call{method: "POST", path: "/v1/acquire", body: body, timeout: left + c.timeout, unknownAgain: true}, &a)
		// The wait's call broke (a restart, a leader change): the same
		// request re-attaches to its place in the queue until the wait's end.
		if errors.Is(err, ErrOutcomeUnknown) && ctx.Err() == nil && time.Now().Before(until) {
			continue
		}
		break
	}
	if err == nil {
		if lost := l.Err(); lost != nil {
			err = lost
		}
	}
	if err != nil {
		// Given up (a timeout, an error, ctx cancelled): the wait is
		// withdrawn with its connection, and the lease made for it ends.
		// Not on the caller's cancelled ctx, nor one without end: at most
		// 2 s (etcd's Mutex.Lock could hang on the client's context here).
		l.stopRenewing()
		cleanup, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = c.do(cleanup, call{method: "DELETE", path: fmt.Sprintf("/v1/leases/%d", l.id), retryFor: time.Second}, nil)
		cancel()
		l.end(ErrReleased)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	l.grant(a)
	return l, nil
}

// held is the lease an immediate acquire made.
func (c *Client) held(key string, keys []string, a acquired, ttl time.Duration, sent time.Time) *Lease {
	l := c.newLease(key, keys, a.Lease, ttl, sent)
	l.grant(a)
	return l
}

func decodeCheckpoint(b64 string) []byte {
	if b64 == "" {
		return nil
	}
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil
	}
	return data
}

func sortedSet(keys []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// ReleaseByFence releases key if fence still holds it; never anyone
// else's hold (an error that is ErrStaleFence then).
func (c *Client) ReleaseByFence(ctx context.Context, key string, fence uint64) error {
	body := map[string]interface{}{"key": key, "fence": fence, "request_id": requestID()}
	return c.do(ctx, call{method: "POST", path: "/v1/release", body: body, unknownAgain: true}, nil)
}

// Holder is one hold of a key, as the server describes it.
type Holder struct {
	Lease     uint64 `json:"lease"`
	Holder    string `json:"holder"`
	Fence     uint64 `json:"fence"`
	TTLLeftMs uint64 `json:"ttl_left_ms"`
	Mode      string `json:"mode"`
}

// Waiter is one wait in a key's queue.
type Waiter struct {
	Lease      uint64 `json:"lease"`
	Holder     string `json:"holder"`
	WaitLeftMs uint64 `json:"wait_left_ms"`
	Mode       string `json:"mode"`
}

// Lock is a key as the server describes it.
type Lock struct {
	Key              string   `json:"key"`
	Holder           *Holder  `json:"holder"`
	Holders          []Holder `json:"holders"`
	Permits          int      `json:"permits"`
	Waiters          []Waiter `json:"waiters"`
	HasCheckpoint    bool     `json:"has_checkpoint"`
	DelayLeftMs      uint64   `json:"delay_left_ms"`
	CheckpointBase64 string   `json:"checkpoint_base64,omitempty"`
	CheckpointFence  uint64   `json:"checkpoint_fence,omitempty"`
}

// Describe is the key as the server sees it; a free key is no error.
func (c *Client) Describe(ctx context.Context, key string) (*Lock, error) {
	var lock Lock
	if err := c.do(ctx, call{method: "GET", path: "/v1/locks/" + escapeKey(key)}, &lock); err != nil {
		return nil, err
	}
	return &lock, nil
}

// Locks lists the keys under prefix (the first page of up to 10,000);
// heldOnly leaves out keys nobody holds or waits for.
func (c *Client) Locks(ctx context.Context, prefix string, heldOnly bool) ([]Lock, error) {
	var page struct {
		Locks []Lock `json:"locks"`
	}
	q := url.Values{"prefix": {prefix}, "held": {strconv.FormatBool(heldOnly)}}
	if err := c.do(ctx, call{method: "GET", path: "/v1/locks", query: q}, &page); err != nil {
		return nil, err
	}
	return page.Locks, nil
}
