package ledger

import (
	"reflect"
	"testing"
)

// FuzzDecodeRow feeds arbitrary file content to the row decoder of both spaces: it must never
// panic, and every row it accepts must pass validate and survive encode and decode unchanged.
func FuzzDecodeRow(f *testing.F) {
	r := managedRow(ownerA, "worker", ownerB+".boss")
	r.Ver = Version
	r.Role = "review"
	r.Label = "a label"
	good, _ := encodeRow(r)
	f.Add(good)
	f.Add([]byte(`{"ver":1,"owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"a","scope":[],"allowSubscribe":[],"allowPublish":[],"lifecycleUid":"aaaaaaaaaaaaaaaaaaaaaaaaaa","grantedAt":1}`))
	f.Add([]byte(`{"ver":1,"OWNER":"x"}`))
	f.Add([]byte(`{"scope":["a"],"scope":["b"]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, kind := range []Kind{Interactive, Managed} {
			got, err := decodeRow(kind, data)
			if err != nil {
				continue
			}
			if verr := validate(kind, got); verr != nil {
				t.Fatalf("accepted an invalid row: %v", verr)
			}
			enc, err := encodeRow(got)
			if err != nil {
				t.Fatal(err)
			}
			again, err := decodeRow(kind, enc)
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("round trip: %+v, %v; want %+v", again, err, got)
			}
		}
	})
}
