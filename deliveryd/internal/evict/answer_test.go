package evict

import (
	"encoding/json"
	"strings"
	"testing"
)

const (
	ansAccount = "ADQ4FXGHQJ6Q5RFJ4MWOJRPCDO2XCVRAUEDXZW2U5SDSX5ACBNEMIWEF"
	ansOther   = "AAQYCFDX5BVI6NWOEZHR3OEDGQ4YOOXUX2WC6ZZZHFRDNQ3IRJMW6ZTB"
	ansServer  = "NDJWE4SOUJOJT2TY5Y2YQEOAHGAK5VIGXTGKWJSFHVCII4ITI3LBHBUV"
	ansUser    = "UCEHH4MFDD6UXDPV52I4RFFLYHEO4RCQW44YHHNMHUUSCXGUPAY54DOA"
)

// realAnswer is a server's answer as nats-server writes it (ServerAPIResponse around a Connz,
// auth requested), one connection of the account and one of another.
var realAnswer = `{"server":{"name":"n1","host":"0.0.0.0","id":"` + ansServer + `","ver":"2.11.0","jetstream":true,"flags":3,"seq":12,"time":"2026-12-02T11:00:00Z"},` +
	`"data":{"server_id":"` + ansServer + `","now":"2026-12-02T11:00:00Z","num_connections":2,"total":2,"offset":0,"limit":4096,"connections":[` +
	`{"cid":7,"kind":"Client","type":"nats","ip":"127.0.0.1","port":50123,"name":"web","lang":"go","version":"1.47.0","authorized_user":"` + ansUser + `","account":"` + ansAccount + `","tags":["owner:local","actor:bob","principal:local.bob","profile:agent"]},` +
	`{"cid":9,"kind":"Client","type":"nats","authorized_user":"` + ansUser + `","account":"` + ansOther + `","tags":["principal:local.eve"]}]}}`

func TestScanAnswer(t *testing.T) {
	t.Run("ok/real answer keeps the account's connection", func(t *testing.T) {
		a, ok := decodeAnswer([]byte(realAnswer), ansAccount)
		want := []Connection{{Server: ansServer, Cid: 7, User: ansUser, Principal: "local.bob"}}
		if !ok || a.Server != ansServer || !a.Whole || len(a.Connections) != 1 || a.Connections[0] != want[0] {
			t.Fatalf("decodeAnswer = %+v, %v; want %+v", a, ok, want)
		}
	})
	t.Run("ok/truncated answer is usable but not whole", func(t *testing.T) {
		a, ok := decodeAnswer([]byte(strings.Replace(realAnswer, `"total":2`, `"total":3`, 1)), ansAccount)
		if !ok || a.Whole {
			t.Fatalf("decodeAnswer = %+v, %v; want ok and not whole", a, ok)
		}
	})
	t.Run("ok/unaccounted connection is kept", func(t *testing.T) {
		a, ok := decodeAnswer([]byte(strings.Replace(realAnswer, `"account":"`+ansOther+`",`, ``, 1)), ansAccount)
		if !ok || len(a.Connections) != 2 || a.Connections[1].Cid != 9 {
			t.Fatalf("decodeAnswer = %+v, %v; want both connections", a, ok)
		}
	})
	for name, in := range map[string]string{
		"error answer":   `{"server":{"id":"` + ansServer + `"},"error":{"code":503,"description":"unavailable"}}`,
		"no data":        `{"server":{"id":"` + ansServer + `"}}`,
		"no server id":   strings.Replace(realAnswer, `"id":"`+ansServer+`"`, `"id":""`, 1),
		"cut short":      realAnswer[:len(realAnswer)/2],
		"not json":       `garbage`,
		"oversized":      `{"server":{"id":"x"},"data":{},"pad":"` + strings.Repeat("a", maxAnswer) + `"}`,
		"wrong type":     strings.Replace(realAnswer, `"cid":7`, `"cid":"7"`, 1),
		"negative cid":   strings.Replace(realAnswer, `"cid":7`, `"cid":-7`, 1),
		"data and error": strings.Replace(realAnswer, `"data":`, `"error":{"code":500},"data":`, 1),
	} {
		t.Run("fail/"+name, func(t *testing.T) {
			if a, ok := decodeAnswer([]byte(in), ansAccount); ok {
				t.Fatalf("decodeAnswer accepted %+v", a)
			}
			tl := newTally(ansAccount)
			tl.add([]byte(realAnswer))
			tl.add([]byte(in))
			if s := tl.result(); s.Complete || s.Servers != 1 || len(s.Connections) != 1 {
				t.Fatalf("scan after a bad answer = %+v; want incomplete, one server, one connection", s)
			}
		})
	}
	t.Run("ok/one server answering twice counts once", func(t *testing.T) {
		tl := newTally(ansAccount)
		tl.add([]byte(realAnswer))
		tl.add([]byte(realAnswer))
		if s := tl.result(); !s.Complete || s.Servers != 1 || len(s.Connections) != 2 {
			t.Fatalf("scan = %+v", s)
		}
	})
}

// FuzzDecodeAnswer: a server's CONNZ answer is untrusted bytes. Whatever decodes names its server,
// keeps exactly the connections of the account (or naming none), each attributed to that server;
// whatever does not makes the scan incomplete and counts no server.
func FuzzDecodeAnswer(f *testing.F) {
	f.Add([]byte(realAnswer), ansAccount)
	f.Add([]byte(`{"server":{"id":"`+ansServer+`"},"error":{"code":503,"description":"unavailable"}}`), ansAccount)
	f.Add([]byte(strings.Replace(realAnswer, `"total":2`, `"total":4096`, 1)), ansAccount)
	f.Add([]byte(realAnswer[:len(realAnswer)/2]), ansAccount)
	f.Add([]byte(realAnswer), ansOther)
	f.Add([]byte(`{"server":{"id":"s"},"data":{"connections":[{"cid":1},{"cid":2,"account":"x","tags":["principal:"]}]}}`), "")
	f.Add([]byte(`{"server":{"id":"s"},"data":null}`), "")
	f.Fuzz(func(t *testing.T, data []byte, account string) {
		a, ok := decodeAnswer(data, account)
		tl := newTally(account)
		tl.add(data)
		s := tl.result()
		if !ok {
			if s.Complete || s.Servers != 0 || len(s.Connections) != 0 {
				t.Fatalf("a rejected answer left the scan %+v", s)
			}
			return
		}
		if a.Server == "" {
			t.Fatal("accepted an answer without a server id")
		}
		if len(data) > maxAnswer {
			t.Fatalf("accepted %d bytes", len(data))
		}
		// An independent read of the same bytes: which connections belong to the account.
		var ref struct {
			Data struct {
				Total int `json:"total"`
				Conns []struct {
					Cid     uint64 `json:"cid"`
					User    string `json:"authorized_user"`
					Account string `json:"account"`
				} `json:"connections"`
			} `json:"data"`
		}
		if err := json.Unmarshal(data, &ref); err != nil {
			t.Fatalf("accepted bytes json rejects: %v", err)
		}
		var want []Connection
		for _, c := range ref.Data.Conns {
			if c.Account == "" || c.Account == account {
				want = append(want, Connection{Server: a.Server, Cid: c.Cid, User: c.User})
			}
		}
		if len(a.Connections) != len(want) {
			t.Fatalf("kept %d connections, the account has %d", len(a.Connections), len(want))
		}
		for i, c := range a.Connections {
			if c.Server != a.Server || c.Cid != want[i].Cid || c.User != want[i].User {
				t.Fatalf("connection %d = %+v, want %+v", i, c, want[i])
			}
		}
		if a.Whole != (ref.Data.Total <= len(ref.Data.Conns)) {
			t.Fatalf("whole = %v for total %d of %d listed", a.Whole, ref.Data.Total, len(ref.Data.Conns))
		}
		if s.Complete != a.Whole || s.Servers != 1 || len(s.Connections) != len(a.Connections) {
			t.Fatalf("scan %+v from answer %+v", s, a)
		}
	})
}
