package service

// Early reclaim of a held plane claim (issue 22 row 6; seed 000 "Claim recovery order").
//
// The plane row names its holder: its instance id, the public user nkey of its data-account
// connection (the auth-plane rail's key, random per process and never shared) and that
// connection's name. A start that finds another incarnation's live row does not wait out the
// row's TTL when a connection-liveness sweep proves the holder gone:
//
//   - The sweep is one account-scoped CONNZ request, $SYS.REQ.ACCOUNT.PING.CONNZ, filtered on the
//     holder's user key (open connections only). The broker imports that subject into every
//     account and every server of the cluster answers it with the requester's own account's
//     connections (nats-server events.go: accPingReqSubj, mapped to
//     $SYS.REQ.ACCOUNT.<account>.CONNZ), so the data-account auth-plane credential reads only
//     the data account; upstream asks deliveryd's $SYS-holding admin rail instead (its oracle),
//     and authd holds no $SYS credential either way.
//   - The holder is live when any answer lists a connection of its user key (whatever its
//     name: the rail's proof connection counts too): the start refuses with PLANE_HELD and
//     ErrHolderLive.
//   - The holder is gone only when the sweep is conclusive: every server expected answered,
//     without error, and none listed it. authd expects (1) the server its own connection is on
//     (the INFO's server id), (2) every server of the auth bucket stream's peer group (leader
//     and replicas from the stream info, by server name), and (3) as many distinct servers as
//     the connection knows URLs: the configured brokers plus the client URLs the cluster
//     advertises in INFO (nc.Servers). A server answering twice counts once. Answers are
//     collected for at most sweepWindow, and for sweepSettle more once the expected set is
//     complete, so a late answer that lists the holder still refuses.
//   - Anything else is inconclusive and refuses (PLANE_HELD, ErrSweepInconclusive): a row that
//     names no user key (an older authd), a request the broker refused (no answer at all), a
//     server that answered with an error or malformed bytes, a missing expected server. The
//     refusal is fail-safe, not a verdict on the holder: retry, or wait for the row's TTL.
//   - The take is a compare-and-set at the revision read before the sweep (lease.Config.Reclaim),
//     so a holder that renewed meanwhile keeps its claim; a replaced holder finds its row Taken at
//     its next renewal and stops (ErrPlaneTaken).
//
// What the expected set cannot see. The advertised URLs follow the cluster's routes: a server
// that is down or cut off from the others is withdrawn from them, while configured brokers
// stay. A server that is down holds no connection, so that loss is harmless; a server that is up
// but partitioned from the rest, holding the holder's connection, is missed unless it is a peer
// of the auth bucket's stream (at three replicas on three servers, every server is) or is named
// in brokers. So on a cluster larger than the bucket's replica count, list every server in
// brokers. Servers that do not advertise (no_advertise) are seen only through brokers too. URLs
// that name one server twice (a host name and its address) overcount, which only makes sweeps
// inconclusive. A holder connected through a leaf node whose server does not answer is not
// covered. In each of these cases the holder still stops answering callouts at its fence (the
// TTL less the margin) at the latest, and at once when its plane connection drops (planeGate).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/internal/connz"
	"github.com/cotalgo/cotal/pkg/lease"
)

// planeConnName names authd's data-account connection; the plane row carries it.
const planeConnName = "authd-plane"

// Why a held plane claim was not reclaimed; a PLANE_HELD *StartError wraps one of them when a
// sweep ran.
var (
	// ErrHolderLive: a server lists a connection of the holder's user key. Stop that authd.
	ErrHolderLive = errors.New("the holder's broker connection is live")
	// ErrSweepInconclusive: the sweep could not prove the holder gone (a server missing, an
	// error or malformed answer, a row naming no connection). Retry, or wait for the TTL.
	ErrSweepInconclusive = errors.New("the connection-liveness sweep was inconclusive")
)

// Sweep timing.
const (
	// sweepWindow bounds how long a sweep waits for every expected server's answer.
	sweepWindow = 2 * time.Second
	// sweepSettle is how long a sweep still listens once every expected server answered.
	sweepSettle = 200 * time.Millisecond
	// maxSweepAnswer bounds one server's answer (the broker's max payload bounds it too).
	maxSweepAnswer = connz.MaxAnswer
)

// planeSweep is the liveness sweep over authd's data-account connection (package connz does the
// request, the expected server set and the collection; this file grades).
type planeSweep struct {
	connz.Sweeper
}

func newPlaneSweep(nc *nats.Conn, bucket string) planeSweep {
	return planeSweep{connz.Sweeper{NC: nc, Stream: "KV_" + bucket, Window: sweepWindow, Settle: sweepSettle}}
}

// reclaim is lease.Config.Reclaim: nil only on a conclusive sweep that lists no connection of
// the holder.
func (p planeSweep) reclaim(ctx context.Context, held lease.Row) error {
	return p.sweep(ctx, held.User)
}

// sweep asks every server for the open connections of user and grades the answers (see the file
// comment): nil when conclusively none, an ErrHolderLive or ErrSweepInconclusive error otherwise.
func (p planeSweep) sweep(ctx context.Context, user string) error {
	if !nkeys.IsValidPublicUserKey(user) {
		return inconclusive("the row names no holder connection (no user key: written by an authd without an instance identity?)")
	}
	body, _ := json.Marshal(struct {
		User string `json:"user"`
	}{user}) // state 0: open connections only; auth false: no JWT in the answer
	err := p.Sweep(ctx, body, gradeAnswer)
	var ie *connz.InconclusiveError
	if errors.As(err, &ie) {
		return inconclusive("%s", ie.Reason)
	}
	return err
}

// maxListedNames bounds the connections a live-holder refusal names.
const maxListedNames = 5

// gradeAnswer grades one server's answer to the sweep's CONNZ request, untrusted bytes: the
// answering server's id (never empty) and name when it lists no connection of the holder's user
// key; an ErrHolderLive error when it lists one; an ErrSweepInconclusive error when it proves
// nothing (oversized, malformed, no server id, an error answer, no connection list of its own).
func gradeAnswer(data []byte) (id, name string, err error) {
	a, err := connz.Decode(data)
	if err != nil {
		var ie *connz.InconclusiveError
		if errors.As(err, &ie) {
			return "", "", inconclusive("%s", ie.Reason)
		}
		return "", "", inconclusive("%v", err)
	}
	if len(a.Conns) > 0 || a.NumConns > 0 {
		names := make([]string, 0, len(a.Conns))
		for _, c := range a.Conns {
			names = append(names, strconv.Quote(c.Name)+" (cid "+strconv.FormatUint(c.Cid, 10)+")")
		}
		sort.Strings(names)
		if len(names) > maxListedNames { // the refusal names a few, not whatever a server sent
			names = append(names[:maxListedNames], "...")
		}
		return "", "", fmt.Errorf("%w: server %.80s lists %d connection(s) of its user key: %.1000s", ErrHolderLive, a.ServerName, max(a.NumConns, len(a.Conns)), strings.Join(names, ", "))
	}
	return a.ServerID, a.ServerName, nil
}

// inconclusive is an ErrSweepInconclusive error saying why.
func inconclusive(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrSweepInconclusive}, a...)...)
}

// planeHeld is the PLANE_HELD refusal for a held claim, in three operator faces: a live holder
// (stop it), this instance's own identity held by a live process (a shared or copied state
// directory), and an inconclusive sweep (fail-safe: retry or wait for the TTL, never "stop the
// other one").
func planeHeld(cfg *config.Config, instance string, he *lease.HeldError, err error) *StartError {
	who := he.Row.Holder
	if he.Row.Instance != "" {
		who += " (instance " + he.Row.Instance + ")"
	}
	sp := strconv.Quote(cfg.Space)
	var reason string
	switch {
	case errors.Is(err, ErrHolderLive) && he.Row.Instance == instance:
		reason = "this state directory's instance " + instance + " already serves space " + sp + " in another process, " + who + ", whose broker connection is live: two processes share one instance identity (a state directory shared or copied); stop the other one"
	case errors.Is(err, ErrHolderLive):
		reason = "another authd serves space " + sp + ": " + who + " holds its plane claim and its broker connection is live; stop it first"
	case errors.Is(err, ErrSweepInconclusive):
		reason = "the plane claim of space " + sp + " is held by " + who + ", and the connection-liveness sweep could not prove that holder gone; this refusal is fail-safe: retry, or wait for its claim to expire (the holder's plane_ttl after its last renewal); do not delete the row by hand"
	default:
		reason = "another authd serves space " + sp + ": " + who + " holds its plane claim; stop it, or wait for its claim to expire"
	}
	return &StartError{Code: CodePlaneHeld, Reason: reason, Err: err, Details: he.Details()}
}

// logReclaim logs the row this start replaced, if it reclaimed one.
func (s *Service) logReclaim() {
	if r := s.plane.Reclaimed(); r != nil {
		s.log.Warn("plane claim reclaimed before its TTL: the sweep found the holder's connection on no server",
			"holder", r.Holder, "instance", r.Instance, "incarnation", r.Incarnation, "conn", r.Conn, "since", r.Since)
	}
}

// planeGate is the holder's side of early reclaim. A successor may take the claim as soon as a
// sweep finds this holder's plane connection on no server, and that is also the case while the
// connection is between two servers (reconnecting). So the callout answers only while the plane
// connection is connected and the claim was written (renewed, re-created or marked ready) after
// the connection's latest reconnect: a reconnect closes the gate and asks keepPlane for an
// immediate renewal (kick), whose stored write opens it again and whose Taken stops the service.
// A holder replaced during a reconnect therefore answers no callout after it.
type planeGate struct {
	nc    *nats.Conn
	plane *lease.Lease
	kick  chan struct{}

	mu    sync.Mutex
	seen  uint64    // the connection's reconnect count last seen
	since time.Time // when that count was first seen; zero before any reconnect
}

// newPlaneGate watches nc's reconnects (its reconnect handler is kept and called first).
func newPlaneGate(nc *nats.Conn, plane *lease.Lease) *planeGate {
	g := &planeGate{nc: nc, plane: plane, kick: make(chan struct{}, 1), seen: nc.Stats().Reconnects}
	prev := nc.ReconnectHandler()
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		g.check()
	})
	return g
}

// check notes a new reconnect (and kicks a renewal) and returns when the latest was seen.
func (g *planeGate) check() time.Time {
	n := g.nc.Stats().Reconnects
	g.mu.Lock()
	defer g.mu.Unlock()
	if n != g.seen {
		g.seen, g.since = n, time.Now()
		select {
		case g.kick <- struct{}{}:
		default:
		}
	}
	return g.since
}

// open is callout.Config.Gate.
func (g *planeGate) open() bool {
	if !g.nc.IsConnected() {
		return false
	}
	since := g.check()
	return since.IsZero() || g.plane.LastWritten().After(since)
}

// kicked is what keepPlane waits on besides its timer: a reconnect asks for a renewal now.
func (g *planeGate) kicked() <-chan struct{} {
	if g == nil {
		return nil
	}
	return g.kick
}
