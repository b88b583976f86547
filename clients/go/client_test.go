package leasehold

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func client(t *testing.T, url string, holder string) *Client {
	t.Helper()
	c, err := New(url, &Options{Holder: holder})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestAContendedKeyNamesItsHolderAndTokensGrow(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	a, b := client(t, n.url(), "a"), client(t, n.url(), "b")
	la, err := a.TryAcquire(ctx, "report", LockOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "report", LockOptions{TTL: 5 * time.Second})
	var e *Error
	if !errors.Is(err, ErrHeld) || !errors.As(err, &e) || e.Details["holder"] != "a" {
		t.Fatalf("want held by a, got %v", err)
	}
	if fence, ok := e.Detail("fence"); !ok || fence != la.Fence() {
		t.Fatalf("the refusal names fence %v, the holder has %d", e.Details["fence"], la.Fence())
	}
	got := make(chan *Lease)
	go func() {
		lb, err := b.Acquire(ctx, "report", LockOptions{TTL: 5 * time.Second, Wait: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- lb
	}()
	time.Sleep(200 * time.Millisecond)
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil || lb.Fence() <= la.Fence() {
		t.Fatalf("the waiter's token %v is not above %d", lb, la.Fence())
	}
	if _, err := la.Token(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a released lease's token: %v", err)
	}
	select {
	case <-la.Done():
	default:
		t.Fatal("Done is not closed after Release")
	}
	if !errors.Is(la.Err(), ErrReleased) {
		t.Fatalf("Err after Release: %v", la.Err())
	}
	_ = lb.Release(ctx)
}

// A lease outlives several TTLs while it renews itself.
func TestALeaseRenewsItselfPastItsTTL(t *testing.T) {
	n := startNode(t)
	c := client(t, n.url(), "renewer")
	l, err := c.TryAcquire(context.Background(), "renewed", LockOptions{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if _, err := l.Token(); err != nil {
		t.Fatalf("lost while renewing: %v", err)
	}
	lock, err := c.Describe(context.Background(), "renewed")
	if err != nil || lock.Holder == nil || lock.Holder.Fence != l.Fence() {
		t.Fatalf("the server no longer has it: %+v %v", lock, err)
	}
	_ = l.Release(context.Background())
}

// Cancelling the ctx of a waiting Acquire withdraws the wait from the
// server's queue and ends the lease made for it.
func TestACancelledWaitLeavesTheQueue(t *testing.T) {
	n := startNode(t)
	a, b := client(t, n.url(), "a"), client(t, n.url(), "b")
	held, err := a.TryAcquire(context.Background(), "q", LockOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := b.Acquire(ctx, "q", LockOptions{TTL: 10 * time.Second, Wait: time.Minute})
		done <- err
	}()
	waitFor(t, "the waiter in the queue", 10*time.Second, func() bool {
		lock, err := a.Describe(context.Background(), "q")
		return err == nil && len(lock.Waiters) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait answered %v", err)
	}
	waitFor(t, "the wait withdrawn", 5*time.Second, func() bool {
		lock, err := a.Describe(context.Background(), "q")
		return err == nil && len(lock.Waiters) == 0
	})
	_, leases := raw(t, "GET", n.url()+"/v1/leases", nil)
	if list := leases["leases"].([]interface{}); len(list) != 1 {
		t.Fatalf("the waiter's lease was left behind: %v", list)
	}
	_ = held.Release(context.Background())
}

// etcd-io/etcd#22082: a retried unlock deleted a newer lock of the key.
// Here a release names its token: one whose lease was lost (revoked) and
// whose key was granted again releases nothing of the new holder's, twice.
func TestAReleaseAfterTheLossNeverTouchesTheNewHolder(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	a, b := client(t, n.url(), "a"), client(t, n.url(), "b")
	la, err := a.TryAcquire(ctx, "k", LockOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	raw(t, "DELETE", fmt.Sprintf("%s/v1/leases/%d", n.url(), la.ID()), nil)
	select {
	case <-la.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked lease was not reported lost")
	}
	lb, err := b.TryAcquire(ctx, "k", LockOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("releasing a lost lease answered %v", err)
	}
	_ = la.Release(ctx)
	lock, _ := b.Describe(ctx, "k")
	if lock.Holder == nil || lock.Holder.Fence != lb.Fence() {
		t.Fatalf("the new holder's lock was touched: %+v", lock)
	}
	if err := a.ReleaseByFence(ctx, "k", la.Fence()); !errors.Is(err, ErrStaleFence) {
		t.Fatalf("a stale fence released: %v", err)
	}
	_ = lb.Release(ctx)
}

// etcd-io/etcd#18082: Lock hung because its clean-up used the client's
// context. Here the clean-up after a cancelled wait is bounded, even with
// the server frozen.
func TestAGivenUpWaitReturnsEvenWithTheServerFrozen(t *testing.T) {
	n := startNode(t)
	a, b := client(t, n.url(), "a"), client(t, n.url(), "b")
	held, err := a.TryAcquire(context.Background(), "frozen", LockOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := b.Acquire(ctx, "frozen", LockOptions{TTL: 30 * time.Second, Wait: time.Minute})
		done <- err
	}()
	waitFor(t, "the waiter in the queue", 10*time.Second, func() bool {
		lock, err := a.Describe(context.Background(), "frozen")
		return err == nil && len(lock.Waiters) == 1
	})
	n.signal(syscall.SIGSTOP)
	defer n.signal(syscall.SIGCONT)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("answered %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Acquire hung in its clean-up")
	}
	n.signal(syscall.SIGCONT)
	_ = held.Release(context.Background())
}

// A revoked lease is lost at once: Done closes, Context is cancelled, Err
// and Token say so.
func TestARevokedLeaseIsLostAtOnce(t *testing.T) {
	n := startNode(t)
	c := client(t, n.url(), "h")
	l, err := c.TryAcquire(context.Background(), "revoked", LockOptions{TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	raw(t, "DELETE", fmt.Sprintf("%s/v1/leases/%d", n.url(), l.ID()), nil)
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not lost")
	}
	if !errors.Is(l.Err(), ErrLeaseLost) {
		t.Fatalf("Err: %v", l.Err())
	}
	if _, err := l.Token(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Token: %v", err)
	}
}

// A hold released by its token elsewhere (`leasehold release KEY --fence
// F`) is lost at the holder's next renewal, though its lease lives on: a
// lone key, and one key of a lock set.
func TestAHoldReleasedByItsTokenElsewhereIsLost(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	holder, operator := client(t, n.url(), "holder"), client(t, n.url(), "operator")
	lone, err := holder.TryAcquire(ctx, "elsewhere/lone", LockOptions{TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	set, err := holder.AcquireSet(ctx, []string{"elsewhere/a", "elsewhere/b"}, LockOptions{TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := operator.ReleaseByFence(ctx, "elsewhere/lone", lone.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := operator.ReleaseByFence(ctx, "elsewhere/b", set.Fence()); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Lease{lone, set} {
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not lost", l.Key())
		}
		if err := l.Err(); !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "released by its token elsewhere") {
			t.Fatalf("%s: Err %v", l.Key(), err)
		}
	}
	if err := lone.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("releasing it after: %v", err)
	}
}

// With the server frozen, the client gives up at sent + TTL - margin:
// before the server could have expired the lease.
func TestTheClientGivesUpBeforeTheServerCould(t *testing.T) {
	n := startNode(t)
	c := client(t, n.url(), "h")
	sent := time.Now()
	l, err := c.TryAcquire(context.Background(), "paused", LockOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n.signal(syscall.SIGSTOP)
	defer n.signal(syscall.SIGCONT)
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not lost while the server was frozen")
	}
	if lost := time.Since(sent); lost >= time.Second+500*time.Millisecond {
		t.Fatalf("lost only after %s: a TTL's end had come", lost)
	}
	if !l.Deadline().Before(sent.Add(time.Second)) {
		t.Fatalf("the deadline %s is not before the TTL's end", l.Deadline())
	}
}

func TestSemaphoresReadersSetsAndCheckpoints(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	c := client(t, n.url(), "h")
	var permits []*Lease
	for i := 0; i < 2; i++ {
		p, err := c.TryAcquire(ctx, "api", LockOptions{Permits: 2, TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		permits = append(permits, p)
	}
	if _, err := c.TryAcquire(ctx, "api", LockOptions{Permits: 2}); !errors.Is(err, ErrHeld) {
		t.Fatalf("a third permit of two: %v", err)
	}
	r1, err := c.TryAcquire(ctx, "catalog", LockOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.TryAcquire(ctx, "catalog", LockOptions{Shared: true})
	if err != nil || r2.Fence() == r1.Fence() {
		t.Fatalf("two readers: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "catalog", LockOptions{}); !errors.Is(err, ErrHeld) {
		t.Fatalf("a writer beside readers: %v", err)
	}
	set, err := c.AcquireSet(ctx, []string{"acct/42", "acct/17"}, LockOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"acct/17", "acct/42"} {
		lock, _ := c.Describe(ctx, k)
		if lock.Holder == nil || lock.Holder.Fence != set.Fence() {
			t.Fatalf("%s is not held by the set: %+v", k, lock)
		}
	}
	if err := set.SaveCheckpoint(ctx, []byte("step 3")); err != nil {
		t.Fatal(err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"acct/17", "acct/42"} {
		if lock, _ := c.Describe(ctx, k); lock.Holder != nil {
			t.Fatalf("%s still held after the set's release", k)
		}
	}
	next, err := c.TryAcquire(ctx, "acct/17", LockOptions{})
	if err != nil || string(next.Checkpoint()) != "step 3" {
		t.Fatalf("the next holder's checkpoint: %q %v", next.Checkpoint(), err)
	}
	for _, l := range append(permits, r1, r2, next) {
		_ = l.Release(ctx)
	}
}

func TestAnElectionIsObservedThroughEveryChange(t *testing.T) {
	n := startNode(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	observer := client(t, n.url(), "watcher").Election("scheduler")
	changes := observer.Observe(ctx)
	next := func() *Leader {
		select {
		case o := <-changes:
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			return o.Leader
		case <-time.After(10 * time.Second):
			t.Fatal("no change within 10 s")
			return nil
		}
	}
	if l := next(); l != nil {
		t.Fatalf("a leader before anyone campaigned: %+v", l)
	}
	a := client(t, n.url(), "a").Election("scheduler")
	lead, err := a.Campaign(ctx, []byte("a:1"), LockOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l := next(); l == nil || string(l.Value) != "a:1" || l.Fence != lead.Fence() {
		t.Fatalf("want a:1, got %+v", l)
	}
	if err := lead.Proclaim(ctx, []byte("a:2")); err != nil {
		t.Fatal(err)
	}
	if l := next(); l == nil || string(l.Value) != "a:2" {
		t.Fatalf("want a:2, got %+v", l)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var leadB *Leadership
	go func() {
		defer wg.Done()
		b := client(t, n.url(), "b").Election("scheduler")
		leadB, err = b.Campaign(ctx, []byte("b:1"), LockOptions{TTL: 5 * time.Second})
	}()
	time.Sleep(200 * time.Millisecond)
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if l := next(); l != nil {
		t.Fatalf("want none between leaders, got %+v", l)
	}
	if l := next(); l == nil || string(l.Value) != "b:1" || l.Fence <= lead.Fence() {
		t.Fatalf("want b:1 with a higher token, got %+v", l)
	}
	if now, err := observer.Leader(ctx); err != nil || now == nil || string(now.Value) != "b:1" {
		t.Fatalf("Leader: %+v %v", now, err)
	}
	_ = leadB.Resign(ctx)
}

func TestEveryCodeHasItsSentinel(t *testing.T) {
	for _, code := range []string{"invalid_argument", "lease_not_found", "lease_expired", "held", "lock_delayed",
		"stale_fence", "wait_timeout", "unauthenticated", "permission_denied", "not_leader", "unavailable",
		"outcome_unknown", "not_found", "method_not_allowed", "not_added", "tls_required", "watch_behind",
		"resource_exhausted", "internal"} {
		err := fromBody(400, map[string]interface{}{"error": map[string]interface{}{"code": code, "message": "m"}})
		matched := 0
		for _, s := range []error{ErrInvalidArgument, ErrLeaseNotFound, ErrLeaseExpired, ErrHeld, ErrLockDelayed,
			ErrStaleFence, ErrWaitTimeout, ErrUnauthenticated, ErrPermissionDenied, ErrNotLeader, ErrUnavailable,
			ErrOutcomeUnknown, ErrNotFound, ErrMethodNotAllowed, ErrNotAdded, ErrTLSRequired, ErrWatchBehind,
			ErrResourceExhausted, ErrInternal} {
			if errors.Is(err, s) {
				matched++
			}
		}
		if matched != 1 {
			t.Errorf("%s matches %d sentinels", code, matched)
		}
	}
}
