package plane3

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestMirror: a mirror opened on a bucket with history holds each key's last value and none of
// its deleted keys; after Sync it holds every change stored before, with no wait of the test's
// own (each write is read back at once, many times over, so a Sync that did not wait for its
// watch fails here); a delete and a purge remove a key; a Sync on a closed connection fails.
func TestMirror(t *testing.T) {
	e := plane3test.New(t)
	dc := e.Delivery(t)
	js := plane3test.JS(t, dc)
	ctx := plane3test.Ctx(t)
	kv, err := OpenBucket(ctx, js, e.N, space.Members)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, value string) uint64 {
		t.Helper()
		rev, err := kv.PutString(ctx, key, value)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	want := func(m *Mirror, key, value string, rev uint64) {
		t.Helper()
		r, ok := m.Get(key)
		switch {
		case value == "" && ok:
			t.Fatalf("%s = %q at %d, want no row", key, r.Value, r.Revision)
		case value != "" && (!ok || string(r.Value) != value || r.Revision != rev):
			t.Fatalf("%s = %q at %d (found %v), want %q at %d", key, r.Value, r.Revision, ok, value, rev)
		}
	}

	empty, err := OpenMirror(js, kv)
	if err != nil {
		t.Fatal(err)
	}
	if err := empty.Sync(ctx); err != nil {
		t.Fatalf("Sync on an empty bucket: %v", err)
	}
	n := 0
	empty.Each(func(string, Row) { n++ })
	empty.Close()
	if n != 0 {
		t.Fatalf("an empty bucket mirrored %d rows", n)
	}

	put("a", "a1")
	revA := put("a", "a2")
	put("b", "b1")
	if err := kv.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	revC := put("c", "c1")
	m, err := OpenMirror(js, kv)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	want(m, "a", "a2", revA)
	want(m, "b", "", 0)
	want(m, "c", "c1", revC)

	for i := range 300 {
		key := fmt.Sprintf("k%d", i%7)
		value := fmt.Sprintf("v%d", i)
		rev := put(key, value)
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		want(m, key, value, rev)
	}
	if err := kv.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	want(m, "a", "", 0)
	want(m, "c", "", 0)

	dc.Close()
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := m.Sync(short); err == nil {
		t.Fatal("Sync on a closed connection succeeded")
	}
}
