// Package connz is authd's account connection sweep: one account-scoped CONNZ request,
// $SYS.REQ.ACCOUNT.PING.CONNZ, over a data-account connection, and the grading of what comes
// back. The broker imports that subject into every account, and every server of the cluster
// answers it with the requester's own account's connections (nats-server events.go:
// accPingReqSubj, mapped to $SYS.REQ.ACCOUNT.<account>.CONNZ), so a data-account credential reads
// only the data account and authd needs no $SYS credential.
//
// Two parts of authd sweep: the plane claim's early reclaim (authd/service reclaim.go: is the
// holder's connection anywhere?) and the retirement barrier's containment
// (authd/internal/authority contain.go: is any connection of a retiring principal left?). Both
// need a conclusive answer, and both decide "none" only when every expected server answered:
//
//   - the server the sweeping connection is on (its INFO's server id);
//   - every server of the auth bucket stream's peer group (leader and replicas from the stream
//     info, by server name);
//   - as many distinct servers as the connection knows URLs (the configured brokers plus the
//     client URLs the cluster advertises in INFO, nc.Servers).
//
// A server answering twice counts once. Answers are collected for at most Window, and for Settle
// more once the expected set is complete, so a late answer still counts. Anything short of that
// is an *InconclusiveError (ErrInconclusive): never "none".
package connz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/space"
)

// MaxAnswer bounds one server's answer: a larger one is not a server's and is inconclusive.
const MaxAnswer = 1 << 20

// ErrInconclusive is what every *InconclusiveError is: the sweep proves nothing.
var ErrInconclusive = errors.New("connz: the sweep was inconclusive")

// InconclusiveError says why a sweep or an answer proves nothing.
type InconclusiveError struct{ Reason string }

func (e *InconclusiveError) Error() string { return ErrInconclusive.Error() + ": " + e.Reason }

// Is makes errors.Is(err, ErrInconclusive) true.
func (e *InconclusiveError) Is(target error) bool { return target == ErrInconclusive }

// Inconclusive is an *InconclusiveError with a formatted reason.
func Inconclusive(format string, a ...any) error {
	return &InconclusiveError{Reason: fmt.Sprintf(format, a...)}
}

// Conn is one listed connection, as far as a sweep reads it. AuthorizedUser, NameTag and Tags
// are present only when the request asked for auth.
type Conn struct {
	Cid            uint64   `json:"cid"`
	Name           string   `json:"name"`
	AuthorizedUser string   `json:"authorized_user"`
	NameTag        string   `json:"name_tag"`
	Tags           []string `json:"tags"`
}

// Answer is one server's answer (nats-server ServerAPIResponse around a Connz), decoded.
type Answer struct {
	// ServerID is the answering server's id, never empty; ServerName its name.
	ServerID, ServerName string
	// NumConns is the count the server reports for this page; Total its whole count and Offset
	// the page's start (for paging).
	NumConns, Total, Offset int
	Conns                   []Conn
}

type wireAnswer struct {
	Server struct {
		Name string `json:"name"`
		ID   string `json:"id"`
	} `json:"server"`
	Data *struct {
		ID       string `json:"server_id"`
		NumConns int    `json:"num_connections"`
		Total    int    `json:"total"`
		Offset   int    `json:"offset"`
		Conns    []Conn `json:"connections"`
	} `json:"data"`
	Error *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// Decode reads one server's answer, untrusted bytes. It refuses, as inconclusive, an answer over
// MaxAnswer bytes, one that is not JSON of the answer's shape, one without a server id, an error
// answer and one with no connection list of the answering server's own.
func Decode(data []byte) (Answer, error) {
	if len(data) > MaxAnswer {
		return Answer{}, Inconclusive("an answer of %d bytes", len(data))
	}
	var a wireAnswer
	if err := json.Unmarshal(data, &a); err != nil || a.Server.ID == "" {
		return Answer{}, Inconclusive("a malformed answer (%v)", err)
	}
	if a.Error != nil {
		return Answer{}, Inconclusive("server %s answered an error: %d %.200s", a.Server.Name, a.Error.Code, a.Error.Description)
	}
	if a.Data == nil || (a.Data.ID != "" && a.Data.ID != a.Server.ID) {
		return Answer{}, Inconclusive("server %s answered no connection list of its own", a.Server.Name)
	}
	return Answer{
		ServerID: a.Server.ID, ServerName: a.Server.Name,
		NumConns: a.Data.NumConns, Total: a.Data.Total, Offset: a.Data.Offset, Conns: a.Data.Conns,
	}, nil
}

// Expect is the server set a conclusive sweep must hear from.
type Expect struct {
	Connected string   // the server id of the sweeping connection
	Count     int      // distinct server URLs that connection knows
	Peers     []string // server names of the auth bucket stream's peer group
}

// Expected reads the server set from nc and the info of stream (the auth bucket's stream).
func Expected(ctx context.Context, nc *nats.Conn, stream string, window time.Duration) (Expect, error) {
	var e Expect
	if e.Connected = nc.ConnectedServerId(); e.Connected == "" {
		return e, errors.New("this connection is not connected")
	}
	hosts := map[string]bool{}
	for _, s := range nc.Servers() {
		if u, err := url.Parse(s); err == nil && u.Host != "" {
			hosts[strings.ToLower(u.Host)] = true
		}
	}
	e.Count = max(1, len(hosts))
	js, err := jetstream.New(nc)
	if err != nil {
		return e, err
	}
	octx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	st, err := js.Stream(octx, stream)
	if err != nil {
		return e, fmt.Errorf("stream info of %s: %w", stream, err)
	}
	if ci := st.CachedInfo().Cluster; ci != nil {
		if ci.Leader != "" {
			e.Peers = append(e.Peers, ci.Leader)
		}
		for _, r := range ci.Replicas {
			if r != nil && r.Name != "" {
				e.Peers = append(e.Peers, r.Name)
			}
		}
	}
	return e, nil
}

// Missing says which expected servers did not answer ("" when none): answered maps server id to
// server name.
func (e Expect) Missing(answered map[string]string) string {
	var why []string
	if _, ok := answered[e.Connected]; !ok {
		why = append(why, "the server this connection is on ("+e.Connected+") did not answer")
	}
	names := map[string]bool{}
	for _, n := range answered {
		names[n] = true
	}
	var peers []string
	for _, p := range e.Peers {
		if !names[p] {
			peers = append(peers, p)
		}
	}
	if len(peers) > 0 {
		why = append(why, "the auth bucket's stream peers "+strings.Join(peers, ", ")+" did not answer")
	}
	if len(answered) < e.Count {
		why = append(why, fmt.Sprintf("%d of the %d servers this connection knows answered", len(answered), e.Count))
	}
	return strings.Join(why, "; ")
}

// Sweeper sends one account CONNZ request per Sweep over NC and waits for the servers.
type Sweeper struct {
	NC *nats.Conn
	// Stream is the auth bucket's stream, KV_cotal_auth_<t>: its peers must answer.
	Stream string
	// Window bounds how long a sweep waits for every expected server; Settle is how long it
	// still listens once they all answered.
	Window, Settle time.Duration
}

// Sweep publishes body (a ConnzOptions object) on space.AccountConnzPing and hands each answer's
// bytes to visit, which returns the answering server's id and name or an error that ends the
// sweep with that error. It returns nil only when every expected server answered; otherwise an
// *InconclusiveError naming who did not.
func (s Sweeper) Sweep(ctx context.Context, body []byte, visit func(data []byte) (id, name string, err error)) error {
	expect, err := Expected(ctx, s.NC, s.Stream, s.Window)
	if err != nil {
		return Inconclusive("the server set is unknown: %v", err)
	}
	inbox := s.NC.NewInbox()
	sub, err := s.NC.SubscribeSync(inbox)
	if err != nil {
		return Inconclusive("reply subscription: %v", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.NC.PublishRequest(space.AccountConnzPing, inbox, body); err != nil {
		return Inconclusive("CONNZ request: %v", err)
	}
	deadline := time.Now().Add(s.Window)
	answered := map[string]string{}
	var complete time.Time
	for {
		until := deadline
		if settled := complete.Add(s.Settle); !complete.IsZero() && settled.Before(until) {
			until = settled
		}
		wait := time.Until(until)
		if wait <= 0 {
			break
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return Inconclusive("%v", ctx.Err())
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
				break
			}
			return Inconclusive("reading answers: %v", err)
		}
		id, name, err := visit(m.Data)
		if err != nil {
			return err
		}
		answered[id] = name
		if complete.IsZero() && expect.Missing(answered) == "" {
			complete = time.Now()
		}
	}
	if why := expect.Missing(answered); why != "" {
		if last := s.NC.LastError(); last != nil && errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), "CONNZ") {
			return Inconclusive("the broker refused the CONNZ request (%v); %s", last, why)
		}
		return Inconclusive("%s within %v", why, s.Window)
	}
	return nil
}
