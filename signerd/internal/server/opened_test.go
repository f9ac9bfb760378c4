package server

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

func requestClaims(user string, exp time.Time) *jwt.AuthorizationRequestClaims {
	ac := &jwt.AuthorizationRequestClaims{}
	ac.UserNkey = user
	ac.Expires = exp.Unix()
	return ac
}

func TestOpenedCacheTakesOnce(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	c := newOpenedCache(1<<10, OpenedCacheTTL)
	sp := &keystore.Space{}
	k := openedKeyOf(sp, []byte("box"), "XKEY")
	ac := requestClaims("U1", now.Add(2*time.Second))
	c.put(k, ac, 3, now)

	for _, miss := range []openedKey{
		openedKeyOf(sp, []byte("box2"), "XKEY"),
		openedKeyOf(sp, []byte("box"), "XKEY2"),
		openedKeyOf(&keystore.Space{}, []byte("box"), "XKEY"),
		// The separator keeps xkey and box from sliding into each other.
		openedKeyOf(sp, []byte("ox"), "XKEYb"),
	} {
		if got := c.take(miss, now); got != nil {
			t.Fatalf("take(%x) = %v, want a miss", miss.sum[:4], got)
		}
	}
	if got := c.take(k, now); got != ac {
		t.Fatalf("take = %v, want the cached claims", got)
	}
	if got := c.take(k, now); got != nil {
		t.Fatalf("second take = %v, want a miss (one answer per open)", got)
	}
	if c.len() != 0 || c.used != 0 {
		t.Fatalf("cache holds %d entries, %d bytes after the take; want none", c.len(), c.used)
	}
}

func TestOpenedCacheTTL(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	c := newOpenedCache(1<<10, 10*time.Second)
	sp := &keystore.Space{}
	old, fresh := openedKeyOf(sp, []byte("old"), "X"), openedKeyOf(sp, []byte("fresh"), "X")
	c.put(old, requestClaims("U1", now), 3, now)
	if got := c.take(old, now.Add(10*time.Second+time.Nanosecond)); got != nil {
		t.Fatalf("take after the TTL = %v, want a miss", got)
	}
	c.put(old, requestClaims("U1", now), 3, now)
	c.put(fresh, requestClaims("U2", now), 5, now.Add(11*time.Second))
	if c.len() != 1 {
		t.Fatalf("after a put past the TTL the cache holds %d entries, want 1 (the stale one dropped)", c.len())
	}
	if got := c.take(fresh, now.Add(11*time.Second)); got == nil || got.UserNkey != "U2" {
		t.Fatalf("take(fresh) = %v, want U2", got)
	}
	c.put(old, requestClaims("U1", now), 3, now)
	if got := c.take(old, now.Add(-time.Second)); got != nil {
		t.Fatalf("take with the clock before the put = %v, want a miss", got)
	}
}

func TestOpenedCacheBudget(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	c := newOpenedCache(10, time.Minute)
	sp := &keystore.Space{}
	keys := make([]openedKey, 4)
	for i := range keys {
		keys[i] = openedKeyOf(sp, []byte{byte(i)}, "X")
		c.put(keys[i], requestClaims("U", now), 4, now)
	}
	// 4 bytes each under a 10-byte budget: the two newest stay.
	if c.len() != 2 || c.used != 8 {
		t.Fatalf("cache holds %d entries, %d bytes; want 2 and 8", c.len(), c.used)
	}
	for i, want := range []bool{false, false, true, true} {
		if got := c.take(keys[i], now) != nil; got != want {
			t.Fatalf("entry %d cached = %v, want %v", i, got, want)
		}
	}
	c.put(openedKeyOf(sp, []byte("big"), "X"), requestClaims("U", now), 11, now)
	if c.len() != 0 {
		t.Fatalf("an entry over the whole budget was cached")
	}
}

func TestOpenedRequestRechecksExpiry(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := &Service{opened: newOpenedCache(1<<10, time.Hour)}
	sp := &keystore.Space{}
	k := openedKeyOf(sp, []byte("box"), "X")
	s.opened.put(k, requestClaims("U1", now), 3, now)
	ac, err := s.openedRequest(sp, []byte("box"), "X", now.Add(CalloutClockSkew))
	if err != nil || ac.UserNkey != "U1" {
		t.Fatalf("openedRequest at exp+skew = %v, %v; want the cached claims", ac, err)
	}
	s.opened.put(k, requestClaims("U1", now), 3, now)
	_, err = s.openedRequest(sp, []byte("box"), "X", now.Add(CalloutClockSkew+time.Second))
	var r *refusal
	if !errors.As(err, &r) || r.code != codes.InvalidArgument {
		t.Fatalf("openedRequest past exp+skew: %v, want INVALID_ARGUMENT", err)
	}
}
