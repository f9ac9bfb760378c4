//go:build cotal_testhook

package plane3

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// EnvPark is read only by a binary built with the cotal_testhook tag (deliveryd's e2e tests):
// comma-separated <stream prefix>=<needle> rules. A loop that fetches a pass holding a message
// of a stream with that prefix whose body contains the needle says so on stderr and parks for
// ever, its pass fetched and unsettled: a pass in flight at a kill -9.
const EnvPark = "COTAL_TEST_PARK"

func init() {
	type rule struct{ stream, needle string }
	var rules []rule
	for _, r := range strings.Split(os.Getenv(EnvPark), ",") {
		if s, n, ok := strings.Cut(r, "="); ok && s != "" && n != "" {
			rules = append(rules, rule{s, n})
		}
	}
	if len(rules) == 0 {
		return
	}
	Hook = func(at Point, msgs []jetstream.Msg) {
		if at != AtFetched {
			return
		}
		for _, m := range msgs {
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			for _, r := range rules {
				if strings.HasPrefix(md.Stream, r.stream) && bytes.Contains(m.Data(), []byte(r.needle)) {
					fmt.Fprintf(os.Stderr, "cotal_testhook: parked a pass of %d on %s holding %q\n", len(msgs), md.Stream, r.needle)
					select {}
				}
			}
		}
	}
}
