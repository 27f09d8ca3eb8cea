package cache

import (
	"strconv"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
)

func benchKeys(n int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Key{Policy: "api-default", Key: "user-" + strconv.Itoa(i), Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	}
	return keys
}

func benchDenied(b *testing.B, keys []Key) *Denied {
	d := newTestDenied(b, DeniedConfig{})
	for _, k := range keys {
		d.Add(k, 1, denial(100, 0, time.Minute, time.Minute), t0)
	}
	d.Wait()
	return d
}

func BenchmarkDeniedLookupHit(b *testing.B) {
	keys := benchKeys(1)
	d := benchDenied(b, keys)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := d.Lookup(keys[0], 1, t0); !ok {
			b.Fatal("miss")
		}
	}
}

func BenchmarkDeniedLookupMiss(b *testing.B) {
	d := benchDenied(b, benchKeys(1024))
	absent := Key{Policy: "api-default", Key: "someone-else", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := d.Lookup(absent, 1, t0); ok {
			b.Fatal("hit")
		}
	}
}

func BenchmarkDeniedAdd(b *testing.B) {
	keys := benchKeys(1024)
	d := newTestDenied(b, DeniedConfig{})
	dec := denial(100, 0, time.Minute, time.Minute)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		d.Add(keys[i%len(keys)], 1, dec, t0)
		i++
	}
}

// The parallel variants spread over 1024 keys: one hot key is the case for
// contention on ristretto's shard lock, the spread one for throughput.

func BenchmarkDeniedLookupHitParallel(b *testing.B) {
	keys := benchKeys(1024)
	d := benchDenied(b, keys)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			d.Lookup(keys[i%len(keys)], 1, t0)
			i++
		}
	})
}

func BenchmarkDeniedLookupHitParallelOneKey(b *testing.B) {
	keys := benchKeys(1)
	d := benchDenied(b, keys)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d.Lookup(keys[0], 1, t0)
		}
	})
}

func BenchmarkDeniedLookupMissParallel(b *testing.B) {
	d := benchDenied(b, nil)
	keys := benchKeys(1024)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			d.Lookup(keys[i%len(keys)], 1, t0)
			i++
		}
	})
}

func BenchmarkDeniedAddParallel(b *testing.B) {
	keys := benchKeys(1024)
	d := newTestDenied(b, DeniedConfig{})
	dec := denial(100, 0, time.Minute, time.Minute)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			d.Add(keys[i%len(keys)], 1, dec, t0)
			i++
		}
	})
}
