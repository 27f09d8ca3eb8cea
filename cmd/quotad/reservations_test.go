package main

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/redistest"
)

// Two quotad processes on one redis-server share a token budget of 1,000
// an hour: a reservation of 500 taken at one is settled at the other with
// 120, and 380 come back; the settle retried changes nothing; a
// reservation settled past the budget puts the key in debt, so a check is
// denied with a wait.
func TestBinarySettlesReservationsAtAnyNode(t *testing.T) {
	r := redistest.Start(t)
	path := writeFile(t, "quotad.yaml", `
policies:
  - name: tokens
    algorithm: fixed_window
    limit: 1000
    period: 1h
`)
	a := startQuotad(t, "--config", path, "--redis", r.URL())
	b := startQuotad(t, "--config", path, "--redis", r.URL())
	post := func(base, method, body string) string {
		t.Helper()
		resp, err := http.Post(base+"/quotad.v1.QuotaService/"+method, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s %s: %d %s", method, body, resp.StatusCode, raw)
		}
		return strings.ReplaceAll(string(raw), ", ", ",") // protojson varies its spaces
	}
	reserved := post(a, "Reserve", `{"policy":"tokens","key":"team","cost":"500"}`)
	m := regexp.MustCompile(`"reservationId":"([^"]+)"`).FindStringSubmatch(reserved)
	if m == nil || !strings.Contains(reserved, `"remaining":"500"`) || !strings.Contains(reserved, `"expiresAfter":"600s"`) {
		t.Fatalf("reserve 500: %s", reserved)
	}
	settle := `{"policy":"tokens","key":"team","reservationId":"` + m[1] + `","actual":"120"}`
	if got := post(b, "Settle", settle); !strings.Contains(got, `"outcome":"SETTLE_OUTCOME_SETTLED"`) || !strings.Contains(got, `"refunded":"380"`) || !strings.Contains(got, `"remaining":"880"`) {
		t.Fatalf("settle 120 at the other node: %s", got)
	}
	if got := post(a, "Settle", settle); !strings.Contains(got, `"outcome":"SETTLE_OUTCOME_SETTLED_BEFORE"`) || !strings.Contains(got, `"actualRecorded":"120"`) || !strings.Contains(got, `"remaining":"880"`) {
		t.Fatalf("settle retried: %s", got)
	}
	reserved = post(b, "Reserve", `{"policy":"tokens","key":"team","cost":"800"}`)
	m = regexp.MustCompile(`"reservationId":"([^"]+)"`).FindStringSubmatch(reserved)
	if m == nil {
		t.Fatalf("reserve 800: %s", reserved)
	}
	got := post(a, "Settle", `{"policy":"tokens","key":"team","reservationId":"`+m[1]+`","actual":"1100"}`)
	if !strings.Contains(got, `"charged":"300"`) || !strings.Contains(got, `"allowed":false`) || strings.Contains(got, `"retryAfter":"0s"`) {
		t.Fatalf("settle 1100 of 800: %s", got)
	}
	if got := post(b, "Check", `{"policy":"tokens","key":"team"}`); !strings.Contains(got, `"allowed":false`) {
		t.Fatalf("a check in debt: %s", got)
	}
}
