package leasehold

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Error is a refusal from leaseholdd, or from this client: Code is the
// stable code (docs/api.md, "Errors"), Message is for people, and Details
// holds the rest of the error body (holder, fence, leader, ...).
//
// Compare with errors.Is against the sentinel of its code:
//
//	if errors.Is(err, leasehold.ErrHeld) { ... }
//
// and read its details with errors.As:
//
//	var e *leasehold.Error
//	if errors.As(err, &e) { fmt.Println(e.Details["holder"]) }
type Error struct {
	Code    string
	Message string
	Details map[string]interface{}
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Message
}

// Is makes errors.Is(err, ErrHeld) true for every error of code "held".
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// Detail is a numeric detail of the error (a fence, a lease id), if it has one.
func (e *Error) Detail(name string) (uint64, bool) {
	switch v := e.Details[name].(type) {
	case json.Number:
		n, err := strconv.ParseUint(v.String(), 10, 64)
		return n, err == nil
	case float64:
		return uint64(v), true
	case uint64:
		return v, true
	}
	return 0, false
}

func sentinel(code string) *Error { return &Error{Code: code} }

// One sentinel for every code in the README's table, and the client's own.
var (
	// ErrInvalidArgument: a field is out of its limits; nothing changed.
	ErrInvalidArgument = sentinel("invalid_argument")
	// ErrLeaseNotFound: the lease was never granted.
	ErrLeaseNotFound = sentinel("lease_not_found")
	// ErrLeaseExpired: the lease ended (expired or revoked).
	ErrLeaseExpired = sentinel("lease_expired")
	// ErrHeld: someone else holds the key (details: holder, lease, fence).
	ErrHeld = sentinel("held")
	// ErrLockDelayed: the key is in its lock-delay (details: delay_left_ms).
	ErrLockDelayed = sentinel("lock_delayed")
	// ErrStaleFence: the token presented does not hold the key.
	ErrStaleFence = sentinel("stale_fence")
	// ErrWaitTimeout: a wait ended without a grant.
	ErrWaitTimeout = sentinel("wait_timeout")
	// ErrUnauthenticated: no token, or a bad or revoked one.
	ErrUnauthenticated = sentinel("unauthenticated")
	// ErrPermissionDenied: the token lacks a permission.
	ErrPermissionDenied = sentinel("permission_denied")
	// ErrNotLeader: a follower answered (details: leader); the client
	// follows it by itself, so it reaches a caller only if no leader took it.
	ErrNotLeader = sentinel("not_leader")
	// ErrUnavailable: nothing was done; retry shortly.
	ErrUnavailable = sentinel("unavailable")
	// ErrOutcomeUnknown: it may still take effect; the client retried it
	// with its request id until it gave up.
	ErrOutcomeUnknown = sentinel("outcome_unknown")
	// ErrNotFound: no such route (the server is older than this client).
	ErrNotFound = sentinel("not_found")
	// ErrMethodNotAllowed: the route exists, but not with this method.
	ErrMethodNotAllowed = sentinel("method_not_allowed")
	// ErrNotAdded: a member to add did not answer or catch up.
	ErrNotAdded = sentinel("not_added")
	// ErrTLSRequired: plaintext to a TLS port: use https://.
	ErrTLSRequired = sentinel("tls_required")
	// ErrWatchBehind: a watch's events are gone: list again, then watch again.
	ErrWatchBehind = sentinel("watch_behind")
	// ErrResourceExhausted: a quota or rate limit refused it; nothing was done.
	ErrResourceExhausted = sentinel("resource_exhausted")
	// ErrInternal: the server failed in a way the caller cannot fix.
	ErrInternal = sentinel("internal")
	// ErrLeaseLost is this client's own: the lease is lost (a renewal was
	// refused, or its client-side deadline passed). Stop mutating.
	ErrLeaseLost = sentinel("lease_lost")
)

// errorf makes an error of `code` with a message.
func errorf(code, format string, args ...interface{}) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// fromBody is the error an HTTP error answer stands for.
func fromBody(status int, body map[string]interface{}) *Error {
	inner, ok := body["error"].(map[string]interface{})
	if !ok {
		return errorf("internal", "HTTP %d without an error body", status)
	}
	e := &Error{Details: map[string]interface{}{}}
	for k, v := range inner {
		switch k {
		case "code":
			e.Code, _ = v.(string)
		case "message":
			e.Message, _ = v.(string)
		default:
			e.Details[k] = v
		}
	}
	if e.Code == "" {
		e.Code = "internal"
	}
	return e
}

// notDone: nothing was done, so the same request may go anywhere.
func notDone(err error) bool {
	return errors.Is(err, ErrNotLeader) || errors.Is(err, ErrUnavailable)
}
