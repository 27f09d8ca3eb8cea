package node_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// A node on the embedded memory store, with one configured policy: two
// units a minute per key. The memory store is the authority of this one
// process; Redis (node/store/redis) is the one every node of a cluster
// shares.
func ExampleNew() {
	n, err := node.New(node.Config{Policies: []node.Policy{{
		Name:  "api",
		Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 2, Period: time.Minute},
	}}}, memory.New(nil, 0), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()

	api, _ := n.Policy("api")
	for range 3 {
		res, err := n.Check(context.Background(), api, "user-1", 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Allowed, res.Remaining, res.Source)
	}
	// Output:
	// true 1 store
	// true 0 store
	// false 0 store
}

// Check also takes a policy that is not configured, an inline limit under
// a namespace of the caller's choosing. Cost 0 asks without spending; a
// cost the limit can never admit is an error, not a denial.
func ExampleNode_Check() {
	n, err := node.New(node.Config{}, memory.New(nil, 0), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()

	signup := node.Policy{Name: "signup", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Hour, Burst: 3}}
	for _, cost := range []int64{2, 0, 2, 4} {
		res, err := n.Check(context.Background(), signup, "203.0.113.7", cost)
		if err != nil {
			fmt.Printf("cost %d: %v\n", cost, err)
			continue
		}
		fmt.Printf("cost %d: allowed %t, remaining %d\n", cost, res.Allowed, res.Remaining)
	}
	// Output:
	// cost 2: allowed true, remaining 1
	// cost 0: allowed true, remaining 1
	// cost 2: allowed false, remaining 1
	// cost 4: cost: invalid cost: 4 exceeds what the limit can ever admit (3)
}
