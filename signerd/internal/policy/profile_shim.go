package policy

import "github.com/cotalgo/cotal/pkg/profiles"

// parseProfile is a stand-in for profiles.Parse until pkg/profiles provides it.
func parseProfile(s string) (profiles.Name, error) {
	switch n := profiles.Name(s); n {
	case profiles.Agent, profiles.Supervisor, profiles.Provisioner, profiles.Deprovisioner,
		profiles.Delivery, profiles.Observer, profiles.Admin, profiles.Operator, profiles.Probe,
		profiles.AuthCallout, profiles.Sentinel:
		return n, nil
	}
	return "", &profiles.UnknownProfileError{Name: s}
}
