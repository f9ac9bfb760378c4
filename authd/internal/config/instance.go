package config

import "fmt"

// InstanceIDLen is the length of an instance id: 128 random bits as lowercase hex.
const InstanceIDLen = 32

// CheckInstanceID refuses anything but InstanceIDLen lowercase hex digits.
func CheckInstanceID(id string) error {
	if len(id) != InstanceIDLen {
		return fmt.Errorf("%.80q is not %d lowercase hex digits", id, InstanceIDLen)
	}
	for _, r := range id {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return fmt.Errorf("%.80q is not %d lowercase hex digits", id, InstanceIDLen)
		}
	}
	return nil
}
