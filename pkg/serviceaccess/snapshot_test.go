package serviceaccess_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

const smallManifest = `{"v":1,"root":{"urn":"ep","kind":"endpoint"},"members":[]}`

func smallSnapshot() serviceaccess.Snapshot {
	return serviceaccess.Snapshot{V: 1, Account: testAccount, Space: "acme & <co>", Owner: testOwner, Endpoint: "ep",
		Instance: testIID, Generation: 3, Contract: *contractOf(smallManifest)}
}

// TestSnapshotCanonical asserts the canonical bytes of a small snapshot literally (keys sorted
// at every level, no whitespace, HTML characters as they are, bytes as padded standard base64)
// and its witness as a known answer.
func TestSnapshotCanonical(t *testing.T) {
	s := smallSnapshot()
	got, err := s.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	d := serviceaccess.Digest([]byte(smallManifest))
	want := `{"account":"` + testAccount + `","contract":{"artifacts":[{"bytes":"` +
		base64.StdEncoding.EncodeToString([]byte(smallManifest)) + `","digest":"` + d + `"}],"closures":["` + d + `"]},` +
		`"endpoint":"ep","generation":3,"instance":"` + testIID + `","owner":"` + testOwner + `","space":"acme & <co>","v":1}`
	if string(got) != want {
		t.Fatalf("canonical\n%s\nwant\n%s", got, want)
	}
	const wantLiteral = `{"account":"AADEXUKMFVICBSSDYCT7HJJGVFSZG434WQWE4D4D5IHCYG6P7X5O7546","contract":{"artifacts":[{"bytes":"eyJ2IjoxLCJyb290Ijp7InVybiI6ImVwIiwia2luZCI6ImVuZHBvaW50In0sIm1lbWJlcnMiOltdfQ==","digest":"sha256:ae8319c6df4ad1db6c7e4947056b59916dd6f5be4232ec18e5b6d9c340e1826f"}],"closures":["sha256:ae8319c6df4ad1db6c7e4947056b59916dd6f5be4232ec18e5b6d9c340e1826f"]},"endpoint":"ep","generation":3,"instance":"01jd8x9y0z1a2b3c4d5e6f7g8h","owner":"u_abcdefghijklmnopqrstuvwxyz","space":"acme & <co>","v":1}`
	if string(got) != wantLiteral {
		t.Fatalf("canonical\n%s\nis not the literal", got)
	}
	const wantDigest = "sha256:ae8319c6df4ad1db6c7e4947056b59916dd6f5be4232ec18e5b6d9c340e1826f"
	if d != wantDigest {
		t.Fatalf("manifest digest %s, want %s", d, wantDigest)
	}
	const wantWitness = "w_c6pr3g56iqiegqofoikxch26zbiupujxpfpfeqmh3acuyhlq5hwq"
	if w := serviceaccess.WitnessOf(got); w != wantWitness || !serviceaccess.ValidWitness(w) {
		t.Fatalf("witness %s, want %s", w, wantWitness)
	}

	t.Run("ok/stable under field order", func(t *testing.T) {
		// The same snapshot written with its keys in another order, spaced, reads back to the
		// same canonical bytes.
		var m map[string]any
		if err := json.Unmarshal(got, &m); err != nil {
			t.Fatal(err)
		}
		shuffled := `{ "v": 1, "space": "acme & <co>", "owner": "` + testOwner + `", "instance": "` + testIID + `",
			"generation": 3, "endpoint": "ep", "contract": {"closures": ["` + d + `"], "artifacts": [{"digest": "` + d +
			`", "bytes": "` + base64.StdEncoding.EncodeToString([]byte(smallManifest)) + `"}]}, "account": "` + testAccount + `"}`
		var s2 serviceaccess.Snapshot
		if err := json.Unmarshal([]byte(shuffled), &s2); err != nil {
			t.Fatal(err)
		}
		again, err := s2.Canonical()
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("canonical of the reordered snapshot\n%s\nwant\n%s (%v)", again, got, err)
		}
	})
	t.Run("ok/ParseSnapshot round trip", func(t *testing.T) {
		p, err := serviceaccess.ParseSnapshot(got)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := p.Canonical()
		if !bytes.Equal(again, got) || p.Generation != 3 || p.Space != "acme & <co>" {
			t.Fatalf("round trip %s", again)
		}
	})
	t.Run("ok/nil lists are written empty", func(t *testing.T) {
		b, err := serviceaccess.Snapshot{V: 1}.Canonical()
		if err != nil || !strings.Contains(string(b), `"contract":{"artifacts":[],"closures":[]}`) {
			t.Fatalf("canonical %s, %v", b, err)
		}
	})
	t.Run("ok/a changed field changes the witness", func(t *testing.T) {
		s2 := smallSnapshot()
		s2.Generation = 4
		b, _ := s2.Canonical()
		if serviceaccess.WitnessOf(b) == serviceaccess.WitnessOf(got) {
			t.Fatal("same witness for another generation")
		}
	})
	for _, tc := range []struct{ name, in string }{
		{"fail/parse spaced", strings.Replace(string(got), `"v":1`, `"v": 1`, 1)},
		{"fail/parse reordered", strings.Replace(strings.Replace(string(got), `"v":1}`, `"zz":1}`, 1), `{"account"`, `{"v":1,"account"`, 1)},
		{"fail/parse HTML escaped", strings.Replace(string(got), "&", `\u0026`, 1)},
		{"fail/parse unknown key", strings.Replace(string(got), `"v":1}`, `"v":1,"x":1}`, 1)},
		{"fail/parse generation 0", strings.Replace(string(got), `"generation":3`, `"generation":0`, 1)},
		{"fail/parse owner", strings.Replace(string(got), testOwner, "alice", 1)},
		{"fail/parse account", strings.Replace(string(got), testAccount, "U"+testAccount[1:], 1)},
		{"fail/parse trailing", string(got) + "\n"},
		{"fail/parse contract for another endpoint", strings.Replace(string(got), `"endpoint":"ep"`, `"endpoint":"eq"`, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := serviceaccess.ParseSnapshot([]byte(tc.in))
			var e *serviceaccess.Error
			if s != nil || !errors.As(err, &e) {
				t.Fatalf("snapshot %v, err %v: want an *Error", s, err)
			}
		})
	}
}
