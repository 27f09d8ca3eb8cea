package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
)

// screenshotDir, when set, receives the console test's screenshots too
// (make screenshots writes docs/console-*.png with it).
var screenshotDir = flag.String("console.screenshots", "", "also write the console test's screenshots (PNG) to this `directory`")

// startBinary runs the built quotad with args on a free loopback port and
// returns its base URL. It is stopped with SIGTERM when the test ends.
func startBinary(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(quotadtest.Binary(t), append([]string{"--listen", "127.0.0.1:0"}, args...)...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("quotad stderr:\n%s", stderr.tail())
		}
	})
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		<-exited
		t.Fatalf("quotad printed nothing; stderr:\n%s", stderr.tail())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	const marker = "quotad listening on "
	if !strings.HasPrefix(lines.Text(), marker) {
		t.Fatalf("first line %q does not say where quotad listens", lines.Text())
	}
	return strings.Fields(strings.TrimPrefix(lines.Text(), marker))[0]
}

// lookChromium finds Debian's chromium. Its absence fails the test: the
// console is only proven in a real browser.
func lookChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found in PATH: the console test drives a real headless Chromium; " +
		"install it with `make chromium` (sudo apt-get install -y --no-install-recommends chromium fonts-liberation)")
	return ""
}

// browser starts a headless Chromium that can reach nothing but
// 127.0.0.1 and the addresses newBrowser's alsoReach names (no DNS, no
// QUIC, no background or component traffic) with a fresh profile, and
// records every request the page makes and every error it reports.
type browser struct {
	ctx      context.Context
	mu       sync.Mutex
	requests []string
	errors   []string
}

func newBrowser(t *testing.T, chromium string, alsoReach ...string) *browser {
	t.Helper()
	rules := "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
	for _, h := range alsoReach {
		rules += ", EXCLUDE " + h
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox, // tests may run as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		// Any name but the loopback address (and alsoReach) fails to
		// resolve: a page that needed a CDN would break here.
		chromedp.Flag("host-resolver-rules", rules),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	// A generous bound for a loaded 2-core machine; the test normally
	// takes a few seconds.
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	b := &browser{ctx: ctx}
	// chromedp enables the Network, Runtime and Log domains on its own.
	if err := chromedp.Listen(ctx, b.record); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

// record keeps what the page requests and the errors it reports. It runs
// on chromedp's reading goroutine and must be quick.
func (b *browser) record(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch e := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.requests = append(b.requests, e.Request.URL)
	case *runtime.EventExceptionThrown:
		b.errors = append(b.errors, (&chromedp.ExceptionError{ExceptionDetails: e.ExceptionDetails}).Error())
	case *log.EventEntryAdded:
		if e.Entry.Level == log.EntryLevelError {
			b.errors = append(b.errors, "log: "+e.Entry.Text+" "+e.Entry.URL)
		}
	}
}

func (b *browser) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// text returns the text of the first visible element matching sel.
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
	if err != nil {
		t.Fatalf("read %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// waitJS waits until the JavaScript expression is true.
func (b *browser) waitJS(t *testing.T, what, expr string) {
	t.Helper()
	b.do(t, "wait for "+what, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second)))
}

// card returns a selector inside the playground card of algorithm algo.
func card(algo, sel string) string {
	return fmt.Sprintf(`.card[data-algorithm=%q] %s`, algo, sel)
}

// setField sets a card's field as a user would: a new value, then change.
func (b *browser) setField(t *testing.T, algo, name, value string) {
	t.Helper()
	js := fmt.Sprintf(`(() => { const i = document.querySelector(%q); i.value = %q; i.dispatchEvent(new Event('change')); return true; })()`,
		card(algo, "input[name="+name+"]"), value)
	b.do(t, "set "+algo+" "+name, chromedp.Evaluate[chromedp.Void](js))
}

// clicks presses a card's button and waits until the card shows n
// decisions in all (the buttons are disabled while a check is running).
func (b *browser) click(t *testing.T, algo, action string, wantDecisions int) {
	t.Helper()
	b.do(t, "click "+algo+" "+action, chromedp.Click(chromedp.CSS(card(algo, `button[data-action=`+action+`]:not([disabled])`)), chromedp.NodeVisible))
	b.waitJS(t, fmt.Sprintf("%s to show %d decisions", algo, wantDecisions), fmt.Sprintf(
		`(() => { const c = document.querySelector(%q); return !c.querySelector('button[disabled]') && Number(c.querySelector('.n-allowed').textContent) + Number(c.querySelector('.n-denied').textContent) === %d; })()`,
		fmt.Sprintf(`.card[data-algorithm=%q]`, algo), wantDecisions))
}

// screenshot captures the whole page as PNG, checks it is not blank and
// shows the colours of allowed and denied decisions, and writes it to the
// test's directory (and to -console.screenshots).
func (b *browser) screenshot(t *testing.T, name string) { b.screenshotTo(t, name, *screenshotDir) }

// screenshotTo is screenshot writing to the test's directory and to dir,
// unless dir is empty.
func (b *browser) screenshotTo(t *testing.T, name, dir string) {
	t.Helper()
	// From the top, so that the sticky header is where a reader expects it.
	b.do(t, "scroll to the top", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	buf, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	img, err := png.Decode(bytes.NewReader(buf))
	if err != nil {
		t.Fatalf("screenshot %s is not a PNG: %v", name, err)
	}
	checkNotBlank(t, name, img)
	for _, dir := range []string{t.TempDir(), dir} {
		if dir == "" {
			continue
		}
		path := filepath.Join(dir, name+".png")
		if err := os.WriteFile(path, buf, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s: %dx%d, %d bytes", path, img.Bounds().Dx(), img.Bounds().Dy(), len(buf))
	}
}

// checkNotBlank fails unless img is a real page: large, not one colour,
// and with the console's green (allowed) and red (denied).
func checkNotBlank(t *testing.T, name string, img image.Image) {
	t.Helper()
	r := img.Bounds()
	if r.Dx() < 1000 || r.Dy() < 600 {
		t.Fatalf("screenshot %s is %dx%d", name, r.Dx(), r.Dy())
	}
	counts := map[[3]uint32]int{}
	green, red := 0, 0
	for y := r.Min.Y; y < r.Max.Y; y += 2 {
		for x := r.Min.X; x < r.Max.X; x += 2 {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			c := [3]uint32{cr >> 8, cg >> 8, cb >> 8}
			counts[c]++
			if near(c, [3]uint32{0x16, 0xa3, 0x4a}) {
				green++
			}
			if near(c, [3]uint32{0xdc, 0x26, 0x26}) {
				red++
			}
		}
	}
	total, top := 0, 0
	for _, n := range counts {
		total += n
		top = max(top, n)
	}
	if len(counts) < 50 || top > total*9/10 || green < 20 || red < 20 {
		t.Fatalf("screenshot %s looks blank: %d colours, the commonest covers %d of %d samples, %d green and %d red samples",
			name, len(counts), top, total, green, red)
	}
}

func near(a, b [3]uint32) bool {
	d := func(x, y uint32) uint32 { return max(x, y) - min(x, y) }
	return d(a[0], b[0]) < 12 && d(a[1], b[1]) < 12 && d(a[2], b[2]) < 12
}

// The console in a real browser, on the built binary with a real redis-server:
// five Sends on the fixed window (limit 5) are allowed and the sixth is
// denied with a retry-after; Burst 10 on the token bucket (capacity 5)
// splits 5/5; Reset makes the fixed window allow again; the Live view shows
// those decisions and the key denied most; the page loads nothing from
// anywhere but quotad and reports no error.
func TestConsoleInChromium(t *testing.T) {
	chromium := lookChromium(t)
	r := redistest.Start(t)
	policies := writeFile(t, "quotad.yaml", `
policies:
  - {name: api, algorithm: token_bucket, limit: 2000, period: 1s, burst: 400}
  - {name: login, algorithm: fixed_window, limit: 3, period: 1m}
`)
	// A loaded machine must not time out Redis calls: a check that fails
	// open would read as allowed where the test expects a denial.
	// The keys themselves, for the Live view's top limited keys to name
	// the ones the test denied (by default they are hashed).
	args := []string{"--redis", r.URL(), "--config", policies, "--redis-timeout", "5s", "--console-show-keys"}
	if *screenshotDir != "" {
		port, err := redistest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--cluster-addr", fmt.Sprintf("127.0.0.1:%d", port), "--cluster-insecure", "--node-name", "quotad-1")
	}
	base := startBinary(t, args...)
	b := newBrowser(t, chromium)
	b.do(t, "open /", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(card("gcra", "button[data-action=send]"))))

	// A one-hour window: the six checks must not straddle its edge.
	if untilEdge := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); untilEdge < time.Minute {
		t.Logf("waiting %s for the hour's window edge to pass", untilEdge)
		time.Sleep(untilEdge + time.Second)
	}
	if got := b.text(t, card("fixed_window", "h2")); got != "Fixed window" {
		t.Fatalf("fixed window card titled %q", got)
	}
	if limit, err := chromedp.Run(b.ctx, chromedp.Value(chromedp.CSS(card("fixed_window", "input[name=limit]")))); err != nil || limit != "5" {
		t.Fatalf("fixed window limit %q (%v), want 5", limit, err)
	}
	b.setField(t, "fixed_window", "period", "1h")
	for i := 1; i <= 6; i++ {
		b.click(t, "fixed_window", "send", i)
		want := "allowed"
		if i == 6 {
			want = "denied"
		}
		if got := b.text(t, card("fixed_window", ".verdict")); got != want {
			t.Fatalf("send %d: the card shows %q, want %q", i, got, want)
		}
	}
	if a, d := b.text(t, card("fixed_window", ".n-allowed")), b.text(t, card("fixed_window", ".n-denied")); a != "5" || d != "1" {
		t.Fatalf("fixed window: %s allowed, %s denied; want 5 and 1", a, d)
	}
	retry := b.text(t, card("fixed_window", ".retry-after"))
	if retry == "—" || !strings.ContainsAny(retry, "0123456789") {
		t.Fatalf("the denial shows retry-after %q, want a wait", retry)
	}
	t.Logf("sixth send: denied, remaining %s, retry-after %s, source %s",
		b.text(t, card("fixed_window", ".remaining")), retry, b.text(t, card("fixed_window", ".source")))

	// Capacity 5 and one token back per 12 minutes: ten in a row are
	// five allowed, five denied.
	b.setField(t, "token_bucket", "period", "1h")
	b.click(t, "token_bucket", "burst", 10)
	if a, d := b.text(t, card("token_bucket", ".n-allowed")), b.text(t, card("token_bucket", ".n-denied")); a != "5" || d != "5" {
		t.Fatalf("token bucket burst 10: %s allowed, %s denied; want 5 and 5", a, d)
	}

	b.do(t, "reset", chromedp.Click(chromedp.CSS(card("fixed_window", "button[data-action=reset]"))))
	b.waitJS(t, "the reset", fmt.Sprintf(`document.querySelector(%q).textContent === 'reset'`, card("fixed_window", ".verdict")))
	b.click(t, "fixed_window", "send", 7)
	if got := b.text(t, card("fixed_window", ".verdict")); got != "allowed" {
		t.Fatalf("send after reset: %q, want allowed", got)
	}

	// The boundary demo: five checks just before a fixed-window edge and
	// five just after. The sliding log admits 5; the fixed window more (all
	// 10 unless the first checks were too slow to land before the edge).
	// The demo times its first five checks against the browser's clock;
	// on a loaded machine they can land after the edge, so a run where the
	// fixed window shows no boundary burst is tried again, up to 3 times.
	var fixed, sliding string
	for try := 1; try <= 3; try++ {
		b.do(t, "run the boundary demo", chromedp.Click(chromedp.CSS("#boundary-run")))
		b.waitJS(t, "the boundary demo", `document.querySelectorAll('.lane-verdict[data-allowed]').length === 2`)
		fixed = b.text(t, `.lane[data-lane=fixed_window] .lane-verdict`)
		sliding = b.text(t, `.lane[data-lane=sliding_window_log] .lane-verdict`)
		if !strings.HasPrefix(fixed, "5 of 10") {
			break
		}
		t.Logf("boundary demo try %d: fixed window %q: its first checks missed the edge; again", try, fixed)
	}
	if !strings.HasPrefix(sliding, "5 of 10 allowed") || strings.HasPrefix(fixed, "5 of 10") {
		t.Fatalf("boundary demo: fixed window %q, sliding log %q; want more than 5 and exactly 5", fixed, sliding)
	}
	t.Logf("boundary demo: fixed window %q, sliding log %q", fixed, sliding)
	b.screenshot(t, "console-playground")

	// Live: the cards made 5 + 5 + 1 allowed and 1 + 5 denied under the
	// playground's namespace; the demo 1 (its probe) + fa + 5 allowed and
	// 10 − fa + 5 denied. The token bucket's key was denied 5 times.
	fa, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`Number(document.querySelector('.lane[data-lane=fixed_window] .lane-verdict').dataset.allowed)`))
	if err != nil {
		t.Fatal(err)
	}
	wantAllowed, wantDenied := 11+1+fa+5, 6+10-fa+5
	b.do(t, "open Live", chromedp.Click(chromedp.CSS("#tab-live")))
	row := `tr[data-policy="quotad-console"]`
	b.waitJS(t, fmt.Sprintf("the live totals (%d allowed, %d denied)", wantAllowed, wantDenied), fmt.Sprintf(
		`(() => { const r = document.querySelector(%q); return !!r && r.querySelector('.total-allowed').textContent === '%d' && r.querySelector('.total-denied').textContent === '%d'; })()`,
		row, wantAllowed, wantDenied))
	b.waitJS(t, "the token bucket's key among the top limited keys", `[...document.querySelectorAll('.top-policy[data-policy="quotad-console"] li')].some(
		(li) => li.dataset.key.includes('/token_bucket/') && li.querySelector('.count').textContent === '5')`)
	b.waitJS(t, "the configured policies' rows", `!!document.querySelector('tr[data-policy="api"]') && !!document.querySelector('tr[data-policy="login"]')`)
	if got := b.text(t, "#kpi-breaker"); got != "closed" {
		t.Errorf("breaker tile %q, want closed", got)
	}
	// A reload starts the chart from the node's history, which holds
	// every decision the page made.
	total := int64(wantAllowed + wantDenied)
	awaitHistory(t, base, "scope=node", total)
	if decisions, samples := b.reloadAndReadLoadedHistory(t); decisions != total || samples < 1 {
		t.Fatalf("after the reload the chart loaded %d decisions in %d samples, want all %d", decisions, samples, total)
	}
	b.waitJS(t, "the live totals again after the reload", fmt.Sprintf(
		`(() => { const r = document.querySelector(%q); return !!r && r.querySelector('.total-allowed').textContent === '%d'; })()`, row, wantAllowed))
	// docs/console-live.png is taken on a cluster of three
	// (TestConsoleLiveViewShowsTheClusterFromAMemberWithoutLoad); this
	// one stays with the test.
	b.screenshotTo(t, "console-live", "")

	b.mu.Lock()
	defer b.mu.Unlock()
	for _, u := range b.requests {
		if !strings.HasPrefix(u, base+"/") {
			t.Errorf("the page requested %s, outside quotad", u)
		}
	}
	if len(b.errors) > 0 {
		t.Errorf("the page reported errors:\n%s", strings.Join(b.errors, "\n"))
	}
	t.Logf("%d requests, all to %s", len(b.requests), base)
}

// loadForScreenshots sends traffic for the docs' picture of the Live
// view until the returned function is called: a few hot keys on api
// (answered from leases), abusive keys on login (denied, then answered by
// the denied cache).
func loadForScreenshots(base string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	check := func(policy, key string) {
		body := fmt.Sprintf(`{"policy":%q,"key":%q}`, policy, key)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/quotad.v1.QuotaService/Check", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				check("api", fmt.Sprintf("tenant-%d", i%3))
				switch {
				case i%3 == 0:
					check("login", "203.0.113.7")
				case i%5 == g:
					check("login", "198.51.100.23")
				case i%40 == 0:
					check("login", fmt.Sprintf("192.0.2.%d", i%17))
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

func TestConsoleSettings(t *testing.T) {
	noEnv := func(string) string { return "" }
	c, err := loadConfig(nil, noEnv, io.Discard)
	if err != nil || !c.Console.Enabled || c.Console.ShowKeys {
		t.Fatalf("defaults: %+v, %v; want the console on, keys hashed", c.Console, err)
	}
	path := writeFile(t, "q.yaml", "console:\n  enabled: false\n  show_keys: false\n")
	c, err = loadConfig([]string{"--config", path}, noEnv, io.Discard)
	if err != nil || c.Console.Enabled || c.Console.ShowKeys {
		t.Fatalf("file: %+v, %v", c.Console, err)
	}
	if rc := c.rpcConfig(); !rc.DisableConsole || rc.ShowKeys {
		t.Fatalf("rpc config %+v, want the console off and keys hidden", rc)
	}
	env := map[string]string{"QUOTAD_CONSOLE_SHOW_KEYS": "true", "QUOTAD_CONSOLE": "false"}
	c, err = loadConfig([]string{"--config", path, "--console"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || !c.Console.Enabled || !c.Console.ShowKeys {
		t.Fatalf("env and flag over the file: %+v, %v; want both on", c.Console, err)
	}
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// The built binary serves the page and its assets from itself (the
// browser test shows they are all it needs), and --console=false removes
// them while GET /status stays.
func TestConsoleOnAndOffOnTheBinary(t *testing.T) {
	on := startBinary(t)
	resp, body := get(t, on+"/")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(body, "<title>quotad console</title>") || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("GET / on the binary: %d %v\n%.200s", resp.StatusCode, resp.Header, body)
	}
	for _, asset := range []string{"api.js", "playground.js", "live.js", "console.css", "favicon.svg"} {
		if resp, _ := get(t, on+"/console/"+asset); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /console/%s: %d", asset, resp.StatusCode)
		}
	}

	off := startBinary(t, "--console=false")
	for _, path := range []string{"/", "/console/playground.js", "/console/console.css"} {
		if resp, _ := get(t, off+path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("--console=false: GET %s is %d, want 404", path, resp.StatusCode)
		}
	}
	if resp, body := get(t, off+"/status"); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"policies"`) {
		t.Errorf("--console=false: GET /status %d\n%.200s", resp.StatusCode, body)
	}
}
