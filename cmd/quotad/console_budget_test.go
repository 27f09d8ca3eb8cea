package main

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// The Playground's token budget in a real Chromium against the built
// binary: a reservation of 500 settled with 120 gives 380 back (880 left);
// one of 500 settled with 1,500 charges 1,000 past the estimate and puts
// the key in debt, shown with the wait until a token fits; the panel asks
// again until the refill pays it back.
func TestConsoleTokenBudgetInChromium(t *testing.T) {
	chromium := lookChromium(t)
	base := startBinary(t)
	b := newBrowser(t, chromium)
	b.do(t, "open /", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#budget button[data-action=reserve]")))
	set := func(name, value string) {
		b.do(t, "set "+name, chromedp.SetValue(chromedp.CSS("#budget input[name="+name+"]"), value))
	}
	press := func(action string) {
		b.do(t, "press "+action, chromedp.Click(chromedp.CSS("#budget button[data-action="+action+"]:not([disabled])")))
	}

	press("reserve")
	b.waitJS(t, "the reservation", `(document.querySelector('#budget .budget-log li') || {}).textContent === 'Reserve 500: 500 left'`)
	press("settle")
	b.waitJS(t, "380 to come back", `(document.querySelector('#budget .budget-log li') || {}).textContent === 'Settle 120 of 500: 380 came back'`)
	// The bucket refills 1,000 tokens a minute meanwhile: 880 and what
	// the seconds since the reservation added.
	b.waitJS(t, "about 880 left", `(() => { const n = Number(document.querySelector('#budget .budget-remaining').textContent.replace(',', '')); return n >= 880 && n < 950; })()`)

	press("reserve")
	set("actual", "1500")
	press("settle")
	b.waitJS(t, "the debt", `document.querySelector('#budget').classList.contains('in-debt')`)
	if got := b.text(t, "#budget .budget-log li"); got != "Settle 1500 of 500: 1000 charged past the estimate" {
		t.Errorf("the log says %q after the overspend", got)
	}
	if got := b.text(t, "#budget .budget-state"); !strings.HasPrefix(got, "In debt: the next token fits in ") || b.text(t, "#budget .budget-remaining") != "0" {
		t.Errorf("in debt the panel says %q, %s left", got, b.text(t, "#budget .budget-remaining"))
	}
	// About 880 - 500 - 1000 = -620 tokens: the next one fits after about
	// 621 of the refill's 1,000 a minute, some 37 s; the wait shown must
	// shrink as the panel asks again.
	first := b.text(t, "#budget .budget-state")
	b.waitJS(t, "the wait to shrink", `!document.querySelector('#budget .budget-state').textContent.endsWith(`+"`"+strings.TrimPrefix(first, "In debt: the next token fits in ")+"`"+`)`)
	if len(b.errors) > 0 {
		t.Errorf("the page reported errors:\n%s", strings.Join(b.errors, "\n"))
	}
}
