package manager

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// phases times one spawn (Inspect's spawn_phases and the spawn-to-connected benchmark).
type phases struct {
	admitted                time.Time
	provision, mint, launch time.Duration
	connected               time.Duration // zero until the first liveness probe
	signer                  atomic.Int64  // nanoseconds spent in signerd calls
}

type phasesKey struct{}

// withPhases makes signer calls made under ctx count toward p.signer.
func withPhases(ctx context.Context, p *phases) context.Context {
	return context.WithValue(ctx, phasesKey{}, p)
}

// signerTimer is a signer client interceptor adding each call's duration to the spawn whose
// context it runs under.
func signerTimer(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	p, _ := ctx.Value(phasesKey{}).(*phases)
	if p == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	p.signer.Add(int64(time.Since(start)))
	return err
}

func (p *phases) proto() *managerv1.SpawnPhases {
	out := &managerv1.SpawnPhases{
		Provision: durationpb.New(p.provision), Mint: durationpb.New(p.mint), Launch: durationpb.New(p.launch),
		Signer: durationpb.New(time.Duration(p.signer.Load())),
	}
	if p.connected > 0 {
		out.Connected = durationpb.New(p.connected)
	}
	return out
}
