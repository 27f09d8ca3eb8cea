// quotad console: the API client and small helpers shared by the views.
// Calls use quotad's public API only: quotad.v1.QuotaService over Connect's
// JSON protocol (POST /quotad.v1.QuotaService/<Method>), and GET /status.
'use strict';

const quotad = {
  async call(method, body, headers) {
    const res = await fetch('/quotad.v1.QuotaService/' + method, {
      method: 'POST',
      headers: Object.assign({ 'Content-Type': 'application/json' }, headers || {}),
      body: JSON.stringify(body || {}),
    });
    const text = await res.text();
    let data = {};
    try { data = text ? JSON.parse(text) : {}; } catch (e) { data = { message: text }; }
    if (!res.ok) {
      const err = new Error(data.message || res.statusText || ('HTTP ' + res.status));
      err.code = data.code || ('http_' + res.status);
      throw err;
    }
    return data;
  },
  // check returns the decision with numbers parsed: allowed, limit,
  // remaining, retryAfterMs, resetAfterMs, source ("store", "lease", ...).
  async check(policy, key, limit) {
    const req = { policy: policy, key: key };
    if (limit) req.limit = limit;
    const r = await this.call('Check', req);
    return {
      allowed: !!r.allowed,
      limit: Number(r.limit || 0),
      remaining: Number(r.remaining || 0),
      retryAfterMs: durationMs(r.retryAfter),
      resetAfterMs: durationMs(r.resetAfter),
      source: (r.source || 'SOURCE_UNSPECIFIED').replace(/^SOURCE_/, '').toLowerCase().replace(/_/g, ' '),
    };
  },
  // reset sends the admin token, when there is one, as a bearer token.
  reset(policy, key, token) {
    return this.call('Reset', { policy: policy, key: key }, token ? { Authorization: 'Bearer ' + token } : null);
  },
  async policies() {
    return (await this.call('ListPolicies', {})).policies || [];
  },
  // status reads GET /status; query is its parameters, e.g.
  // 'scope=cluster&history=1'. A refusal's message is the server's.
  async status(query) {
    const url = '/status' + (query ? '?' + query : '');
    const res = await fetch(url, { cache: 'no-store' });
    if (!res.ok) throw new Error('GET ' + url + ': HTTP ' + res.status + ' ' + (await res.text()).trim());
    return res.json();
  },
};

// durationMs parses protobuf's JSON duration ("41.337s") into milliseconds.
function durationMs(d) {
  if (!d) return 0;
  return Math.round(parseFloat(d) * 1000);
}

// parsePeriod accepts 500ms, 10s, 1m, 1h (or a bare number of seconds) and
// returns milliseconds, or NaN.
function parsePeriod(text) {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/.exec(text);
  if (!m) return NaN;
  const unit = { ms: 1, s: 1000, m: 60000, h: 3600000 }[m[2] || 's'];
  return Math.round(parseFloat(m[1]) * unit);
}

// fmtMs shows a wait: "—" for none, "850 ms", "4.2 s", "3 m 20 s".
function fmtMs(ms) {
  if (!ms) return '—';
  if (ms < 1000) return ms + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 1 : 0) + ' s';
  const secs = Math.round(ms / 1000);
  const m = Math.floor(secs / 60), s = secs % 60;
  return m + ' m' + (s ? ' ' + s + ' s' : '');
}

function fmtPeriod(ms) {
  if (ms % 3600000 === 0) return ms / 3600000 + 'h';
  if (ms % 60000 === 0) return ms / 60000 + 'm';
  if (ms % 1000 === 0) return ms / 1000 + 's';
  return ms + 'ms';
}

function fmtNum(n) {
  if (n === null || n === undefined || isNaN(n)) return '–';
  if (n >= 100 || Number.isInteger(n)) return Math.round(n).toLocaleString('en-US');
  return n.toFixed(n < 10 ? 1 : 0);
}

function fmtPct(part, whole) {
  if (!whole) return '–';
  return (100 * part / whole).toFixed(part === whole || part === 0 ? 0 : 1) + ' %';
}

// el builds an element: el('div', {class: 'x', text: 'hi'}, child, ...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

// sizeCanvas matches a canvas's drawing buffer to its CSS size and the
// screen's pixel ratio, and returns its 2D context scaled to CSS pixels.
function sizeCanvas(canvas) {
  const r = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * r) || canvas.height !== Math.round(h * r)) {
    canvas.width = Math.round(w * r);
    canvas.height = Math.round(h * r);
  }
  const ctx = canvas.getContext('2d');
  ctx.setTransform(r, 0, 0, r, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx: ctx, w: w, h: h };
}

const colors = { ok: '#16a34a', okSoft: '#86efac', bad: '#dc2626', badSoft: '#fecaca', grid: '#eceef5', muted: '#8a8fa5', accent: '#4f46e5' };

// Views: the hash picks one (#playground or #live).
function showView() {
  const name = location.hash === '#live' ? 'live' : 'playground';
  for (const v of ['playground', 'live']) {
    document.getElementById('view-' + v).hidden = v !== name;
    document.getElementById('tab-' + v).classList.toggle('active', v === name);
  }
  window.dispatchEvent(new CustomEvent('quotad:view', { detail: name }));
}
window.addEventListener('hashchange', showView);
document.addEventListener('DOMContentLoaded', showView);
