package authority

import (
	"encoding/json"
	"testing"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// FuzzDecodeRetireArgs: the rail body is untrusted bytes. What the decoder accepts is a closed
// object whose fields pass their grammars, and re-encoding it decodes to the same arguments.
func FuzzDecodeRetireArgs(f *testing.F) {
	f.Add([]byte(`{"v":1,"opId":"b5beb5e4f583874a2f0947bbbd","serveEndpoint":"manager","serveInstanceId":"bbbbbbbbbbbbbbbbbbbbbbbbbb","serveEpoch":0}`))
	f.Add([]byte(`{"v":1,"opId":"b5beb5e4f583874a2f0947bbbd","serveEndpoint":"manager","serveInstanceId":"bbbbbbbbbbbbbbbbbbbbbbbbbb","serveEpoch":1,"v":1}`))
	f.Add([]byte(`{"v":1,"opId":"x","serveEndpoint":"a.b","serveInstanceId":"y","serveEpoch":-1}`))
	f.Add([]byte(`{"v":1.0,"serveEpoch":9007199254740992}`))
	f.Add([]byte(`[] `))
	f.Fuzz(func(t *testing.T, b []byte) {
		args, err := DecodeRetireArgs(b)
		if err != nil {
			return
		}
		if len(b) > maxRailBody || args.ServeEpoch > lifecycle.MaxSafeInteger {
			t.Fatalf("accepted %d bytes, epoch %d", len(b), args.ServeEpoch)
		}
		if space.ValidateUID(args.OpID) != nil || space.ValidateUID(args.ServeInstanceID) != nil {
			t.Fatalf("accepted ids %q %q", args.OpID, args.ServeInstanceID)
		}
		if _, err := lifecycle.EndpointToken(args.ServeEndpoint); err != nil {
			t.Fatalf("accepted endpoint %q", args.ServeEndpoint)
		}
		re, _ := json.Marshal(map[string]any{"v": 1, "opId": args.OpID, "serveEndpoint": args.ServeEndpoint,
			"serveInstanceId": args.ServeInstanceID, "serveEpoch": args.ServeEpoch})
		back, err := DecodeRetireArgs(re)
		if err != nil || back != args {
			t.Fatalf("round trip %s: %+v, %v", re, back, err)
		}
	})
}
