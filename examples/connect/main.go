// Command connect mints an agent credential through signerd, writes it as a .creds file and
// connects with it. Its flag defaults are the layout `make run` uses (space demo,
// .cotal-dev/pki, nats on :4222):
//
//	go run ./examples/connect -signerd 127.0.0.1:PORT
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

type config struct {
	signerd, natsURL, space, credsPath string
	tls                                mtls.ClientFiles // managerd's client certificate
}

func main() {
	var c config
	flag.StringVar(&c.signerd, "signerd", "127.0.0.1:7443", "signerd address")
	flag.StringVar(&c.natsURL, "nats", "nats://127.0.0.1:4222", "broker URL")
	flag.StringVar(&c.space, "space", "demo", "space name")
	flag.StringVar(&c.credsPath, "creds", ".cotal-dev/creds/agent.creds", "where to write the .creds file (0600, parent 0700)")
	flag.StringVar(&c.tls.ServerCAFile, "ca", ".cotal-dev/pki/ca.pem", "CA signerd's certificate chains to")
	flag.StringVar(&c.tls.CertFile, "cert", ".cotal-dev/pki/clients/managerd-demo.pem", "client certificate")
	flag.StringVar(&c.tls.KeyFile, "key", ".cotal-dev/pki/clients/managerd-demo.key", "client key")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := space.NewNames(c.space)
	if err != nil {
		return err
	}
	signer, err := signerclient.Dial(signerclient.Config{Addr: c.signerd, TLS: c.tls, ServerID: "spiffe://cotal.local/signerd"})
	if err != nil {
		return err
	}
	defer signer.Close()

	// 1. What must exist first: the space's streams and buckets. pkg/provision creates them (or
	// finds them, as `make run` made them) on a one-shot provisioner credential held in memory.
	if _, err := provision.Run(ctx, provision.Config{Signer: signer, Space: c.space, NatsURL: c.natsURL,
		Owner: "demo", Actor: "readme"}); err != nil {
		return fmt.Errorf("provision: %w", err)
	}

	// 2. A user nkey, made here. Its seed goes only into the .creds file, never to signerd.
	user, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	defer user.Wipe()
	pub, err := user.PublicKey()
	if err != nil {
		return err
	}

	// 3. Mint: name a profile and the user's public key; signerd builds the permissions.
	cred, err := signer.Mint(ctx, &signerv1.MintRequest{
		Space: c.space, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub,
		Params: &signerv1.ProfileParams{
			Owner: "demo", Actor: "readme", LifecycleUid: "readme0example0lifecycle01",
			Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
		},
	})
	if err != nil {
		return err
	}

	// 4. The .creds file: JWT and seed, written 0600 and atomically; the seed buffer is wiped.
	seed, err := creds.SeedFromKeyPair(user)
	if err != nil {
		return err
	}
	defer seed.Wipe()
	if err := creds.WriteCreds(c.credsPath, cred.GetJwt(), seed); err != nil {
		return err
	}

	// 5. Connect. Replies (every request, every JetStream call) come only to _INBOX_<user nkey>:
	// the default _INBOX. prefix is refused by the broker.
	inbox, err := space.InboxPrefix(pub)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(c.natsURL, nats.UserCredentials(c.credsPath), nats.CustomInboxPrefix(inbox))
	if err != nil {
		return err
	}
	defer nc.Close()

	// 6. Use it: post on general as demo.readme (stored in CHAT_<t>) and read it live.
	post, err := n.Chat("demo", "readme", "general")
	if err != nil {
		return err
	}
	read, err := n.ChatRead("general")
	if err != nil {
		return err
	}
	sub, err := nc.SubscribeSync(read)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ack, err := js.Publish(ctx, post, []byte("hello from the README"))
	if err != nil {
		return err
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "minted %s for user %s, wrote %s\n", cred.GetJti(), pub, c.credsPath)
	fmt.Fprintf(out, "stored as %s #%d, received %q on %s\n", ack.Stream, ack.Sequence, msg.Data, msg.Subject)
	fmt.Fprintf(out, "nats --server %s --creds %s --inbox-prefix %s pub -J %s hi\n", c.natsURL, c.credsPath, inbox, post)
	return nil
}
