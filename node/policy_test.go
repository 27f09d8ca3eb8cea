package node

import (
	"errors"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
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

// NewPolicy refuses what Validate refuses and marks what it accepts; a
// literal, validated, equals the policy NewPolicy built of it.
func TestNewPolicy(t *testing.T) {
	ok := Policy{Name: "ok", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 2, Period: time.Minute}}
	if _, err := NewPolicy(Policy{Name: "a:b", Limit: ok.Limit}); !errors.Is(err, ErrInvalidPolicyName) {
		t.Fatalf("NewPolicy of a bad name: %v", err)
	}
	if _, err := NewPolicy(Policy{Name: "ok"}); !errors.Is(err, algorithms.ErrInvalidInput) {
		t.Fatalf("NewPolicy of no limit: %v", err)
	}
	p, err := NewPolicy(ok)
	if err != nil || !p.valid {
		t.Fatalf("NewPolicy(%+v) = %+v, %v", ok, p, err)
	}
	if v, err := ok.validated(); err != nil || v != p {
		t.Fatalf("a literal validated is %+v, %v; want %+v", v, err, p)
	}

}
