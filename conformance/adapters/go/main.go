// The Go client's conformance adapter: commands as JSON lines on stdin,
// answers as JSON lines on stdout (conformance/README.md), each command
// run at once in its own goroutine, so a waiting acquire never holds up
// the next command. Connects to LEASEHOLD_ENDPOINT as LEASEHOLD_HOLDER;
// LEASEHOLD_PLANTED_BUG plants a bug in the client.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	leasehold "github.com/leasehold/leasehold/clients/go"
)

type command struct {
	ID   uint64                 `json:"id"`
	Op   string                 `json:"op"`
	Args map[string]interface{} `json:"args"`
	As   string                 `json:"as"`
}

type failure map[string]interface{}

func (f failure) Error() string { return fmt.Sprint(f["message"]) }

func fail(code, format string, args ...interface{}) failure {
	return failure{"code": code, "message": fmt.Sprintf(format, args...), "details": map[string]interface{}{}}
}

// coded is the client's error as the suite names it: the code its type stands for.
func coded(err error) failure {
	var f failure
	if errors.As(err, &f) {
		return f
	}
	var e *leasehold.Error
	if errors.As(err, &e) {
		details := e.Details
		if details == nil {
			details = map[string]interface{}{}
		}
		return failure{"code": e.Code, "message": e.Error(), "details": details}
	}
	if errors.Is(err, context.Canceled) {
		return fail("cancelled", "the wait was given up")
	}
	return fail("other", "%v", err)
}

type adapter struct {
	c           *leasehold.Client
	mu          sync.Mutex
	leases      map[string]*leasehold.Lease
	leaderships map[string]*leasehold.Leadership
	waits       map[string]context.CancelFunc
	streams     map[string]chan interface{}
}

func num(args map[string]interface{}, name string) uint64 {
	if v, ok := args[name].(float64); ok {
		return uint64(v)
	}
	return 0
}

func str(args map[string]interface{}, name string) string {
	s, _ := args[name].(string)
	return s
}

func ms(args map[string]interface{}, name string, dflt uint64) time.Duration {
	if v := num(args, name); v > 0 {
		return time.Duration(v) * time.Millisecond
	}
	return time.Duration(dflt) * time.Millisecond
}

func nowMs() uint64 { return uint64(time.Now().UnixNano() / int64(time.Millisecond)) }

func (a *adapter) lease(h string) (*leasehold.Lease, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.leases[h]; ok {
		return l, nil
	}
	return nil, fail("adapter", "no lease %q", h)
}

func (a *adapter) leadership(h string) (*leasehold.Leadership, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.leaderships[h]; ok {
		return l, nil
	}
	return nil, fail("adapter", "no leadership %q", h)
}

func (a *adapter) stream(h string, ch chan interface{}) {
	a.mu.Lock()
	a.streams[h] = ch
	a.mu.Unlock()
}

// next is a stream's next item within within_ms.
func (a *adapter) next(args map[string]interface{}) (interface{}, error) {
	a.mu.Lock()
	ch, ok := a.streams[str(args, "handle")]
	a.mu.Unlock()
	if !ok {
		return nil, fail("adapter", "no stream %q", str(args, "handle"))
	}
	select {
	case item, open := <-ch:
		if !open {
			return nil, fail("adapter", "the stream ended")
		}
		if err, isErr := item.(error); isErr {
			return nil, coded(err)
		}
		return item, nil
	case <-time.After(ms(args, "within_ms", 10000)):
		return nil, fail("no_change", "nothing in time")
	}
}

func (a *adapter) acquire(args map[string]interface{}, handle string) (interface{}, error) {
	o := leasehold.LockOptions{
		TTL:       ms(args, "ttl_ms", 15000),
		Wait:      ms(args, "wait_ms", 0),
		LockDelay: ms(args, "lock_delay_ms", 0),
		Shared:    str(args, "mode") == "shared",
		Permits:   int(num(args, "permits")),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.mu.Lock()
	a.waits[handle] = cancel
	a.mu.Unlock()
	var keys []string
	if list, ok := args["keys"].([]interface{}); ok {
		for _, k := range list {
			keys = append(keys, fmt.Sprint(k))
		}
	}
	var l *leasehold.Lease
	var err error
	switch {
	case keys != nil && o.Wait > 0:
		l, err = a.c.AcquireSet(ctx, keys, o)
	case keys != nil:
		l, err = a.c.TryAcquireSet(ctx, keys, o)
	case o.Wait > 0:
		l, err = a.c.Acquire(ctx, str(args, "key"), o)
	default:
		l, err = a.c.TryAcquire(ctx, str(args, "key"), o)
	}
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	a.leases[handle] = l
	a.mu.Unlock()
	answer := map[string]interface{}{"fence": l.Fence(), "lease": l.ID()}
	if cp := l.Checkpoint(); cp != nil {
		answer["checkpoint"] = string(cp)
		answer["checkpoint_base64"] = base64.StdEncoding.EncodeToString(cp)
	}
	return answer, nil
}

func (a *adapter) command(cmd command) (interface{}, error) {
	ctx := context.Background()
	args := cmd.Args
	switch cmd.Op {
	case "acquire":
		return a.acquire(args, cmd.As)
	case "cancel":
		a.mu.Lock()
		cancel := a.waits[str(args, "handle")]
		a.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		return map[string]interface{}{}, nil
	case "token":
		l, err := a.lease(str(args, "handle"))
		if err != nil {
			return nil, err
		}
		at := nowMs()
		fence, err := l.Token()
		if err != nil {
			return map[string]interface{}{"live": false, "reason": err.Error(), "at_ms": at}, nil
		}
		return map[string]interface{}{"live": true, "fence": fence, "at_ms": at}, nil
	case "wait_lost":
		l, err := a.lease(str(args, "handle"))
		if err != nil {
			return nil, err
		}
		select {
		case <-l.Done():
			return map[string]interface{}{"lost": true, "reason": fmt.Sprint(l.Err())}, nil
		case <-time.After(ms(args, "within_ms", 10000)):
			return map[string]interface{}{"lost": false}, nil
		}
	case "release":
		l, err := a.lease(str(args, "handle"))
		if err != nil {
			return nil, err
		}
		return map[string]interface{}{}, l.Release(ctx)
	case "save_checkpoint":
		l, err := a.lease(str(args, "handle"))
		if err != nil {
			return nil, err
		}
		return map[string]interface{}{}, l.SaveCheckpoint(ctx, []byte(str(args, "data")))
	case "release_by_fence":
		return map[string]interface{}{}, a.c.ReleaseByFence(ctx, str(args, "key"), num(args, "fence"))
	case "campaign":
		lead, err := a.c.Election(str(args, "election")).Campaign(ctx, []byte(str(args, "value")),
			leasehold.LockOptions{TTL: ms(args, "ttl_ms", 15000)})
		if err != nil {
			return nil, err
		}
		a.mu.Lock()
		a.leaderships[cmd.As] = lead
		a.mu.Unlock()
		return map[string]interface{}{"fence": lead.Fence()}, nil
	case "proclaim":
		lead, err := a.leadership(str(args, "handle"))
		if err != nil {
			return nil, err
		}
		return map[string]interface{}{}, lead.Proclaim(ctx, []byte(str(args, "value")))
	case "resign":
		lead, err := a.leadership(str(args, "handle"))
		if err != nil {
			return nil, err
		}
		return map[string]interface{}{}, lead.Resign(ctx)
	case "observe":
		ch := make(chan interface{}, 1024)
		a.stream(cmd.As, ch)
		go func() {
			for o := range a.c.Election(str(args, "election")).Observe(ctx) {
				switch {
				case o.Err != nil:
					ch <- o.Err
				case o.Leader == nil:
					ch <- nil
				default:
					ch <- map[string]interface{}{"value": string(o.Leader.Value), "fence": o.Leader.Fence, "holder": o.Leader.Holder}
				}
			}
		}()
		return map[string]interface{}{}, nil
	case "next_leader":
		item, err := a.next(args)
		if err != nil {
			return nil, err
		}
		return map[string]interface{}{"leader": item}, nil
	case "watch":
		ch := make(chan interface{}, 4096)
		a.stream(cmd.As, ch)
		go func() {
			for item := range a.c.Watch(ctx, str(args, "prefix"), nil) {
				if item.Err != nil {
					ch <- item.Err
					continue
				}
				e := item.Event
				ch <- map[string]interface{}{"kind": e.Kind, "key": e.Key, "fence": e.Fence, "index": e.Index, "seq": e.Seq}
			}
		}()
		return map[string]interface{}{}, nil
	case "next_events":
		var events []interface{}
		for i := uint64(0); i < num(args, "count"); i++ {
			item, err := a.next(args)
			if err != nil {
				return nil, err
			}
			events = append(events, item)
		}
		return map[string]interface{}{"events": events}, nil
	case "churn":
		for i := uint64(0); i < num(args, "count"); i++ {
			l, err := a.c.TryAcquire(ctx, fmt.Sprintf("%s%d", str(args, "prefix"), i), leasehold.LockOptions{TTL: ms(args, "ttl_ms", 5000)})
			if err != nil {
				return nil, err
			}
			if err := l.Release(ctx); err != nil {
				return nil, err
			}
		}
		return map[string]interface{}{}, nil
	}
	return nil, fail("adapter", "no op %q", cmd.Op)
}

func main() {
	c, err := leasehold.FromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	a := &adapter{c: c, leases: map[string]*leasehold.Lease{}, leaderships: map[string]*leasehold.Leadership{},
		waits: map[string]context.CancelFunc{}, streams: map[string]chan interface{}{}}
	var out sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var cmd command
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			fmt.Fprintln(os.Stderr, "not JSON:", in.Text())
			continue
		}
		go func(cmd command) {
			ok, err := a.command(cmd)
			line := map[string]interface{}{"id": cmd.ID}
			if err != nil {
				line["error"] = coded(err)
			} else {
				line["ok"] = ok
			}
			out.Lock()
			_ = enc.Encode(line)
			out.Unlock()
		}(cmd)
	}
}
