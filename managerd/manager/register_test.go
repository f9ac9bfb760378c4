package manager

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteIdentity: the identity file is {"v":1,"space","instanceId"}, 0600, in a 0700 directory
// it creates when missing, and a rewrite replaces it whole.
func TestWriteIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := writeIdentity(dir, "alpha", instanceA); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, IdentityFile)
	b, err := os.ReadFile(path)
	if err != nil || string(b) != `{"v":1,"space":"alpha","instanceId":"`+instanceA+`"}`+"\n" {
		t.Fatalf("identity file = %q, %v", b, err)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, dir: 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v, %v; want mode %v", p, fi, err, want)
		}
	}
	if err := writeIdentity(dir, "beta", instanceA); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != `{"v":1,"space":"beta","instanceId":"`+instanceA+`"}`+"\n" {
		t.Fatalf("rewritten identity file = %q", b)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeIdentity(dir, "alpha", instanceA); err == nil {
		t.Fatal("wrote into a directory looser than 0700")
	}
}
