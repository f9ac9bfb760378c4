// Command testagent is the agent managerd's tests spawn: a real Cotal agent, small enough to read
// in one sitting. It reads its launch material from the file $COTAL_LAUNCH_MATERIAL names (it must
// be a regular file of this uid, mode 0600 or stricter), connects to the broker with the
// credential in it, joins each of its subscribe channels through deliveryd, prints what it
// receives on its terminal, and posts each line it reads from its terminal.
//
// Usage:
//
//	testagent [--probe-every 5s]
//
// It prints one line per event on stdout (its terminal), and nothing else there:
//
//	connected <owner>.<actor> <uid>      first broker connection made
//	reconnected                          a later broker connection made
//	manager-alive                        the manager answered a liveness probe (after none had, or one went unanswered)
//	manager-unreachable                  a probe had no answer (no responder, or none before the next probe)
//	joined <channel> <generation>        deliveryd made it a durable member of <channel>
//	not-durable <channel> <reason>       deliveryd's join did not activate (it tries again)
//	ready                                every channel joined and its dlv_ durable bound: it is consuming
//	recv <channel> <from> <text>         a delivery (then acked); text with a control character is printed Go-quoted
//	sent <channel> <id>                  a terminal line posted to its first subscribe channel
//	error <what>                         a failure it keeps running through (a post the broker refused, say)
//	open <path> <result>                 the answer to a terminal line "!open <path>": ok, or the errno name (EACCES)
//	unix <path> <result>                 the answer to "!unix <path>": connecting to a Unix socket, ok or the errno name
//	tls <addr> <result>                  the answer to "!tls <host:port>": a TLS handshake without a client
//	                                     certificate, "accepted" or "refused" (the server's alert or close)
//
// Terminal lines starting with "!" are not posted: they are questions the isolation tests ask the
// agent itself about what its uid can reach.
//
// Errors that stop it go to stderr (also its terminal) with exit status 1. SIGTERM, SIGHUP
// (its terminal hung up) and SIGINT close the connection and exit 0.
//
// The broker connection re-reads the material file at every connect and reconnect (nats.UserJWT
// callbacks), so a credential managerd renewed and the launcher replaced in the file is used
// from the next connection on: the broker closes a connection whose JWT expires, and the agent
// reconnects forever. Its reply inboxes are _INBOX_<user public key>, the only inbox prefix an
// agent credential may subscribe to (pkg/signerclient's rail explains why).
//
// Given the exchange form of the material (a remote managerd's agent: no credential), it connects
// through pkg/authclient's agent arm instead: it exchanges its actor token at the material's
// exchange URL for a bearer and connects through the auth callout with the space's sentinel.
//
// It never prints the material, the JWT, the seed or the token.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"golang.org/x/sys/unix"

	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/material"
	"github.com/cotalgo/cotal/pkg/space"
)

const usage = `Usage: testagent [--probe-every DURATION]

The test agent managerd's tests spawn. It reads its launch material from the file named by
$COTAL_LAUNCH_MATERIAL (a regular file of this uid, mode 0600), connects to the broker with its
credential (re-read at every reconnect), joins its subscribe channels through deliveryd, prints
"recv <channel> <from> <text>" for each delivery and posts each line of its standard input to its
first subscribe channel. SIGTERM, SIGHUP and SIGINT end it with status 0.

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testagent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	probeEvery := fs.Duration("probe-every", 5*time.Second, "how often to probe the manager's liveness plane")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.Usage()
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 || *probeEvery <= 0 {
		fmt.Fprintln(stderr, "testagent: no arguments are taken, and --probe-every must be positive")
		return 2
	}
	path := os.Getenv(material.EnvVar)
	if path == "" {
		fmt.Fprintf(stderr, "testagent: %s is not set\n", material.EnvVar)
		return 1
	}
	m, err := material.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "testagent: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)
	defer stop()
	a := &agent{path: path, m: m, out: &printer{w: stdout}, probeEvery: *probeEvery}
	if err := a.run(ctx, stdin); err != nil {
		fmt.Fprintf(stderr, "testagent: %v\n", err)
		return 1
	}
	return 0
}

// printer writes whole lines to the terminal, one at a time.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) line(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}

// printable is s when it holds no control character, else s Go-quoted: text from the mesh never
// reaches the terminal as escape sequences or extra lines.
func printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) || r == unicode.ReplacementChar }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

type agent struct {
	path       string
	m          material.Material
	out        *printer
	probeEvery time.Duration

	n     space.Names
	nc    *nats.Conn
	js    jetstream.JetStream
	keyMu sync.Mutex
	key   nkeys.KeyPair // from the last read of the material, for the nonce
}

// authOptions are the connection's credential options. With a credential (signer mode): the
// JWT and seed re-read from the material at every connect, and _INBOX_<user key> as the inbox
// prefix. With the exchange form (a remote managerd's agent): pkg/authclient's agent arm, which
// exchanges the actor token at the material's exchange URL for a bearer (renewed ahead of its
// expiry) and connects through the auth callout with the sentinel as its user JWT and its bound
// inbox nonce, which is also its connection name (the callout refuses any other name, so the
// credential form alone names the connection "cotal-testagent <owner>.<actor>").
func (a *agent) authOptions(ctx context.Context) ([]nats.Option, error) {
	m := a.m
	if m.Exchange() {
		c, err := authclient.New(authclient.Config{URL: m.ExchangeURL, Owner: m.Owner, Actor: m.Actor, ActorToken: m.Token})
		if err != nil {
			return nil, err
		}
		for {
			opts, err := c.NatsOptions(m.Sentinel)
			if err == nil {
				return opts, nil
			}
			a.out.line("error exchange: %s", printable(err.Error()))
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
	_, kp, err := m.Credential()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	kp.Wipe()
	if err != nil {
		return nil, err
	}
	return []nats.Option{nats.UserJWT(a.userJWT, a.sign), nats.CustomInboxPrefix("_INBOX_" + pub),
		nats.Name("cotal-testagent " + m.Owner + "." + m.Actor)}, nil
}

// userJWT is the nats.UserJWT callback: read the material file again and keep its key for
// sign, so each connect presents the freshest credential.
func (a *agent) userJWT() (string, error) {
	m, err := material.ReadFile(a.path)
	if err != nil {
		return "", err
	}
	userJWT, kp, err := m.Credential()
	if err != nil {
		return "", err
	}
	a.keyMu.Lock()
	if a.key != nil {
		a.key.Wipe()
	}
	a.key = kp
	a.keyMu.Unlock()
	return userJWT, nil
}

func (a *agent) sign(nonce []byte) ([]byte, error) {
	a.keyMu.Lock()
	defer a.keyMu.Unlock()
	if a.key == nil {
		return nil, errors.New("no credential read")
	}
	return a.key.Sign(nonce)
}

func (a *agent) run(ctx context.Context, stdin io.Reader) error {
	m := a.m
	var err error
	if a.n, err = space.NewNames(m.Space); err != nil {
		return err
	}
	auth, err := a.authOptions(ctx)
	if err != nil {
		return err
	}
	defer func() {
		a.keyMu.Lock()
		if a.key != nil {
			a.key.Wipe()
			a.key = nil
		}
		a.keyMu.Unlock()
	}()
	opts := append(auth,
		nats.IgnoreAuthErrorAbort(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { a.out.line("reconnected") }),
		// nats.go's default handler prints to stderr; a refused publish is worth a line, an
		// expired credential (the normal end of one) is not.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if !errors.Is(err, nats.ErrAuthExpired) {
				a.out.line("error %s", printable(err.Error()))
			}
		}),
	)
	servers := strings.Join(m.Servers, ",")
	for last := ""; ; {
		a.nc, err = nats.Connect(servers, opts...)
		if err == nil {
			break
		}
		if err.Error() != last {
			last = err.Error()
			a.out.line("error connect: %s", printable(last))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	defer a.nc.Close()
	a.out.line("connected %s.%s %s", m.Owner, m.Actor, m.LifecycleUID)
	if a.js, err = jetstream.New(a.nc); err != nil {
		return err
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := a.startProbe(ctx, &wg); err != nil {
		return err
	}
	// Not waited for: a read of the terminal does not end with ctx, and the process exits.
	go a.readTerminal(ctx, stdin)
	if err := a.joinAll(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	c, err := dlvclient.New(ctx, a.js, dlvclient.Config{Space: m.Space, Owner: m.Owner, Actor: m.Actor, LifecycleUID: m.LifecycleUID})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, a.deliver) }()
	a.out.line("ready")
	select {
	case err := <-done:
		if ctx.Err() == nil && err != nil {
			return err
		}
	case <-ctx.Done():
		<-done
	}
	cancel()
	// Close (not Drain): an unacked delivery is redelivered to the next incarnation.
	a.nc.Close()
	return nil
}

// joinAll joins each subscribe channel, retrying (deliveryd may not be up yet) until it is a
// durable member or ctx ends.
func (a *agent) joinAll(ctx context.Context) error {
	m := a.m
	for _, ch := range m.Subscribe {
		for {
			jctx, cancel := context.WithTimeout(ctx, dlvclient.DefaultJoinTimeout)
			res, err := dlvclient.Join(jctx, a.nc, a.n, m.Owner, m.Actor, m.LifecycleUID, ch)
			cancel()
			if ctx.Err() != nil {
				return nil
			}
			var re *dlvclient.RefusedError
			switch {
			case err == nil && res.Durable:
				a.out.line("joined %s %d", ch, res.Generation)
			case err == nil:
				a.out.line("not-durable %s %s", ch, printable(res.Reason))
			case errors.As(err, &re):
				return fmt.Errorf("join %s: %w", ch, err)
			}
			if err == nil && res.Durable {
				break
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// chatMsg is the part of a chat message the agent reads and writes.
type chatMsg struct {
	ID   string `json:"id"`
	From struct {
		ID string `json:"id"`
	} `json:"from"`
	Text string `json:"text"`
}

func (a *agent) deliver(_ context.Context, d dlvclient.Delivery) error {
	var msg chatMsg
	if err := json.Unmarshal(d.Msg, &msg); err != nil {
		a.out.line("error delivery %d is not a chat message", d.Seq)
		return nil // acked: a message that does not decode never will
	}
	a.out.line("recv %s %s %s", d.Channel, printable(msg.From.ID), printable(msg.Text))
	return nil
}

// readTerminal posts each line of stdin to the first subscribe channel.
func (a *agent) readTerminal(ctx context.Context, stdin io.Reader) {
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		if ctx.Err() != nil {
			return
		}
		text := strings.TrimRight(sc.Text(), "\r")
		if text == "" {
			continue
		}
		if path, ok := strings.CutPrefix(text, "!open "); ok {
			a.out.line("open %s %s", printable(path), tryOpen(path))
			continue
		}
		if path, ok := strings.CutPrefix(text, "!unix "); ok {
			a.out.line("unix %s %s", printable(path), tryUnix(path))
			continue
		}
		if addr, ok := strings.CutPrefix(text, "!tls "); ok {
			a.out.line("tls %s %s", printable(addr), tryTLS(addr))
			continue
		}
		if len(a.m.Subscribe) == 0 {
			a.out.line("error no channel to post to")
			continue
		}
		ch := a.m.Subscribe[0]
		id, err := a.post(ctx, ch, text)
		if err != nil {
			a.out.line("error post %s: %s", ch, printable(err.Error()))
			continue
		}
		a.out.line("sent %s %s", ch, id)
	}
}

// tryOpen opens path for reading (or listing) and closes it: "ok", or the errno name.
func tryOpen(path string) string {
	f, err := os.Open(path)
	if err == nil {
		f.Close()
		return "ok"
	}
	return errnoName(err)
}

// tryUnix connects to the Unix socket at path and hangs up: "ok", or the errno name.
func tryUnix(path string) string {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err == nil {
		c.Close()
		return "ok"
	}
	return errnoName(err)
}

// tryTLS makes a TLS handshake with addr presenting no client certificate (the agent has none
// it could read), then reads: a server that requires one ends the connection with an alert or a
// close ("refused"); one that took the handshake waits for a request ("accepted"). The server's
// certificate is not verified: only whether the server lets this client in matters.
func tryTLS(addr string) string {
	d := &net.Dialer{Timeout: 2 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // probing only
	if err != nil {
		return "refused"
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	var b [1]byte
	_, err = c.Read(b[:])
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "accepted"
	}
	return "refused"
}

// errnoName is the errno name in err, or "error".
func errnoName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return "error"
}

// post publishes text to channel as a chat message {id, from: {id: owner.actor}, text} and waits
// for CHAT to store it.
func (a *agent) post(ctx context.Context, channel, text string) (string, error) {
	subject, err := a.n.Chat(a.m.Owner, a.m.Actor, channel)
	if err != nil {
		return "", err
	}
	id := randomID()
	body, err := json.Marshal(map[string]any{"id": id, "from": map[string]string{"id": a.m.Owner + "." + a.m.Actor}, "text": text})
	if err != nil {
		return "", err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := a.js.Publish(pctx, subject, body); err != nil {
		return "", err
	}
	return id, nil
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// startProbe subscribes to the agent's manager-liveness answer lane and probes the manager plane
// now and every probeEvery, as itself, with the reply subject <probe>.reply.<nonce>. It prints
// manager-alive when an answer comes after none had (or after an unanswered probe) and
// manager-unreachable when a probe goes unanswered (a no-responders status, or nothing before
// the next probe).
func (a *agent) startProbe(ctx context.Context, wg *sync.WaitGroup) error {
	m := a.m
	probe, err := a.n.LiveManager(m.Owner, m.Actor)
	if err != nil {
		return err
	}
	lane, err := a.n.LiveManagerReplies(m.Owner, m.Actor)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	state := "" // "", "alive" or "unreachable"
	answered := true
	set := func(s string) {
		if state != s {
			state = s
			a.out.line("manager-%s", s)
		}
	}
	sub, err := a.nc.Subscribe(lane, func(msg *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		answered = true
		if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
			set("unreachable")
			return
		}
		set("alive")
	})
	if err != nil {
		return err
	}
	send := func() {
		mu.Lock()
		if !answered {
			set("unreachable")
		}
		answered = false
		mu.Unlock()
		_ = a.nc.PublishMsg(&nats.Msg{Subject: probe, Reply: probe + ".reply." + randomID()})
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { _ = sub.Unsubscribe() }()
		tick := time.NewTicker(a.probeEvery)
		defer tick.Stop()
		send()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				send()
			}
		}
	}()
	return nil
}
