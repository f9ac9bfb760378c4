package evict

import (
	"strings"
	"testing"
)

func TestParsePrincipal(t *testing.T) {
	for _, p := range []string{"local.bob", "u_abcdefghijklmnopqrstuvwxyz.web", "Local.BoB"} {
		t.Run("ok/"+p, func(t *testing.T) {
			if err := ParsePrincipal(p); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, p := range []string{"", "bob", "local.*", "local.>", "*.bob", "local.bob.x", "local.b ob", "local.", ".bob"} {
		t.Run("fail/"+p, func(t *testing.T) {
			if err := ParsePrincipal(p); err == nil {
				t.Fatalf("%q accepted", p)
			}
		})
	}
}

func TestParsePlaneQuery(t *testing.T) {
	const (
		srv  = "NDJWE4SOUJOJT2TY5Y2YQEOAHGAK5VIGXTGKWJSFHVCII4ITI3LBHBUV"
		user = "UCEHH4MFDD6UXDPV52I4RFFLYHEO4RCQW44YHHNMHUUSCXGUPAY54DOA"
	)
	tuple := `{"serverId":"` + srv + `","cid":7,"userNkey":"` + user + `"}`
	t.Run("ok/two tuples", func(t *testing.T) {
		q, err := ParsePlaneQuery([]byte(`{"ledger":` + tuple + `,"records":` + tuple + `}`))
		if err != nil || q.Ledger.Cid != 7 || q.Records.User != user || q.Ledger.Server != srv {
			t.Fatalf("%+v %v", q, err)
		}
	})
	for name, body := range map[string]string{
		"missing records": `{"ledger":` + tuple + `}`,
		"extra key":       `{"ledger":` + tuple + `,"records":` + tuple + `,"more":1}`,
		"wide tuple":      `{"ledger":` + strings.Replace(tuple, `"cid":7`, `"cid":7,"x":1`, 1) + `,"records":` + tuple + `}`,
		"zero cid":        `{"ledger":` + strings.Replace(tuple, `"cid":7`, `"cid":0`, 1) + `,"records":` + tuple + `}`,
		"server wildcard": `{"ledger":` + strings.Replace(tuple, srv, "*", 1) + `,"records":` + tuple + `}`,
		"not a user":      `{"ledger":` + strings.Replace(tuple, user, srv, 1) + `,"records":` + tuple + `}`,
		"not json":        `[`,
	} {
		t.Run("fail/"+name, func(t *testing.T) {
			if _, err := ParsePlaneQuery([]byte(body)); err == nil {
				t.Fatalf("%s accepted", body)
			}
		})
	}
}

func TestPrincipalOf(t *testing.T) {
	if got := principalOf([]string{"owner:local", "principal:local.bob", "profile:agent"}); got != "local.bob" {
		t.Fatalf("principalOf = %q", got)
	}
	if got := principalOf([]string{"profile:delivery"}); got != "" {
		t.Fatalf("principalOf(no principal) = %q", got)
	}
}

func TestDialerRefusesForeignAccount(t *testing.T) {
	for _, acct := range []string{"", "*", "AAT6LL2VLE3SZW5AIYXT5MZHX2I7BRWM5T4HBYVAKRQZSWH7JBFP3V7E.>"} {
		d := &Dialer{Minter: nil, Account: acct, Brokers: []string{"nats://127.0.0.1:1"}}
		if _, err := New(d, nil); err == nil {
			t.Fatalf("account %q accepted", acct)
		}
	}
}
