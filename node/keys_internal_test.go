package node

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// keyIdentity is everything a key base stands for.
type keyIdentity struct {
	prefix, name, key string
	inline            bool
	limit, periodMs   int64
	capacity          int64
}

// parseBase inverts keyBase: it is the proof that the layout is injective
// (distinct identities cannot share a base if one function maps each base
// back to its identity).
func parseBase(t *testing.T, base string) keyIdentity {
	t.Helper()
	if base[0] != '{' {
		t.Fatalf("%q: no hash tag", base)
	}
	end := strings.IndexByte(base, '}')
	tag, rest := base[1:end], base[end+1:]
	prefix, tag, ok1 := strings.Cut(tag, ":")
	name, key, ok2 := strings.Cut(tag, ":")
	if !ok1 || !ok2 {
		t.Fatalf("%q: tag without prefix and name", base)
	}
	id := keyIdentity{prefix: unescape(t, prefix), name: name, key: unescape(t, key)}
	if rest == "" {
		return id
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 || parts[0] != "" {
		t.Fatalf("%q: variant %q is not /L/T/C", base, rest)
	}
	id.inline = true
	id.limit, _ = strconv.ParseInt(parts[1], 10, 64)
	id.periodMs, _ = strconv.ParseInt(parts[2], 10, 64)
	id.capacity, _ = strconv.ParseInt(parts[3], 10, 64)
	return id
}

func unescape(t *testing.T, s string) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			t.Fatalf("%q: bad escape at %d", s, i)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String()
}

// randomText is a short string drawn from bytes that matter to the layout.
func randomText(rng *rand.Rand, alphabet string, minLen int) string {
	b := make([]byte, minLen+rng.IntN(6))
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// Random prefixes, names, keys and limits, built from the bytes the layout
// treats specially: every base parses back to what it was made of, so no
// two of them are equal; every key of it shares one hash tag that holds the
// whole identity.
func TestKeyBasesAreInjective(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]keyIdentity{}
	for range 20000 {
		prefix := randomText(rng, "q:%/a1", 1) // never a brace: Validate refuses them
		n := keysNode(prefix)
		name := randomText(rng, "ab.-_1", 1)
		key := randomText(rng, "k:%}{/ \xff1", 1)
		p := Policy{Name: name, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1 + rng.Int64N(20), Period: time.Duration(1+rng.Int64N(20)) * time.Millisecond}}
		want := keyIdentity{prefix: prefix, name: name, key: key, inline: true, limit: p.Limit.Limit, periodMs: p.Limit.PeriodMillis(), capacity: p.Limit.Capacity()}
		if rng.IntN(2) == 0 {
			n = keysNode(prefix, p)
			want = keyIdentity{prefix: prefix, name: name, key: key}
		}
		base := n.keyBase(p, key)
		if got := parseBase(t, base); got != want {
			t.Fatalf("%q parses as %+v, was made from %+v", base, got, want)
		}
		if other, ok := seen[base]; ok && other != want {
			t.Fatalf("%q stands for %+v and %+v", base, other, want)
		}
		seen[base] = want
		family, _ := SplitBase(base)
		if family != n.keyFamily(name, key) {
			t.Fatalf("%q: family %q, keyFamily %q", base, family, n.keyFamily(name, key))
		}
		for _, k := range algorithms.AllKeys(base) {
			if tag := hashTag(k); tag != family[1:len(family)-1] {
				t.Fatalf("%q hashes on %q, not on its family %q", k, tag, family)
			}
		}
	}
}

// The issue's collision: prefix q with inline namespace prod and key
// per-ip:victim2 was the Redis key of prefix q:prod's configured policy
// per-ip and key victim2.
func TestKeyBaseIssueCollision(t *testing.T) {
	lim := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 3, Period: time.Minute}
	inlineNode := keysNode("q")
	configured := Policy{Name: "per-ip", Limit: lim}
	configuredNode := keysNode("q:prod", configured)
	a := inlineNode.keyBase(Policy{Name: "prod", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: time.Millisecond}}, "per-ip:victim2")
	b := configuredNode.keyBase(configured, "victim2")
	t.Logf("inline: %s, configured: %s", a, b)
	if a == b || hashTag(a) == hashTag(b) {
		t.Fatalf("the two share a key: %s and %s", a, b)
	}
	if want := "{q%3Aprod:per-ip:victim2}"; b != want {
		t.Errorf("configured base %s, want %s", b, want)
	}
	if want := "{q:prod:per-ip:victim2}/1000/1/1000"; a != want {
		t.Errorf("inline base %s, want %s", a, want)
	}
}

// The layout of configured policies is unchanged for prefixes and keys
// without '%', ':' (prefix) or '}': their counters survive an upgrade.
func TestKeyBaseOfPlainKeysIsUnchanged(t *testing.T) {
	api := Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 1, Period: time.Second}}
	n := keysNode("quotad", api)
	if got := n.keyBase(api, "user:1/x{y"); got != "{quotad:api:user:1/x{y}" {
		t.Fatalf("base %s", got)
	}
}

// keysNode is a bare node with key prefix prefix and the configured
// policies ps, enough for keyBase and keyFamily.
func keysNode(prefix string, ps ...Policy) *Node {
	n := &Node{cfg: Config{KeyPrefix: prefix}}
	n.policies.Store(newPolicySet(ps, FailOpen))
	return n
}

func ExampleNode_keyBase() {
	api := Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100, Period: time.Minute}}
	n := keysNode("quotad", api)
	fmt.Println(n.keyBase(api, "user-1"))
	fmt.Println(n.keyBase(api, "}odd%key"))
	fmt.Println(n.keyBase(Policy{Name: "ns", Limit: algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 100, Period: time.Minute, Burst: 20}}, "user-1"))
	// Output:
	// {quotad:api:user-1}
	// {quotad:api:%7Dodd%25key}
	// {quotad:ns:user-1}/100/60000/20
}

// hashTag returns the part of a Redis key that decides its Cluster slot,
// as Redis Cluster (and the Redis store's pipeline) reads it: the text
// between the first "{" and the first "}" after it, if not empty, else the
// whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}
