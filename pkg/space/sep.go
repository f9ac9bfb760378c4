package space

import "fmt"

// Service endpoint subjects (seed 002): an endpoint instance serves requests on
// cotal.<t>.sep.<epTok>.<iid>.> and answers on cotal.<t>.sep.reply.<epTok>.<iid>.>. epTok is the
// endpoint's key token (pkg/lifecycle's EndpointToken: labels joined by '_'); iid the instance
// id. "reply" cannot be an endpoint token (a token holds no '.', and the reply family has one
// more token before the instance), so the two families never overlap.
const (
	sepPrefix      = "sep"
	sepReplyPrefix = "sep.reply"
)

func checkServiceCoords(epTok, iid string) error {
	if epTok == "" || epTok == "reply" || len(epTok) > 64 || !isEndpointToken(epTok) {
		return fmt.Errorf("space: service endpoint token %q is not a subject token", epTok)
	}
	if err := ValidateUID(iid); err != nil {
		return fmt.Errorf("space: service instance id: %w", err)
	}
	return nil
}

// ServiceServe is the subject family an instance serves: cotal.<t>.sep.<epTok>.<iid>.>.
func (n Names) ServiceServe(epTok, iid string) (string, error) {
	if err := checkServiceCoords(epTok, iid); err != nil {
		return "", err
	}
	return n.sub(sepPrefix + "." + epTok + "." + iid + ".>"), nil
}

// ServiceReply is the subject family an instance answers on: cotal.<t>.sep.reply.<epTok>.<iid>.>.
func (n Names) ServiceReply(epTok, iid string) (string, error) {
	if err := checkServiceCoords(epTok, iid); err != nil {
		return "", err
	}
	return n.sub(sepReplyPrefix + "." + epTok + "." + iid + ".>"), nil
}

func isEndpointToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
