package managerauthority

import (
	"bytes"
	"net/url"

	"github.com/nats-io/jwt/v2"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// maxListLen bounds each list an enrollment answers (the request's own bound).
const maxListLen = 128

// DecodeEnrollment parses a served enrollment's answer on the client side: at most
// MaxAnswerBytes, one closed Enrollment object (an unknown field, a value of another type or data
// after it is refused), every coordinate within its grammar, each list at most 128 channel
// patterns (subscribe concrete channels), sentinelCreds holding a decorated bearer user JWT, and
// agentBearerExchangeUrl an absolute http(s) URL without user info, query or fragment. Binding
// it to the request (the owner, actor, lists within the asked ones) is the caller's.
func DecodeEnrollmentAnswer(b []byte) (*Enrollment, error) {
	if len(b) > MaxAnswerBytes {
		return nil, bad("the answer is %d bytes (at most %d)", len(b), MaxAnswerBytes)
	}
	var e Enrollment
	if err := lifecycle.DecodeObject(b, &e); err != nil {
		return nil, bad("the answer: %v", err)
	}
	if err := checkTarget("the answer", Target{Owner: e.Owner, Actor: e.Actor, LifecycleUID: e.LifecycleUID}); err != nil {
		return nil, err
	}
	for _, l := range []struct {
		name string
		v    []string
	}{{"subscribe", e.Subscribe}, {"allowSubscribe", e.AllowSubscribe}, {"allowPublish", e.AllowPublish}} {
		if len(l.v) > maxListLen {
			return nil, bad("the answer's %s has more than %d entries", l.name, maxListLen)
		}
		for _, c := range l.v {
			check := space.ValidateChannelPattern
			if l.name == "subscribe" {
				check = space.ValidateChannel
			}
			if err := check(c); err != nil {
				return nil, bad("the answer's %s entry %.40q: %v", l.name, c, err)
			}
		}
	}
	if _, err := SentinelJWT(e.SentinelCreds); err != nil {
		return nil, err
	}
	u, err := url.Parse(e.AgentBearerExchangeURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Opaque != "" ||
		u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return nil, bad("the answer's agentBearerExchangeUrl is not an absolute http(s) URL without user info, query or fragment")
	}
	return &e, nil
}

// SentinelJWT returns the bearer user JWT of a sentinel's creds text.
func SentinelJWT(creds string) (string, error) {
	raw := []byte(creds)
	if !bytes.Contains(raw, []byte("-----BEGIN NATS USER JWT-----")) {
		return "", bad("sentinelCreds hold no decorated user JWT")
	}
	s, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		return "", bad("sentinelCreds hold no decorated user JWT")
	}
	uc, err := jwt.DecodeUserClaims(s)
	if err != nil || !uc.BearerToken {
		return "", bad("sentinelCreds hold no bearer user JWT")
	}
	return s, nil
}

// DecodePrepareRetirementAnswer parses a served prepare-retirement's answer on the client side:
// at most MaxAnswerBytes, one closed PrepareRetirementAnswer of v 1 and KindPrepareRetirement,
// its target within the grammars. Binding it to the request is the caller's.
func DecodePrepareRetirementAnswer(b []byte) (*PrepareRetirementAnswer, error) {
	if len(b) > MaxAnswerBytes {
		return nil, bad("the answer is %d bytes (at most %d)", len(b), MaxAnswerBytes)
	}
	var a PrepareRetirementAnswer
	if err := lifecycle.DecodeObject(b, &a); err != nil {
		return nil, bad("the answer: %v", err)
	}
	if a.V != 1 || a.Kind != KindPrepareRetirement {
		return nil, bad("the answer is not a v 1 %s answer", KindPrepareRetirement)
	}
	if err := checkTarget("the answer's target", a.Target); err != nil {
		return nil, err
	}
	return &a, nil
}
