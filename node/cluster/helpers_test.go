package cluster_test

import (
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/nodetest"
)

var fiveAMinute = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: time.Minute}

// The helpers of package node's tests that the cluster's tests share.
var (
	newNode       = nodetest.New
	newRedisStore = nodetest.RedisStore
)

type countingStore = nodetest.CountingStore
