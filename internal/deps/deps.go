// Package deps pins the module's dependencies while the packages that use them are written.
// It is removed once every dependency has a real importer.
package deps

import (
	_ "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	_ "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	_ "github.com/nats-io/jwt/v2"
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nkeys"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "go.yaml.in/yaml/v3"
	_ "golang.org/x/sys/unix"
	_ "golang.org/x/time/rate"
	_ "google.golang.org/grpc"
	_ "google.golang.org/grpc/health"
	_ "google.golang.org/grpc/reflection"
	_ "google.golang.org/grpc/test/bufconn"
	_ "google.golang.org/protobuf/proto"
	_ "google.golang.org/genproto/googleapis/rpc/errdetails"
)
