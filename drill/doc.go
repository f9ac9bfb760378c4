// Package drill holds the failure drill of issue 13 (drill_test.go): a 3-node NATS cluster
// (pkg/testkit/cluster) with the space at three replicas, two signerd replicas, the deliveryd
// binary, agents consuming their dlv_ durables with pkg/dlvclient and a publisher posting a
// numbered sequence on a durable channel while the drill kills the channel's JetStream leader
// node, one signerd replica and deliveryd, then restarts what it killed. It reports what was
// published, delivered, lost and deduplicated, how long the agents took to reconnect and how many
// signer calls failed over.
//
// `go test ./drill/` runs the small form (part of `make test`); `make drill` runs the full form
// (-drill.full). The package has no code outside its test.
package drill
