package authority

import (
	"crypto/subtle"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// MaxDoorBody bounds a door's request body (upstream 65536 bytes).
const MaxDoorBody = 64 << 10

// DoorError is a guard's refusal: the HTTP status and the sentence the caller reads.
type DoorError struct {
	Status int
	Msg    string
}

func (e *DoorError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Msg) }

// ReadDoor applies the loopback guard set (reference lifecycle-hosted.md §2.1) in its order and
// decodes the closed body into dst, a pointer to a struct whose every field is a string:
//
//  1. a method other than POST: 405;
//  2. an Origin header: 403;
//  3. a Content-Type other than application/json: 415;
//  4. Authorization other than "Bearer <cap>" (constant time): 401;
//  5. a body over MaxDoorBody bytes: 413;
//  6. a body that is not one JSON object of exactly dst's fields, all strings, each present, or
//     with trailing data: 400.
//
// Token grammar (step 7) is the caller's: it knows which fields are owners, actors and uids
// (CheckTokens). wantAuth is the whole expected header value, "Bearer <cap>".
func ReadDoor(r *http.Request, wantAuth []byte, dst any) *DoorError {
	if r.Method != http.MethodPost {
		return &DoorError{http.StatusMethodNotAllowed, "method not allowed (POST only)"}
	}
	if _, ok := r.Header["Origin"]; ok {
		return &DoorError{http.StatusForbidden, "requests with an Origin header are refused"}
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &DoorError{http.StatusUnsupportedMediaType, "the body must be application/json"}
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), wantAuth) != 1 {
		return &DoorError{http.StatusUnauthorized, "missing or wrong capability (Authorization: Bearer <cap>)"}
	}
	if r.ContentLength > MaxDoorBody {
		return &DoorError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxDoorBody)}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxDoorBody+1))
	if err != nil {
		return &DoorError{http.StatusBadRequest, "the body could not be read"}
	}
	if len(body) > MaxDoorBody {
		return &DoorError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxDoorBody)}
	}
	if err := lifecycle.DecodeObject(body, dst); err != nil {
		return &DoorError{http.StatusBadRequest, err.Error()}
	}
	return nil
}

// CheckTokens is guard step 7 for a lifecycle coordinate: owner a derived owner (u_ and 26
// base32: never a p_ platform owner), actor an actor token, uid a lifecycle token.
func CheckTokens(owner, actor, uid string) error {
	if err := space.ValidateDerivedOwner(owner); err != nil {
		return err
	}
	if err := space.ValidateActor(actor); err != nil {
		return err
	}
	return space.ValidateUID(uid)
}
