package server

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/cotalgo/cotal/pkg/profiles"
)

// Remint rebuilds a credential from the parameters it was minted with, under the policy and the
// profiles in force, rather than copying its permissions. The parameters travel in the
// credential itself, as tags, because replicas keep no state but their keys: any replica can
// renew any credential, and the tags are covered by the signature this signer made.
//
// The tags are ParamsTag, which says the credential records its parameters (so a credential
// without parameters is told apart from one minted before they were recorded), and one
// "param:<field>=<value>" tag per parameter that is set, lists joined with ','. No grammar in
// pkg/space admits ',' or '=', and every value is validated again by profiles.Build when it is
// read back. Tags are assigned, never added with jwt.TagList.Add, which lower-cases them.
const (
	// ParamsTag marks a credential that records its minting parameters.
	ParamsTag = "params:v1"
	// ParamTagPrefix starts each parameter tag.
	ParamTagPrefix = "param:"
)

// The parameter tag fields, in the order paramTags writes them.
const (
	paramOwner          = "owner"
	paramActor          = "actor"
	paramUID            = "uid"
	paramRole           = "role"
	paramSubscribe      = "subscribe"
	paramAllowSubscribe = "allow_subscribe"
	paramAllowPublish   = "allow_publish"
	paramCapabilities   = "capabilities"
	paramInboxNonce     = "inbox_nonce"
	paramTargetOwner    = "target_owner"
	paramTargetActor    = "target_actor"
	paramTargetUID      = "target_uid"
	paramServiceEp      = "service_endpoint"
	paramInstanceID     = "instance_id"
	paramMemberChannels = "member_channels"
)

// errNoParams marks a credential minted before signerd recorded parameters.
var errNoParams = errors.New("credential does not record its minting parameters")

// paramTags returns the tags that record p.
func paramTags(p profiles.Params) []string { return appendParamTags(nil, p) }

// maxParamTags is the most tags appendParamTags adds: ParamsTag and one per field.
const maxParamTags = 16

// appendParamTags appends paramTags(p) to tags.
func appendParamTags(tags []string, p profiles.Params) []string {
	tags = append(tags, ParamsTag)
	add := func(field, v string) {
		if v != "" {
			tags = append(tags, ParamTagPrefix+field+"="+v)
		}
	}
	add(paramOwner, p.Owner)
	add(paramActor, p.Actor)
	add(paramUID, p.LifecycleUID)
	add(paramRole, p.Role)
	add(paramSubscribe, strings.Join(p.Subscribe, ","))
	add(paramAllowSubscribe, strings.Join(p.AllowSubscribe, ","))
	add(paramAllowPublish, strings.Join(p.AllowPublish, ","))
	add(paramCapabilities, strings.Join(p.Capabilities, ","))
	add(paramInboxNonce, p.InboxNonce)
	if t := p.Target; t != nil {
		add(paramTargetOwner, t.Owner)
		add(paramTargetActor, t.Actor)
		add(paramTargetUID, t.LifecycleUID)
	}
	add(paramServiceEp, p.ServiceEndpoint)
	add(paramInstanceID, p.InstanceID)
	add(paramMemberChannels, strings.Join(p.MemberChannels, ","))
	return tags
}

// paramsFromTags reads back what paramTags wrote. It refuses a credential without ParamsTag
// (errNoParams), an unknown field, a field given twice and an empty value; the values
// themselves are left to profiles.Build. Any target field makes Params.Target non-nil, so a
// credential recording only part of a target is rebuilt with the rest empty and refused.
func paramsFromTags(tags jwt.TagList) (profiles.Params, error) {
	var p profiles.Params
	marked := false
	seen := map[string]bool{}
	for _, t := range tags {
		if t == ParamsTag {
			marked = true
			continue
		}
		rest, ok := strings.CutPrefix(t, ParamTagPrefix)
		if !ok {
			continue
		}
		field, v, ok := strings.Cut(rest, "=")
		if !ok || v == "" {
			return profiles.Params{}, fmt.Errorf("parameter tag %.40q has no value", t)
		}
		if seen[field] {
			return profiles.Params{}, fmt.Errorf("parameter %.40q is recorded twice", field)
		}
		seen[field] = true
		list := func() []string { return strings.Split(v, ",") }
		switch field {
		case paramOwner:
			p.Owner = v
		case paramActor:
			p.Actor = v
		case paramUID:
			p.LifecycleUID = v
		case paramRole:
			p.Role = v
		case paramSubscribe:
			p.Subscribe = list()
		case paramAllowSubscribe:
			p.AllowSubscribe = list()
		case paramAllowPublish:
			p.AllowPublish = list()
		case paramCapabilities:
			p.Capabilities = list()
		case paramInboxNonce:
			p.InboxNonce = v
		case paramTargetOwner, paramTargetActor, paramTargetUID:
			if p.Target == nil {
				p.Target = &profiles.RetirementTarget{}
			}
			switch field {
			case paramTargetOwner:
				p.Target.Owner = v
			case paramTargetActor:
				p.Target.Actor = v
			default:
				p.Target.LifecycleUID = v
			}
		case paramServiceEp:
			p.ServiceEndpoint = v
		case paramInstanceID:
			p.InstanceID = v
		case paramMemberChannels:
			p.MemberChannels = list()
		default:
			return profiles.Params{}, fmt.Errorf("unknown parameter %.40q", field)
		}
	}
	if !marked {
		return profiles.Params{}, errNoParams
	}
	return p, nil
}

// minterTagOf returns the credential's minter tag, "" if it has none.
func minterTagOf(tags jwt.TagList) string {
	for _, t := range tags {
		if strings.HasPrefix(t, MinterTagPrefix) {
			return t
		}
	}
	return ""
}
