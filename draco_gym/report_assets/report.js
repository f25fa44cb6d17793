// The draco-gym run report: three views (the run at a glance, a group, a rollout) and a
// filtered list of groups, drawn from the JSON the generator embedded in this page.
// Every string that comes from the run is inserted as a text node (el() below), never as
// markup: agent output is hostile. Charts are plain SVG built here.
(function () {
  'use strict';

  var INDEX = JSON.parse(document.getElementById('run-index').textContent);
  var GROUPS = INDEX.groups;
  var app = document.getElementById('app');
  var SVGNS = 'http://www.w3.org/2000/svg';
  var PAGE = 50;
  var COLORS = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#ca8a04', '#db2777', '#4b5563', '#65a30d'];

  // -- DOM helpers: attributes and text only ------------------------------------------------

  function el(tag, attrs) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    for (var i = 2; i < arguments.length; i++) append(node, arguments[i]);
    return node;
  }
  function sv(tag, attrs) {
    var node = document.createElementNS(SVGNS, tag);
    setAttrs(node, attrs);
    for (var i = 2; i < arguments.length; i++) append(node, arguments[i]);
    return node;
  }
  function setAttrs(node, attrs) {
    if (!attrs) return;
    Object.keys(attrs).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) return;
      if (k.slice(0, 2) === 'on') node.addEventListener(k.slice(2), v);
      else if (k === 'text') node.textContent = String(v);
      else node.setAttribute(k, String(v));
    });
  }
  function append(node, kid) {
    if (kid === null || kid === undefined || kid === false) return;
    if (Array.isArray(kid)) { kid.forEach(function (k) { append(node, k); }); return; }
    node.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  function fmt(x, digits) {
    if (x === null || x === undefined || (typeof x === 'number' && !isFinite(x))) return '–';
    if (typeof x !== 'number') return String(x);
    if (digits === undefined) digits = Math.abs(x) >= 100 ? 0 : Math.abs(x) >= 10 ? 1 : 3;
    return x.toFixed(digits);
  }
  function signed(x, digits) { return (x > 0 ? '+' : '') + fmt(x, digits === undefined ? 2 : digits); }
  var VERDICT = { '1': 'PASS', '-1': 'FAIL', '0': 'N/A' };
  var VCLASS = { '1': 'pass', '-1': 'fail', '0': 'na' };
  function okText(ok) { return ok === true ? 'success' : ok === false ? 'failure' : 'unknown'; }

  // -- group detail: gzip + base64 blocks, decompressed when a group is opened ---------------

  var details = {};
  function loadDetail(gid) {
    if (!details[gid]) {
      var b64 = document.getElementById('g' + gid).textContent;
      var bin = atob(b64), bytes = new Uint8Array(bin.length);
      for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
      details[gid] = new Response(stream).text().then(JSON.parse);
    }
    return details[gid];
  }

  // -- routing --------------------------------------------------------------------------------

  function parseHash() {
    var h = location.hash.replace(/^#/, '');
    var q = h.indexOf('?'), path = q < 0 ? h : h.slice(0, q), params = new URLSearchParams(q < 0 ? '' : h.slice(q + 1));
    return { parts: path.split('/').filter(Boolean), params: params };
  }
  function go(hash) { location.hash = hash; }
  var renderToken = 0;

  // The page marks the view it has finished drawing (body[data-shown] = its hash) so that a
  // reader driving it (the tests, the screenshot bench) waits for that view, not for an element
  // the previous view may still show: a view draws when its hashchange fires, and the group and
  // rollout views only once their gzipped detail has been inflated.
  function render() {
    var route = parseHash(), token = ++renderToken, hash = location.hash;
    document.body.removeAttribute('data-shown');
    clear(app);
    app.appendChild(header(route.parts[0] || 'run'));
    var main = el('main', { id: 'view' });
    app.appendChild(main);
    var view = route.parts[0] || 'run', drawn;
    if (view === 'group' && GROUPS[+route.parts[1]]) drawn = groupView(main, +route.parts[1], token);
    else if (view === 'rollout' && GROUPS[+route.parts[1]]) drawn = rolloutView(main, +route.parts[1], +route.parts[2] || 0, token, +route.parts[3] || 0);
    else if (view === 'groups') groupsView(main, route.params);
    else runView(main);
    if (view !== 'rollout' || !route.parts[3]) window.scrollTo(0, 0);
    Promise.resolve(drawn).then(function () { if (token === renderToken) document.body.setAttribute('data-shown', hash); });
  }

  function header(active) {
    var nRollouts = GROUPS.reduce(function (s, g) { return s + g.roll.length; }, 0);
    var tab = function (name, hash, label) {
      return el('a', { href: hash, class: 'tab' + (active === name ? ' active' : '') }, label);
    };
    return el('header', null,
      el('div', { class: 'brand' }, el('strong', null, 'draco-gym report'), ' ', el('span', { class: 'run-title' }, INDEX.title)),
      el('nav', null, tab('run', '#run', 'Run at a glance'),
        tab('groups', '#groups', 'Groups (' + GROUPS.length + ')'),
        active === 'group' ? tab('group', location.hash, 'Group') : null,
        active === 'rollout' ? tab('rollout', location.hash, 'Rollout') : null),
      el('div', { class: 'meta' }, GROUPS.length + ' groups · ' + nRollouts + ' rollouts · generated ' + INDEX.generated),
      (INDEX.warnings || []).length ? el('ul', { class: 'warnings' }, INDEX.warnings.map(function (w) {
        return el('li', null, w);
      })) : null);
  }

  // -- charts ---------------------------------------------------------------------------------

  function lineChart(title, xs, series, opts) {
    opts = opts || {};
    var W = 460, H = 220, L = 48, R = 12, T = 10, B = 28;
    var all = [];
    series.forEach(function (s) { s.y.forEach(function (v) { if (v !== null && v !== undefined) all.push(v); }); });
    var stackedTop = [];
    if (opts.stacked) {
      xs.forEach(function (_, i) { stackedTop.push(series.reduce(function (s, ser) { return s + (ser.y[i] || 0); }, 0)); });
      all = all.concat(stackedTop);
    }
    var lo = Math.min.apply(null, all.concat([0])), hi = Math.max.apply(null, all.concat([lo]));
    if (opts.ymin !== undefined) lo = opts.ymin;
    if (opts.ymax !== undefined) hi = Math.max(opts.ymax, hi);
    if (hi - lo < 1e-12) hi = lo + (Math.abs(lo) || 1);  // a flat series still gets a readable axis
    var step = niceStep(hi - lo);
    var ymin = Math.floor(lo / step + 1e-9) * step, ymax = Math.ceil(hi / step - 1e-9) * step;
    if (ymax <= ymin) ymax = ymin + step;
    var xmin = Math.min.apply(null, xs), xmax = Math.max.apply(null, xs);
    if (xmax === xmin) { xmin -= 0.5; xmax += 0.5; }
    var px = function (x) { return L + (x - xmin) / (xmax - xmin) * (W - L - R); };
    var py = function (y) { return T + (1 - (y - ymin) / (ymax - ymin)) * (H - T - B); };
    var g = sv('svg', { viewBox: '0 0 ' + W + ' ' + H, class: 'chart', role: 'img', 'aria-label': title });
    for (var yv = ymin; yv <= ymax + step / 2; yv += step) {
      g.appendChild(sv('line', { x1: L, x2: W - R, y1: py(yv), y2: py(yv), class: 'grid' }));
      g.appendChild(sv('text', { x: L - 4, y: py(yv) + 4, class: 'tick', 'text-anchor': 'end' }, String(Number(yv.toFixed(6)))));
    }
    var ticks = Math.min(xs.length, 8);
    for (var t = 0; t < ticks; t++) {
      var xv = xs[Math.round(t * (xs.length - 1) / Math.max(ticks - 1, 1))];
      g.appendChild(sv('text', { x: px(xv), y: H - 10, class: 'tick', 'text-anchor': 'middle' }, fmt(xv, 0)));
    }
    if (ymin < 0 && ymax > 0) g.appendChild(sv('line', { x1: L, x2: W - R, y1: py(0), y2: py(0), class: 'zero' }));
    var base = xs.map(function () { return 0; });
    series.forEach(function (s, si) {
      var color = s.color || COLORS[si % COLORS.length];
      if (opts.stacked) {
        var top = xs.map(function (_, i) { return base[i] + (s.y[i] || 0); });
        var pts = xs.map(function (x, i) { return px(x) + ',' + py(top[i]); })
          .concat(xs.slice().reverse().map(function (x, i) { return px(x) + ',' + py(base[xs.length - 1 - i]); }));
        g.appendChild(sv('polygon', { points: pts.join(' '), fill: color, 'fill-opacity': 0.75 }, sv('title', null, s.name)));
        base = top;
        return;
      }
      var d = '', pen = false;
      xs.forEach(function (x, i) {
        var v = s.y[i];
        if (v === null || v === undefined) { pen = false; return; }
        d += (pen ? 'L' : 'M') + px(x).toFixed(1) + ' ' + py(v).toFixed(1);
        pen = true;
      });
      g.appendChild(sv('path', { d: d, stroke: color, fill: 'none', 'stroke-width': 2, 'stroke-dasharray': s.dash || null }));
      if (xs.length <= 120) xs.forEach(function (x, i) {
        var v = s.y[i];
        if (v === null || v === undefined) return;
        g.appendChild(sv('circle', { cx: px(x), cy: py(v), r: 2.5, fill: color },
          sv('title', null, s.name + ' @ ' + fmt(x, 0) + ': ' + fmt(v, 4))));
      });
    });
    var legend = el('div', { class: 'legend' }, series.map(function (s, si) {
      return el('span', null, el('span', { class: 'swatch', style: 'background:' + (s.color || COLORS[si % COLORS.length]) }), s.name);
    }));
    return el('figure', { class: 'card chart-card' }, el('figcaption', null, title), g, legend,
      opts.source ? el('div', { class: 'source' }, opts.source) : null);
  }

  // A tick spacing of 1, 2, 2.5 or 5 times a power of ten giving about four intervals.
  function niceStep(span) {
    var raw = (span > 0 ? span : 1) / 4, mag = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * mag;
  }

  function pick(what) {
    var key = INDEX.metrics.names[what];
    if (key && INDEX.metrics.series[key] && INDEX.metrics.series[key].some(notNull))
      return { x: INDEX.metrics.x, y: INDEX.metrics.series[key], source: 'metrics.jsonl: ' + key };
    var d = INDEX.derived[what];
    if (Array.isArray(d) && d.some(notNull)) return { x: INDEX.derived.x, y: d, source: 'derived from rollouts.jsonl' };
    return null;
  }
  function notNull(v) { return v !== null && v !== undefined; }

  function prefixed(pattern) {
    var out = {};
    Object.keys(INDEX.metrics.series).forEach(function (k) {
      var m = k.match(pattern);
      if (m && INDEX.metrics.series[k].some(notNull)) out[m[1]] = { key: k, y: INDEX.metrics.series[k] };
    });
    return out;
  }

  var missing = [];
  function chartOf(title, entries, opts) {
    entries = entries.filter(function (e) { return e.data; });
    if (!entries.length) { missing.push(title); return null; }
    var xs = entries[0].data.x;
    var sources = [];
    var series = entries.map(function (e) {
      if (sources.indexOf(e.data.source) < 0) sources.push(e.data.source);
      return { name: e.name, y: e.data.y, dash: e.dash };
    });
    opts = opts || {};
    opts.source = sources.join('; ');
    return lineChart(title, xs, series, opts);
  }

  function stackedOf(title, modes, xs, source, opts) {
    var names = Object.keys(modes);
    if (!names.length) { missing.push(title); return null; }
    opts = opts || {};
    opts.stacked = true;
    opts.source = source;
    return lineChart(title, xs, names.map(function (n) { return { name: n, y: modes[n] }; }), opts);
  }

  function runView(main) {
    missing = [];
    var charts = el('div', { class: 'charts' });
    var add = function (c) { if (c) charts.appendChild(c); };
    add(chartOf('Reward, rubric pass rate and env success per iteration', [
      { name: 'reward (mean R)', data: pick('reward') },
      { name: 'rubric pass rate', data: pick('pass_rate') },
      { name: 'env success', data: pick('env_success'), dash: '4 3' }]));
    add(chartOf('Criteria per group, before and after dropout', [
      { name: 'before dropout', data: pick('criteria_before') },
      { name: 'after dropout', data: pick('criteria_after') }], { ymin: 0 }));
    add(chartOf('Inert-credit share: ours (credit steps all at the rule\'s own A_i) and the paper\'s (unanimous verdicts)', [
      { name: 'ours', data: pick('inert_share') },
      { name: 'paper', data: pick('paper_inert_share'), dash: '4 3' }], { ymin: 0, ymax: 1 }));
    add(chartOf('Uncredited citations (verdicts citing a turn without code that no credit step holds)', [
      { name: 'citations', data: pick('uncredited_citations') }], { ymin: 0 }));

    var term = prefixed(/(?:^|\/)termination\/(.+)$/), termData = {};
    Object.keys(term).forEach(function (m) { termData[m] = term[m].y; });
    if (Object.keys(termData).length) add(stackedOf('Termination modes (share of rollouts)', termData, INDEX.metrics.x, 'metrics.jsonl: termination/*', { ymin: 0, ymax: 1 }));
    else add(stackedOf('Termination modes (share of rollouts)', INDEX.derived.termination || {}, INDEX.derived.x, 'derived from rollouts.jsonl', { ymin: 0, ymax: 1 }));

    add(chartOf('Judge cost per iteration', [{ name: 'cost', data: pick('judge_cost') }], { ymin: 0 }));
    add(chartOf('Judge tokens and calls per iteration', [
      { name: 'prompt tokens', data: pick('judge_prompt_tokens') },
      { name: 'completion tokens', data: pick('judge_completion_tokens') },
      { name: 'calls', data: pick('judge_calls'), dash: '4 3' }], { ymin: 0 }));
    var fb = INDEX.derived.fallbacks || {};
    if (Object.keys(fb).length) add(stackedOf('Judge fallbacks per stage (count)', fb, INDEX.derived.x, 'derived from rollouts.jsonl (GroupScore.fallbacks)', { ymin: 0 }));
    else add(chartOf('Judge fallbacks (count)', [{ name: 'fallbacks', data: pick('fallbacks') }], { ymin: 0 }));
    var times = prefixed(/(?:^|\/)(?:time|phases)\/(.+)$/), timeData = {};  // timers/phases/<phase>, or time/<phase>
    Object.keys(times).forEach(function (p) { if (p !== 'iteration') timeData[p] = times[p].y; });
    add(stackedOf('Time per phase (s)', timeData, INDEX.metrics.x, 'metrics.jsonl: timers/phases/*', { ymin: 0 }));

    main.appendChild(el('section', null, el('h2', null, 'The run at a glance'), summaryCards(), charts,
      missing.length ? el('p', { class: 'source', id: 'missing' }, 'Not in this run (no such key in metrics.jsonl, nothing to derive from rollouts.jsonl): ' + missing.join('; ') + '.') : null));
    if (!charts.firstChild) charts.appendChild(el('p', { class: 'empty' }, 'No per-iteration figures: the run has no metrics.jsonl and no rollouts.'));
    if (INDEX.eval) main.appendChild(evalTable(INDEX.eval));
    main.appendChild(allMetrics());
  }

  function summaryCards() {
    var rolls = [], dis = 0;
    GROUPS.forEach(function (g) { rolls = rolls.concat(g.roll); if (g.dis.length) dis++; });
    var its = INDEX.derived.x || [];
    var known = rolls.filter(function (r) { return r.ok !== null; });
    var card = function (label, value, title) { return el('div', { class: 'stat', title: title || null }, el('div', { class: 'v' }, value), el('div', { class: 'l' }, label)); };
    return el('div', { class: 'stats' },
      card('iterations', String(INDEX.metrics.x.length || its.length)),
      card('groups', String(GROUPS.length)),
      card('rollouts', String(rolls.length)),
      card('env success', known.length ? fmt(known.filter(function (r) { return r.ok; }).length / known.length, 2) : '–', 'share of rollouts the environment counted as a success'),
      el('a', { href: '#groups?dis=1', class: 'stat link', title: 'groups where the judge and the environment disagree' },
        el('div', { class: 'v' }, String(dis)), el('div', { class: 'l' }, 'groups where judge and env disagree')));
  }

  function evalTable(ev) {
    // A rate is {v, ci: [lo, hi], k, n}: shown as "v [lo, hi]", its k of n on hover.
    var rate = function (x) { return x !== null && typeof x === 'object' && Array.isArray(x.ci); };
    var shown = function (x) {
      if (rate(x)) return fmt(x.v, 3) + ' [' + fmt(x.ci[0], 2) + ', ' + fmt(x.ci[1], 2) + ']';
      return Number.isInteger(x) ? String(x) : fmt(x);  // a count as a count
    };
    var rows = ev.rows.map(function (r) {
      var cells = r.cells.map(function (x) { return el('td', { class: 'num', title: rate(x) ? x.k + ' of ' + x.n : null }, shown(x)); });
      var diff = !r.diff ? '' : r.diff.ci ? signed(r.diff.v, 3) + ' [' + signed(r.diff.ci[0], 3) + ', ' + signed(r.diff.ci[1], 3) + ']' : 'no change seen';
      if (ev.diff) cells.push(el('td', { class: 'num' }, diff));
      return el('tr', null, el('th', null, r.key), cells);
    });
    return el('section', { class: 'card' }, el('h3', null, 'Evaluation (' + ev.file + ')'),
      el('table', { class: 'eval' }, el('thead', null, el('tr', null, el('th', null, ''), ev.columns.map(function (c) { return el('th', null, c); }), ev.diff ? el('th', null, 'after − before, 95% CI') : null)),
        el('tbody', null, rows)),
      ev.notes.length ? el('ul', { class: 'notes' }, ev.notes.map(function (n) { return el('li', null, n); })) : null);
  }

  function sparkline(ys) {
    var vals = ys.filter(notNull);
    if (!vals.length) return null;
    var lo = Math.min.apply(null, vals), hi = Math.max.apply(null, vals), W = 120, H = 24;
    var d = '', pen = false;
    ys.forEach(function (v, i) {
      if (!notNull(v)) { pen = false; return; }
      var x = ys.length > 1 ? i / (ys.length - 1) * W : W / 2, y = hi > lo ? H - 2 - (v - lo) / (hi - lo) * (H - 4) : H / 2;
      d += (pen ? 'L' : 'M') + x.toFixed(1) + ' ' + y.toFixed(1);
      pen = true;
    });
    return sv('svg', { viewBox: '0 0 ' + W + ' ' + H, class: 'spark' }, sv('path', { d: d }));
  }

  function allMetrics() {
    var keys = Object.keys(INDEX.metrics.series);
    var body = el('tbody', null, keys.map(function (k) {
      var ys = INDEX.metrics.series[k], vals = ys.filter(notNull);
      return el('tr', null, el('td', { class: 'key' }, k), el('td', { class: 'num' }, fmt(vals[vals.length - 1])),
        el('td', { class: 'num' }, vals.length ? fmt(Math.min.apply(null, vals)) : '–'),
        el('td', { class: 'num' }, vals.length ? fmt(Math.max.apply(null, vals)) : '–'), el('td', null, sparkline(ys)));
    }));
    return el('details', { class: 'card' }, el('summary', null, 'Every metric in metrics.jsonl (' + keys.length + ')'),
      keys.length ? el('table', { class: 'metrics' }, el('thead', null, el('tr', null, ['metric', 'last', 'min', 'max', 'per iteration'].map(function (h) { return el('th', null, h); }))), body)
        : el('p', { class: 'empty' }, 'This run has no metrics.jsonl.'));
  }

  // -- the list of groups, filtered -----------------------------------------------------------

  function distinct(get) {
    var seen = {};
    GROUPS.forEach(function (g) { [].concat(get(g)).forEach(function (v) { seen[v] = true; }); });
    return Object.keys(seen).sort();
  }

  function matches(g, f) {
    if (f.task && g.task !== f.task) return false;
    if (f.it && String(g.it) !== f.it) return false;
    if (f.dis && !g.dis.length) return false;
    if (f.term && !g.roll.some(function (r) { return r.term === f.term; })) return false;
    if (f.ok && !g.roll.some(function (r) { return okText(r.ok) === f.ok; })) return false;
    var q = (f.crit || '').toLowerCase();
    if (f.verdict === 'dropped') return g.drop.some(function (d) { return d[0].toLowerCase().indexOf(q) >= 0; });
    if (!q && !f.verdict) return true;
    var want = f.verdict === 'pass' ? 1 : f.verdict === 'fail' ? -1 : f.verdict === 'na' ? 0 : null;
    var cols = [];
    g.crit.forEach(function (c, j) { if (c[0].toLowerCase().indexOf(q) >= 0) cols.push(j); });
    if (!cols.length) return q ? g.drop.some(function (d) { return !f.verdict && d[0].toLowerCase().indexOf(q) >= 0; }) : false;
    if (want === null) return true;
    return g.roll.some(function (r) { return cols.some(function (j) { return r.v[j] === want; }); });
  }

  function groupsView(main, params) {
    var f = {};
    ['task', 'it', 'crit', 'verdict', 'term', 'ok', 'dis'].forEach(function (k) { f[k] = params.get(k) || ''; });
    var page = Math.max(+params.get('page') || 1, 1);
    var apply = function (changes) {
      var p = new URLSearchParams();
      Object.keys(f).forEach(function (k) { var v = k in changes ? changes[k] : f[k]; if (v) p.set(k, v); });
      if (changes.page > 1) p.set('page', changes.page);
      go('#groups?' + p.toString());
    };
    var select = function (name, label, options) {
      return el('label', null, label, ' ', el('select', { name: name, onchange: function (e) { var c = {}; c[name] = e.target.value; apply(c); } },
        options.map(function (o) { var opt = el('option', { value: o[0] }, o[1]); if (o[0] === f[name]) opt.selected = true; return opt; })));
    };
    var crit = el('input', { type: 'search', name: 'crit', placeholder: 'criterion title contains…', value: f.crit });
    crit.addEventListener('change', function () { apply({ crit: crit.value }); });
    var dis = el('input', { type: 'checkbox', name: 'dis' });
    dis.checked = !!f.dis;
    dis.addEventListener('change', function () { apply({ dis: dis.checked ? '1' : '' }); });
    var form = el('div', { class: 'filters card' },
      select('task', 'task', [['', 'any']].concat(distinct(function (g) { return g.task; }).map(function (t) { return [t, t]; }))),
      select('it', 'iteration', [['', 'any']].concat(distinct(function (g) { return String(g.it); }).sort(function (a, b) { return a - b; }).map(function (t) { return [t, t]; }))),
      el('label', null, 'criterion ', crit),
      select('verdict', 'verdict', [['', 'any'], ['pass', 'PASS'], ['fail', 'FAIL'], ['na', 'not applicable'], ['dropped', 'dropped by dropout']]),
      select('term', 'termination', [['', 'any']].concat(distinct(function (g) { return g.roll.map(function (r) { return r.term; }); }).map(function (t) { return [t, t]; }))),
      select('ok', 'env outcome', [['', 'any'], ['success', 'a success'], ['failure', 'a failure'], ['unknown', 'unknown']]),
      el('label', { class: 'lens', title: 'a failed rollout the judge rewards, a successful one it punishes, or a failed one ranked at or above a successful one' },
        dis, ' judge and env disagree (reward-hacking lens)'),
      el('button', { type: 'button', onclick: function () { go('#groups'); } }, 'clear'));
    var hits = GROUPS.filter(function (g) { return matches(g, f); });
    var pages = Math.max(Math.ceil(hits.length / PAGE), 1);
    page = Math.min(page, pages);
    var shown = hits.slice((page - 1) * PAGE, page * PAGE);
    var rows = shown.map(function (g) {
      var oks = g.roll.filter(function (r) { return r.ok === true; }).length, known = g.roll.filter(function (r) { return r.ok !== null; }).length;
      var terms = {};
      g.roll.forEach(function (r) { terms[r.term] = (terms[r.term] || 0) + 1; });
      return el('tr', { class: 'group-row' + (g.dis.length ? ' disagree' : ''), 'data-gid': g.id, onclick: function () { go('#group/' + g.id); } },
        el('td', { class: 'num' }, String(g.it)), el('td', null, el('a', { href: '#group/' + g.id }, g.task)),
        el('td', { class: 'num' }, String(g.roll.length)),
        el('td', null, rewardStrip(g)),
        el('td', { class: 'num' }, known ? oks + '/' + known : '–'),
        el('td', null, Object.keys(terms).map(function (t) { return el('span', { class: 'tag' }, t + ' ' + terms[t]); })),
        el('td', { class: 'num' }, g.crit.length + (g.drop.length ? ' (−' + g.drop.length + ')' : '')),
        el('td', { class: 'num' }, g.fb.length ? String(g.fb.length) : ''),
        el('td', { class: 'why' }, g.dis.length ? g.dis[0] + (g.dis.length > 1 ? '; and ' + (g.dis.length - 1) + ' more' : '') : ''));
    });
    var pager = el('div', { class: 'pager' },
      el('button', { type: 'button', disabled: page <= 1 ? 'disabled' : null, onclick: function () { apply({ page: page - 1 }); } }, '‹ previous'),
      ' page ' + page + ' of ' + pages + ' ',
      el('button', { type: 'button', disabled: page >= pages ? 'disabled' : null, onclick: function () { apply({ page: page + 1 }); } }, 'next ›'));
    main.appendChild(el('section', null, el('h2', null, 'Groups'), form,
      el('p', { class: 'count', id: 'match-count' }, hits.length + ' of ' + GROUPS.length + ' groups match'),
      el('table', { class: 'groups', id: 'groups-table' },
        el('thead', null, el('tr', null, ['iter', 'task', 'G', 'rewards R_i', 'env success', 'terminations', 'criteria (dropped)', 'fallbacks', 'judge vs env'].map(function (h) { return el('th', null, h); }))),
        el('tbody', null, rows)), pager,
      el('p', { class: 'source' }, 'Rewards: one bar per rollout, its height |R_i|, blue for R_i ≥ 0 and red below; the line under it is the environment\'s outcome, green for a success, red for a failure, grey when unknown.')));
  }

  function rewardStrip(g) {
    return el('span', { class: 'strip' }, g.roll.map(function (r, i) {
      var cls = 'cell ' + (r.ok === true ? 'ok' : r.ok === false ? 'bad' : 'unk');
      return el('span', { class: cls, title: '#' + (i + 1) + ' R=' + signed(r.R) + ' A=' + signed(r.A) + ' env ' + okText(r.ok) },
        el('span', { class: 'fill ' + (r.R >= 0 ? 'pos' : 'neg'), style: 'height:' + Math.round(Math.abs(r.R) * 100) + '%' }));
    }));
  }

  // -- the group view ------------------------------------------------------------------------

  function origin(o) {
    var label = { instruction: 'proposed', trajectory: 'from a rollout', static: 'static', rule: 'rule' }[o] || 'origin not saved';
    return el('span', { class: 'origin ' + (o || 'unknown'), title: o ? 'Criterion.origin = ' + o : 'rollouts.jsonl saved this criterion by title only' }, label);
  }

  function navLinks(prevHash, nextHash, upHash, upLabel) {
    return el('div', { class: 'navlinks' },
      prevHash ? el('a', { href: prevHash }, '‹ previous') : el('span', { class: 'off' }, '‹ previous'),
      upHash ? el('a', { href: upHash }, upLabel) : null,
      nextHash ? el('a', { href: nextHash }, 'next ›') : el('span', { class: 'off' }, 'next ›'));
  }

  function groupView(main, gid, token) {
    var g = GROUPS[gid];
    main.appendChild(navLinks(gid > 0 ? '#group/' + (gid - 1) : null, gid < GROUPS.length - 1 ? '#group/' + (gid + 1) : null, '#groups', 'all groups'));
    main.appendChild(el('h2', null, 'Iteration ' + g.it + ' · task ', el('code', null, g.task), ' · G = ' + g.roll.length));
    var instruction = el('div', { class: 'instruction' }, el('p', { class: 'loading' }, 'Loading…'));
    main.appendChild(instruction);
    if (g.dis.length) main.appendChild(el('div', { class: 'card disagree-box' }, el('strong', null, 'Judge and environment disagree: '),
      el('ul', null, g.dis.map(function (d) { return el('li', null, d); }))));

    var maps = [];
    var rows = g.roll.map(function (r, i) {
      maps.push(el('td', { class: 'stepmap-cell' }));
      return el('tr', { class: 'rollout-row' + (r.ok === false && r.R > 0 || r.ok === true && r.R < 0 ? ' disagree' : ''), onclick: function () { go('#rollout/' + gid + '/' + i); } },
        el('td', null, el('a', { href: '#rollout/' + gid + '/' + i }, '#' + (i + 1))),
        el('td', { class: 'num' }, signed(r.R)), el('td', null, advBar(r.A)),
        el('td', { class: 'num' }, r.p + ' / ' + r.f),
        el('td', null, el('span', { class: 'ok-' + okText(r.ok) }, okText(r.ok))),
        el('td', null, r.term), el('td', { class: 'num' }, String(r.ns)), el('td', { class: 'num' }, String(r.tok)), maps[i]);
    });
    main.appendChild(el('section', { class: 'card' }, el('h3', null, 'Rollouts'),
      el('table', { class: 'group-table', id: 'group-table' },
        el('thead', null, el('tr', null, ['rollout', 'R_i', 'A_i (group-normalised)', 'pass / fail', 'env', 'termination', 'steps', 'tokens']
          .map(function (h) { return el('th', null, h); }),
          el('th', null, 'steps, cited by: ', [['pass', 'PASS'], ['fail', 'FAIL'], ['both', 'both'], ['none', 'none']].map(function (k) {
            return el('span', { class: 'key-item' }, el('span', { class: 'stepcell ' + k[0] }), ' ' + k[1] + ' ');
          })))),
        el('tbody', null, rows))));

    var rubric = el('section', { class: 'card' }, el('h3', null, 'The merged rubric (' + g.crit.length + ' criteria after dropout)'));
    var table = el('table', { class: 'rubric', id: 'rubric' });
    table.appendChild(el('thead', null, el('tr', null, el('th', null, 'criterion'), el('th', null, 'origin'),
      g.roll.map(function (r, i) { return el('th', { class: 'num' }, el('a', { href: '#rollout/' + gid + '/' + i }, '#' + (i + 1))); }))));
    var tbody = el('tbody');
    var cells = [];
    g.crit.forEach(function (c, j) {
      var tr = el('tr', null, el('td', { class: 'crit', title: c[2] || null }, c[0]), el('td', null, origin(c[1])));
      g.roll.forEach(function (r, i) {
        var s = r.v[j];
        var td = el('td', { class: 'v ' + (s === null ? 'none' : VCLASS[s]) }, s === null ? '·' : VERDICT[s]);
        cells.push({ td: td, i: i, j: j });
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    table.appendChild(tbody);
    rubric.appendChild(table);
    if (g.drop.length) rubric.appendChild(el('div', { class: 'dropped' }, el('h4', null, 'Dropped (' + g.drop.length + ')'),
      el('ul', null, g.drop.map(function (d) { return el('li', null, el('span', { class: 'crit' }, d[0]), ' ', d[1] ? origin(d[1]) : null, ' — ', el('span', { class: 'reason' }, d[2])); }))));
    if (g.fb.length) rubric.appendChild(el('div', { class: 'fallbacks' }, el('h4', null, 'Judge fallbacks'),
      el('ul', null, g.fb.map(function (f) { return el('li', null, f); }))));
    main.appendChild(rubric);

    return loadDetail(gid).then(function (d) {
      if (token !== renderToken) return;
      clear(instruction);
      instruction.appendChild(folded('Task instruction', d.instruction, 600));
      d.rollouts.forEach(function (roll, i) { maps[i].appendChild(stepMap(gid, i, roll)); });
      // Cited steps and evidence in the rubric cells.
      cells.forEach(function (cell) {
        var v = d.rollouts[cell.i].verdicts.filter(function (x) { return x.c === cell.j; })[0];
        if (!v) return;
        if (v.cite.length) cell.td.appendChild(el('div', { class: 'cites' }, v.cite.map(function (s) {
          return el('a', { href: '#rollout/' + gid + '/' + cell.i + '/' + s, title: 'step ' + s }, 's' + s);
        })));
        cell.td.title = (v.ev || v.just || '').slice(0, 500);
      });
    });
  }

  // One cell per step of a rollout, coloured by the verdicts that cite it, linking to the step.
  function stepMap(gid, i, roll) {
    return el('span', { class: 'stepmap' }, roll.steps.map(function (s, j) {
      var p = 0, f = 0;
      roll.verdicts.forEach(function (v) { if (v.cite.indexOf(j + 1) >= 0) { if (v.s === 1) p++; else if (v.s === -1) f++; } });
      var cls = p && f ? 'both' : p ? 'pass' : f ? 'fail' : 'none';
      var a = roll.adv[j];
      return el('a', { class: 'stepcell ' + cls, href: '#rollout/' + gid + '/' + i + '/' + (j + 1),
        title: 'step ' + (j + 1) + ': ' + p + ' PASS, ' + f + ' FAIL citing it; ' + s.n + ' tokens' +
          (a === undefined || a === null ? '' : '; a_j = ' + signed(a, 3)), onclick: function (e) { e.stopPropagation(); } });
    }));
  }

  function advBar(a) {
    var w = Math.min(Math.abs(a) / 2.5, 1) * 50;
    return el('span', { class: 'adv', title: 'A_i = ' + signed(a, 3) }, el('span', { class: 'label' }, signed(a)),
      el('span', { class: 'advbar' },
        el('span', { class: 'fill ' + (a >= 0 ? 'pos' : 'neg'), style: (a >= 0 ? 'left:50%;' : 'right:50%;') + 'width:' + w.toFixed(1) + '%' })));
  }

  function folded(label, text, limit) {
    var long = text.length > limit || text.split('\n').length > 12;
    if (!long) return el('div', { class: 'block' }, el('div', { class: 'block-label' }, label), el('pre', null, text));
    var det = el('details', { class: 'block' }, el('summary', null, label + ' (' + text.length + ' characters, ' + text.split('\n').length + ' lines)'),
      el('pre', null, text));
    return det;
  }

  // -- the rollout view ----------------------------------------------------------------------

  function rolloutView(main, gid, i, token, focusStep) {
    var g = GROUPS[gid], r = g.roll[i];
    if (!r) { main.appendChild(el('p', null, 'No such rollout.')); return; }
    main.appendChild(navLinks(i > 0 ? '#rollout/' + gid + '/' + (i - 1) : null, i < g.roll.length - 1 ? '#rollout/' + gid + '/' + (i + 1) : null,
      '#group/' + gid, 'its group'));
    main.appendChild(el('h2', null, 'Rollout #' + (i + 1) + ' of ' + g.roll.length + ' · iteration ' + g.it + ' · task ', el('code', null, g.task)));
    main.appendChild(el('div', { class: 'stats' },
      stat('R_i (judge reward)', signed(r.R, 3)), stat('A_i (group-normalised)', signed(r.A, 3)),
      stat('pass / fail', r.p + ' / ' + r.f), stat('env', okText(r.ok)), stat('termination', r.term),
      stat('steps', String(r.ns)), stat('tokens', String(r.tok))));
    var body = el('div', null, el('p', { class: 'loading' }, 'Loading the steps…'));
    main.appendChild(body);
    return loadDetail(gid).then(function (d) {
      if (token !== renderToken) return;
      clear(body);
      var roll = d.rollouts[i];
      var envMetrics = Object.keys(roll.metrics).map(function (k) { return k + '=' + JSON.stringify(roll.metrics[k]); });
      if (envMetrics.length) body.appendChild(el('p', { class: 'env-metrics' }, el('span', { class: 'block-label' }, 'environment metrics '), envMetrics.join(' · ')));
      body.appendChild(el('p', { class: 'source', id: 'full-record' }, 'Full record: ',
        INDEX.files.rollouts_href ? el('a', { href: INDEX.files.rollouts_href, title: 'the whole file, next to this report' }, INDEX.files.rollouts) : INDEX.files.rollouts,
        ' line ' + roll.line + ' (sed -n ' + roll.line + 'p ' + INDEX.files.rollouts + ' | python -m json.tool); capped text in the steps below points there too'));
      body.appendChild(verdictTable(g, gid, i, roll));
      body.appendChild(creditLegend(r, roll));
      var steps = el('section', { class: 'steps', id: 'steps' });
      var scale = creditScale(r, roll);
      roll.steps.forEach(function (s, j) { steps.appendChild(stepCard(g, r, roll, s, j, scale)); });
      if (!roll.steps.length) steps.appendChild(el('p', { class: 'empty' }, 'The agent took no steps.'));
      steps.appendChild(el('div', { class: 'ended' }, 'Episode ended: ' + r.term));
      body.appendChild(steps);
      if (focusStep) {
        var target = document.getElementById('step-' + focusStep);
        if (target) { target.classList.add('focus'); target.scrollIntoView(); }
      }
    });
  }

  function stat(label, value) { return el('div', { class: 'stat' }, el('div', { class: 'v' }, value), el('div', { class: 'l' }, label)); }

  function verdictTable(g, gid, i, roll) {
    var rows = roll.verdicts.map(function (v) {
      var c = g.crit[v.c];
      return el('tr', { class: 'verdict-row ' + VCLASS[v.s] },
        el('td', { class: 'crit' }, c[0]), el('td', null, origin(c[1])),
        el('td', null, el('span', { class: 'vchip ' + VCLASS[v.s] }, VERDICT[v.s])),
        el('td', null, v.cite.map(function (s) { return el('a', { href: '#rollout/' + gid + '/' + i + '/' + s, class: 'cite' }, 'step ' + s); })),
        el('td', null, v.ev || v.just ? el('details', null, el('summary', null, 'evidence'),
          v.ev ? el('p', { class: 'evidence' }, v.ev) : null, v.just ? el('p', { class: 'justification' }, v.just) : null) : ''));
    });
    return el('section', { class: 'card' }, el('h3', null, 'Verdicts (' + roll.verdicts.length + ')'),
      rows.length ? el('table', { class: 'verdicts' }, el('thead', null, el('tr', null, ['criterion', 'origin', 'verdict', 'cites', ''].map(function (h) { return el('th', null, h); }))), el('tbody', null, rows))
        : el('p', { class: 'empty' }, 'No verdicts were saved for this rollout.'));
  }

  function creditScale(r, roll) {
    var perToken = Math.abs(r.A), push = 0;
    roll.steps.forEach(function (s, j) {
      var a = roll.adv[j];
      if (a === undefined || a === null) return;
      perToken = Math.max(perToken, Math.abs(a));
      push = Math.max(push, Math.abs(a * s.n), Math.abs(r.A * s.n));
    });
    return { perToken: perToken || 1, push: push || 1 };
  }

  function creditLegend(r, roll) {
    if (!roll.adv.length) return el('p', { class: 'card empty' }, 'No step credit was saved for this rollout (step_advantages is empty).');
    var total = 0, n = 0;
    roll.steps.forEach(function (s, j) { total += (roll.adv[j] || 0) * s.n; n += s.n; });
    return el('div', { class: 'card legend-box' },
      el('strong', null, 'Step credit. '),
      'Each step shows its per-token advantage a_j and its total push n_j·a_j (tokens × advantage) as bars; ',
      el('span', { class: 'base-swatch' }), ' marks the uniform GRPO baseline (every token gets A_i = ' + signed(r.A, 3) + '). ',
      'Total push over the rollout: ' + signed(total, 1) + ' (uniform: ' + signed(r.A * n, 1) + ', over ' + n + ' step tokens).');
  }

  function creditBars(r, roll, s, j, scale) {
    var a = roll.adv[j];
    if (a === undefined || a === null) return el('div', { class: 'credit empty' }, 'no credit');
    var bar = function (label, value, baseline, max) {
      var w = Math.min(Math.abs(value) / max, 1) * 50, b = 50 + Math.max(Math.min(baseline / max, 1), -1) * 50;
      return el('div', { class: 'cbar', title: label + ' ' + signed(value, 3) + ' (uniform ' + signed(baseline, 3) + ')' },
        el('div', { class: 'cbar-label' }, label, el('span', { class: 'cbar-value' }, signed(value, value * value < 1e4 ? 3 : 1))),
        el('div', { class: 'track' },
          el('span', { class: 'fill ' + (value >= 0 ? 'pos' : 'neg'), style: (value >= 0 ? 'left:50%;' : 'right:50%;') + 'width:' + w.toFixed(1) + '%' }),
          el('span', { class: 'baseline', style: 'left:' + b.toFixed(1) + '%' })));
    };
    return el('div', { class: 'credit' }, bar('per token a_j', a, r.A, scale.perToken), bar('push n_j·a_j', a * s.n, r.A * s.n, scale.push),
      el('div', { class: 'ntok' }, s.n + ' tokens'));
  }

  function stepCard(g, r, roll, s, j, scale) {
    var index = j + 1;
    var citing = roll.verdicts.filter(function (v) { return v.cite.indexOf(index) >= 0; });
    var marks = s.marks.map(function (m) { return el('span', { class: 'mark truncated', title: m }, '✂ ' + m); });
    var card = el('article', { class: 'step' + (s.code === null ? ' closing' : ''), id: 'step-' + index },
      el('div', { class: 'step-head' }, el('span', { class: 'step-n' }, 'Step ' + index),
        s.code === null ? el('span', { class: 'tag' }, 'no code: ' + (s.nocode || 'closing message') + ', keeps A_i') : null, marks),
      el('div', { class: 'step-body' },
        el('div', { class: 'step-main' },
          folded('message', s.text, 1500),
          s.code !== null ? el('div', { class: 'block' }, el('div', { class: 'block-label' }, 'code'), el('pre', { class: 'code' }, s.code)) : null,
          s.obs ? folded('observation', s.obs, 400) : el('div', { class: 'block empty' }, 'no observation'),
          citing.length ? el('div', { class: 'citing' }, el('div', { class: 'block-label' }, 'cited by'),
            citing.map(function (v) {
              return el('details', { class: 'vcite ' + VCLASS[v.s] },
                el('summary', null, el('span', { class: 'vchip ' + VCLASS[v.s] }, VERDICT[v.s]), ' ', el('span', { class: 'crit' }, g.crit[v.c][0])),
                v.ev ? el('p', { class: 'evidence' }, v.ev) : el('p', { class: 'evidence empty' }, 'no evidence given'),
                v.just ? el('p', { class: 'justification' }, v.just) : null);
            })) : el('div', { class: 'citing none' }, 'no verdict cites this step')),
        creditBars(r, roll, s, j, scale)));
    return card;
  }

  window.addEventListener('hashchange', render);
  render();
  document.body.setAttribute('data-ready', '1');
})();
