// quotad console: the Live view. It reads GET /status every second, this
// node's figures (scope node) or the cluster's (scope cluster: the node
// asks every member and adds them up). Rates are the difference of two
// reads, member by member, so that a member that stops answering or
// restarts never makes a rate negative. The first read of a scope asks
// for the node's (or cluster's) history too, so the chart starts full.
'use strict';

(function () {
  const POLL_MS = 1000;
  const HISTORY = 120;
  let history = []; // {allowed, denied} per second, oldest first
  let scope = null; // 'node' or 'cluster'; null until the first read chooses
  let wantHistory = true; // the next read asks for the history
  let prevMembers = {}; // member name -> its figures at the last read
  let rated = false; // whether the last read had an earlier one to rate against
  let last = null;

  const sum = (c) => c.store + c.lease + c.denied_cache + c.fail_open + c.fail_closed;
  const $ = (id) => document.getElementById(id);

  function set(id, text, cls) {
    const e = $(id);
    e.textContent = text;
    if (cls !== undefined) e.className = 'big ' + cls;
  }

  // members returns what each member answered, the same shape in both
  // scopes: {name, now, policies: [{name, allowed, denied}], calls}.
  function members(st) {
    if (st.scope !== 'cluster') return [{ name: st.node || 'this node', now: st.now, policies: st.policies || [], calls: st.store.calls }];
    return (st.members || []).filter((m) => m.answered).map((m) => ({ name: m.name, now: m.now, policies: m.policies || [], calls: m.store.calls }));
  }

  // memberRates is one member's per-second rates between two of its
  // reads: per policy by outcome and source, its decisions and its store
  // calls; null when there is no earlier read or a count went down (the
  // member restarted).
  function memberRates(a, b) {
    if (!a) return null;
    const dt = (Date.parse(b.now) - Date.parse(a.now)) / 1000;
    if (!(dt > 0)) return null;
    const before = {};
    for (const p of a.policies) before[p.name] = p;
    const out = { policies: {}, decisions: 0, calls: (b.calls - a.calls) / dt };
    if (out.calls < 0) return null;
    for (const p of b.policies) {
      const q = before[p.name];
      const r = {};
      for (const o of ['allowed', 'denied']) {
        r[o] = {};
        for (const k of Object.keys(p[o])) {
          const d = p[o][k] - (q ? q[o][k] : 0);
          if (d < 0) return null;
          r[o][k] = d / dt;
        }
        out.decisions += sum(r[o]);
      }
      out.policies[p.name] = r;
    }
    return out;
  }

  // rates adds up the members' rates: {policies, calls, byMember}.
  function rates(st) {
    const out = { policies: {}, calls: 0, byMember: {} };
    const now = {};
    for (const m of members(st)) {
      now[m.name] = m;
      const r = memberRates(prevMembers[m.name], m);
      if (!r) continue;
      out.byMember[m.name] = r.decisions;
      out.calls += r.calls;
      for (const [name, x] of Object.entries(r.policies)) {
        const t = out.policies[name] || (out.policies[name] = { allowed: {}, denied: {} });
        for (const o of ['allowed', 'denied']) for (const k of Object.keys(x[o])) t[o][k] = (t[o][k] || 0) + x[o][k];
      }
    }
    prevMembers = now;
    return out;
  }

  function renderTiles(st, r) {
    let ra = 0, rd = 0, all = 0, lease = 0, cache = 0;
    for (const p of st.policies || []) {
      const x = r.policies[p.name];
      if (x) { ra += sum(x.allowed); rd += sum(x.denied); }
      all += sum(p.allowed) + sum(p.denied);
      lease += p.allowed.lease + p.denied.lease;
      cache += p.allowed.denied_cache + p.denied.denied_cache;
    }
    const cluster = st.scope === 'cluster';
    set('kpi-rate', rated ? fmtNum(ra + rd) : '–');
    $('kpi-rate-sub').textContent = rated ? fmtNum(ra) + ' allowed · ' + fmtNum(rd) + ' denied' : 'measuring…';
    set('kpi-local', fmtPct(lease + cache, all));
    $('kpi-local-sub').textContent = all ? 'lease ' + fmtPct(lease, all) + ' · cache ' + fmtPct(cache, all) : 'no decisions yet';
    const remote = cluster || st.store.breaker !== 'none';
    set('kpi-store', remote ? (rated ? fmtNum(r.calls) : '–') : '0');
    $('kpi-store-sub').textContent = remote ? fmtNum(st.store.calls) + ' calls · ' + fmtNum(st.store.errors) + ' errors' : 'memory store: no Redis';
    if (cluster) {
      const open = st.store.breakers_open;
      set('kpi-breaker', open ? open + ' open' : 'closed', open ? 'bad' : 'ok');
      $('kpi-breaker-sub').textContent = open ? open + ' of ' + st.answered + ' members refuse Redis calls' : 'on all ' + st.answered + ' members';
      const n = st.members.length;
      set('kpi-cluster', st.answered + ' / ' + n, st.answered < n ? 'bad' : 'ok');
      $('kpi-cluster-sub').textContent = st.answered < n ? (n - st.answered) + ' not answering: totals without them' : 'members answering';
      const odd = st.members.filter((m) => m.other_policies || m.generation_behind).length;
      set('kpi-config', st.generation === null || st.generation === undefined ? 'at start' : String(st.generation), odd ? 'bad' : '');
      $('kpi-config-sub').textContent = odd ? odd + ' member' + (odd > 1 ? 's' : '') + ' differ · sha ' + st.policies_sha256.slice(0, 8) : 'all alike · sha ' + st.policies_sha256.slice(0, 8);
      $('kpi-config-tile').title = 'highest generation among the members answering; policies digest most of them run: ' + st.policies_sha256;
      return;
    }
    const br = st.store.breaker;
    set('kpi-breaker', br === 'none' ? 'none' : br, br === 'open' ? 'bad' : br === 'closed' ? 'ok' : '');
    $('kpi-breaker-sub').textContent = br === 'none' ? 'the memory store has none' : 'opened ' + st.store.breaker_opens + ' times';
    const ms = st.cluster.members || [];
    const alive = ms.filter((m) => m.state === 'alive').length;
    set('kpi-cluster', st.cluster.clustered ? alive + ' / ' + ms.length : 'standalone', '');
    $('kpi-cluster-sub').textContent = st.cluster.clustered ? 'members alive' : 'no memberlist cluster';
    // Until something reloads the config there is one generation, the one
    // loaded at start: the tile shows its policies' digest and load time.
    const c = st.config;
    const gen = c.generation === null || c.generation === undefined;
    set('kpi-config', gen ? 'at start' : String(c.generation), '');
    $('kpi-config-sub').textContent = c.policies + ' policies · sha ' + c.policies_sha256.slice(0, 8);
    $('kpi-config-tile').title = (gen ? 'no config reloads: the configuration loaded at start. ' : 'generation ' + c.generation + ', ') +
      'loaded ' + c.loaded_at + ', ' + c.policies + ' configured policies, sha256 ' + c.policies_sha256;
  }

  function renderPolicies(st, r) {
    const body = $('policies').tBodies[0];
    const rows = [];
    for (const p of st.policies || []) {
      const x = r.policies[p.name];
      const total = sum(p.allowed) + sum(p.denied);
      const rate = (f) => (rated ? fmtNum(x ? f(x) : 0) : '–');
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

  // renderRLQS shows Envoy's rate limit quota service on this node, when
  // it serves it (the node scope only: the cluster's sum leaves it out).
  function renderRLQS(st) {
    const q = st.rlqs;
    $('rlqs-panel').hidden = !q;
    if (!q) return;
    $('rlqs-legend').textContent = q.streams + ' Envoy stream' + (q.streams === 1 ? '' : 's') + ' · ' + q.rounds + ' rounds';
    const rows = q.limits.map((l) => el('tr', { 'data-rlqs-policy': l.policy },
      el('td', { class: 'name', text: l.policy }),
      el('td', { class: 'key', text: l.key }),
      el('td', { class: 'num', text: fmtNum(l.rate) }),
      el('td', { class: 'num', text: l.level === null ? '–' : fmtNum(l.level) }),
      el('td', { class: 'num rlqs-assigned', text: fmtNum(l.assigned) + (l.in_debt ? ' (in debt)' : '') }),
      el('td', { class: 'num', text: String(l.buckets) }),
      el('td', { class: 'num', text: String(l.members) }),
      el('td', { class: 'num', text: String(l.allowed) }),
      el('td', { class: 'num', text: String(l.denied) })));
    if (!rows.length) rows.push(el('tr', { class: 'empty' }, el('td', { colspan: '9', text: 'No Envoy bucket yet.' })));
    $('rlqs').tBodies[0].replaceChildren(...rows);
  }

  const SHOWN_KEYS = 10;
  const expanded = new Set(); // policies whose whole top list is open

  function renderTopKeys(st) {
    $('top-window').textContent = 'keys denied most in the last ' + st.top_denied_window.replace(/0s$/, '') +
      (st.scope === 'cluster' ? ' · merged over ' + st.answered + ' member' + (st.answered === 1 ? '' : 's') : '') +
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
          return el('li', { 'data-key': k.key, 'data-count': String(k.count) },
            el('span', { class: 'rank', text: String(i + 1) }),
            el('div', { class: 'bar', title: k.key }, bar, el('span', { text: k.key })),
            el('span', { class: 'count', title: k.error ? 'denied between ' + (k.count - k.error) + ' and ' + k.count + ' times (an estimate)' : 'denied ' + k.count + ' times' },
              fmtNum(k.count), k.error ? el('small', { text: ' ≥' + fmtNum(k.count - k.error) }) : null));
        })), more));
    }
    if (!blocks.length) blocks.push(el('p', { class: 'muted', text: 'No key has been denied recently.' }));
    box.replaceChildren(...blocks);
  }

  function renderMembers(st, r) {
    $('store-describe').textContent = 'store: ' + st.store.describe;
    const body = $('members').tBodies[0];
    if (st.scope === 'cluster') {
      $('members').tHead.rows[0].replaceChildren(...['Member', 'API', 'State', 'Decisions/s', 'Breaker', 'Config', 'Error'].map((h) => el('th', { text: h })));
      body.replaceChildren(...st.members.map((m) => {
        const state = m.answered ? m.state : (m.state === 'alive' ? 'unreachable' : m.state);
        const load = r.byMember[m.name];
        const c = m.config;
        const odd = m.other_policies || m.generation_behind;
        return el('tr', { 'data-member': m.name, class: m.answered ? '' : 'down' },
          el('td', { class: 'name' }, m.name, m.self ? el('span', { class: 'pill self', text: 'this node' }) : null),
          el('td', { text: m.api || (m.self ? location.origin : m.addr) }),
          el('td', {}, el('span', { class: 'pill ' + (m.answered ? m.state : 'dead'), text: state })),
          el('td', { class: 'num member-rate', text: load === undefined ? '–' : fmtNum(load) }),
          el('td', { text: m.store ? m.store.breaker : '–' }),
          el('td', { class: odd ? 'odd' : '', title: c ? 'policies sha256 ' + c.policies_sha256 + ', loaded ' + c.loaded_at : '' },
            c ? (c.generation === null ? 'at start' : 'gen ' + c.generation) + ' · sha ' + c.policies_sha256.slice(0, 8) +
              (m.generation_behind ? ' · behind' : '') + (m.other_policies ? ' · other policies' : '') : '–'),
          el('td', { class: 'error-cell', text: m.error || '' }));
      }));
      return;
    }
    $('members').tHead.rows[0].replaceChildren(...['Member', 'Address', 'State', 'Since'].map((h) => el('th', { text: h })));
    const ms = st.cluster.members || [];
    if (!ms.length) {
      body.replaceChildren(el('tr', { class: 'empty' }, el('td', { colspan: '4', text: 'Standalone: this node is not in a cluster.' })));
      return;
    }
    body.replaceChildren(...ms.map((m) => el('tr', { 'data-member': m.name },
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

  // loadHistory replaces the chart's bars with the samples the server
  // kept, one per second, the newest HISTORY of them; the canvas says how
  // many samples and decisions it took from the server.
  function loadHistory(h) {
    const samples = (h && h.samples) || [];
    history = samples.slice(-HISTORY).map((s) => ({ allowed: s.allowed, denied: s.denied }));
    const canvas = $('rate-chart');
    canvas.dataset.loadedSamples = String(samples.length);
    canvas.dataset.loadedDecisions = String(samples.reduce((n, s) => n + s.allowed + s.denied, 0));
  }

  function renderNode(st, ok) {
    const open = ok && (st.scope === 'cluster' ? st.store.breakers_open > 0 : st.store.breaker === 'open');
    $('node-pill').querySelector('.dot').className = 'dot ' + (ok ? (open ? 'bad' : 'ok') : 'bad');
    $('node-text').textContent = ok ? (st.node ? st.node + ' · ' : '') + st.store.describe : 'quotad is not answering';
  }

  function renderScope() {
    for (const b of document.querySelectorAll('#live-scope button')) b.classList.toggle('active', b.dataset.scope === scope);
    $('live-intro').textContent = scope === 'cluster'
      ? 'The cluster\'s figures: this node asks every member\'s GET /status each second and adds them up. Rates are over the last second; shares and totals since each member started.'
      : 'This node\'s figures from GET /status, refreshed every second. Rates are over the last second; shares and totals since the node started.';
  }

  async function poll() {
    let st;
    const asked = scope;
    try {
      st = await quotad.status('scope=' + (asked || 'node') + (wantHistory ? '&history=1' : ''));
    } catch (e) {
      renderNode(null, false);
      $('live-updated').textContent = 'not updated: ' + e.message;
      return;
    }
    if (asked === null) {
      // The first read chooses: the cluster when there is one.
      scope = st.cluster && st.cluster.clustered ? 'cluster' : 'node';
      renderScope();
      if (scope === 'cluster') return poll();
    }
    if (asked !== scope && asked !== null) return; // the scope changed while asking
    if (wantHistory) {
      loadHistory(st.history);
      wantHistory = false;
    }
    const r = rates(st);
    rated = Object.keys(r.byMember).length > 0;
    if (rated) {
      let a = 0, d = 0;
      for (const x of Object.values(r.policies)) { a += sum(x.allowed); d += sum(x.denied); }
      history.push({ allowed: a, denied: d });
      if (history.length > HISTORY) history.shift();
    }
    renderNode(st, true);
    renderTiles(st, r);
    renderPolicies(st, r);
    renderTopKeys(st);
    renderRLQS(st);
    renderMembers(st, r);
    last = st;
    drawChart();
    $('live-updated').textContent = 'updated ' + new Date(st.now).toLocaleTimeString() +
      (st.scope === 'cluster' ? ' · ' + st.answered + ' of ' + st.members.length + ' members' : '');
  }

  // loop reads again POLL_MS after each read ends, so that a slow member
  // never stacks reads up.
  async function loop() {
    await poll();
    setTimeout(loop, POLL_MS);
  }

  document.addEventListener('DOMContentLoaded', () => {
    for (const b of document.querySelectorAll('#live-scope button')) {
      b.addEventListener('click', () => {
        if (scope === b.dataset.scope) return;
        scope = b.dataset.scope;
        wantHistory = true;
        prevMembers = {};
        rated = false;
        renderScope();
        poll();
      });
    }
    loop();
    window.addEventListener('resize', drawChart);
    window.addEventListener('quotad:view', () => { if (last) drawChart(); });
  });
})();
