// Package leasehold is the Go client of Leasehold: distributed locks that
// are a lease plus a fencing token, over leaseholdd's HTTP/JSON API.
//
//	c, err := leasehold.New("http://10.0.0.1:7419,10.0.0.2:7419,10.0.0.3:7419", nil)
//	lease, err := c.Acquire(ctx, "nightly-report", leasehold.LockOptions{TTL: 30 * time.Second})
//	if err != nil { ... }
//	defer lease.Release(context.Background())
//	for _, batch := range batches {
//		fence, err := lease.Token() // fails once the lease is lost
//		if err != nil { return err }
//		write(batch, fence) // the resource refuses lower tokens
//	}
//
// The client keeps the lease rules for you (docs/api.md, "Rules for a
// client of your own"): it renews every TTL/3, counts its deadline from
// when each request was sent and gives up before the server can; a lease
// it has lost closes Done() and cancels Context() at once; it sends a call
// whose answer was lost again with the same request id, so it acts once;
// it releases by key and token, never by name alone; and a caller that
// gives up on a wait withdraws it from the server's queue.
package leasehold

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// DefaultEndpoint is the local single node of `leaseholdd` with no flags.
const DefaultEndpoint = "http://127.0.0.1:7419"

// Options configure a Client. The zero value, or nil, is fine.
type Options struct {
	// Holder is the name others see when they find a key held (default:
	// LEASEHOLD_HOLDER, else host/pid).
	Holder string
	// Token is an access token, sent as Authorization: Bearer (default:
	// LEASEHOLD_TOKEN).
	Token string
	// CAFile is the CA (PEM) to trust for https:// endpoints instead of the
	// system's (default: LEASEHOLD_CACERT).
	CAFile string
	// CertFile and KeyFile are a client certificate and its key (PEM), for
	// a node started with --tls-client-ca (default: LEASEHOLD_CLIENT_CERT,
	// LEASEHOLD_CLIENT_KEY).
	CertFile, KeyFile string
	// TLSConfig replaces everything above about TLS.
	TLSConfig *tls.Config
	// Timeout bounds one call that does not wait (default 5 s).
	Timeout time.Duration
	// RetryFor is how long a call is tried again while nothing was done
	// (no node took it) or its outcome is unknown (default 10 s).
	RetryFor time.Duration
}

// Client talks to one leaseholdd node or a cluster's nodes: calls go to the
// leader, follow a not_leader answer's hint, and move past nodes that
// cannot be reached. It is safe for concurrent use.
type Client struct {
	endpoints *endpoints
	holder    string
	token     string
	http      *http.Client
	timeout   time.Duration
	retryFor  time.Duration
	// plant is a rule this client breaks on purpose, for the conformance
	// suite to catch (LEASEHOLD_PLANTED_BUG; never set it otherwise).
	plant string
	// hasCert: a client certificate is configured.
	hasCert bool
}

// New connects to the endpoints of url: "http://a:7419" or a cluster's
// "http://a:7419,b:7419,c:7419" (https:// for TLS). Nothing is sent yet.
func New(rawURL string, opts *Options) (*Client, error) {
	if opts == nil {
		opts = &Options{}
	}
	eps, secure, err := parseEndpoints(rawURL)
	if err != nil {
		return nil, err
	}
	env := func(v, name string) string {
		if v != "" {
			return v
		}
		return os.Getenv(name)
	}
	holder := env(opts.Holder, "LEASEHOLD_HOLDER")
	if holder == "" {
		host, _ := os.Hostname()
		holder = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	transport := &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
	if secure {
		config := opts.TLSConfig
		if config == nil {
			config, err = tlsConfig(env(opts.CAFile, "LEASEHOLD_CACERT"),
				env(opts.CertFile, "LEASEHOLD_CLIENT_CERT"), env(opts.KeyFile, "LEASEHOLD_CLIENT_KEY"))
			if err != nil {
				return nil, err
			}
		}
		transport.TLSClientConfig = config
	}
	hasCert := transport.TLSClientConfig != nil &&
		(len(transport.TLSClientConfig.Certificates) > 0 || transport.TLSClientConfig.GetClientCertificate != nil)
	c := &Client{
		endpoints: eps,
		holder:    holder,
		token:     env(opts.Token, "LEASEHOLD_TOKEN"),
		http:      &http.Client{Transport: transport},
		timeout:   opts.Timeout,
		retryFor:  opts.RetryFor,
		plant:     os.Getenv("LEASEHOLD_PLANTED_BUG"),
		hasCert:   hasCert,
	}
	if c.timeout <= 0 {
		c.timeout = 5 * time.Second
	}
	if c.retryFor <= 0 {
		c.retryFor = 10 * time.Second
	}
	return c, nil
}

// FromEnv connects to LEASEHOLD_ENDPOINT (default DefaultEndpoint), with
// the token and TLS files from the environment.
func FromEnv() (*Client, error) {
	endpoint := os.Getenv("LEASEHOLD_ENDPOINT")
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	return New(endpoint, nil)
}

// Close closes idle connections. Leases still held go on renewing until
// released.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Holder is the name this client's leases carry.
func (c *Client) Holder() string { return c.holder }

func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, errorf("invalid_argument", "read the CA file %s: %v", caFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errorf("invalid_argument", "%s holds no PEM certificate", caFile)
		}
		config.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, errorf("invalid_argument", "client certificate %s and key %s: %v", certFile, keyFile, err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return config, nil
}

// endpoints are the nodes of a deployment and the one in use.
type endpoints struct {
	mu      sync.Mutex
	urls    []string
	current int
	scheme  string
}

func parseEndpoints(raw string) (*endpoints, bool, error) {
	raw = strings.TrimSpace(raw)
	secure := strings.HasPrefix(raw, "https://")
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	var urls []string
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimRight(strings.TrimSpace(part), "/")
		if part == "" {
			continue
		}
		if !strings.Contains(part, "://") {
			part = scheme + part
		}
		if !strings.HasPrefix(part, scheme) {
			return nil, false, errorf("invalid_argument", "endpoint %q: every endpoint takes the same scheme: http:// or https://", raw)
		}
		u, err := url.Parse(part)
		if err != nil || u.Host == "" {
			return nil, false, errorf("invalid_argument", "endpoint %q: %q is not HOST:PORT", raw, part)
		}
		urls = append(urls, part)
	}
	if len(urls) == 0 {
		return nil, false, errorf("invalid_argument", "endpoint %q: no address", raw)
	}
	return &endpoints{urls: urls, scheme: scheme}, secure, nil
}

func (e *endpoints) get() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.urls[e.current]
}

func (e *endpoints) several() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.urls) > 1
}

// next moves on from `from` (unless another call already did).
func (e *endpoints) next(from string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.urls[e.current] == from {
		e.current = (e.current + 1) % len(e.urls)
	}
}

// follow goes to the leader a node named; false if it named none.
func (e *endpoints) follow(from string, leader string) bool {
	if leader == "" {
		e.next(from)
		return false
	}
	if !strings.Contains(leader, "://") {
		leader = e.scheme + leader
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, u := range e.urls {
		if u == leader {
			e.current = i
			return true
		}
	}
	e.urls = append(e.urls, leader)
	e.current = len(e.urls) - 1
	return true
}

// requestID is a random id, nonzero and below 2^53 (exact in JSON anywhere).
func requestID() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return uint64(time.Now().UnixNano())&(1<<53-1) | 1
	}
	return binary.LittleEndian.Uint64(b[:])&(1<<53-1) | 1
}

// call is one request to the server.
type call struct {
	method string
	path   string
	query  url.Values
	body   interface{}
	// timeout bounds each attempt (default: the client's).
	timeout time.Duration
	// retryFor bounds the retries (default: the client's; negative: none).
	retryFor time.Duration
	// unknownAgain: the request carries a request id (or acting twice is
	// acting once), so an unknown outcome is sent again too.
	unknownAgain bool
}

// do sends c, following leaders and retrying while nothing was done (and,
// with unknownAgain, while the outcome is unknown); decodes a success into
// out. The caller's ctx bounds it all.
func (c *Client) do(ctx context.Context, k call, out interface{}) error {
	timeout := k.timeout
	if timeout <= 0 {
		timeout = c.timeout
	}
	retryFor := k.retryFor
	if retryFor == 0 {
		retryFor = c.retryFor
	}
	giveUp := time.Now().Add(retryFor)
	var body []byte
	if k.body != nil {
		var err error
		if body, err = json.Marshal(k.body); err != nil {
			return errorf("invalid_argument", "encode the request: %v", err)
		}
	}
	pause := time.Duration(0)
	for {
		base := c.endpoints.get()
		followed, err := c.attempt(ctx, base, k, body, timeout, out)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var e *Error
		final := errors.As(err, &e) && e.Details["final"] == true
		again := notDone(err) || (k.unknownAgain && errors.Is(err, ErrOutcomeUnknown))
		if final || !again || retryFor < 0 || !time.Now().Before(giveUp) {
			return err
		}
		if followed {
			continue
		}
		// 10, 20, ... 50 ms: a leader just elected is found within ~50 ms.
		if pause < 50*time.Millisecond {
			pause += 10 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

// attempt sends k once to base; whether a not_leader answer named a leader
// to go to at once.
func (c *Client) attempt(ctx context.Context, base string, k call, body []byte, timeout time.Duration, out interface{}) (bool, error) {
	u := base + k.path
	if len(k.query) > 0 {
		u += "?" + k.query.Encode()
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, k.method, u, reader)
	if err != nil {
		return false, errorf("invalid_argument", "%s %s: %v", k.method, u, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.endpoints.next(base)
		return false, c.transportError(u, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		c.endpoints.next(base)
		return false, errorf("outcome_unknown", "%s: the answer was cut off: %v", u, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out == nil || len(data) == 0 {
			return false, nil
		}
		if err := json.Unmarshal(data, out); err != nil {
			return false, errorf("internal", "%s: not the answer expected: %v", u, err)
		}
		return false, nil
	}
	var answer map[string]interface{}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if dec.Decode(&answer) != nil {
		return false, errorf("internal", "%s: HTTP %d: %s", u, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	e := fromBody(resp.StatusCode, answer)
	if e.Code == "not_leader" {
		leader, _ := e.Details["leader"].(string)
		return c.endpoints.follow(base, leader), e
	}
	if e.Code == "unavailable" {
		c.endpoints.next(base)
	}
	return false, e
}

// transportError is what a failed exchange stands for: a TLS refusal says
// what to do and is final (every node would refuse it alike); a connection
// never made did nothing (unavailable, final with one endpoint refusing
// it); one that broke after the request was sent may have acted.
func (c *Client) transportError(u string, err error) *Error {
	if advice := tlsAdvice(err, c.hasCert); advice != "" {
		return &Error{Code: "unavailable", Message: fmt.Sprintf("%s: %s (%v)", u, advice, err),
			Details: map[string]interface{}{"final": true}}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		if !c.endpoints.several() && strings.Contains(err.Error(), "refused") {
			return &Error{Code: "unavailable", Message: fmt.Sprintf("%s: %v (is leaseholdd running there?)", u, err),
				Details: map[string]interface{}{"final": true}}
		}
		return errorf("unavailable", "%s: %v", u, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return errorf("outcome_unknown", "%s: no answer in time: %v", u, err)
	}
	return errorf("outcome_unknown", "%s: %v", u, err)
}

// tlsAdvice says what to do about a TLS failure, from its text; "" if it
// is not one. The same advice as the Rust and Python clients give.
func tlsAdvice(err error, hasCert bool) string {
	text := err.Error()
	has := func(s ...string) bool {
		for _, x := range s {
			if strings.Contains(text, x) {
				return true
			}
		}
		return false
	}
	switch {
	case has("certificate required") && hasCert:
		// Go presents a certificate only if a CA the server names signed it.
		return "the server does not accept this client certificate: use one signed by the CA of the server's --tls-client-ca"
	case has("certificate required"):
		return "the server requires a client certificate: give CertFile and KeyFile (LEASEHOLD_CLIENT_CERT, LEASEHOLD_CLIENT_KEY)"
	case has("certificate signed by unknown authority", "x509: certificate is not valid"):
		return "the server's certificate is not signed by a CA this client trusts, or does not name the host: give CAFile with the CA that signed it (LEASEHOLD_CACERT)"
	case has("unknown certificate authority", "bad certificate", "decrypt error"):
		return "the server does not accept this client certificate: use one signed by the CA of the server's --tls-client-ca"
	case has("certificate has expired", "certificate expired"):
		return "a certificate is outside its validity period: renew it"
	case has("server gave HTTP response to HTTPS client", "first record does not look like a TLS handshake"):
		return "the server does not speak TLS on this port: use http://"
	}
	return ""
}
