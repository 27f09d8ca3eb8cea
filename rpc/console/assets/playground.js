// quotad console: the Playground view, a card per algorithm and the
// boundary-burst demonstration.
'use strict';

(function () {
  const NAMESPACE = 'quotad-console';
  const STRIP_MS = 30000;
  const session = randomId();

  const ALGORITHMS = [
    { id: 'fixed_window', title: 'Fixed window', burst: false,
      blurb: 'Counts requests in windows aligned to the clock; the count starts over at every edge.' },
    { id: 'sliding_window_log', title: 'Sliding window log', burst: false,
      blurb: 'Exact: at most limit requests in any rolling period, one log entry per request.' },
    { id: 'sliding_window_counter', title: 'Sliding window counter', burst: false,
      blurb: 'Weighs the previous window by how much of it still overlaps: constant memory, nearly exact.' },
    { id: 'token_bucket', title: 'Token bucket', burst: true,
      blurb: 'A bucket of burst tokens refilled at limit per period: bursts up to its capacity, then the refill rate.' },
    { id: 'leaky_bucket', title: 'Leaky bucket', burst: true,
      blurb: 'Each request adds to a bucket of capacity burst that drains at limit per period.' },
    { id: 'gcra', title: 'GCRA', burst: true,
      blurb: 'Generic cell rate algorithm: one timestamp per key, requests spaced period/limit apart with a burst tolerance.' },
  ];
  const byEnum = {};
  for (const a of ALGORITHMS) byEnum['ALGORITHM_' + a.id.toUpperCase()] = a;

  function randomId() {
    const b = new Uint8Array(4);
    crypto.getRandomValues(b);
    return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }
  const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(0, ms)));
  const token = () => document.getElementById('admin-token').value.trim();

  // A card drives one limit: an algorithm with editable limit, period and
  // burst (inline mode), or a configured policy with an editable key.
  function card(spec) {
    const s = { decisions: [], allowed: 0, denied: 0, key: '', busy: false };
    const field = (label, name, value, opts) => el('label', { class: opts && opts.wide ? 'key' : null }, label,
      el('input', Object.assign({ name: name, value: value, disabled: opts && opts.disabled, spellcheck: 'false' }, opts && opts.input)));
    const fields = el('div', { class: 'fields' },
      field('Limit', 'limit', spec.limit, { disabled: spec.configured, input: { type: 'number', min: '1' } }),
      field('Period', 'period', fmtPeriod(spec.periodMs), { disabled: spec.configured }),
      field('Burst', 'burst', spec.algo.burst ? spec.burst : '—', { disabled: spec.configured || !spec.algo.burst, input: spec.algo.burst ? { type: 'number', min: '0' } : {} }),
      spec.configured ? field('Key', 'key', 'console-' + session, { wide: true }) : null);
    const verdict = el('span', { class: 'verdict', text: 'ready' });
    const remaining = el('dd', { class: 'remaining', text: '—' });
    const retry = el('dd', { class: 'retry-after', text: '—' });
    const source = el('dd', { class: 'source', text: '—' });
    const errorText = el('p', { class: 'error-text', hidden: true });
    const strip = el('canvas', { class: 'strip' });
    const nAllowed = el('b', { class: 'n-allowed', text: '0' });
    const nDenied = el('b', { class: 'n-denied', text: '0' });
    const keyName = el('span', { class: 'key-name' });
    const buttons = {
      send: el('button', { class: 'primary', 'data-action': 'send', text: 'Send', onclick: () => run(1) }),
      burst: el('button', { 'data-action': 'burst', text: 'Burst 10', onclick: () => run(10) }),
      reset: el('button', { 'data-action': 'reset', text: 'Reset', onclick: reset }),
    };
    const root = el('article', { class: 'card', 'data-algorithm': spec.algo.id, 'data-policy': spec.policy },
      el('div', { class: 'card-head' }, el('h2', { text: spec.title }), el('span', { class: 'tag', text: spec.tag })),
      el('p', { class: 'blurb', text: spec.algo.blurb }),
      fields,
      el('div', { class: 'actions' }, buttons.send, buttons.burst, el('span', { class: 'spacer' }), buttons.reset),
      el('div', { class: 'result', 'aria-live': 'polite' }, verdict,
        el('dl', { class: 'facts' }, el('dt', { text: 'remaining' }), el('dt', { text: 'retry-after' }), el('dt', { text: 'source' }),
          remaining, retry, source)),
      errorText,
      strip,
      el('div', { class: 'card-foot' }, el('span', {}, 'allowed ', nAllowed, ' · denied ', nDenied), keyName));
    // The facts grid lays out three terms, then three values.
    const input = (name) => fields.querySelector('[name=' + name + ']');

    // limit reads the fields; it throws a message for a bad one.
    function limit() {
      if (spec.configured) return null;
      const l = Number(input('limit').value);
      const p = parsePeriod(input('period').value);
      if (!Number.isInteger(l) || l < 1) throw new Error('limit: a whole number ≥ 1');
      if (!(p >= 1)) throw new Error('period: write e.g. 500ms, 10s, 1m, 1h');
      const out = { algorithm: 'ALGORITHM_' + spec.algo.id.toUpperCase(), limit: String(l), period: p / 1000 + 's' };
      if (spec.algo.burst) {
        const b = Number(input('burst').value);
        if (!Number.isInteger(b) || b < 0) throw new Error('burst: a whole number ≥ 0 (0 means limit)');
        out.burst = String(b);
      }
      return out;
    }

    // keyFor names the key: each set of fields gets a fresh one, so that
    // changing the limit starts from an empty state.
    function keyFor() {
      if (spec.configured) return input('key').value.trim();
      const l = limit();
      return 'web-' + session + '/' + spec.algo.id + '/' + l.limit + '-' + input('period').value.trim() + (l.burst ? '-' + l.burst : '');
    }

    function refreshKey() {
      let k;
      try { k = keyFor(); } catch (e) { showError(e.message); return; }
      showError('');
      if (k === s.key) return;
      s.key = k;
      s.decisions = []; s.allowed = 0; s.denied = 0;
      nAllowed.textContent = '0'; nDenied.textContent = '0';
      verdict.className = 'verdict'; verdict.textContent = 'ready';
      remaining.textContent = retry.textContent = source.textContent = '—';
      keyName.textContent = spec.configured ? '' : 'key ' + k;
      keyName.title = k;
      drawStrip();
    }

    function showError(msg) {
      errorText.hidden = !msg;
      errorText.textContent = msg;
      if (msg) { verdict.className = 'verdict error'; verdict.textContent = 'error'; }
    }

    function busy(on) {
      s.busy = on;
      for (const b of Object.values(buttons)) b.disabled = on;
    }

    function record(d) {
      s.decisions.push({ t: performance.now(), allowed: d.allowed, remaining: d.remaining, limit: d.limit });
      if (s.decisions.length > 400) s.decisions.splice(0, 100);
      if (d.allowed) s.allowed++; else s.denied++;
      nAllowed.textContent = s.allowed;
      nDenied.textContent = s.denied;
      verdict.className = 'verdict ' + (d.allowed ? 'allowed' : 'denied');
      verdict.textContent = d.allowed ? 'allowed' : 'denied';
      remaining.textContent = d.remaining + ' / ' + d.limit;
      retry.textContent = fmtMs(d.retryAfterMs);
      source.textContent = d.source;
      drawStrip();
    }

    async function run(n) {
      if (s.busy) return;
      let l;
      try { refreshKey(); l = limit(); } catch (e) { showError(e.message); return; }
      if (!s.key) { showError('key: must not be empty'); return; }
      busy(true);
      try {
        for (let i = 0; i < n; i++) record(await quotad.check(spec.policy, s.key, l));
        showError('');
      } catch (e) {
        showError(e.code + ': ' + e.message);
      } finally {
        busy(false);
      }
    }

    async function reset() {
      if (s.busy) return;
      try { refreshKey(); } catch (e) { showError(e.message); return; }
      busy(true);
      try {
        await quotad.reset(spec.policy, s.key, token());
        s.decisions.push({ t: performance.now(), reset: true });
        verdict.className = 'verdict'; verdict.textContent = 'reset';
        remaining.textContent = retry.textContent = source.textContent = '—';
        showError('');
        drawStrip();
      } catch (e) {
        const hint = e.code === 'unauthenticated' || e.code === 'permission_denied' ? ' (fill in the admin token)' : '';
        showError(e.code + ': ' + e.message + hint);
      } finally {
        busy(false);
      }
    }

    // drawStrip shows the last 30 s: a bar per decision, green and as high
    // as what remained after it when allowed, red and full when denied.
    function drawStrip() {
      const { ctx, w, h } = sizeCanvas(strip);
      const now = performance.now();
      ctx.strokeStyle = colors.grid;
      ctx.lineWidth = 1;
      for (let t = 5000; t < STRIP_MS; t += 5000) {
        const x = Math.round(w - (t / STRIP_MS) * w) + 0.5;
        ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, h); ctx.stroke();
      }
      ctx.fillStyle = colors.muted;
      ctx.font = '10px system-ui, sans-serif';
      ctx.fillText('last 30 s', 6, 12);
      for (const d of s.decisions) {
        const age = now - d.t;
        if (age > STRIP_MS) continue;
        const x = w - (age / STRIP_MS) * w - 3;
        if (d.reset) {
          ctx.strokeStyle = colors.accent; ctx.setLineDash([3, 3]);
          ctx.beginPath(); ctx.moveTo(x + 1.5, 0); ctx.lineTo(x + 1.5, h); ctx.stroke();
          ctx.setLineDash([]);
          continue;
        }
        if (d.allowed) {
          const bh = 8 + (h - 14) * (d.limit ? d.remaining / d.limit : 0);
          ctx.fillStyle = colors.ok;
          ctx.fillRect(x, h - 2 - bh, 3, bh);
        } else {
          ctx.fillStyle = colors.bad;
          ctx.fillRect(x, 4, 3, h - 6);
        }
      }
    }

    for (const name of ['limit', 'period', 'burst', 'key']) {
      const i = input(name);
      if (i) i.addEventListener('change', refreshKey);
    }
    return { root: root, refreshKey: refreshKey, draw: drawStrip, active: () => s.decisions.some((d) => performance.now() - d.t < STRIP_MS + 500) };
  }

  // The boundary demo: the same ten checks on a fixed window and a sliding
  // log (5 per 4 s), five just before a fixed-window edge and five just
  // after it.
  function boundary() {
    const btn = document.getElementById('boundary-run');
    const state = document.getElementById('boundary-state');
    const lanes = {};
    for (const lane of document.querySelectorAll('#boundary .lane')) {
      lanes[lane.dataset.lane] = { canvas: lane.querySelector('canvas'), verdict: lane.querySelector('.lane-verdict'), shots: [] };
    }
    const LIMIT = { limit: '5', period: '4s' };
    const BEFORE = 400, AFTER = 150;

    function draw() {
      for (const lane of Object.values(lanes)) {
        const { ctx, w, h } = sizeCanvas(lane.canvas);
        const mid = w / 2;
        ctx.strokeStyle = colors.muted; ctx.setLineDash([4, 4]);
        ctx.beginPath(); ctx.moveTo(mid + 0.5, 8); ctx.lineTo(mid + 0.5, h - 22); ctx.stroke();
        ctx.setLineDash([]);
        ctx.fillStyle = colors.muted; ctx.font = '11px system-ui, sans-serif'; ctx.textAlign = 'center';
        ctx.fillText('window edge', mid, h - 8);
        ctx.fillText(BEFORE + ' ms before', mid / 2, h - 8);
        ctx.fillText(AFTER + ' ms after', mid + mid / 2, h - 8);
        lane.shots.forEach((shot, i) => {
          const group = i < 5 ? 0 : 1, j = i % 5;
          const x = (group === 0 ? mid / 2 : mid + mid / 2) + (j - 2) * 26;
          const y = (h - 22) / 2 + 4;
          ctx.beginPath(); ctx.arc(x, y, 10, 0, 2 * Math.PI);
          ctx.fillStyle = shot.allowed ? colors.ok : colors.bad; ctx.fill();
          ctx.strokeStyle = '#fff'; ctx.lineWidth = 2;
          ctx.beginPath();
          if (shot.allowed) { ctx.moveTo(x - 4, y); ctx.lineTo(x - 1, y + 3); ctx.lineTo(x + 5, y - 4); } else { ctx.moveTo(x - 4, y - 4); ctx.lineTo(x + 4, y + 4); ctx.moveTo(x + 4, y - 4); ctx.lineTo(x - 4, y + 4); }
          ctx.stroke(); ctx.lineWidth = 1;
        });
        ctx.textAlign = 'start';
      }
    }

    async function fire(keys) {
      for (let i = 0; i < 5; i++) {
        for (const [id, key] of Object.entries(keys)) {
          const d = await quotad.check(NAMESPACE, key, Object.assign({ algorithm: 'ALGORITHM_' + id.toUpperCase() }, LIMIT));
          lanes[id].shots.push({ t: performance.now(), allowed: d.allowed });
          draw();
        }
      }
    }

    async function runDemo() {
      btn.disabled = true;
      const run = randomId();
      const base = 'web-' + session + '/boundary-' + run + '/';
      const keys = { fixed_window: base + 'fixed', sliding_window_log: base + 'log' };
      for (const lane of Object.values(lanes)) { lane.shots = []; lane.verdict.textContent = '\u00a0'; lane.verdict.className = 'lane-verdict'; delete lane.verdict.dataset.allowed; }
      draw();
      try {
        // One check on a probe key says how long the window has left.
        state.textContent = 'Finding the next window edge…';
        const t0 = performance.now();
        const probe = await quotad.check(NAMESPACE, base + 'probe', Object.assign({ algorithm: 'ALGORITHM_FIXED_WINDOW' }, LIMIT));
        let edge = (t0 + performance.now()) / 2 + probe.resetAfterMs;
        if (edge - performance.now() < BEFORE + 500) edge += 4000;
        state.textContent = 'Waiting ' + fmtMs(Math.round(edge - BEFORE - performance.now())) + ' for the next edge…';
        await sleep(edge - BEFORE - performance.now());
        state.textContent = 'Five requests before the edge…';
        await fire(keys);
        await sleep(edge + AFTER - performance.now());
        state.textContent = 'Five requests after it…';
        await fire(keys);
        for (const [id, lane] of Object.entries(lanes)) {
          const ok = lane.shots.filter((x) => x.allowed);
          const span = ok.length > 1 ? (ok[ok.length - 1].t - ok[0].t) / 1000 : 0;
          lane.verdict.textContent = ok.length + ' of 10 allowed' + (ok.length > 5
            ? ' within ' + span.toFixed(2) + ' s: twice the limit'
            : ': never more than 5 in any 4 s');
          lane.verdict.className = 'lane-verdict ' + (ok.length > 5 ? 'bad' : 'good');
          lane.verdict.dataset.allowed = ok.length;
        }
        state.textContent = 'Done. Run it again to see the same shape at the next edge.';
      } catch (e) {
        state.textContent = 'The demo failed: ' + (e.code ? e.code + ': ' : '') + e.message;
      } finally {
        btn.disabled = false;
      }
    }
    btn.addEventListener('click', runDemo);
    window.addEventListener('resize', draw);
    draw();
  }

  // start builds the cards: one per algorithm with inline limits, or one
  // per configured policy when this server refuses inline limits.
  async function start() {
    document.getElementById('namespace').textContent = NAMESPACE;
    let inline = true;
    try { inline = (await quotad.status()).config.inline_limits; } catch (e) { /* assume the default */ }
    const specs = [];
    if (inline) {
      for (const a of ALGORITHMS) {
        specs.push({ algo: a, title: a.title, tag: a.id, policy: NAMESPACE, limit: 5, periodMs: 10000, burst: 5, configured: false });
      }
    } else {
      document.getElementById('boundary').hidden = true;
      document.getElementById('playground-intro').textContent =
        'This server accepts only its configured policies (inline limits are off), so each card is one of them. ' +
        'Send, Burst 10 and Reset act on the key you choose.';
      for (const p of await quotad.policies()) {
        const a = byEnum[p.limit.algorithm] || { id: p.limit.algorithm, title: p.limit.algorithm, burst: false, blurb: '' };
        specs.push({ algo: a, title: p.name, tag: a.title, policy: p.name, limit: p.limit.limit,
          periodMs: durationMs(p.limit.period), burst: p.limit.burst || '0', configured: true });
      }
    }
    const box = document.getElementById('cards');
    const made = specs.map(card);
    for (const c of made) { box.append(c.root); c.refreshKey(); }
    if (!made.length) box.append(el('p', { class: 'muted', text: 'No configured policies.' }));
    // Keep the strips moving while they show recent decisions.
    setInterval(() => { for (const c of made) if (c.active()) c.draw(); }, 250);
    window.addEventListener('resize', () => made.forEach((c) => c.draw()));
    window.addEventListener('quotad:view', () => made.forEach((c) => c.draw()));
    boundary();
  }

  document.addEventListener('DOMContentLoaded', start);
})();
