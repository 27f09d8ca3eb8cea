package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The members' published demand (node.ShareStore) on Redis: one hash per
// shared limit, whose field member|parity holds "round|vector" for the
// member's last two rounds. One script call writes the member's vector of
// a round and reads every member's vector of the round before, so that
// every member asking during a round reads the same set; fields two rounds
// old or more are deleted on the way, and the hash expires ttl after its
// last write.

// shareScript is the exchange: KEYS[1] the hash; ARGV member, round,
// vector, ttl in ms. It returns a flat list of member, vector pairs.
var shareScript = goredis.NewScript(`
local r = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1] .. '|' .. (r % 2), ARGV[2] .. '|' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local want = tostring(r - 1)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local v = all[i + 1]
  local bar = string.find(v, '|', 1, true)
  local tag = string.sub(v, 1, bar - 1)
  if tag == want then
    local f = all[i]
    out[#out + 1] = string.sub(f, 1, #f - 2)
    out[#out + 1] = string.sub(v, bar + 1)
  elseif tonumber(tag) < r - 1 then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
`)

// ExchangeShares implements node.ShareStore, through the checks' pipeline.
func (s *Store) ExchangeShares(ctx context.Context, base, member string, round int64, vector string, ttl time.Duration) (map[string]string, error) {
	args := []any{member, strconv.FormatInt(round, 10), vector, ttl.Milliseconds()}
	reply, err := s.checkPipe.run(ctx, s.cfg.Timeout, shareScript, nil, []string{base}, args, nil)
	if err != nil {
		return nil, fmt.Errorf("redis share exchange: %w", err)
	}
	flat, ok := reply.([]any)
	if !ok || len(flat)%2 != 0 {
		return nil, fmt.Errorf("redis share exchange: unexpected reply %T", reply)
	}
	out := make(map[string]string, len(flat)/2)
	for i := 0; i < len(flat); i += 2 {
		m, ok1 := flat[i].(string)
		v, ok2 := flat[i+1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("redis share exchange: unexpected reply element %T", flat[i])
		}
		out[m] = v
	}
	return out, nil
}
