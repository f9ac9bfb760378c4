package keystore_test

import (
	"bufio"
	"bytes"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// The needles travel masked (each byte XOR scanMask), so the test's own copies of what it looks
// for never match; scanMemory unmasks them only inside a mapping it does not scan.
const scanMask = 0xa5

// scanOverlap is how much consecutive chunks of the scan overlap: more than the longest needle.
const scanOverlap = 128

// scanFixtureEnv names the directory in which the helper process builds the fixture.
const scanFixtureEnv = "COTAL_KEYSTORE_SCAN_FIXTURE"

// needle is one secret form the scan looks for, masked, with the most copies allowed.
type needle struct {
	Name   string `json:"name"`
	Masked []byte `json:"masked"`
	// AfterOpen and AfterClose are the copies allowed in the process after Open and after
	// Close: the cached key holds one raw copy; nothing else may.
	AfterOpen  int `json:"after_open"`
	AfterClose int `json:"after_close"`
}

func mask(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = c ^ scanMask
	}
	return out
}

// TestScanFixtureHelper is not a test: TestOpenLeavesNoSeedCopies runs it in a child process
// to create the key files and the masked needles, so the parent never holds a seed before
// Open.
func TestScanFixtureHelper(t *testing.T) {
	dir := os.Getenv(scanFixtureEnv)
	if dir == "" {
		t.Skip("helper process for TestOpenLeavesNoSeedCopies")
	}
	f := newFixture(t, "alpha")
	if err := os.Rename(f.dir, filepath.Join(dir, "state")); err != nil {
		t.Fatal(err)
	}
	f.dir = filepath.Join(dir, "state")
	var ns []needle
	add := func(name string, b []byte, afterOpen, afterClose int) {
		ns = append(ns, needle{Name: name, Masked: mask(b), AfterOpen: afterOpen, AfterClose: afterClose})
	}
	for _, file := range []string{keystore.FileDataSigning, keystore.FileAuthSigning, keystore.FileXKey} {
		text := bytes.TrimSpace(readFile(t, f.secret("alpha", file)))
		bin, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(string(text))
		if err != nil {
			t.Fatal(err)
		}
		add(file+" text", text, 0, 0)
		switch file {
		case keystore.FileXKey:
			// crypto/ecdh keeps an unwipeable copy of the scalar when the public key is
			// derived (documented on curveKey); the cached key is the other. Its scalar
			// multiplication also leaves a clamped copy on its stack, which equals the seed
			// when the seed is already clamped (1 key in 32): one more copy then.
			raw := bin[2:34]
			extra := 0
			if raw[0]&7 == 0 && raw[31]&0xc0 == 0x40 {
				extra = 1
			}
			add(file+" raw", raw, 2+extra, 1+extra)
		case keystore.FileDataSigning:
			// The test signs with this key: crypto/ed25519 caches an expanded copy of it
			// (documented on SigningKey.Sign), which Close cannot wipe.
			add(file+" raw", bin[2:34], 1, 1)
		default:
			add(file+" raw", bin[2:34], 1, 0)
		}
	}
	pemText := readFile(t, f.secret("alpha", keystore.FileIssuer))
	var b64 strings.Builder
	for _, line := range strings.Split(string(pemText), "\n") {
		if !strings.HasPrefix(line, "-----") {
			b64.WriteString(line)
		}
	}
	der, err := base64.StdEncoding.DecodeString(b64.String())
	if err != nil || len(der) != 48 {
		t.Fatalf("issuer key: %d bytes, %v", len(der), err)
	}
	add("issuer.key base64", []byte(b64.String()), 0, 0)
	add("issuer.key PKCS#8 DER", der, 0, 0)
	add("issuer.key raw seed", der[16:], 1, 0)
	for _, file := range []string{keystore.FileOwnerSecret, keystore.FileMACKey} {
		text := bytes.TrimSpace(readFile(t, f.secret("alpha", file)))
		raw, err := base64.StdEncoding.DecodeString(string(text))
		if err != nil {
			t.Fatal(err)
		}
		add(file+" base64", text, 0, 0)
		add(file+" raw", raw, 1, 0)
	}
	out, err := json.Marshal(ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "needles.json"), out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestOpenLeavesNoSeedCopies is finding 9's seed hygiene, measured: after Open, this process's
// writable memory holds no seed text, base64 or PKCS#8 text of any secret, and exactly the one
// raw copy each cached key needs; after Close, none (but the xkey's crypto/ecdh copy). Before
// the fix Open left 5 text and 7 raw copies of every seed. The key files are made by a child
// process so this one holds no secret before Open.
func TestOpenLeavesNoSeedCopies(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("scans /proc/self/mem")
	}
	if os.Getenv(scanFixtureEnv) != "" {
		t.Skip("inside the helper process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestScanFixtureHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), scanFixtureEnv+"="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper process: %v\n%s", err, out)
	}
	var ns []needle
	if err := json.Unmarshal(readFile(t, filepath.Join(dir, "needles.json")), &ns); err != nil {
		t.Fatal(err)
	}
	if len(ns) != 13 {
		t.Fatalf("%d needles, want 13", len(ns))
	}
	f := fixture{dir: filepath.Join(dir, "state"), spaces: []string{"alpha"}}
	if _, err := scanMemory(ns); err != nil {
		t.Skipf("cannot scan this process's memory: %v", err)
	}

	st, err := keystore.Open(f.config())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	runtime.GC()
	check := func(when string, allowed func(needle) int) {
		t.Helper()
		counts, err := scanMemory(ns)
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range ns {
			t.Logf("%s: %d copies of %s", when, counts[i], n.Name)
			if counts[i] > allowed(n) {
				t.Errorf("%s: %d copies of %s in memory, want at most %d", when, counts[i], n.Name, allowed(n))
			}
		}
	}
	check("after Open", func(n needle) int { return n.AfterOpen })
	// The store must still work: the copies counted are the live keys.
	sp, ok := st.Space("alpha")
	if !ok {
		t.Fatal("space alpha not loaded")
	}
	if _, err := sp.DataSigning.Sign([]byte("m")); err != nil {
		t.Fatalf("sign after Open: %v", err)
	}
	st.Close()
	runtime.GC()
	check("after Close", func(n needle) int { return n.AfterClose })
}

// scanMemory counts each needle in this process's private writable mappings (heap, stacks,
// data), read through /proc/self/mem. The needles are unmasked, and memory read, only inside a
// mapping of the scan's own, which it skips.
func scanMemory(ns []needle) ([]int, error) {
	const needleArea, chunk = 4096, 1 << 20
	area, err := syscall.Mmap(-1, 0, needleArea+chunk+scanOverlap, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, err
	}
	defer func() { _ = syscall.Munmap(area) }()
	self := uintptr(unsafe.Pointer(&area[0]))
	plain := make([][]byte, len(ns))
	off := 0
	for i, n := range ns {
		if off+len(n.Masked) > needleArea {
			return nil, fmt.Errorf("needles exceed %d bytes", needleArea)
		}
		plain[i] = area[off : off+len(n.Masked)]
		for j, c := range n.Masked {
			plain[i][j] = c ^ scanMask
		}
		off += len(n.Masked)
	}
	buf := area[needleArea:]
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	counts := make([]int, len(ns))
	sc := bufio.NewScanner(bytes.NewReader(maps))
	regions := 0
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || !strings.HasPrefix(fields[1], "rw") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		// Larger mappings are the race detector's shadow memory (metadata, terabytes of it
		// sparse), not data: a test process's heap arenas and stacks are far smaller.
		if err1 != nil || err2 != nil || end-start > 1<<30 {
			continue
		}
		regions++
		// The kernel may merge buf's mapping with a neighbour: scan around it.
		ranges := [][2]uint64{{start, end}}
		if bs, be := uint64(self), uint64(self)+uint64(len(area)); bs >= start && bs < end {
			ranges = [][2]uint64{{start, bs}, {be, end}}
		}
		for _, r := range ranges {
			scanRange(mem, buf, r[0], r[1], plain, counts)
		}
	}
	if regions == 0 {
		return nil, fmt.Errorf("no writable mappings in /proc/self/maps")
	}
	return counts, nil
}

// scanRange counts the needles in [start, end) of mem, read chunk by chunk into buf.
func scanRange(mem *os.File, buf []byte, start, end uint64, needles [][]byte, counts []int) {
	chunk := uint64(len(buf) - scanOverlap)
	for off := start; off < end; off += chunk {
		got, err := mem.ReadAt(buf[:min(uint64(len(buf)), end-off)], int64(off))
		if err != nil && err != io.EOF {
			return // an unreadable region (guard pages)
		}
		window := buf[:got]
		// Count a needle only where it starts before the overlap, which the next chunk reads
		// again.
		limit := min(got, int(chunk))
		for i, nd := range needles {
			for rest, base := window, 0; ; {
				j := bytes.Index(rest, nd)
				if j < 0 || base+j >= limit {
					break
				}
				counts[i]++
				rest, base = rest[j+1:], base+j+1
			}
		}
	}
}

// TestCloseWipesOpenedKeys is finding 9's Close over a store built by Open from real files:
// every buffer that holds key material is zeroed, and the public keys the space was checked
// against are those of the cached keys.
func TestCloseWipesOpenedKeys(t *testing.T) {
	f := newFixture(t, "alpha")
	st, err := keystore.Open(f.config())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	sp, _ := st.Space("alpha")
	if got := keystore.XKeyPublicForTest(sp); got != sp.Trust.XKey() {
		t.Fatalf("cached xkey public key %s, space facts say %s", got, sp.Trust.XKey())
	}
	if got := sp.DataSigning.Public(); !slices.Contains(sp.Trust.DataSigningKeys(), got) {
		t.Fatalf("cached data signing key %s is not one of %v", got, sp.Trust.DataSigningKeys())
	}
	if got := sp.AuthSigning.Public(); !slices.Contains(sp.Trust.AuthSigningKeys(), got) {
		t.Fatalf("cached callout signing key %s is not one of %v", got, sp.Trust.AuthSigningKeys())
	}
	material := keystore.KeyMaterialForTest(sp)
	if len(material) != 6 {
		t.Fatalf("%d key buffers, want 6", len(material))
	}
	for name, b := range material {
		if len(b) == 0 || bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("%s is empty or zero before Close", name)
		}
	}
	st.Close()
	for name, b := range material {
		if !bytes.Equal(b, make([]byte, len(b))) {
			t.Errorf("%s not zeroed by Close", name)
		}
	}
}
