// twc dashboard: the overview of every worker deployment and one page per worker deployment,
// kept current by the server's live stream (/api/live, server-sent events from Kubernetes
// watches). Plain DOM and SVG, no libraries.
'use strict';

(function () {
  const app = document.getElementById('app');
  const crumb = document.getElementById('crumb');
  const liveBadge = document.getElementById('live');
  const SVG = 'http://www.w3.org/2000/svg';
  const ACTIONS = ['pause', 'resume', 'promote', 'abort', 'retry'];

  const state = {
    rows: new Map(), // key -> overview row
    skew: 0, // server clock minus ours
    key: null, // the worker deployment shown, or null for the overview
    details: null,
    fetching: false,
    again: false,
    hellos: 0,
    filter: '',
  };

  // ---- helpers ------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === 'text') node.textContent = value;
      else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? '' : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null) continue;
      if (name === 'text') node.textContent = value;
      else node.setAttribute(name, value);
    }
    for (const child of children.flat()) if (child) node.append(child);
    return node;
  }

  function now() { return Date.now() + state.skew; }

  function duration(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + 's';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm' + (s % 60 ? (s % 60) + 's' : '');
    const h = Math.floor(m / 60);
    if (h < 48) return h + 'h' + (m % 60 ? (m % 60) + 'm' : '');
    return Math.floor(h / 24) + 'd';
  }

  function ago(at) { return at ? duration(now() - at) + ' ago' : '-'; }

  function percent(x) { return (Math.round(x * 10) / 10) + '%'; }

  function clock(at) { return at ? new Date(at).toLocaleTimeString() : '-'; }

  function workerPath(key) {
    const [ns, name] = key.split('/');
    return '/w/' + encodeURIComponent(ns) + '/' + encodeURIComponent(name);
  }

  async function getJson(url, options) {
    const response = await fetch(url, options);
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  // Share of new workflows on Current and on the ramping target.
  function routing(row) {
    const ramp = row.target && row.ramp !== null && row.ramp !== undefined ? row.ramp : 0;
    const current = row.current ? 100 - ramp : 0;
    const bar = el('span', { class: 'bar', title: 'Current ' + percent(current) + ', Ramping ' + percent(ramp) },
      el('span', { class: 'cur', style: 'width:' + current + '%' }),
      el('span', { class: 'rmp', style: 'width:' + ramp + '%' }));
    const label = row.target ? (row.ramp !== null && row.ramp !== undefined ? percent(ramp) + ' on ' + row.target : 'target ' + row.target)
      : (row.current ? '100% Current' : 'unversioned');
    return el('span', { class: 'routing' }, bar, el('span', { class: 'bar-label ramp', text: label }));
  }

  function badge(phase) { return el('span', { class: 'badge phase ' + phase, text: phase }); }

  // ---- overview -----------------------------------------------------------------------------

  function rowElement(row) {
    return el('tr', { 'data-key': row.key, 'data-phase': row.phase },
      el('td', {}, el('a', { href: workerPath(row.key), class: 'name', text: row.name })),
      el('td', { class: 'namespace', text: row.namespace }),
      el('td', {}, badge(row.phase)),
      el('td', { class: 'mono current', text: row.current || '-' }),
      el('td', { class: 'mono target', text: row.target || '-' }),
      el('td', {}, routing(row)),
      el('td', { class: 'stop', title: row.stop ? row.stop.message : '' , text: row.stop ? row.stop.reason + ': ' + row.stop.message : '' }),
      el('td', { class: 'age', 'data-at': row.created || '', text: row.created ? duration(now() - row.created) : '-' }));
  }

  function matches(row) {
    if (!state.filter) return true;
    const text = (row.key + ' ' + row.phase + ' ' + (row.current || '') + ' ' + (row.target || '') + ' ' + (row.stop ? row.stop.reason : '')).toLowerCase();
    return text.includes(state.filter);
  }

  function counts() {
    const phases = new Map();
    for (const row of state.rows.values()) phases.set(row.phase, (phases.get(row.phase) || 0) + 1);
    const parts = [state.rows.size + ' worker deployments'];
    for (const [phase, n] of [...phases.entries()].sort()) parts.push(phase + ' ' + n);
    return parts.join(' · ');
  }

  async function showOverview() {
    crumb.textContent = 'Worker deployments';
    document.title = 'twc dashboard';
    const data = await getJson('/api/overview');
    state.skew = data.now - Date.now();
    state.rows = new Map(data.rows.map((r) => [r.key, r]));
    const filter = el('input', { type: 'search', placeholder: 'Filter: name, namespace, phase, build, reason', value: state.filter,
      oninput: (e) => { state.filter = e.target.value.toLowerCase(); applyFilter(); } });
    const body = el('tbody', { id: 'rows' });
    const fragment = document.createDocumentFragment();
    for (const row of [...state.rows.values()].sort((a, b) => a.key.localeCompare(b.key))) {
      const tr = rowElement(row);
      if (!matches(row)) tr.hidden = true;
      fragment.append(tr);
    }
    body.append(fragment);
    app.replaceChildren(
      el('div', { class: 'toolbar' }, filter, el('span', { id: 'counts', class: 'muted', text: counts() }),
        data.synced ? null : el('span', { class: 'muted', text: '(still listing)' })),
      el('div', { class: 'card' }, el('table', { id: 'overview' },
        el('thead', {}, el('tr', {}, ['Name', 'Namespace', 'Phase', 'Current', 'Target', 'Routing', 'Stopped by', 'Age'].map((h) => el('th', { text: h })))),
        body)));
  }

  function applyFilter() {
    for (const tr of document.querySelectorAll('#rows tr')) {
      const row = state.rows.get(tr.dataset.key);
      tr.hidden = !row || !matches(row);
    }
  }

  function overviewChanged(key, row) {
    const body = document.getElementById('rows');
    if (!body) return;
    const old = body.querySelector('tr[data-key="' + CSS.escape(key) + '"]');
    if (!row) {
      state.rows.delete(key);
      if (old) old.remove();
    } else {
      state.rows.set(key, row);
      const tr = rowElement(row);
      tr.hidden = !matches(row);
      if (old) old.replaceWith(tr);
      else {
        const next = [...body.children].find((r) => r.dataset.key.localeCompare(key) > 0);
        body.insertBefore(tr, next || null);
      }
    }
    const countsNode = document.getElementById('counts');
    if (countsNode) countsNode.textContent = counts();
  }

  // ---- one worker deployment ----------------------------------------------------------------

  function header(row) {
    return el('div', { id: 'summary', class: 'card' },
      el('h1', {}, el('span', { text: row.name }), el('span', { class: 'muted', text: row.namespace + ' · ' + row.kind + ' · ' + row.strategy }), badge(row.phase)),
      el('div', { class: 'routing-line' }, routing(row)),
      row.stop ? el('p', { class: 'stop', id: 'stop', text: row.stop.reason + ': ' + row.stop.message }) : null);
  }

  function controls() {
    const answer = el('span', { id: 'answer', role: 'status' });
    const buttons = ACTIONS.map((action) => el('button', {
      'data-action': action, class: action === 'abort' ? 'danger' : '', text: action[0].toUpperCase() + action.slice(1),
      onclick: () => send(action, buttons, answer),
    }));
    return el('div', { class: 'card' }, el('h2', { text: 'Controls' }), el('div', { class: 'controls' }, buttons, answer));
  }

  async function send(action, buttons, answer) {
    if (action === 'abort' && !window.confirm('Abort the rollout? Routing goes back to the previous Current version.')) return;
    for (const b of buttons) b.disabled = true;
    answer.className = '';
    answer.textContent = action + ': sending…';
    try {
      const [ns, name] = state.key.split('/');
      const reply = await getJson('/api/workers/' + encodeURIComponent(ns) + '/' + encodeURIComponent(name) + '/' + action, { method: 'POST', headers: { 'X-Twc-Control': action } });
      answer.className = reply.accepted ? 'accepted' : 'rejected';
      answer.textContent = reply.answer;
    } catch (e) {
      answer.className = 'rejected';
      answer.textContent = 'failed: ' + e.message;
    } finally {
      for (const b of buttons) b.disabled = false;
    }
  }

  function table(id, heads, rows) {
    return el('table', { id },
      el('thead', {}, el('tr', {}, heads.map((h) => el('th', { text: h })))),
      el('tbody', {}, rows));
  }

  function versionsCard(d) {
    const rows = d.versions.map((v) => el('tr', { 'data-build': v.buildId, 'data-state': v.state },
      el('td', { text: v.role }),
      el('td', { class: 'mono', text: v.buildId }),
      el('td', {}, el('span', { class: 'badge', text: v.state })),
      el('td', { class: 'num routed', text: v.routed === null || v.routed === undefined ? '-' : percent(v.routed) }),
      el('td', { class: 'num', text: v.replicas === null || v.replicas === undefined ? '-' : v.readyReplicas + '/' + v.replicas }),
      el('td', { class: 'num', text: v.taskQueues }),
      el('td', { class: 'num', text: v.openPinned === null || v.openPinned === undefined ? '-' : v.openPinned }),
      el('td', { text: drainText(v) }),
      el('td', { class: 'mono', text: v.deployment || '-' })));
    return el('div', { class: 'card' }, el('h2', { text: 'Versions' }),
      table('versions', ['Role', 'Build', 'State', 'New workflows', 'Ready/replicas', 'Task queues polled', 'Open pinned', 'Drain', 'Deployment'], rows));
  }

  function drainText(v) {
    const parts = [];
    if (v.drainDone && v.drainDone.length) parts.push('done: ' + v.drainDone.join(', '));
    if (v.drainNext) parts.push('next: ' + v.drainNext + (v.drainNextAt ? (v.drainNextAt > now() ? ' in ' + duration(v.drainNextAt - now()) : ' now') : ''));
    if (v.eligibleForDeletion) parts.push('eligible for deletion');
    return parts.join('; ') || '-';
  }

  function rolloutCard(d) {
    const r = d.rollout;
    const lines = [];
    if (r.message) lines.push(el('p', { id: 'rollout-message', text: r.message }));
    const facts = [];
    if (r.startedAt) facts.push('started ' + ago(r.startedAt));
    if (r.nextStepAt && !r.heldBy) facts.push('next step in ' + duration(r.nextStepAt - now()));
    if (r.heldBy) facts.push('held by ' + r.heldBy);
    if (r.promoteRequested) facts.push('promotion requested');
    if (facts.length) lines.push(el('p', { class: 'muted', text: facts.join(' · ') }));
    const links = [];
    if (d.links.rollout) links.push(el('a', { id: 'rollout-link', href: d.links.rollout, target: '_blank', rel: 'noopener', text: 'Rollout workflow' }));
    if (d.links.twdWorkflow) links.push(el('a', { href: d.links.twdWorkflow, target: '_blank', rel: 'noopener', text: 'TWD workflow' }));
    if (d.links.allRollouts) links.push(el('a', { href: d.links.allRollouts, target: '_blank', rel: 'noopener', text: 'All rollouts' }));
    if (r.workflowId) lines.push(el('p', { class: 'mono', text: r.workflowId + (r.runId ? ' (run ' + r.runId + ')' : '') }));
    if (links.length) lines.push(el('p', { class: 'links' }, links));
    if (d.steps.length) lines.push(timeline(d.steps));
    return el('div', { class: 'card' }, el('h2', { text: 'Rollout' }), lines);
  }

  function timeline(steps) {
    const width = 640, height = 46, gap = 4;
    const total = steps.reduce((sum, s) => sum + Math.max(s.pauseMs, 1), 0);
    const usable = width - gap * steps.length;
    let x = 0;
    const groups = steps.map((s) => {
      const w = Math.max(44, usable * Math.max(s.pauseMs, 1) / total);
      const g = svg('g', { class: 'step ' + s.state, 'data-step': s.index, 'data-state': s.state },
        svg('rect', { x, y: 4, width: w, height: 22, rx: 3 }),
        svg('text', { x: x + 4, y: 19, text: s.ramp + '% · ' + s.pause, style: 'fill:#1b1f24' }),
        svg('text', { x: x + 2, y: 40, text: s.state === 'now' && s.ends ? 'now, ends ' + clock(s.ends) : s.state === 'planned' && s.started ? 'from ' + clock(s.started) : s.state }));
      if (s.state === 'now' && s.started && s.ends && s.ends > s.started) {
        const f = Math.min(1, Math.max(0, (now() - s.started) / (s.ends - s.started)));
        g.append(svg('line', { class: 'now-line', x1: x + f * w, x2: x + f * w, y1: 2, y2: 28 }));
      }
      x += w + gap;
      return g;
    });
    const drawn = svg('svg', { id: 'timeline', viewBox: '0 0 ' + Math.max(width, x) + ' ' + height, width: '100%', height }, groups);
    return el('div', {}, drawn, el('div', { class: 'legend' },
      el('span', {}, el('i', { style: 'background:#b7d3c3' }), 'done'),
      el('span', {}, el('i', { style: 'background:var(--ramp)' }), 'now'),
      el('span', {}, el('i', { style: 'background:var(--held)' }), 'held'),
      el('span', {}, el('i', { style: 'background:#e3e6ea' }), 'planned')));
  }

  // A line chart of `series` ([{label, cls, points: [{at, value, ...}]}]) with dashed limits.
  function chart(id, series, limits, describe) {
    const width = 640, height = 180, left = 44, right = 10, top = 10, bottom = 24;
    const all = series.flatMap((s) => s.points).filter((p) => p.value !== null && p.value !== undefined);
    if (!all.length) return el('p', { class: 'muted', text: 'No measurements yet.' });
    const times = all.map((p) => p.at);
    let t0 = Math.min(...times), t1 = Math.max(...times);
    if (t1 === t0) { t0 -= 30000; t1 += 30000; }
    const values = all.map((p) => p.value).concat(limits.map((l) => l.value));
    const vmax = Math.max(1, ...values) * 1.15;
    const sx = (t) => left + (width - left - right) * (t - t0) / (t1 - t0);
    const sy = (v) => top + (height - top - bottom) * (1 - v / vmax);
    const nodes = [
      svg('line', { x1: left, x2: left, y1: top, y2: height - bottom, stroke: '#c5ccd6' }),
      svg('line', { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom, stroke: '#c5ccd6' }),
      svg('text', { x: 4, y: top + 8, text: String(Math.round(vmax)) }),
      svg('text', { x: 4, y: height - bottom, text: '0' }),
      svg('text', { x: left, y: height - 6, text: clock(t0) }),
      svg('text', { x: width - right - 60, y: height - 6, text: clock(t1) }),
    ];
    for (const l of limits) {
      nodes.push(svg('line', { class: 'limit', 'data-limit': l.value, x1: left, x2: width - right, y1: sy(l.value), y2: sy(l.value) }));
      nodes.push(svg('text', { x: width - right - 90, y: sy(l.value) - 4, text: l.label, style: 'fill:var(--bad)' }));
    }
    for (const s of series) {
      const pts = s.points.filter((p) => p.value !== null && p.value !== undefined);
      if (pts.length > 1) nodes.push(svg('polyline', { class: 'series ' + (s.cls || ''), points: pts.map((p) => sx(p.at) + ',' + sy(p.value)).join(' ') }));
      for (const p of pts) {
        const c = svg('circle', { class: 'point ' + (p.verdict || ''), cx: sx(p.at), cy: sy(p.value), r: 4, 'data-value': p.value, 'data-verdict': p.verdict || '' });
        c.append(svg('title', { text: describe(s, p) }));
        nodes.push(c);
      }
    }
    return svg('svg', { id, viewBox: '0 0 ' + width + ' ' + height, width: '100%', height }, nodes);
  }

  function analysisCard(d) {
    if (!d.checks.length) return null;
    const blocks = d.checks.map((check) => {
      const points = d.analysis.filter((p) => p.check === check.name);
      const limits = [];
      if (check.max !== null && check.max !== undefined) limits.push({ value: check.max, label: 'max ' + check.max });
      if (check.min !== null && check.min !== undefined) limits.push({ value: check.min, label: 'min ' + check.min });
      const status = (d.rollout.analysis || []).find((a) => a.name === check.name);
      return el('div', { class: 'check', 'data-check': check.name },
        el('p', {}, el('strong', { text: check.name }), ' ', el('span', { class: 'muted', text: check.measures + (check.dryRun ? ' (dry run)' : '') }),
          status ? el('span', { class: 'muted', text: ' · last ' + (status.phase || '-') + ', ' + status.successful + ' ok / ' + status.failed + ' failed / ' + status.inconclusive + ' inconclusive' }) : null),
        chart('analysis-' + check.name, [{ label: check.name, points }], limits,
          (s, p) => 'step ' + (p.step + 1) + ' at ' + clock(p.at) + ': ' + p.value + ' (' + p.verdict + ') ' + p.message),
        status && status.message ? el('p', { class: 'muted', text: status.message }) : null);
    });
    return el('div', { class: 'card', id: 'analysis' }, el('h2', { text: 'Analysis' }), blocks,
      el('div', { class: 'legend' }, el('span', {}, el('i', { style: 'background:var(--ok)' }), 'passed'),
        el('span', {}, el('i', { style: 'background:var(--bad)' }), 'failed'),
        el('span', {}, el('i', { style: 'background:var(--warn)' }), 'inconclusive'),
        el('span', { text: '- - limit' })));
  }

  function autoscalingCard(d) {
    if (!d.autoscaling && !d.backlog.length && !d.scaled.length) return null;
    const builds = [...new Set(d.backlog.map((p) => p.buildId))];
    const backlog = builds.map((b) => ({ label: b, points: d.backlog.filter((p) => p.buildId === b).map((p) => ({ at: p.at, value: p.backlog })) }));
    const deployments = [...new Set(d.scaled.map((p) => p.deployment))];
    const replicas = deployments.map((name) => ({ label: name, cls: 'replicas', points: d.scaled.filter((p) => p.deployment === name).map((p) => ({ at: p.at, value: p.replicas })) }));
    const a = d.autoscaling;
    const limits = a && a.maxReplicas ? [{ value: a.maxReplicas, label: 'max ' + a.maxReplicas + ' replicas' }] : [];
    return el('div', { class: 'card', id: 'autoscaling' }, el('h2', { text: 'Autoscaling' }),
      a ? el('p', { class: 'muted', text: a.minReplicas + '..' + a.maxReplicas + ' replicas, target ' + (a.backlogPerReplica ? a.backlogPerReplica + ' waiting tasks per replica' : 'oldest task ' + a.backlogAgeSeconds + 's') }) : null,
      el('p', { text: 'Backlog (waiting tasks) per version' }),
      chart('backlog-chart', backlog, [], (s, p) => s.label + ' at ' + clock(p.at) + ': ' + p.value + ' waiting'),
      el('p', { text: 'Replicas set by the controller' }),
      chart('replicas-chart', replicas, limits, (s, p) => s.label + ' at ' + clock(p.at) + ': ' + p.value + ' replicas'));
  }

  function conditionsCard(d) {
    return el('div', { class: 'card' }, el('h2', { text: 'Conditions' }),
      table('conditions', ['Type', 'Status', 'Reason', 'Message', 'Since'], d.conditions.map((c) => el('tr', { 'data-type': c.type },
        el('td', { text: c.type }), el('td', { class: 'cond-' + c.status, text: c.status }), el('td', { text: c.reason }),
        el('td', { text: c.message }), el('td', { text: ago(c.since) })))));
  }

  function eventsCard(d) {
    return el('div', { class: 'card' }, el('h2', { text: 'Events' }),
      d.events.length ? table('events', ['Age', 'Type', 'Reason', 'Message'], d.events.map((e) => el('tr', { class: 'ev-' + e.type },
        el('td', { text: ago(e.at) }), el('td', { text: e.type }), el('td', { text: e.reason }),
        el('td', { text: (e.message || '') + (e.count > 1 ? ' (x' + e.count + ')' : '') })))) : el('p', { class: 'muted', text: 'None.' }));
  }

  function renderDetails(d) {
    state.details = d;
    state.skew = d.now - Date.now();
    document.title = d.summary.key + ' · twc';
    const keepAnswer = document.getElementById('answer');
    const controlCard = keepAnswer ? keepAnswer.closest('.card') : controls();
    const charts = [analysisCard(d), autoscalingCard(d)].filter(Boolean);
    app.replaceChildren(...[
      header(d.summary),
      d.engineError ? el('p', { class: 'error card', text: 'Engine Temporal not reachable; showing Kubernetes only: ' + d.engineError }) : null,
      controlCard,
      el('div', { class: 'grid' }, rolloutCard(d), versionsCard(d)),
      charts.length ? el('div', { class: 'grid' }, charts) : null,
      el('div', { class: 'grid' }, conditionsCard(d), eventsCard(d)),
    ].filter(Boolean));
  }

  async function refreshDetails() {
    if (state.fetching) { state.again = true; return; }
    state.fetching = true;
    try {
      const [ns, name] = state.key.split('/');
      const d = await getJson('/api/workers/' + encodeURIComponent(ns) + '/' + encodeURIComponent(name));
      if (state.key === d.summary.key) renderDetails(d);
    } catch (e) {
      app.replaceChildren(el('p', { class: 'error', text: e.message }), el('p', {}, el('a', { href: '/', text: 'All worker deployments' })));
    } finally {
      state.fetching = false;
      if (state.again) { state.again = false; refreshDetails(); }
    }
  }

  function detailsRowChanged(row) {
    const old = document.getElementById('summary');
    if (old && row) old.replaceWith(header(row));
  }

  // ---- routing and live updates -------------------------------------------------------------

  function show() {
    const parts = location.pathname.split('/').filter(Boolean);
    if (parts[0] === 'w' && parts.length === 3) {
      state.key = decodeURIComponent(parts[1]) + '/' + decodeURIComponent(parts[2]);
      crumb.replaceChildren(el('a', { href: '/', text: 'Worker deployments' }), ' / ' + state.key);
      return refreshDetails();
    }
    state.key = null;
    return showOverview().catch((e) => app.replaceChildren(el('p', { class: 'error', text: e.message })));
  }

  function live() {
    const source = new EventSource('/api/live');
    source.addEventListener('hello', () => {
      liveBadge.textContent = 'live';
      liveBadge.className = 'live on';
      // After a reconnection, changes may have been missed: read everything again.
      if (state.hellos++ > 0) show();
    });
    source.addEventListener('row', (e) => {
      const change = JSON.parse(e.data);
      if (state.key === null) overviewChanged(change.key, change.row);
      else if (state.key === change.key) { detailsRowChanged(change.row); refreshDetails(); }
    });
    source.addEventListener('details', (e) => {
      const change = JSON.parse(e.data);
      if (state.key !== null && state.key === change.key) refreshDetails();
    });
    source.addEventListener('reload', () => show());
    source.addEventListener('error', () => {
      liveBadge.textContent = 'reconnecting';
      liveBadge.className = 'live';
    });
  }

  // Ages move on without a change.
  setInterval(() => {
    for (const cell of document.querySelectorAll('td.age[data-at]')) {
      const at = Number(cell.dataset.at);
      if (at) cell.textContent = duration(now() - at);
    }
  }, 10000);

  show();
  live();
})();
