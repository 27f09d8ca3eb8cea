package redis

import "testing"

// Redact hides the password of URLs and addresses, parsed or not, and
// leaves everything else as it was.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://user:pw@host:6379/0":      "redis://user:xxxxx@host:6379/0",
		"redis://:pw@host:bad/0":           "redis://:xxxxx@host:bad/0",
		"rediss://u:p@ss@host:1/0?x=a@b":   "rediss://u:xxxxx@host:1/0?x=a@b",
		"redis://u:pa/ss@host:1":           "redis://u:xxxxx@host:1",
		"user:pw@h:26379":                  "user:xxxxx@h:26379",
		"redis://user@host:6379":           "redis://user@host:6379",
		"redis://host:6379/0":              "redis://host:6379/0",
		"h:7000":                           "h:7000",
		"redis://user:pw@[::1/0#frag@ment": "redis://user:xxxxx@[::1/0#frag@ment",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
