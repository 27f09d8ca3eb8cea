// quotad console: the token-budget panel of the Playground. A budget of
// tokens whose cost is known only after the work (an LLM response):
// Reserve an estimate, Settle it with what was used, and watch the unused
// part come back, or a cost past the budget put the key in debt that the
// refill pays back. It calls Reserve, Settle and Check (cost 0) on an
// inline limit, on a key private to this page.
'use strict';

(function () {
  const NAMESPACE = 'quotad-console-budget';
  const LIMIT = { algorithm: 'ALGORITHM_TOKEN_BUCKET', limit: '1000', period: '60s' };
  const key = 'budget-' + Math.random().toString(16).slice(2, 10);
  let reservation = null;
  let timer = null;

  function panel() {
    const num = (name, value) => el('input', { name: name, type: 'number', min: '0', value: value });
    const estimate = num('estimate', 500);
    const actual = num('actual', 120);
    const meterFill = el('div', { class: 'budget-fill' });
    const remaining = el('b', { class: 'budget-remaining', text: '1,000' });
    const state = el('p', { class: 'budget-state hint', text: 'No reservation held.' });
    const log = el('ol', { class: 'budget-log' });
    const buttons = {
      reserve: el('button', { class: 'primary', 'data-action': 'reserve', text: 'Reserve', onclick: reserve }),
      settle: el('button', { 'data-action': 'settle', text: 'Settle', disabled: true, onclick: settle }),
    };
    const root = el('section', { id: 'budget', class: 'panel budget' },
      el('div', { class: 'panel-head' },
        el('div', null,
          el('h2', { text: 'A token budget' }),
          el('p', { text: 'An LLM response\'s cost is known only once it is done. Reserve an estimate before the work, ' +
            'settle with the tokens it used after it: the rest comes back. Settle past the budget and the key owes the ' +
            'difference: it is refused until the refill (1,000 tokens a minute) pays it back.' })),
        el('div', { class: 'panel-actions' },
          el('label', null, 'Estimate', estimate), buttons.reserve,
          el('label', null, 'Used', actual), buttons.settle)),
      el('div', { class: 'budget-meter' }, meterFill),
      el('p', null, 'Tokens left: ', remaining, ' of 1,000'),
      state, log);

    function note(text, cls) {
      log.prepend(el('li', { class: cls || null, text: text }));
      while (log.children.length > 6) log.lastChild.remove();
    }
    function show(d) {
      remaining.textContent = fmtNum(d.remaining);
      meterFill.style.width = (100 * d.remaining / 1000) + '%';
      root.classList.toggle('in-debt', !d.allowed);
      clearTimeout(timer);
      if (!d.allowed) {
        state.textContent = 'In debt: the next token fits in ' + fmtMs(d.retryAfterMs) + '.';
        // Asked again until the refill has paid the debt back; only then,
        // so that an idle page adds no checks to the Live view.
        timer = setTimeout(refresh, 500);
      } else if (!reservation) {
        state.textContent = 'No reservation held.';
      }
    }
    async function refresh() {
      try {
        // Cost 0: how the key stands, spending nothing.
        const r = await quotad.call('Check', { policy: NAMESPACE, key: key, cost: 0, limit: LIMIT });
        show({ allowed: !!r.allowed, remaining: Number(r.remaining || 0), retryAfterMs: durationMs(r.retryAfter) });
      } catch (e) {
        state.textContent = e.message;
      }
    }
    async function reserve() {
      try {
        const r = await quotad.call('Reserve', { policy: NAMESPACE, key: key, cost: estimate.value, limit: LIMIT });
        const d = r.decision || {};
        if (!r.reservationId) {
          note('Reserve ' + estimate.value + ': refused, retry in ' + fmtMs(durationMs(d.retryAfter)), 'denied');
        } else {
          reservation = { id: r.reservationId, estimate: Number(estimate.value) };
          buttons.settle.disabled = false;
          buttons.reserve.disabled = true;
          state.textContent = 'Holding a reservation of ' + estimate.value + ' tokens; settle it with what was used.';
          note('Reserve ' + estimate.value + ': ' + fmtNum(Number(d.remaining || 0)) + ' left', 'allowed');
        }
      } catch (e) { note('Reserve: ' + e.message, 'denied'); }
      refresh();
    }
    async function settle() {
      if (!reservation) return;
      try {
        const r = await quotad.call('Settle', { policy: NAMESPACE, key: key, limit: LIMIT, reservationId: reservation.id, actual: actual.value });
        const back = Number(r.refunded || 0), charged = Number(r.charged || 0);
        note('Settle ' + actual.value + ' of ' + reservation.estimate + ': ' +
          (charged ? charged + ' charged past the estimate' : back + ' came back'), charged ? 'denied' : 'allowed');
      } catch (e) { note('Settle: ' + e.message, 'denied'); }
      reservation = null;
      buttons.settle.disabled = true;
      buttons.reserve.disabled = false;
      refresh();
    }
    // The panel needs inline limits; /status says whether the server
    // takes them, without a check that would count as a decision.
    quotad.status().then((st) => { if (!st.config.inline_limits) root.hidden = true; }, () => {});
    return root;
  }

  document.addEventListener('DOMContentLoaded', () => {
    const boundary = document.getElementById('boundary');
    boundary.parentNode.insertBefore(panel(), boundary);
  });
})();
