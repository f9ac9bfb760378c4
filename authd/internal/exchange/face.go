package exchange

import (
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// CheckCap refuses a capability that is not CapHexLen lowercase hex characters (32 random bytes).
func CheckCap(cap string) error {
	if b, err := hex.DecodeString(cap); err != nil || len(cap) != CapHexLen || strings.ToLower(cap) != cap || len(b) != CapHexLen/2 {
		return fmt.Errorf("the cap must be %d lowercase hex characters (32 random bytes)", CapHexLen)
	}
	return nil
}

// DoorFace is what a door other than /exchange (the service-endpoint and manager-service
// authority doors) takes from the face it serves: the Authorization header value the loopback
// face requires ("Bearer <cap>"; nil on the public face, which takes no cap), the face's name for
// the log, and the defaults for the clock, the logger and the failure throttle.
type DoorFace struct {
	Auth     []byte
	Name     string
	Now      func() time.Time
	Log      *slog.Logger
	Throttle *Throttle
}

// NewDoorFace decides a door's face: the loopback face needs a valid cap, the public one refuses
// any. now, log and throttle may be nil (time.Now, a discarding logger, a fresh failure
// throttle).
func NewDoorFace(loopback bool, cap string, now func() time.Time, log *slog.Logger, throttle *Throttle) (DoorFace, error) {
	f := DoorFace{Name: "public", Now: now, Log: log, Throttle: throttle}
	if loopback {
		if err := CheckCap(cap); err != nil {
			return DoorFace{}, fmt.Errorf("the loopback door: %w", err)
		}
		f.Auth, f.Name = []byte("Bearer "+cap), "loopback"
	} else if cap != "" {
		return DoorFace{}, errors.New("the public door takes no cap")
	}
	if f.Now == nil {
		f.Now = time.Now
	}
	if f.Log == nil {
		f.Log = slog.New(slog.DiscardHandler)
	}
	if f.Throttle == nil {
		f.Throttle = NewFailureThrottle()
	}
	return f, nil
}
