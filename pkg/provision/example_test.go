package provision_test

import (
	"context"
	"fmt"

	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// The examples here are compiled, not run (they have no Output comment: they need a signerd and
// a broker, which provision_test.go starts). docs/deliveryd.md quotes their lines, and
// docs/docs_test.go's TestGoFragments fails unless the quoted lines appear here in order.

// ExampleRun provisions space "demo" on a one-shot provisioner credential minted by signerd.
func ExampleRun() {
	ctx := context.Background()
	var signer *signerclient.Client // a client whose certificate names a caller allowed the provisioner profile
	url := "nats://127.0.0.1:4222"

	rep, err := provision.Run(ctx, provision.Config{Signer: signer, Space: "demo", NatsURL: url})
	// or, on a connection you hold: provision.Ensure(ctx, js, names, provision.Options{})
	fmt.Println(rep, err)
}

// ExampleRunProvisionAgent provisions one agent incarnation's durables and ACL row, then removes
// them, each on a one-shot credential (provisioner, then deprovisioner).
func ExampleRunProvisionAgent() {
	ctx := context.Background()
	var signer *signerclient.Client
	cfg := provision.Config{Signer: signer, Space: "demo", NatsURL: "nats://127.0.0.1:4222"}
	uid := "01J0000000000000000000000A"

	p, err := provision.RunProvisionAgent(ctx, cfg, provision.Agent{Owner: "local", Actor: "a1",
		LifecycleUID: uid, Role: "reviewer", AllowSubscribe: []string{"general"}}) // provisioner
	fmt.Println(p, err)
	res, err := provision.RunDeprovisionAgent(ctx, cfg, "local", "a1", uid, []string{"general"}) // deprovisioner
	// or, on connections you hold: ProvisionAgent(ctx, js, names, agent), Rollback, DeprovisionAgent
	fmt.Println(res, err)
}
