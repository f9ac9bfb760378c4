package main

import (
	"bufio"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
)

// statusRow is one line of the status table. Nothing in it is secret: identities are SPIFFE ids
// and public keys, expiries are times.
type statusRow struct{ name, identity, key, ready, expires string }

func (s *stack) printStatus() {
	fmt.Fprintln(s.out)
	tw := tabwriter.NewWriter(s.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DAEMON\tIDENTITY\tNATS USER KEY\tREADY\tCREDENTIAL EXPIRES")
	for _, r := range s.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.name, r.identity, r.key, r.ready, r.expires)
	}
	_ = tw.Flush()
}

// certFacts is a certificate file's URI SAN and expiry.
func certFacts(path string) (id, notAfter string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?", "?"
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "?", "?"
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "?", "?"
	}
	id = c.Subject.CommonName
	if len(c.URIs) > 0 {
		id = c.URIs[0].String()
	}
	return id, c.NotAfter.UTC().Format(time.RFC3339)
}

// auditCredential is the user public key and expiry of the last credential of profile signerd
// granted to caller, from signerd's audit log (which records both, and never a JWT).
func (s *stack) auditCredential(caller, profile string) (key, exp string) {
	key, exp = "?", "?"
	f, err := os.Open(s.l.audit)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r struct {
			Caller, RPC, Profile, Subject, Decision string
			Expiry                                  time.Time
		}
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.Caller != caller || r.Decision != "granted" || (r.RPC != "Mint" && r.RPC != "Remint") {
			continue
		}
		if p := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(r.Profile, "PROFILE_")), "_", "-"); p != profile {
			continue
		}
		key, exp = r.Subject, r.Expiry.UTC().Format(time.RFC3339)
	}
	return
}

func fmtTS(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "?"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}
