package leasehold

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A watch given every endpoint outlives the follower it streams from: every
// event arrives once, in order, the same list as a watch from the start on
// a node never killed. An observer given the same endpoints sees every
// leader.
func TestAWatchAndAnObserverGoOnAcrossAKillOfTheirNode(t *testing.T) {
	c := startCluster(t)
	leader := c.waitLeader(t)
	follower := (leader + 1) % 3
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watcher := client(t, c.endpoints(follower), "watcher")
	events := watcher.Watch(ctx, "w/", nil)
	leaders := client(t, c.endpoints(follower), "observer").Election("boss").Observe(ctx)
	if o := <-leaders; o.Err != nil || o.Leader != nil {
		t.Fatalf("first observation: %+v", o)
	}
	writer := client(t, c.endpoints(leader), "writer")
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if l, err := writer.TryAcquire(ctx, fmt.Sprintf("w/%d", i), LockOptions{TTL: 5 * time.Second}); err == nil {
				_ = l.Release(ctx)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var seen []*Event
	read := func(n int) {
		for want := len(seen) + n; len(seen) < want; {
			select {
			case item := <-events:
				if item.Err != nil {
					t.Fatal(item.Err)
				}
				seen = append(seen, item.Event)
			case <-time.After(20 * time.Second):
				t.Fatal("the watch stopped")
			}
		}
	}
	campaigner := client(t, c.endpoints(leader), "a").Election("boss")
	lead, err := campaigner.Campaign(ctx, []byte("a"), LockOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	read(20)
	c.nodes[follower].kill()
	_ = lead.Resign(ctx)
	leadB, err := client(t, c.endpoints(leader), "b").Election("boss").Campaign(ctx, []byte("b"), LockOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	read(40)
	close(stop)
	<-wrote
	var values []string
	for len(values) < 3 {
		select {
		case o := <-leaders:
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			if o.Leader == nil {
				values = append(values, "")
			} else {
				values = append(values, string(o.Leader.Value))
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("leaders seen: %q", values)
		}
	}
	if fmt.Sprint(values) != fmt.Sprint([]string{"a", "", "b"}) {
		t.Fatalf("leaders seen: %q", values)
	}
	_ = leadB.Resign(ctx)
	for i := 1; i < len(seen); i++ {
		a, b := seen[i-1], seen[i]
		if b.Index < a.Index || (b.Index == a.Index && b.Seq <= a.Seq) {
			t.Fatalf("out of order or twice at %d: %v then %v", i, a, b)
		}
	}
	reference := client(t, c.nodes[(leader+2)%3].url(), "reference")
	all := reference.Watch(ctx, "w/", &Position{Index: 0, Seq: ^uint32(0)})
	last := seen[len(seen)-1]
	var whole []*Event
	for len(whole) == 0 || whole[len(whole)-1].Index < last.Index ||
		(whole[len(whole)-1].Index == last.Index && whole[len(whole)-1].Seq < last.Seq) {
		select {
		case item := <-all:
			if item.Err != nil {
				t.Fatal(item.Err)
			}
			whole = append(whole, item.Event)
		case <-time.After(10 * time.Second):
			t.Fatal("the history")
		}
	}
	start := -1
	for i, e := range whole {
		if e.Index == seen[0].Index && e.Seq == seen[0].Seq {
			start = i
		}
	}
	if start < 0 || len(whole)-start != len(seen) {
		t.Fatalf("the watch saw %d events, the history has %d from its first", len(seen), len(whole)-start)
	}
	for i, e := range seen {
		w := whole[start+i]
		if e.String() != w.String() || e.Index != w.Index || e.Seq != w.Seq {
			t.Fatalf("event %d: watched %v, the history has %v", i, e, w)
		}
	}
}

// A holder with TTL 2 s keeps its lock through a kill -9 of the leader,
// and the client finds the new leader by itself.
func TestAHolderKeepsItsLockThroughALeaderKill(t *testing.T) {
	c := startCluster(t)
	leader := c.waitLeader(t)
	ctx := context.Background()
	cl := client(t, c.endpoints(0), "holder")
	l, err := cl.TryAcquire(ctx, "kept", LockOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c.nodes[leader].kill()
	time.Sleep(3 * time.Second)
	if _, err := l.Token(); err != nil {
		t.Fatalf("lost through the failover: %v", err)
	}
	other, err := cl.TryAcquire(ctx, "after", LockOptions{TTL: 2 * time.Second})
	if err != nil || other.Fence() <= l.Fence() {
		t.Fatalf("after the failover: %v", err)
	}
	if _, err := cl.TryAcquire(ctx, "kept", LockOptions{}); err == nil {
		t.Fatal("the kept lock was free")
	}
	_ = l.Release(ctx)
	_ = other.Release(ctx)
}
