package leasehold

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func openssl(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("openssl", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("openssl %v: %v\n%s", args, err, out)
	}
}

func newCA(t *testing.T, dir, name string) {
	openssl(t, dir, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc", "-days", "30",
		"-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
		"-subj", "/CN="+name, "-keyout", name+"-key.pem", "-out", name+".pem")
}

func newLeaf(t *testing.T, dir, ca, name string, ext ...string) {
	args := []string{"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc", "-days", "30",
		"-addext", "basicConstraints=critical,CA:FALSE", "-addext", "keyUsage=critical,digitalSignature"}
	args = append(args, ext...)
	args = append(args, "-CA", ca+".pem", "-CAkey", ca+"-key.pem", "-subj", "/CN="+name,
		"-keyout", name+"-key.pem", "-out", name+".pem")
	openssl(t, dir, args...)
}

// A node that requires client certificates is reached with one, and each
// TLS mistake is refused at once with what to do, never retried for
// seconds as if the node were down.
func TestClientCertificatesAndEveryTLSMistake(t *testing.T) {
	dir := t.TempDir()
	newCA(t, dir, "ca")
	newCA(t, dir, "strangers")
	newLeaf(t, dir, "ca", "server", "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "extendedKeyUsage=serverAuth")
	newLeaf(t, dir, "ca", "me", "-addext", "extendedKeyUsage=clientAuth")
	newLeaf(t, dir, "strangers", "stranger", "-addext", "extendedKeyUsage=clientAuth")
	f := func(name string) string { return filepath.Join(dir, name) }
	n := &node{t: t, dir: dir}
	n.addr = "127.0.0.1:" + itoa(freePort(t))
	n.args = []string{"--listen", n.addr, "--data-dir", f("data"), "--tls-cert", f("server.pem"),
		"--tls-key", f("server-key.pem"), "--tls-client-ca", f("ca.pem")}
	n.start()
	t.Cleanup(n.kill)
	https := "https://" + n.addr
	ctx := context.Background()
	good := &Options{CAFile: f("ca.pem"), CertFile: f("me.pem"), KeyFile: f("me-key.pem")}
	waitFor(t, "leaseholdd over TLS", 20*time.Second, func() bool {
		c, err := New(https, good)
		if err != nil {
			return false
		}
		defer c.Close()
		l, err := c.TryAcquire(ctx, "tls/ready", LockOptions{})
		if err != nil {
			return false
		}
		return l.Release(ctx) == nil
	})
	mistakes := []struct {
		url  string
		opts *Options
		says string
	}{
		{https, &Options{CAFile: f("ca.pem")}, "requires a client certificate"},
		{https, &Options{CAFile: f("ca.pem"), CertFile: f("stranger.pem"), KeyFile: f("stranger-key.pem")}, "does not accept this client certificate"},
		{https, &Options{CertFile: f("me.pem"), KeyFile: f("me-key.pem")}, "not signed by a CA this client trusts"},
		{"http://" + n.addr, nil, "TLS"},
	}
	for _, m := range mistakes {
		c, err := New(m.url, m.opts)
		if err != nil {
			t.Fatal(err)
		}
		started := time.Now()
		_, err = c.TryAcquire(ctx, "tls/mistake", LockOptions{})
		c.Close()
		if err == nil || !strings.Contains(err.Error(), m.says) {
			t.Fatalf("%s %+v: want %q, got %v", m.url, m.opts, m.says, err)
		}
		if took := time.Since(started); took > 3*time.Second {
			t.Fatalf("%s %+v: refused only after %s", m.url, m.opts, took)
		}
		if m.says == "TLS" && !errors.Is(err, ErrTLSRequired) {
			t.Fatalf("plain HTTP to a TLS port: %v", err)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
