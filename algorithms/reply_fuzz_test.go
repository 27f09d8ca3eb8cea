package algorithms

import (
	"errors"
	"testing"
)

// FuzzDecodeAcquireReply feeds the decoder replies of every shape Redis
// could send: the right eight integers with any values, too few or too many
// items, and items of other types. It must never panic; what it accepts
// must keep the contract callers rely on.
func FuzzDecodeAcquireReply(f *testing.F) {
	f.Add(uint8(0), int64(1), int64(10), int64(9), int64(1000), int64(0), int64(1), int64(0), int64(0))
	f.Add(uint8(0), int64(0), int64(10), int64(0), int64(1000), int64(500), int64(0), int64(0), int64(0))
	f.Add(uint8(1), int64(1), int64(10), int64(9), int64(1000), int64(0), int64(5), int64(200), int64(3))
	f.Add(uint8(2), int64(1), int64(-1), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0))
	f.Add(uint8(3), int64(1), int64(1<<62), int64(1<<62), int64(1<<62), int64(0), int64(1<<62), int64(1<<62), int64(0))
	f.Fuzz(func(t *testing.T, shape uint8, a, limit, remaining, resetMs, retryMs, granted, useMs, ref int64) {
		items := []any{a, limit, remaining, resetMs, retryMs, granted, useMs, ref}
		// shape picks a malformation: low bits the length, high bits a
		// foreign item type at some position.
		switch shape % 4 {
		case 1:
			items = items[:int(uint64(a)%8)]
		case 2:
			items = append(items, ref)
		}
		if at := int(shape/4) % 9; at < len(items) && shape >= 32 {
			items[at] = []any{"nested", nil, 1.5, "1"}[shape%4]
		}
		var reply any = items
		if shape == 255 {
			reply = "OK"
		}
		d, g, err := DecodeAcquireReply(reply)
		if err != nil {
			if !errors.Is(err, ErrBadReply) {
				t.Fatalf("error %v does not wrap ErrBadReply", err)
			}
			return
		}
		switch {
		case d.Limit <= 0 || d.Remaining < 0 || d.Remaining > d.Limit:
			t.Fatalf("accepted remaining %d of limit %d", d.Remaining, d.Limit)
		case d.ResetAfter < 0 || d.RetryAfter < 0 || g.UseWithin < 0:
			t.Fatalf("accepted a negative wait: %+v %+v", d, g)
		case d.Allowed && d.RetryAfter != 0:
			t.Fatalf("accepted an allowed decision with a retry_after: %+v", d)
		case g.Units < 0 || g.Units > d.Limit || !d.Allowed && g.Units != 0:
			t.Fatalf("accepted grant %+v with %+v", g, d)
		}
		if r, err := DecodeReleaseReply(reply); err == nil && r < 0 {
			t.Fatalf("release reply decoded to %d", r)
		}
	})
}
