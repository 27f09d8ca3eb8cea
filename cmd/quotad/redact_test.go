package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/quotadtest"
)

// A Redis URL or address that quotad refuses is echoed in the error with
// its password redacted, whatever form it takes (a URL that does not
// parse, one that parses but is refused, a Sentinel or Cluster address
// written as a URL or with credentials) and wherever it comes from (flag,
// environment, config file); so is the one --print-settings shows.
func TestRedisPasswordsAreNeverEchoed(t *testing.T) {
	const secret = "s3cretpw"
	bin := quotadtest.Binary(t)
	file := writeFile(t, "q.yaml", "redis:\n  url: redis://user:"+secret+"@host:bad/0\n")
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"url with a bad port", []string{"--redis", "redis://user:" + secret + "@host:bad/0"}, nil, `parse "redis://user:xxxxx@host:bad/0"`},
		{"url with a bad host", []string{"--redis", "redis://:" + secret + "@[::1/0"}, nil, `parse "redis://:xxxxx@[::1/0"`},
		{"url with an unknown option", []string{"--redis", "rediss://user:" + secret + "@host:6379/0?foo=bar"}, nil, "unexpected option: foo"},
		{"url from the environment", nil, []string{"QUOTAD_REDIS=redis://user:" + secret + "@host:bad/0"}, "redis://user:xxxxx@host:bad/0"},
		{"url from the config file", []string{"--config", file}, nil, "redis://user:xxxxx@host:bad/0"},
		{"sentinel address with credentials", []string{"--redis-sentinel", "user:" + secret + "@h:26379", "--redis-master", "m"}, nil, `"user:xxxxx@h:26379"`},
		{"cluster address as a url", []string{"--redis-cluster", "redis://user:" + secret + "@h:7000"}, nil, `"redis://user:xxxxx@h:7000"`},
		{"cluster list with an empty item", []string{"--redis-cluster", "a:1,,redis://user:" + secret + "@h:7000"}, nil, `"a:1,,redis://user:xxxxx@h:7000"`},
		{"print-settings", []string{"--print-settings", "--redis", "redis://user:" + secret + "@host:6379/0"}, nil, "redis://user:xxxxx@host:6379/0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"--listen", "127.0.0.1:0"}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			out, _ := cmd.CombinedOutput()
			if strings.Contains(string(out), secret) {
				t.Fatalf("the password is in the output:\n%s", out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("output does not say %q:\n%s", tc.want, out)
			}
			t.Logf("%s", strings.TrimSpace(string(out[:min(len(out), 300)])))
		})
	}
}
