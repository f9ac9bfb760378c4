package authority

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/cotalgo/cotal/pkg/space"
)

// maxListBytes bounds one STREAM.INFO answer (a page of subjects with their counts).
const maxListBytes = 16 << 20

// maxKeyPages bounds the pages one listing reads (the server pages subjects by 100000).
const maxKeyPages = 64

type infoAnswer struct {
	Total  int `json:"total"`
	Offset int `json:"offset"`
	Limit  int `json:"limit"`
	State  struct {
		LastSeq  uint64            `json:"last_seq"`
		Subjects map[string]uint64 `json:"subjects"`
	} `json:"state"`
	Error *apiError `json:"error"`
}

// streamInfo asks $JS.API.STREAM.INFO of kind's stream, with subjects_filter filter when not
// empty (one page from offset), refusing an answer over maxBytes. It is a read: Reads counts it.
func (s *Store) streamInfo(ctx context.Context, kind space.BucketKind, filter string, offset, maxBytes int) (infoAnswer, error) {
	var resp infoAnswer
	stream, err := s.names.BucketStream(kind)
	if err != nil {
		return resp, fmt.Errorf("authority: %w", err)
	}
	api, err := space.StreamInfo(stream)
	if err != nil {
		return resp, fmt.Errorf("authority: %w", err)
	}
	req := []byte("{}")
	if filter != "" {
		req, _ = json.Marshal(struct {
			Filter string `json:"subjects_filter"`
			Offset int    `json:"offset,omitempty"`
		}{filter, offset})
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	s.reads.Add(1)
	msg, err := s.nc.RequestWithContext(ctx, api, req)
	if err != nil {
		return resp, fmt.Errorf("%w: stream info of %s: %v", ErrUnavailable, stream, err)
	}
	if len(msg.Data) > maxBytes {
		return resp, fmt.Errorf("%w: stream info of %s: an answer of %d bytes", ErrUnavailable, stream, len(msg.Data))
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return resp, fmt.Errorf("%w: stream info of %s: undecodable answer: %v", ErrUnavailable, stream, err)
	}
	if resp.Error != nil {
		return resp, fmt.Errorf("%w: stream info of %s: %s (%d)", ErrUnavailable, stream, resp.Error.Description, resp.Error.ErrCode)
	}
	return resp, nil
}

// LastSeq is the last sequence of kind's stream (STREAM.INFO, leader-answered).
func (s *Store) LastSeq(ctx context.Context, kind space.BucketKind) (uint64, error) {
	resp, err := s.streamInfo(ctx, kind, "", 0, maxListBytes)
	return resp.State.LastSeq, err
}

// Keys lists the keys of kind's bucket that start with prefix (a key prefix ending in '.', such
// as "stage."), sorted: STREAM.INFO with subjects_filter $KV.<bucket>.<prefix>>, the listing the
// auth-plane profile allows. A key is listed once whatever its message count; a deleted key is
// listed too (its marker is a message), and reading it is corruption (Store.GetRaw).
func (s *Store) Keys(ctx context.Context, kind space.BucketKind, prefix string) ([]string, error) {
	if !strings.HasSuffix(prefix, ".") {
		return nil, fmt.Errorf("authority: key prefix %q does not end in '.'", prefix)
	}
	all, err := s.names.KVAll(kind)
	if err != nil {
		return nil, fmt.Errorf("authority: %w", err)
	}
	head := strings.TrimSuffix(all, ">")
	filter := head + prefix + ">"
	var keys []string
	for page, offset := 0, 0; ; page++ {
		if page == maxKeyPages {
			return nil, fmt.Errorf("%w: more than %d pages of %s keys", ErrUnavailable, maxKeyPages, prefix)
		}
		resp, err := s.streamInfo(ctx, kind, filter, offset, maxListBytes)
		if err != nil {
			return nil, err
		}
		for subj := range resp.State.Subjects {
			key, ok := strings.CutPrefix(subj, head)
			if !ok || !strings.HasPrefix(key, prefix) {
				return nil, fmt.Errorf("%w: stream info listed %q outside %s", ErrUnavailable, subj, filter)
			}
			keys = append(keys, key)
		}
		offset += len(resp.State.Subjects)
		if len(resp.State.Subjects) == 0 || offset >= resp.Total {
			break
		}
	}
	sort.Strings(keys)
	return slices.Compact(keys), nil
}
