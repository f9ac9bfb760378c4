// Package evict is deliveryd's $SYS executor (reference/delivery.md §4, upstream evict-exec.ts):
// live eviction of a principal's connections, a principal's liveness, and the plane-claim
// liveness oracle, each read from the broker's connection list of the daemon's own data account.
//
// Two credentials, never one broad system user that both enumerates and kills: the
// membership-observer requests $SYS.REQ.ACCOUNT.<acct>.CONNZ of the one account, the
// connection-evictor may only publish $SYS.REQ.SERVER.*.KICK. Both are minted by signerd per call
// on deliveryd's identity (only deliveryd's policy may mint them), each on its own connection
// with its own in-memory key, closed and wiped when the call ends. The account is pinned at start
// to the daemon's own credential account, and the observer's credential must name it.
//
// Semantics, stated in every result rather than inferred: a KICK has no per-connection ack, so an
// eviction succeeds only when a re-scan finds the principal gone (VerifiedGone). The account
// CONNZ request fans out to every server of a cluster, each answering for its own connections; a
// scan is complete only when every answer is whole (not truncated, not in error) and at least as
// many distinct servers answered as the observer's connection knows of (its configured URLs and
// the ones the cluster advertised). A server down or silent makes the verdicts "unknown", never
// "gone", and callers must fail closed. (A cluster member the client was never told of cannot be
// counted: deployments that turn off advertising must list every node.) A principal with no live
// connection is an idempotent success.
package evict

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/space"
)

// Defaults of a scan and of the verification after a KICK.
const (
	// ScanWait bounds one scan; ScanSettle is how long it waits for further servers' answers
	// after the last one.
	ScanWait   = 2 * time.Second
	ScanSettle = 150 * time.Millisecond
	// ScanLimit is the page size asked of each server; a server reporting more connections than
	// it returned makes the scan incomplete.
	ScanLimit = 4096
	// VerifyRounds re-scans after a KICK until the principal is gone.
	VerifyRounds = 5
	// VerifyPause separates the verification rounds.
	VerifyPause = 100 * time.Millisecond
)

// ErrNotWired is the refusal when no executor is configured.
var ErrNotWired = errors.New("no executor wired (this delivery daemon holds no $SYS credential)")

// Executor runs the $SYS verbs.
type Executor struct {
	d   *Dialer
	log *slog.Logger
}

// New checks d and returns an executor over it.
func New(d *Dialer, log *slog.Logger) (*Executor, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Executor{d: d, log: log}, nil
}

// Connection is one live connection of the data account, as the scan attributes it.
type Connection struct {
	Server    string `json:"serverId"`
	Cid       uint64 `json:"cid"`
	User      string `json:"userNkey"`
	Principal string `json:"principal,omitempty"`
}

// Scan is one read of the account's connections.
type Scan struct {
	Connections []Connection
	// Complete: every answer arrived whole, from at least as many servers as the connection
	// knows of.
	Complete bool
	// Servers is how many distinct servers answered.
	Servers int
}

// EvictResult is evictPrincipal's data.
type EvictResult struct {
	Principal    string `json:"principal"`
	Kicked       int    `json:"kicked"`
	Remaining    int    `json:"remaining"`
	VerifiedGone bool   `json:"verifiedGone"`
	ScanComplete bool   `json:"scanComplete"`
}

// LivenessResult is principalLiveness' data: live, gone, or unknown when the scan was not
// complete (never gone on a partial read).
type LivenessResult struct {
	Principal    string `json:"principal"`
	Verdict      string `json:"verdict"`
	Connections  int    `json:"connections"`
	ScanComplete bool   `json:"scanComplete"`
}

// Verdicts.
const (
	Live    = "live"
	Gone    = "gone"
	Unknown = "unknown"
)

// ConnTuple names one connection: the server, its connection id and the user key it holds.
type ConnTuple struct {
	Server string `json:"serverId"`
	Cid    uint64 `json:"cid"`
	User   string `json:"userNkey"`
}

// PlaneQuery is planeConnLiveness' query: exactly the two connections of a plane claim.
type PlaneQuery struct {
	Ledger  *ConnTuple `json:"ledger"`
	Records *ConnTuple `json:"records"`
}

// PlaneResult is planeConnLiveness' data.
type PlaneResult struct {
	Ledger       string `json:"ledger"`
	Records      string `json:"records"`
	ScanComplete bool   `json:"scanComplete"`
}

// ParsePrincipal checks owner.actor against the grammars.
func ParsePrincipal(p string) error {
	owner, actor, ok := strings.Cut(p, ".")
	if !ok {
		return fmt.Errorf("principal %.64q is not owner.actor", p)
	}
	if err := space.ValidateOwner(owner); err != nil {
		return err
	}
	return space.ValidateActor(actor)
}

// ParsePlaneQuery decodes a closed {ledger, records} query of two connection tuples.
func ParsePlaneQuery(raw []byte) (PlaneQuery, error) {
	var q PlaneQuery
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		return PlaneQuery{}, errors.New("the query must be exactly {ledger, records} connection tuples ({serverId, cid, userNkey})")
	}
	for _, t := range []*ConnTuple{q.Ledger, q.Records} {
		if t == nil || t.Cid == 0 || !nkey.IsUser(t.User) {
			return PlaneQuery{}, errors.New("the query must be exactly {ledger, records} connection tuples ({serverId, cid, userNkey})")
		}
		if _, err := space.SysKick(t.Server); err != nil {
			return PlaneQuery{}, fmt.Errorf("query: %w", err)
		}
	}
	return q, nil
}

// Evict kicks every connection of principal in the data account and verifies by re-scanning.
func (e *Executor) Evict(ctx context.Context, principal string) (EvictResult, error) {
	res := EvictResult{Principal: principal}
	if err := ParsePrincipal(principal); err != nil {
		return res, err
	}
	obs, err := e.d.Dial(ctx, signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER, "deliveryd-evict-observer", false)
	if err != nil {
		return res, err
	}
	defer obs.Close()
	scan, err := ScanAccount(ctx, obs.Conn, e.d.Account)
	if err != nil {
		return res, err
	}
	targets := scan.of(principal)
	if len(targets) == 0 {
		res.VerifiedGone, res.ScanComplete = scan.Complete, scan.Complete
		return res, nil
	}
	ev, err := e.d.Dial(ctx, signerv1.Profile_PROFILE_CONNECTION_EVICTOR, "deliveryd-evict-kick", false)
	if err != nil {
		return res, err
	}
	defer ev.Close()
	for _, c := range targets {
		if err := Kick(ctx, ev.Conn, c.Server, c.Cid); err != nil {
			e.log.Warn("evictPrincipal: kick failed", "principal", principal, "server", c.Server, "cid", c.Cid, "err", err)
			continue
		}
		res.Kicked++
	}
	for round := 0; round < VerifyRounds; round++ {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(VerifyPause):
		}
		scan, err = ScanAccount(ctx, obs.Conn, e.d.Account)
		if err != nil {
			continue
		}
		res.Remaining, res.ScanComplete = len(scan.of(principal)), scan.Complete
		if res.Remaining == 0 && scan.Complete {
			res.VerifiedGone = true
			break
		}
	}
	e.log.Info("evictPrincipal", "principal", principal, "kicked", res.Kicked, "remaining", res.Remaining, "verifiedGone", res.VerifiedGone)
	return res, nil
}

// PrincipalLiveness says whether principal holds a live connection in the data account.
func (e *Executor) PrincipalLiveness(ctx context.Context, principal string) (LivenessResult, error) {
	res := LivenessResult{Principal: principal, Verdict: Unknown}
	if err := ParsePrincipal(principal); err != nil {
		return res, err
	}
	scan, err := e.scan(ctx)
	if err != nil {
		return res, err
	}
	res.Connections, res.ScanComplete = len(scan.of(principal)), scan.Complete
	switch {
	case res.Connections > 0:
		res.Verdict = Live
	case scan.Complete:
		res.Verdict = Gone
	}
	return res, nil
}

// PlaneConnLiveness grades the two connections of a plane claim: live when listed with the same
// user key, gone when a complete scan does not list them, unknown otherwise.
func (e *Executor) PlaneConnLiveness(ctx context.Context, q PlaneQuery) (PlaneResult, error) {
	scan, err := e.scan(ctx)
	if err != nil {
		return PlaneResult{Ledger: Unknown, Records: Unknown}, err
	}
	grade := func(t *ConnTuple) string {
		for _, c := range scan.Connections {
			if c.Server == t.Server && c.Cid == t.Cid && c.User == t.User {
				return Live
			}
		}
		if scan.Complete {
			return Gone
		}
		return Unknown
	}
	return PlaneResult{Ledger: grade(q.Ledger), Records: grade(q.Records), ScanComplete: scan.Complete}, nil
}

func (e *Executor) scan(ctx context.Context) (Scan, error) {
	obs, err := e.d.Dial(ctx, signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER, "deliveryd-liveness-observer", false)
	if err != nil {
		return Scan{}, err
	}
	defer obs.Close()
	return ScanAccount(ctx, obs.Conn, e.d.Account)
}

func (s Scan) of(principal string) []Connection {
	var out []Connection
	for _, c := range s.Connections {
		if c.Principal == principal {
			out = append(out, c)
		}
	}
	return out
}

// connzAnswer is the part of a server's CONNZ answer a scan reads.
type connzAnswer struct {
	Server struct {
		ID string `json:"id"`
	} `json:"server"`
	Data *struct {
		Total       int `json:"total"`
		Connections []struct {
			Cid            uint64   `json:"cid"`
			AuthorizedUser string   `json:"authorized_user"`
			Account        string   `json:"account"`
			Tags           []string `json:"tags"`
		} `json:"connections"`
	} `json:"data"`
	Error *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// maxAnswer bounds one server's CONNZ answer: 64 MiB, the largest payload a NATS server can be
// configured to carry (a page of ScanLimit connections with their auth fields is far below it).
// A larger answer is not a server's and counts as a malformed one.
const maxAnswer = 64 << 20

// answer is one server's CONNZ answer as a scan keeps it.
type answer struct {
	// Server is the answering server's id, never empty.
	Server string
	// Connections are its connections of the account (or naming no account), attributed.
	Connections []Connection
	// Whole: the server listed every connection it counts (not truncated at the page size).
	Whole bool
}

// decodeAnswer reads one server's CONNZ answer, untrusted bytes, keeping the connections of
// account. ok is false for an answer a scan cannot use (oversized, malformed, an error answer,
// no connection list, no server id): such an answer makes the scan incomplete.
func decodeAnswer(data []byte, account string) (answer, bool) {
	if len(data) > maxAnswer {
		return answer{}, false
	}
	var a connzAnswer
	if err := json.Unmarshal(data, &a); err != nil || a.Data == nil || a.Error != nil || a.Server.ID == "" {
		return answer{}, false
	}
	out := answer{Server: a.Server.ID, Whole: a.Data.Total <= len(a.Data.Connections)}
	for _, c := range a.Data.Connections {
		if c.Account != "" && c.Account != account {
			continue
		}
		out.Connections = append(out.Connections, Connection{
			Server: a.Server.ID, Cid: c.Cid, User: c.AuthorizedUser, Principal: principalOf(c.Tags),
		})
	}
	return out, true
}

// tally folds the answers of one scan of account.
type tally struct {
	account  string
	scan     Scan
	answered map[string]bool
}

func newTally(account string) *tally {
	return &tally{account: account, scan: Scan{Complete: true}, answered: map[string]bool{}}
}

// add folds one answer in: an unusable or partial answer makes the scan incomplete, and only a
// usable one counts its server as answered.
func (t *tally) add(data []byte) {
	a, ok := decodeAnswer(data, t.account)
	if !ok {
		t.scan.Complete = false
		return
	}
	t.answered[a.Server] = true
	if !a.Whole {
		t.scan.Complete = false
	}
	t.scan.Connections = append(t.scan.Connections, a.Connections...)
}

// result is the scan so far, Servers counting the distinct servers that answered.
func (t *tally) result() Scan {
	s := t.scan
	s.Servers = len(t.answered)
	return s
}

// ScanAccount requests the CONNZ of account on nc (a membership-observer connection) and gathers
// every server's answer until ScanSettle passes without one, or ScanWait.
func ScanAccount(ctx context.Context, nc *nats.Conn, account string) (Scan, error) {
	subj, err := space.SysAccountConnz(account)
	if err != nil {
		return Scan{}, err
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return Scan{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(map[string]any{"auth": true, "limit": ScanLimit})
	if err := nc.PublishRequest(subj, inbox, body); err != nil {
		return Scan{}, err
	}
	if err := nc.Flush(); err != nil {
		return Scan{}, err
	}
	deadline := time.Now().Add(ScanWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	t := newTally(account)
	wait := time.Until(deadline)
	for {
		m, err := sub.NextMsg(wait)
		if err != nil {
			if errors.Is(err, nats.ErrTimeout) {
				break
			}
			return Scan{}, err
		}
		t.add(m.Data)
		wait = min(ScanSettle, time.Until(deadline))
		if wait <= 0 {
			break
		}
	}
	scan := t.result()
	if scan.Servers == 0 {
		return Scan{}, errors.New("no server answered the connection scan")
	}
	// The answers prove nothing of a server this connection knows of (configured or discovered)
	// that did not answer: fewer answering servers than known ones is incomplete.
	if len(nc.Servers()) > scan.Servers {
		scan.Complete = false
	}
	return scan, nil
}

// principalOf reads the principal tag profiles put on every principal credential.
func principalOf(tags []string) string {
	for _, t := range tags {
		if p, ok := strings.CutPrefix(t, "principal:"); ok {
			return p
		}
	}
	return ""
}

// Kick asks server to close connection cid, on nc (a connection-evictor connection).
func Kick(ctx context.Context, nc *nats.Conn, server string, cid uint64) error {
	subj, err := space.SysKick(server)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]uint64{"cid": cid})
	ctx, cancel := context.WithTimeout(ctx, ScanWait)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, subj, body)
	if err != nil {
		return err
	}
	var a connzAnswer
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return fmt.Errorf("kick answer: %w", err)
	}
	if a.Error != nil {
		return fmt.Errorf("kick refused: %s", a.Error.Description)
	}
	return nil
}
