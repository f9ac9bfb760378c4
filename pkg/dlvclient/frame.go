package dlvclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cotalgo/cotal/pkg/space"
)

// The delivery frame on the wire (upstream endpoint.ts readerHandle and pumpDlv).
const (
	// FrameHeader marks a message the trusted reader published to DLV; FrameHeaderValue is its
	// only accepted value. An agent terminates any DLV message without it.
	FrameHeader      = "Cotal-Delivery-Frame"
	FrameHeaderValue = "1"
	// FrameVersion is the frame body's version.
	FrameVersion = 1
	// MaxFrameBytes bounds a frame body this package decodes; the broker's default max_payload
	// is 1 MiB.
	MaxFrameBytes = 1 << 20
	// MaxIDBytes bounds a message id.
	MaxIDBytes = 256
)

// Frame is the body of a DLV message: {version, channel, msg}, msg being the chat message as the
// sender posted it (normalised to its authenticated channel by the fan-out writer).
type Frame struct {
	Version int             `json:"version"`
	Channel string          `json:"channel"`
	Msg     json.RawMessage `json:"msg"`
}

// ErrBadFrame matches every frame DecodeFrame refuses.
var ErrBadFrame = errors.New("dlvclient: not a delivery frame")

// msgID is the part of a chat message the client reads: its id.
type msgID struct {
	ID *string `json:"id"`
}

// DecodeFrame reads a DLV message body strictly: a JSON object of at most MaxFrameBytes with
// version 1, a channel that passes space.ValidateChannel and a msg that is a JSON object whose id,
// when present, is a string of at most MaxIDBytes. It returns the frame and the message id (""
// when the message has none). It refuses anything else with an error matching ErrBadFrame.
func DecodeFrame(body []byte) (Frame, string, error) {
	var f Frame
	if len(body) > MaxFrameBytes {
		return f, "", fmt.Errorf("%w: %d bytes", ErrBadFrame, len(body))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Frame{}, "", fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	if dec.More() {
		return Frame{}, "", fmt.Errorf("%w: trailing data", ErrBadFrame)
	}
	if f.Version != FrameVersion {
		return Frame{}, "", fmt.Errorf("%w: version %d", ErrBadFrame, f.Version)
	}
	if err := space.ValidateChannel(f.Channel); err != nil {
		return Frame{}, "", fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	id, err := checkMsg(f.Msg)
	if err != nil {
		return Frame{}, "", err
	}
	return f, id, nil
}

// checkMsg is DecodeFrame's check of a frame's msg: a JSON object whose id, when present, is a
// string of at most MaxIDBytes. It returns the id ("" when absent).
func checkMsg(msg json.RawMessage) (string, error) {
	trimmed := bytes.TrimSpace(msg)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return "", fmt.Errorf("%w: msg is not an object", ErrBadFrame)
	}
	var m msgID
	if err := json.Unmarshal(trimmed, &m); err != nil {
		return "", fmt.Errorf("%w: msg: %v", ErrBadFrame, err)
	}
	id := ""
	if m.ID != nil {
		id = *m.ID
	}
	if len(id) > MaxIDBytes {
		return "", fmt.Errorf("%w: id of %d bytes", ErrBadFrame, len(id))
	}
	return id, nil
}

// EncodeFrame is DecodeFrame's inverse, for the trusted reader: it refuses what DecodeFrame would
// refuse of its output (a bad channel, a msg that is not an object or whose id is not a short
// string, a frame over MaxFrameBytes). It checks the parts, not a decode of the whole frame: the
// trusted reader frames every copy (FuzzEncodeFrame holds it to the whole-frame check).
func EncodeFrame(channel string, msg json.RawMessage) ([]byte, error) {
	if err := space.ValidateChannel(channel); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	if _, err := checkMsg(msg); err != nil {
		return nil, err
	}
	b, err := json.Marshal(Frame{Version: FrameVersion, Channel: channel, Msg: msg})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	if len(b) > MaxFrameBytes {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadFrame, len(b))
	}
	return b, nil
}
