package exchange

import (
	"strings"
	"testing"
)

func TestNewDoorFace(t *testing.T) {
	good := strings.Repeat("ab", CapHexLen/2)
	t.Run("ok/loopback takes a cap as its Bearer header", func(t *testing.T) {
		f, err := NewDoorFace(true, good, nil, nil, nil)
		if err != nil || string(f.Auth) != "Bearer "+good || f.Name != "loopback" || f.Now == nil || f.Log == nil || f.Throttle == nil {
			t.Fatalf("face %+v err %v", f, err)
		}
	})
	t.Run("ok/public takes none and requires none", func(t *testing.T) {
		th := NewFailureThrottle()
		f, err := NewDoorFace(false, "", nil, nil, th)
		if err != nil || f.Auth != nil || f.Name != "public" || f.Throttle != th {
			t.Fatalf("face %+v err %v", f, err)
		}
	})
	for name, c := range map[string]string{
		"fail/short": good[:62], "fail/upper case": strings.ToUpper(good), "fail/not hex": strings.Repeat("zz", CapHexLen/2), "fail/empty": "",
	} {
		t.Run(name+" cap on loopback", func(t *testing.T) {
			if _, err := NewDoorFace(true, c, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "lowercase hex") {
				t.Fatalf("err %v, want the cap's grammar named", err)
			}
		})
	}
	t.Run("fail/a cap on the public face", func(t *testing.T) {
		if _, err := NewDoorFace(false, good, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "takes no cap") {
			t.Fatalf("err %v", err)
		}
	})
}
