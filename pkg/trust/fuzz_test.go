package trust_test

import (
	"testing"

	"github.com/cotalgo/cotal/pkg/trust"
)

// FuzzLoadSpace feeds arbitrary account JWT text to LoadSpace against a fixed broker: it must
// never panic, and anything it accepts must be signed by that broker's operator.
func FuzzLoadSpace(f *testing.F) {
	b, op, err := trust.NewBroker("fuzz")
	if err != nil {
		f.Fatal(err)
	}
	sp, _, _, err := trust.NewSpace(b, op, "s", []string{"UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("s", sp.DataAccountJWT(), sp.AuthAccountJWT())
	f.Add("s", sp.AuthAccountJWT(), sp.DataAccountJWT())
	f.Add("s", "", "")
	f.Add("s", "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.AAAA", b.SystemAccountJWT())
	f.Fuzz(func(t *testing.T, name, data, auth string) {
		got, err := trust.LoadSpace(b, name, data, auth)
		if err != nil {
			return
		}
		if got.DataAccountJWT() != data || got.AuthAccountJWT() != auth {
			t.Fatal("accepted space does not hold the JWTs it was given")
		}
		if _, err := trust.RenderServerConfig(trust.ServerConfig{StoreDir: "/js", Broker: b, Spaces: []*trust.Space{got}}); err != nil {
			t.Fatalf("LoadSpace accepted what RenderServerConfig refuses: %v", err)
		}
	})
}
