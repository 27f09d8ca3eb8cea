package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
)

// sharedAPIPort returns a TCP port free on 127.0.0.1 to 127.0.0.n: members
// that share one API port reach each other's at the host of their gossip
// address, as --cluster-api-port's default does.
func sharedAPIPort(t *testing.T, n int) int {
	t.Helper()
	for range 20 {
		port, err := redistest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		free := true
		for i := 2; i <= n && free; i++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0."+strconv.Itoa(i), strconv.Itoa(port)))
			if err != nil {
				free = false
				continue
			}
			l.Close()
		}
		if free {
			return port
		}
	}
	t.Fatalf("no TCP port free on 127.0.0.1 to 127.0.0.%d after 20 tries", n)
	return 0
}

// startSharedPort starts n members on 127.0.0.1 to 127.0.0.n, all with
// their API on one port, gossiping with a fresh key; extra are more flags
// for each. It does not wait for the cluster to form.
func startSharedPort(t *testing.T, n int, redisURL string, extra ...string) []*proc {
	t.Helper()
	bin := quotadtest.Binary(t)
	key := make([]byte, 32)
	rand.Read(key)
	keyFile := writeFile(t, "gossip.key", base64.StdEncoding.EncodeToString(key)+"\n")
	port := sharedAPIPort(t, n)
	procs := []*proc{startProcOn(t, bin, 1, port, redisURL, "", keyFile, extra...)}
	seed := "127.0.0.1:" + procs[0].gossipPort(t)
	for i := 2; i <= n; i++ {
		procs = append(procs, startProcOn(t, bin, i, port, redisURL, seed, keyFile, extra...))
	}
	return procs
}

// startSharedPortCluster is startSharedPort, waiting (generously) until
// each member sees n live members.
func startSharedPortCluster(t *testing.T, n int, redisURL string, extra ...string) []*proc {
	t.Helper()
	procs := startSharedPort(t, n, redisURL, extra...)
	for _, p := range procs {
		waitCluster(t, p, 20*time.Second, fmt.Sprintf("a cluster of %d", n), func(v clusterView) bool { return v.Size == n })
	}
	return procs
}

// tally is what the load generator sent and what it got back: per policy
// the checks allowed and denied, per denied key its denials.
type tally struct {
	mu              sync.Mutex
	allowed, denied map[string]int64
	deniedKeys      map[string]int64
	// sentTo counts the checks sent to each member; errors are the
	// checks that got no decision.
	sentTo map[string]int64
	errors []string
}

func newTally() *tally {
	return &tally{allowed: map[string]int64{}, denied: map[string]int64{}, deniedKeys: map[string]int64{}, sentTo: map[string]int64{}}
}

// total is every decision the load got.
func (ty *tally) total() int64 {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	var n int64
	for _, m := range []map[string]int64{ty.allowed, ty.denied} {
		for _, v := range m {
			n += v
		}
	}
	return n
}

// load checks policy api (tenant keys, mostly allowed from leases) and
// login (two abusive addresses, soon denied) through the given members
// only, from four workers, rounds times each, and counts every answer. A
// check that gets no decision is an error, the first of which it returns.
func (ty *tally) load(ctx context.Context, members []*proc, rounds int) error {
	check := func(p *proc, policy, key string) {
		res, err := checkOn(ctx, p, policy, key, nil)
		ty.mu.Lock()
		defer ty.mu.Unlock()
		ty.sentTo[p.name]++
		if err != nil {
			ty.errors = append(ty.errors, fmt.Sprintf("%s %s/%s: %v", p.name, policy, key, err))
			return
		}
		if res.Allowed {
			ty.allowed[policy]++
			return
		}
		ty.denied[policy]++
		ty.deniedKeys[policy+"/"+key]++
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range rounds {
				p := members[(w+i)%len(members)]
				check(p, "api", fmt.Sprintf("tenant-%d", i%3))
				check(p, "login", "203.0.113.7")
				if i%3 == 0 {
					check(p, "login", "198.51.100.23")
				}
			}
		})
	}
	wg.Wait()
	if len(ty.errors) > 0 {
		return fmt.Errorf("%d checks got no decision, the first: %s", len(ty.errors), ty.errors[0])
	}
	return nil
}

// awaitHistory waits until the history GET /status?<scope>&history=1 of
// the node at base returns holds want decisions. Nodes sample once a
// second; the 30 s allowed cover a starved ticker on a loaded machine.
func awaitHistory(t *testing.T, base, scope string, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := historyDecisions(base + "/status?" + scope + "&history=1")
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %s history holds %d decisions (%v), want the %d made", scope, n, err, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// historyDecisions adds up the decisions of the history at url.
func historyDecisions(url string) (int64, error) {
	res, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var st struct {
		History struct {
			Samples []struct{ Allowed, Denied int64 }
		}
	}
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		return 0, err
	}
	var n int64
	for _, s := range st.History.Samples {
		n += s.Allowed + s.Denied
	}
	return n, nil
}

// reloadAndReadLoadedHistory reloads the page and returns what its chart
// loaded from the history at its first read: decisions and samples.
func (b *browser) reloadAndReadLoadedHistory(t *testing.T) (decisions, samples int64) {
	t.Helper()
	b.do(t, "reload the page", chromedp.Reload())
	b.waitJS(t, "the chart loaded from the history", `document.querySelector('#rate-chart').dataset.loadedDecisions !== undefined`)
	got, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.querySelector('#rate-chart').dataset.loadedDecisions + ' ' + document.querySelector('#rate-chart').dataset.loadedSamples`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(got, &decisions, &samples); err != nil {
		t.Fatalf("the chart says it loaded %q: %v", got, err)
	}
	return decisions, samples
}

// The operator's view of a cluster behind a load balancer: three built
// quotad processes share one redis-server; load goes to node-1 and node-2
// only; node-3's Live view, in a real headless Chromium, shows the
// cluster's totals (exactly what the load generator counted: counters
// are exact and the load has ended before they are read) and the keys
// denied most merged across the members (exact too: two keys denied,
// far fewer than the sketch's 64 counters, within its 5-minute window).
// A reload draws the chart from the node's history at once: the samples
// it loads add up to every decision made. A member killed shows as down,
// with the error, and the totals say they lack it.
func TestConsoleLiveViewShowsTheClusterFromAMemberWithoutLoad(t *testing.T) {
	chromium := lookChromium(t)
	r := redistest.Start(t)
	policies := writeFile(t, "quotad.yaml", `
policies:
  - {name: api, algorithm: token_bucket, limit: 2000, period: 1s, burst: 400}
  - {name: login, algorithm: fixed_window, limit: 10, period: 1h}
`)
	procs := startSharedPortCluster(t, 3, r.URL(), "--config", policies, "--console-show-keys")
	loaded, idle := procs[:2], procs[2]
	ctx := context.Background()

	b := newBrowser(t, chromium, "127.0.0.3")
	b.do(t, "open node-3's Live view", chromedp.Navigate(idle.api+"/#live"),
		chromedp.WaitVisible(chromedp.CSS(`#live-scope button.active[data-scope=cluster]`)))

	ty := newTally()
	done := make(chan error, 1)
	go func() { done <- ty.load(ctx, loaded, 400) }()
	// While the load runs, the cluster's rate shows on a member that gets
	// none of it.
	b.waitJS(t, "a decision rate above zero on node-3", `parseFloat(document.querySelector('#kpi-rate').textContent) > 0`)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ty.mu.Lock()
	t.Logf("load sent %v; allowed %v, denied %v; denied keys %v", ty.sentTo, ty.allowed, ty.denied, ty.deniedKeys)
	if ty.sentTo["node-3"] != 0 || ty.denied["login"] == 0 || ty.allowed["api"] == 0 {
		t.Fatalf("the load must go to node-1 and node-2 only and be both allowed and denied: %v, %v, %v", ty.sentTo, ty.allowed, ty.denied)
	}
	ty.mu.Unlock()

	// node-3 itself decided nothing: what its view shows came from the
	// others.
	if own := getStatusOf(t, idle.api, ""); own.decisions() != 0 {
		t.Fatalf("node-3 made %d decisions itself, want 0", own.decisions())
	}
	for _, policy := range []string{"api", "login"} {
		row := fmt.Sprintf(`tr[data-policy=%q]`, policy)
		b.waitJS(t, fmt.Sprintf("%s's cluster totals (%d allowed, %d denied)", policy, ty.allowed[policy], ty.denied[policy]), fmt.Sprintf(
			`(() => { const r = document.querySelector(%q); return !!r && r.querySelector('.total-allowed').textContent === '%d' && r.querySelector('.total-denied').textContent === '%d'; })()`,
			row, ty.allowed[policy], ty.denied[policy]))
	}
	for _, key := range []string{"203.0.113.7", "198.51.100.23"} {
		want := ty.deniedKeys["login/"+key]
		b.waitJS(t, fmt.Sprintf("%s among login's top keys, denied %d times on node-1 and node-2 together", key, want), fmt.Sprintf(
			`(() => { const li = document.querySelector('.top-policy[data-policy="login"] li[data-key=%q]'); return !!li && li.dataset.count === '%d'; })()`, key, want))
	}
	if got := b.text(t, "#kpi-cluster"); got != "3 / 3" {
		t.Errorf("cluster tile %q, want 3 / 3 members answering", got)
	}

	// A reload: the chart starts from the cluster's history, every
	// decision of the load in it. The node samples once a second, so the
	// test first waits (generously) until the history holds the last
	// decisions.
	total := ty.total()
	awaitHistory(t, idle.api, "scope=cluster", total)
	decisions, samples := b.reloadAndReadLoadedHistory(t)
	if decisions != total || samples < 1 {
		t.Fatalf("after the reload the chart loaded %d decisions in %d samples, want all %d", decisions, samples, total)
	}
	t.Logf("after the reload the chart started with %d samples holding all %d decisions", samples, decisions)

	if *screenshotDir != "" {
		stop1, stop2 := loadForScreenshots(loaded[0].api), loadForScreenshots(loaded[1].api)
		// Only for the docs' picture: twenty seconds of rates on top of
		// the history make the chart readable.
		time.Sleep(20 * time.Second)
		b.screenshot(t, "console-live")
		stop1()
		stop2()
	}

	// node-1 dies without leaving: node-3 cannot reach it, then gossip
	// declares it dead; either way its row says it is down, with why.
	killed := procs[0]
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-killed.exited
	b.waitJS(t, "node-1 shown as down with the error", `(() => {
		const r = document.querySelector('tr[data-member="node-1"]');
		return !!r && r.classList.contains('down') && ['unreachable', 'dead'].includes(r.querySelector('.pill').textContent) &&
			r.querySelector('.error-cell').textContent.length > 0; })()`)
	b.waitJS(t, "the cluster tile counting two members answering", `document.querySelector('#kpi-cluster').textContent === '2 / 3'`)
	t.Logf("node-1 shows %q: %s", b.text(t, `tr[data-member="node-1"] .pill`), b.text(t, `tr[data-member="node-1"] .error-cell`))

	b.mu.Lock()
	defer b.mu.Unlock()
	for _, u := range b.requests {
		if !strings.HasPrefix(u, idle.api+"/") {
			t.Errorf("the page requested %s, outside node-3", u)
		}
	}
	if len(b.errors) > 0 {
		t.Errorf("the page reported errors:\n%s", strings.Join(b.errors, "\n"))
	}
}

// statusCounts is the part of GET /status that counts decisions.
type statusCounts struct {
	Policies []struct {
		Allowed, Denied map[string]int64
	} `json:"policies"`
}

func (s statusCounts) decisions() int64 {
	var n int64
	for _, p := range s.Policies {
		for _, c := range []map[string]int64{p.Allowed, p.Denied} {
			for _, v := range c {
				n += v
			}
		}
	}
	return n
}

func getStatusOf(t *testing.T, base, query string) statusCounts {
	t.Helper()
	res, err := http.Get(base + "/status" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var s statusCounts
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
