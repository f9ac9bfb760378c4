package dlvclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The gap marker on the wire. The trusted reader publishes it into a lifecycle's DLV subject when
// it had to drop copies because the lifecycle's durable held as many unacked messages as DLV keeps
// per subject (pkg/provision.MaxMsgsPerSubject): publishing them would have made the broker discard
// older unacked ones without a trace. The marker says only how many copies are missing, and that
// they are missing before the marker: frames stored before it were delivered as usual, frames after
// it follow the gap.
//
// It carries the frame header (Cotal-Delivery-Frame: 1, so it is the trusted reader's like every
// DLV message) and GapHeader with the count in canonical decimal; its body is
// {"version":1,"gap":<count>}, the same count. A client that predates the marker refuses that body
// as a frame (an unknown field) and terminates it with a warning.
const (
	// GapHeader marks a gap marker; its value is the count of missing copies.
	GapHeader = "Cotal-Delivery-Gap"
	// maxGapBytes bounds a marker body DecodeGap reads.
	maxGapBytes = 256
)

// Gap is a gap marker handed to Config.OnGap: Missing copies were dropped before this point in
// the lifecycle's DLV subject, Seq being the marker's own sequence in DLV_<t>.
type Gap struct {
	Missing uint64
	Seq     uint64
}

// GapHandler handles a gap marker. An error makes the client nak the marker for redelivery.
type GapHandler func(ctx context.Context, g Gap) error

// ErrBadGap matches every gap marker DecodeGap refuses.
var ErrBadGap = errors.New("dlvclient: not a gap marker")

// gapBody is the marker's body.
type gapBody struct {
	Version int     `json:"version"`
	Gap     *uint64 `json:"gap"`
}

// EncodeGap is the marker body for missing copies, for the trusted reader, with the GapHeader
// value to send beside it. It refuses a zero count.
func EncodeGap(missing uint64) (body []byte, header string, err error) {
	if missing == 0 {
		return nil, "", fmt.Errorf("%w: zero count", ErrBadGap)
	}
	body, err = json.Marshal(gapBody{Version: FrameVersion, Gap: &missing})
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrBadGap, err)
	}
	return body, strconv.FormatUint(missing, 10), nil
}

// DecodeGap reads a gap marker strictly: the header value a canonical positive decimal (no sign,
// no leading zero, no space), the body a JSON object of at most 256 bytes with exactly version 1
// and gap, gap equal to the header's count. It returns the count and refuses anything else with
// an error matching ErrBadGap.
func DecodeGap(header string, body []byte) (uint64, error) {
	n, err := strconv.ParseUint(header, 10, 64)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != header {
		return 0, fmt.Errorf("%w: header %q", ErrBadGap, header)
	}
	if len(body) > maxGapBytes {
		return 0, fmt.Errorf("%w: %d bytes", ErrBadGap, len(body))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var g gapBody
	if err := dec.Decode(&g); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrBadGap, err)
	}
	if dec.More() {
		return 0, fmt.Errorf("%w: trailing data", ErrBadGap)
	}
	if g.Version != FrameVersion || g.Gap == nil || *g.Gap != n {
		return 0, fmt.Errorf("%w: version %d, count does not match the header", ErrBadGap, g.Version)
	}
	return n, nil
}
