// Command cycle is `leasehold bench --workload cycle` from Go: each of
// --clients goroutines takes a free key and releases it, again and again,
// for --seconds, over one Client. Prints one JSON object: the cycles, their
// rate, and the longest a user went between two cycles done (its pause
// through a failover, for bench/failover.py); bench/clients.py reads the
// process's CPU time beside it.
//
//	go run ./bench/cycle --endpoint http://127.0.0.1:7419 --clients 50 --seconds 5
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sync"
	"sync/atomic"
	"time"

	leasehold "github.com/leasehold/leasehold/clients/go"
)

func main() {
	endpoint := flag.String("endpoint", "http://127.0.0.1:7419", "the node")
	clients := flag.Int("clients", 50, "concurrent users")
	seconds := flag.Float64("seconds", 5, "how long")
	keys := flag.Int("keys", 100000, "distinct keys")
	flag.Parse()
	c, err := leasehold.New(*endpoint, &leasehold.Options{Holder: "bench-go"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer c.Close()
	ctx := context.Background()
	o := leasehold.LockOptions{TTL: 30 * time.Second}
	var cycles, failures, longestNs int64
	until := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
	started := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed))
			last := time.Now()
			for time.Now().Before(until) {
				l, err := c.TryAcquire(ctx, fmt.Sprintf("bench/go/%d", r.Intn(*keys)), o)
				if err == nil {
					err = l.Release(ctx)
				}
				if err != nil {
					atomic.AddInt64(&failures, 1)
					continue
				}
				atomic.AddInt64(&cycles, 1)
				gap := int64(time.Since(last))
				last = time.Now()
				for {
					old := atomic.LoadInt64(&longestNs)
					if gap <= old || atomic.CompareAndSwapInt64(&longestNs, old, gap) {
						break
					}
				}
			}
		}(int64(i))
	}
	wg.Wait()
	elapsed := time.Since(started).Seconds()
	_ = json.NewEncoder(os.Stdout).Encode(map[string]interface{}{
		"client": "go", "clients": *clients, "cycles": cycles, "failures": failures,
		"per_second": float64(cycles) / elapsed, "longest_gap_ms": float64(longestNs) / 1e6,
	})
}
