// quotad console: the Live view, this node's figures from GET /status,
// read every second. Rates are the difference of two reads.
'use strict';

(function () {
  const POLL_MS = 1000;
  const HISTORY = 120;
  const history = []; // {allowed, denied} per second, oldest first
  let prev = null;
  let last = null;

  const sum = (c) => c.store + c.lease + c.denied_cache + c.fail_open + c.fail_closed;
  const $ = (id) => document.getElementById(id);

  function set(id, text, cls) {
    const e = $(id);
    e.textContent = text;
    if (cls !== undefined) e.className = 'big ' + cls;
  }

  // rates returns per-second differences of every policy's counts between
  // two reads, by policy name.
  function rates(a, b) {
    const out = {};
    if (!a) return out;
    const dt = (Date.parse(b.now) - Date.parse(a.now)) / 1000;
    if (!(dt > 0)) return out;
    const before = {};
    for (const p of a.policies || []) before[p.name] = p;
    for (const p of b.policies || []) {
      const q = before[p.name];
      const r = {};
      for (const o of ['allowed', 'denied']) {
        r[o] = {};
        for (const k of Object.keys(p[o])) r[o][k] = Math.max(0, (p[o][k] - (q ? q[o][k] : 0)) / dt);
      }
      out[p.name] = r;
    }
    out._store = Math.max(0, (b.store.calls - a.store.calls) / dt);
    return out;
  }

  function renderTiles(st, r) {
    let ra = 0, rd = 0, all = 0, local = 0, lease = 0, cache = 0;
    for (const p of st.policies || []) {
      const x = r[p.name];
      if (x) { ra += sum(x.allowed); rd += sum(x.denied); }
      all += sum(p.allowed) + sum(p.denied);
      lease += p.allowed.lease + p.denied.lease;
      cache += p.allowed.denied_cache + p.denied.denied_cache;
    }
    local = lease + cache;
    set('kpi-rate', prev ? fmtNum(ra + rd) : '–');
    $('kpi-rate-sub').textContent = prev ? fmtNum(ra) + ' allowed · ' + fmtNum(rd) + ' denied' : 'measuring…';
    set('kpi-local', fmtPct(local, all));
    $('kpi-local-sub').textContent = all ? 'lease ' + fmtPct(lease, all) + ' · cache ' + fmtPct(cache, all) : 'no decisions yet';
    const remote = st.store.breaker !== 'none';
    set('kpi-store', remote ? (prev ? fmtNum(r._store) : '–') : '0');
    $('kpi-store-sub').textContent = remote ? fmtNum(st.store.calls) + ' calls · ' + fmtNum(st.store.errors) + ' errors' : 'memory store: no Redis';
    const br = st.store.breaker;
    set('kpi-breaker', br === 'none' ? 'none' : br, br === 'open' ? 'bad' : br === 'closed' ? 'ok' : '');
    $('kpi-breaker-sub').textContent = br === 'none' ? 'the memory store has none' : 'opened ' + st.store.breaker_opens + ' times';
    const members = st.cluster.members || [];
    const alive = members.filter((m) => m.state === 'alive').length;
    set('kpi-cluster', st.cluster.clustered ? alive + ' / ' + members.length : 'standalone');
    $('kpi-cluster-sub').textContent = st.cluster.clustered ? 'members alive' : 'no memberlist cluster';
    // Until something reloads the config there is one generation, the one
    // loaded at start: the tile shows its policies' digest and load time.
    const c = st.config;
    const gen = c.generation === null || c.generation === undefined;
    set('kpi-config', gen ? 'at start' : String(c.generation));
    $('kpi-config-sub').textContent = c.policies + ' policies · sha ' + c.policies_sha256.slice(0, 8);
    $('kpi-config-tile').title = (gen ? 'no config reloads: the configuration loaded at start. ' : 'generation ' + c.generation + ', ') +
      'loaded ' + c.loaded_at + ', ' + c.policies + ' configured policies, sha256 ' + c.policies_sha256;
  }

  function renderPolicies(st, r) {
    const body = $('policies').tBodies[0];
    const rows = [];
    for (const p of st.policies || []) {
      const x = r[p.name];
      const total = sum(p.allowed) + sum(p.denied);
      const rate = (f) => (x && prev ? fmtNum(f(x)) : '–');
      const lim = p.limit ? [el('div', { text: p.limit.algorithm }),
        el('small', { text: p.limit.limit + ' / ' + p.limit.period.replace(/m0s$/, 'm').replace(/h0m$/, 'h') + (p.limit.burst ? ' · burst ' + p.limit.burst : '') })] : null;
      rows.push(el('tr', { 'data-policy': p.name },
        el('td', { class: 'name', text: p.name }),
        el('td', { class: 'limit' }, ...(lim ? lim : [el('span', { class: 'pill inline', text: 'inline limits' })])),
        el('td', { class: 'num rate-allowed', text: rate((y) => sum(y.allowed)) }),
        el('td', { class: 'num rate-denied', text: rate((y) => sum(y.denied)) }),
        el('td', { class: 'num', text: rate((y) => y.allowed.store + y.denied.store) }),
        el('td', { class: 'num', text: rate((y) => y.allowed.lease + y.denied.lease) }),
        el('td', { class: 'num', text: rate((y) => y.allowed.denied_cache + y.denied.denied_cache) }),
        el('td', { class: 'num', text: rate((y) => y.allowed.fail_open + y.denied.fail_closed) }),
        el('td', { class: 'num', text: fmtPct(p.allowed.lease + p.denied.lease, total) }),
        el('td', { class: 'num', text: fmtPct(p.allowed.denied_cache + p.denied.denied_cache, total) }),
        el('td', { class: 'num total-allowed', text: String(sum(p.allowed)) }),
        el('td', { class: 'num total-denied', text: String(sum(p.denied)) })));
    }
    if (!rows.length) rows.push(el('tr', { class: 'empty' }, el('td', { colspan: '12', text: 'No policies configured and no decisions yet.' })));
    body.replaceChildren(...rows);
  }

  const SHOWN_KEYS = 10;
  const expanded = new Set(); // policies whose whole top list is open

  function renderTopKeys(st) {
    $('top-window').textContent = 'keys denied most in the last ' + st.top_denied_window.replace(/0s$/, '') +
      (st.keys === 'sha256' ? ' · keys shown as SHA-256 prefixes' : '') +
      (st.top_denied_untracked ? ' · ' + st.top_denied_untracked + ' denials under untracked policies' : '');
    const box = $('top-keys');
    const blocks = [];
    for (const p of st.policies || []) {
      const t = p.top_denied;
      if (!t || !t.keys.length) continue;
      const max = t.keys[0].count || 1;
      const open = expanded.has(p.name);
      const more = t.keys.length > SHOWN_KEYS ? el('button', {
        class: 'more', text: open ? 'show the top ' + SHOWN_KEYS : 'show all ' + t.keys.length,
        onclick: () => { if (open) expanded.delete(p.name); else expanded.add(p.name); renderTopKeys(st); },
      }) : null;
      blocks.push(el('div', { class: 'top-policy', 'data-policy': p.name },
        el('h3', {}, p.name, el('span', { text: fmtNum(t.denials) + ' denials' })),
        el('ol', {}, ...t.keys.slice(0, open ? t.keys.length : SHOWN_KEYS).map((k, i) => {
          const bar = el('i');
          bar.style.width = (100 * k.count / max).toFixed(1) + '%';
          return el('li', { 'data-key': k.key },
            el('span', { class: 'rank', text: String(i + 1) }),
            el('div', { class: 'bar', title: k.key }, bar, el('span', { text: k.key })),
            el('span', { class: 'count', title: k.error ? 'denied between ' + (k.count - k.error) + ' and ' + k.count + ' times (an estimate)' : 'denied ' + k.count + ' times' },
              fmtNum(k.count), k.error ? el('small', { text: ' ≥' + fmtNum(k.count - k.error) }) : null));
        })), more));
    }
    if (!blocks.length) blocks.push(el('p', { class: 'muted', text: 'No key has been denied recently.' }));
    box.replaceChildren(...blocks);
  }

  function renderMembers(st) {
    $('store-describe').textContent = 'store: ' + st.store.describe;
    const body = $('members').tBodies[0];
    const ms = st.cluster.members || [];
    if (!ms.length) {
      body.replaceChildren(el('tr', { class: 'empty' }, el('td', { colspan: '4', text: 'Standalone: this node is not in a cluster.' })));
      return;
    }
    body.replaceChildren(...ms.map((m) => el('tr', {},
      el('td', { class: 'name' }, m.name, m.self ? el('span', { class: 'pill self', text: 'this node' }) : null),
      el('td', { text: m.addr }),
      el('td', {}, el('span', { class: 'pill ' + m.state, text: m.state })),
      el('td', { text: new Date(m.since).toLocaleString() }))));
  }

  function drawChart() {
    const canvas = $('rate-chart');
    if (!canvas.clientWidth) return;
    const { ctx, w, h } = sizeCanvas(canvas);
    const pad = { l: 44, r: 8, t: 8, b: 18 };
    const top = Math.max(4, ...history.map((x) => x.allowed + x.denied));
    const scale = niceCeil(top);
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = colors.muted;
    ctx.strokeStyle = colors.grid;
    for (let i = 0; i <= 4; i++) {
      const y = pad.t + ((h - pad.t - pad.b) * i) / 4;
      ctx.beginPath(); ctx.moveTo(pad.l, Math.round(y) + 0.5); ctx.lineTo(w - pad.r, Math.round(y) + 0.5); ctx.stroke();
      ctx.textAlign = 'right';
      ctx.fillText(fmtNum(scale * (1 - i / 4)), pad.l - 6, y + 4);
    }
    ctx.textAlign = 'left';
    ctx.fillText('2 min ago', pad.l, h - 3);
    ctx.textAlign = 'right';
    ctx.fillText('now', w - pad.r, h - 3);
    ctx.textAlign = 'left';
    const bw = (w - pad.l - pad.r) / HISTORY;
    const ph = h - pad.t - pad.b;
    history.forEach((x, i) => {
      const left = pad.l + (HISTORY - history.length + i) * bw;
      const ha = (ph * x.allowed) / scale, hd = (ph * x.denied) / scale;
      ctx.fillStyle = colors.ok;
      ctx.fillRect(left, pad.t + ph - ha, Math.max(1, bw - 1), ha);
      ctx.fillStyle = colors.bad;
      ctx.fillRect(left, pad.t + ph - ha - hd, Math.max(1, bw - 1), hd);
    });
  }

  // niceCeil rounds v up to a scale whose quarters read well (4 → 1, 2, 3, 4).
  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 4, 8, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function renderNode(st, ok) {
    $('node-pill').querySelector('.dot').className = 'dot ' + (ok ? (st.store.breaker === 'open' ? 'bad' : 'ok') : 'bad');
    $('node-text').textContent = ok ? (st.node ? st.node + ' · ' : '') + st.store.describe : 'quotad is not answering';
  }

  async function poll() {
    let st;
    try {
      st = await quotad.status();
    } catch (e) {
      renderNode(null, false);
      $('live-updated').textContent = 'not updated: ' + e.message;
      return;
    }
    const r = rates(prev, st);
    if (prev) {
      let a = 0, d = 0;
      for (const name of Object.keys(r)) if (name !== '_store') { a += sum(r[name].allowed); d += sum(r[name].denied); }
      history.push({ allowed: a, denied: d });
      if (history.length > HISTORY) history.shift();
    }
    renderNode(st, true);
    renderTiles(st, r);
    renderPolicies(st, r);
    renderTopKeys(st);
    renderMembers(st);
    prev = st;
    last = st;
    drawChart();
    $('live-updated').textContent = 'updated ' + new Date(st.now).toLocaleTimeString();
  }

  document.addEventListener('DOMContentLoaded', () => {
    poll();
    setInterval(poll, POLL_MS);
    window.addEventListener('resize', drawChart);
    window.addEventListener('quotad:view', () => { if (last) drawChart(); });
  });
})();
