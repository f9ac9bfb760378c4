package service

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const (
	gradeServer = "NDJWE4SOUJOJT2TY5Y2YQEOAHGAK5VIGXTGKWJSFHVCII4ITI3LBHBUV"
	gradeOther  = "NAQYCFDX5BVI6NWOEZHR3OEDGQ4YOOXUX2WC6ZZZHFRDNQ3IRJMW6ZTB"
)

// Answers as nats-server writes them to $SYS.REQ.ACCOUNT.PING.CONNZ filtered on a user key
// (ServerAPIResponse around a Connz).
var (
	gradeNone = `{"server":{"name":"n1","host":"0.0.0.0","id":"` + gradeServer + `","ver":"2.11.0","seq":3,"time":"2026-12-02T11:00:00Z"},` +
		`"data":{"server_id":"` + gradeServer + `","now":"2026-12-02T11:00:00Z","num_connections":0,"total":0,"offset":0,"limit":1024,"connections":[]}}`
	gradeListed = strings.Replace(strings.Replace(gradeNone, `"num_connections":0,"total":0`, `"num_connections":1,"total":1`, 1),
		`"connections":[]`, `"connections":[{"cid":4,"kind":"Client","type":"nats","name":"authd-plane","lang":"go"}]`, 1)
	gradeError = `{"server":{"name":"n1","id":"` + gradeServer + `"},"error":{"code":500,"description":"connz failed"}}`
)

func TestGradeAnswer(t *testing.T) {
	t.Run("ok/no connection listed", func(t *testing.T) {
		id, name, err := gradeAnswer([]byte(gradeNone))
		if err != nil || id != gradeServer || name != "n1" {
			t.Fatalf("gradeAnswer = %q, %q, %v", id, name, err)
		}
	})
	t.Run("ok/no data server id", func(t *testing.T) {
		id, _, err := gradeAnswer([]byte(strings.Replace(gradeNone, `"server_id":"`+gradeServer+`",`, ``, 1)))
		if err != nil || id != gradeServer {
			t.Fatalf("gradeAnswer = %q, %v", id, err)
		}
	})
	for name, in := range map[string]string{
		"listed":           gradeListed,
		"counted only":     strings.Replace(gradeNone, `"num_connections":0`, `"num_connections":2`, 1),
		"listed uncounted": strings.Replace(gradeListed, `"num_connections":1`, `"num_connections":0`, 1),
	} {
		t.Run("fail/holder live: "+name, func(t *testing.T) {
			if _, _, err := gradeAnswer([]byte(in)); !errors.Is(err, ErrHolderLive) || !strings.Contains(err.Error(), "n1") {
				t.Fatalf("gradeAnswer = %v; want ErrHolderLive naming n1", err)
			}
		})
	}
	for name, in := range map[string]string{
		"error answer":    gradeError,
		"error with data": strings.Replace(gradeNone, `"data":`, `"error":{"code":503},"data":`, 1),
		"another's list":  strings.Replace(gradeNone, `"server_id":"`+gradeServer+`"`, `"server_id":"`+gradeOther+`"`, 1),
		"no data":         `{"server":{"name":"n1","id":"` + gradeServer + `"}}`,
		"no server id":    strings.Replace(gradeNone, `"id":"`+gradeServer+`"`, `"id":""`, 1),
		"cut short":       gradeNone[:len(gradeNone)/2],
		"not json":        `garbage`,
		"wrong type":      strings.Replace(gradeNone, `"num_connections":0`, `"num_connections":"0"`, 1),
		"oversized":       `{"server":{"id":"x"},"data":{},"pad":"` + strings.Repeat("a", maxSweepAnswer) + `"}`,
	} {
		t.Run("fail/inconclusive: "+name, func(t *testing.T) {
			if id, _, err := gradeAnswer([]byte(in)); !errors.Is(err, ErrSweepInconclusive) || id != "" {
				t.Fatalf("gradeAnswer = %q, %v; want ErrSweepInconclusive", id, err)
			}
		})
	}
}

// FuzzGradeAnswer: a server's answer to the sweep is untrusted bytes. The grade is exactly one of
// a server that lists no connection of the holder (a non-empty id), ErrHolderLive, or
// ErrSweepInconclusive; never a pass for an answer that lists a connection.
func FuzzGradeAnswer(f *testing.F) {
	f.Add([]byte(gradeNone))
	f.Add([]byte(gradeListed))
	f.Add([]byte(gradeError))
	f.Add([]byte(gradeNone[:len(gradeNone)/2]))
	f.Add([]byte(strings.Replace(gradeNone, `"server_id":"`+gradeServer+`"`, `"server_id":"`+gradeOther+`"`, 1)))
	f.Add([]byte(`{"server":{"id":"s"},"data":{"num_connections":-1,"connections":null}}`))
	f.Add([]byte(`{"server":{"id":"s"},"data":null,"error":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, name, err := gradeAnswer(data)
		if err != nil {
			live, inconc := errors.Is(err, ErrHolderLive), errors.Is(err, ErrSweepInconclusive)
			if live == inconc {
				t.Fatalf("grade %v: want exactly one of ErrHolderLive, ErrSweepInconclusive", err)
			}
			if id != "" || name != "" {
				t.Fatalf("grade %v still names server %q (%q)", err, id, name)
			}
			return
		}
		if id == "" {
			t.Fatal("passed an answer without a server id")
		}
		if len(data) > maxSweepAnswer {
			t.Fatalf("passed %d bytes", len(data))
		}
		// An independent read of the same bytes: it lists no connection and is no error answer.
		var ref struct {
			Server struct {
				ID string `json:"id"`
			} `json:"server"`
			Data *struct {
				ID       string            `json:"server_id"`
				NumConns int               `json:"num_connections"`
				Conns    []json.RawMessage `json:"connections"`
			} `json:"data"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(data, &ref); err != nil {
			t.Fatalf("passed bytes json rejects: %v", err)
		}
		if ref.Server.ID != id || ref.Data == nil || len(ref.Data.Conns) > 0 || ref.Data.NumConns > 0 {
			t.Fatalf("passed an answer that lists a connection or no list: %q", data)
		}
		if ref.Data.ID != "" && ref.Data.ID != id {
			t.Fatalf("passed server %q answering for %q", id, ref.Data.ID)
		}
		if len(ref.Error) > 0 && string(ref.Error) != "null" {
			t.Fatalf("passed an error answer: %s", ref.Error)
		}
	})
}
