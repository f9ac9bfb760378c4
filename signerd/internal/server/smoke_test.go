package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

func TestSmokeMint(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	files := s.ClientFor(t, mtls.KindManagerd, "alpha")
	tlsCfg, _, err := mtls.NewClientTLS(files, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := signerv1.NewSignerServiceClient(conn).Mint(ctx, &signerv1.MintRequest{
		Space: "alpha", Profile: signerv1.Profile_PROFILE_SUPERVISOR, UserPublicKey: pub,
		Params: &signerv1.ProfileParams{Owner: "local", Actor: "manager"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCredential().GetUserPublicKey() != pub {
		t.Fatalf("subject = %q", resp.GetCredential().GetUserPublicKey())
	}
}
