package leasehold

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests run real leaseholdd processes: $LEASEHOLDD, or the workspace's
// target/debug/leaseholdd (cargo build --bin leaseholdd).
func serverBinary(t *testing.T) string {
	if b := os.Getenv("LEASEHOLDD"); b != "" {
		return b
	}
	b, _ := filepath.Abs("../../target/debug/leaseholdd")
	if _, err := os.Stat(b); err != nil {
		t.Fatalf("%s not found: cargo build --bin leaseholdd, or set LEASEHOLDD", b)
	}
	return b
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// node is one leaseholdd process.
type node struct {
	t    *testing.T
	addr string
	args []string
	dir  string
	cmd  *exec.Cmd
	log  *os.File
}

func (n *node) start() {
	n.t.Helper()
	log, err := os.OpenFile(filepath.Join(n.dir, "node.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	n.log = log
	n.cmd = exec.Command(serverBinary(n.t), n.args...)
	n.cmd.Stdout, n.cmd.Stderr = log, log
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) url() string { return "http://" + n.addr }

// kill is kill -9.
func (n *node) kill() {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = n.cmd.Process.Kill()
		_, _ = n.cmd.Process.Wait()
		n.cmd = nil
	}
	if n.log != nil {
		n.log.Close()
		n.log = nil
	}
}

func (n *node) signal(s syscall.Signal) { _ = n.cmd.Process.Signal(s) }

func (n *node) health() map[string]interface{} {
	c := http.Client{Timeout: time.Second}
	r, err := c.Get(n.url() + "/health")
	if err != nil {
		return nil
	}
	defer r.Body.Close()
	var h map[string]interface{}
	_ = json.NewDecoder(r.Body).Decode(&h)
	return h
}

func (n *node) leads() bool { h := n.health(); return h != nil && h["leader"] == true }

func waitFor(t *testing.T, what string, limit time.Duration, ok func() bool) {
	t.Helper()
	until := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(until) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startNode starts a single node and waits until it leads.
func startNode(t *testing.T, extra ...string) *node {
	t.Helper()
	dir := t.TempDir()
	n := &node{t: t, dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	n.args = append([]string{"--listen", n.addr, "--data-dir", filepath.Join(dir, "data")}, extra...)
	n.start()
	t.Cleanup(n.kill)
	waitFor(t, "leaseholdd to lead", 20*time.Second, n.leads)
	return n
}

// cluster is three nodes forming one group.
type cluster struct{ nodes []*node }

func startCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{}
	var peers []string
	for i := 1; i <= 3; i++ {
		n := &node{t: t, dir: t.TempDir(), addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
		c.nodes = append(c.nodes, n)
		peers = append(peers, fmt.Sprintf("%d=%s", i, n.addr))
	}
	for i, n := range c.nodes {
		n.args = []string{"--node-id", fmt.Sprint(i + 1), "--listen", n.addr, "--peers", strings.Join(peers, ","),
			"--data-dir", filepath.Join(n.dir, "data")}
		n.start()
		t.Cleanup(n.kill)
	}
	c.waitLeader(t)
	return c
}

func (c *cluster) leader() int {
	for i, n := range c.nodes {
		if n.cmd != nil && n.leads() {
			return i
		}
	}
	return -1
}

func (c *cluster) waitLeader(t *testing.T) int {
	t.Helper()
	var l int
	waitFor(t, "a leader", 20*time.Second, func() bool { l = c.leader(); return l >= 0 })
	return l
}

// endpoints lists every node, node `first` first.
func (c *cluster) endpoints(first int) string {
	var addrs []string
	for i := range c.nodes {
		addrs = append(addrs, c.nodes[(first+i)%len(c.nodes)].addr)
	}
	return "http://" + strings.Join(addrs, ",")
}

// raw sends a call to the API without the client.
func raw(t *testing.T, method, url string, body interface{}) (int, map[string]interface{}) {
	t.Helper()
	var buf bytes.Buffer
	if body != nil {
		_ = json.NewEncoder(&buf).Encode(body)
	}
	req, _ := http.NewRequest(method, url, &buf)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer r.Body.Close()
	var out map[string]interface{}
	_ = json.NewDecoder(r.Body).Decode(&out)
	return r.StatusCode, out
}
