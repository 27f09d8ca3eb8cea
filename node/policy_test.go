package node

import (
	"errors"
	"testing"
)

// A bad character in a policy name is quoted as the character it is: the
// whole UTF-8 sequence, or the lone byte when the name is not UTF-8.
func TestPolicyNameErrorQuotesTheCharacter(t *testing.T) {
	for name, want := range map[string]string{
		"a:b":    `policy: invalid policy name: "a:b" has ':' at byte 1; use A-Z a-z 0-9 _ . -`,
		"Привет": `policy: invalid policy name: "Привет" has 'П' at byte 0; use A-Z a-z 0-9 _ . -`,
		"okÐ":    `policy: invalid policy name: "okÐ" has 'Ð' at byte 2; use A-Z a-z 0-9 _ . -`,
		"a\xffb": `policy: invalid policy name: "a\xffb" has '\xff' at byte 1; use A-Z a-z 0-9 _ . -`,
		"x😀":     `policy: invalid policy name: "x😀" has '😀' at byte 1; use A-Z a-z 0-9 _ . -`,
	} {
		err := ValidatePolicyName(name)
		if !errors.Is(err, ErrInvalidPolicyName) || err.Error() != want {
			t.Errorf("ValidatePolicyName(%q) = %v, want %s", name, err, want)
		}
	}
}
