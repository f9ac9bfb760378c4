package connz

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const (
	srv   = "NDJWE4SOUJOJT2TY5Y2YQEOAHGAK5VIGXTGKWJSFHVCII4ITI3LBHBUV"
	other = "NAQYCFDX5BVI6NWOEZHR3OEDGQ4YOOXUX2WC6ZZZHFRDNQ3IRJMW6ZTB"
)

// page is an answer to an auth CONNZ request as nats-server writes it: one page of two
// connections out of five.
var page = `{"server":{"name":"n1","id":"` + srv + `"},"data":{"server_id":"` + srv + `","num_connections":2,"total":5,"offset":2,"limit":2,"connections":[` +
	`{"cid":4,"name":"abc-suffix0123","authorized_user":"u_x-probe","name_tag":"u_x-probe","tags":["profile:agent"]},` +
	`{"cid":5,"name":"authd-plane","authorized_user":"UABC"}]}}`

func TestDecode(t *testing.T) {
	a, err := Decode([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	if a.ServerID != srv || a.ServerName != "n1" || a.Total != 5 || a.Offset != 2 || a.NumConns != 2 || len(a.Conns) != 2 ||
		a.Conns[0].NameTag != "u_x-probe" || a.Conns[0].AuthorizedUser != "u_x-probe" || a.Conns[0].Name != "abc-suffix0123" || a.Conns[1].Cid != 5 {
		t.Fatalf("Decode = %+v", a)
	}
	for name, in := range map[string]string{
		"error":      `{"server":{"name":"n1","id":"` + srv + `"},"error":{"code":500,"description":"x"}}`,
		"another":    strings.Replace(page, `"server_id":"`+srv+`"`, `"server_id":"`+other+`"`, 1),
		"no data":    `{"server":{"id":"` + srv + `"}}`,
		"no id":      strings.Replace(page, `"id":"`+srv+`"`, `"id":""`, 1),
		"not json":   `nope`,
		"wrong type": strings.Replace(page, `"total":5`, `"total":"5"`, 1),
		"oversized":  `{"server":{"id":"x"},"data":{},"pad":"` + strings.Repeat("a", MaxAnswer) + `"}`,
	} {
		if _, err := Decode([]byte(in)); !errors.Is(err, ErrInconclusive) {
			t.Errorf("%s: Decode = %v, want ErrInconclusive", name, err)
		}
	}
}

func TestMissing(t *testing.T) {
	e := Expect{Connected: srv, Count: 2, Peers: []string{"n1", "n2"}}
	if got := e.Missing(map[string]string{srv: "n1", other: "n2"}); got != "" {
		t.Fatalf("Missing with every server = %q", got)
	}
	got := e.Missing(map[string]string{other: "n2"})
	for _, want := range []string{"(" + srv + ") did not answer", "peers n1 did not answer", "1 of the 2 servers"} {
		if !strings.Contains(got, want) {
			t.Fatalf("Missing = %q, want it to say %q", got, want)
		}
	}
}

// FuzzDecode: an answer is untrusted bytes. Decode either refuses it as inconclusive or returns
// a server id that the bytes carry, answering for itself, and no more connections than listed.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(page))
	f.Add([]byte(`{"server":{"id":"s"},"data":{"num_connections":-1,"connections":null}}`))
	f.Add([]byte(`{"server":{"id":"s"},"data":null,"error":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrInconclusive) {
				t.Fatalf("refusal %v is not inconclusive", err)
			}
			return
		}
		var ref struct {
			Server struct {
				ID string `json:"id"`
			} `json:"server"`
			Data *struct {
				ID    string            `json:"server_id"`
				Conns []json.RawMessage `json:"connections"`
			} `json:"data"`
		}
		if err := json.Unmarshal(b, &ref); err != nil || ref.Data == nil || ref.Server.ID != a.ServerID || a.ServerID == "" {
			t.Fatalf("accepted %q as %+v", b, a)
		}
		if ref.Data.ID != "" && ref.Data.ID != a.ServerID || len(ref.Data.Conns) != len(a.Conns) {
			t.Fatalf("accepted %q as %+v", b, a)
		}
	})
}
