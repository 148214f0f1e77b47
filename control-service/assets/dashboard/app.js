// The operator's console of the control service: polls its public JSON (`/v1/stats`, `/v1/zones`,
// `/v1/zones/{zone}/hosts`), draws every zone's hosts on a canvas (one cell per host: its fill as
// the cell's filled height, its lifetime class or LAVA state as the colour and as a digit), charts
// the figures over time (the service's timeline, `/v1/stats/history`, then its own samples), and
// asks the zone's allocator why a clicked host would not take a VM (`POST /v1/zones/{zone}/explain`).
// No framework, no build step.
//
// For tests and measurements, `window.lavaDashboard` exposes the state: `ready`, `firstRenderMs`,
// `updates`, `lastUpdate` ({fetchMs, renderMs, totalMs}), `zones[zone]` ({hosts, vms,
// hostsReported, and `error` while its allocator does not answer}), `refresh()`,
// `cellCenter(zone, hostId)` and `hostOfVm(zone, vmId)`.
'use strict';

(() => {
  const params = new URLSearchParams(location.search);
  const POLL_MS = Math.min(Math.max(Number(params.get('poll')) || 2000, 250), 600000);
  const HISTORY_SAMPLES = 1800;
  const HOST_PAGE = 10000;
  // Okabe-Ito: lifetime classes 0 (shortest) to 5.
  const CLASS_COLOURS = ['#56B4E9', '#E69F00', '#009E73', '#0072B2', '#D55E00', '#CC79A7'];
  const LAVA_COLOURS = { empty: '#e4e8ec', open: '#E69F00', recycling: '#0072B2' };
  const EMPTY = '#e4e8ec';
  const INK = '#1d2329';
  // A sequential scale readable with colour vision deficiencies (cividis' ends and middle).
  const FILL_SCALE = [[0, [0, 34, 78]], [0.5, [124, 123, 120]], [1, [253, 234, 69]]];

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (name === 'class') node.className = value;
      else if (name === 'style') node.style.cssText = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) node.append(child instanceof Node ? child : String(child));
    return node;
  };

  const view = {
    key: sessionStorage.getItem('lava-operator-key') || '',
    colourBy: ['class', 'lava', 'fill'].includes(params.get('colour')) ? params.get('colour') : 'class',
    paused: false,
    zoneList: null,
    zones: new Map(), // zone -> {hosts, byId, vmHost, layout, canvas, ...}
    stats: null,
    history: [],
    selected: null, // {zone, hostId}
    hover: null,
    detailCache: new Map(),
  };

  const api = {
    ready: false,
    firstRenderMs: null,
    updates: 0,
    lastUpdate: null,
    zones: {},
    refresh,
    cellCenter,
    hostOfVm,
  };
  window.lavaDashboard = api;

  // ---------------------------------------------------------------- fetching

  class HttpError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
      this.status = status;
    }
  }

  async function request(path, options = {}) {
    const headers = Object.assign({ Accept: 'application/json' }, options.headers || {});
    if (view.key) headers.Authorization = `Bearer ${view.key}`;
    const response = await fetch(path, Object.assign({}, options, { headers }));
    let body = null;
    const text = await response.text();
    try {
      body = text ? JSON.parse(text) : null;
    } catch (error) {
      body = null;
    }
    if (response.status === 401 || response.status === 403) $('key-form').hidden = false;
    if (!response.ok) throw new HttpError(response.status, body);
    return body;
  }

  async function fetchHosts(zone) {
    const hosts = [];
    let total = Infinity;
    while (hosts.length < total) {
      const page = await request(`/v1/zones/${encodeURIComponent(zone)}/hosts?limit=${HOST_PAGE}&offset=${hosts.length}`);
      total = page.total;
      if (!page.hosts.length) break;
      for (const host of page.hosts) hosts.push(host);
    }
    return { hosts, total: Number.isFinite(total) ? total : hosts.length };
  }

  /** The zone's consolidation where it is on (the allocator answers 404 where it is off: null). */
  function fetchConsolidation(zone) {
    return request(`/v1/zones/${encodeURIComponent(zone)}/consolidation`)
      .catch((error) => (error.status === 404 ? null : { error: error.message }));
  }

  // ---------------------------------------------------------------- update cycle

  let running = null;

  /** One full cycle: fetch everything, then draw it. Cycles never overlap; a caller that arrives
   *  during one waits for it and then runs its own, so what it sees is fetched after it asked. */
  async function refresh() {
    while (running) {
      try {
        await running;
      } catch (error) {
        // That cycle's error was shown; this one tries again.
      }
    }
    running = update();
    try {
      return await running;
    } finally {
      running = null;
    }
  }

  async function update() {
    const started = performance.now();
    try {
      const first = !view.zoneList;
      view.zoneList = await request('/v1/zones');
      if (first) await loadHistory();
      const names = view.zoneList.zones.map((z) => z.zone);
      const [stats, ...pages] = await Promise.all([
        request('/v1/stats'),
        // A zone whose allocator does not answer keeps its last grid, marked stale; the others
        // go on updating.
        ...names.map((zone) => fetchHosts(zone).catch((error) => ({ error }))),
        ...names.map(fetchConsolidation),
      ]);
      const consolidations = pages.splice(names.length);
      const fetched = performance.now();
      view.stats = stats;
      names.forEach((zone, i) => absorbZone(zone, pages[i], consolidations[i]));
      record(stats);
      render();
      const done = performance.now();
      api.lastUpdate = { fetchMs: fetched - started, renderMs: done - fetched, totalMs: done - started };
      api.updates += 1;
      if (!api.ready) {
        api.firstRenderMs = done;
        api.ready = true;
      }
      $('error').hidden = true;
      $('updated').textContent = `updated ${new Date().toLocaleTimeString()} (${Math.round(done - started)} ms)`;
      return api.lastUpdate;
    } catch (error) {
      $('error').textContent = `Could not update: ${error.message}`;
      $('error').hidden = false;
      throw error;
    }
  }

  function absorbZone(zone, page, consolidation) {
    let z = view.zones.get(zone);
    if (!z) {
      z = { zone, hosts: [], byId: new Map(), layout: null, total: 0 };
      view.zones.set(zone, z);
      api.zones[zone] = { hosts: 0, vms: 0, hostsReported: 0 };
    }
    z.consolidationReport = consolidation;
    if (page.error) {
      z.error = page.error.message;
      api.zones[zone].error = z.error;
      return;
    }
    z.error = null;
    z.hosts = page.hosts;
    z.total = page.total;
    z.byId = new Map();
    let vms = 0;
    page.hosts.forEach((host, i) => {
      z.byId.set(host.host_id, i);
      vms += host.vm_count;
    });
    api.zones[zone] = { hosts: page.hosts.length, vms, hostsReported: page.total, consolidation: consolidationState(consolidation) };
    view.detailCache.clear();
  }

  /** What the page shows of a zone's consolidation, for `window.lavaDashboard` (null: off). */
  function consolidationState(c) {
    if (!c || c.error) return c ? { error: c.error } : null;
    return {
      chooser: c.config.chooser, paused: c.paused, budget: c.budget,
      beingEmptied: c.hosts.map((h) => h.host), inFlight: c.in_flight.length,
      started: c.counters.migrations_started, completed: c.counters.migrations_completed,
      wasted: c.counters.wasted, emptied: c.counters.hosts_emptied,
    };
  }

  /** The control service's own timeline, so the charts start with the last hour rather than
   *  empty; without one (disabled), they start now. */
  async function loadHistory() {
    try {
      const history = await request('/v1/stats/history');
      for (const s of history.samples) {
        const zones = {};
        for (const [zone, z] of Object.entries(s.zones)) zones[zone] = { density: z.packing_density, empty: z.empty_hosts_pct };
        view.history.push({ t: s.at_s, requests: s.requests, placed: s.placed, rejected: s.rejected, failed: s.failed, zones });
      }
    } catch (error) {
      // The charts start with this page's own samples.
    }
  }

  /** Keeps one sample per update for the charts: counters as they are (rates come from
   *  differences), gauges per zone. */
  function record(stats) {
    const sample = {
      t: Date.now() / 1000,
      requests: stats.requests,
      placed: stats.placed,
      rejected: stats.rejected,
      failed: stats.failed,
      zones: {},
    };
    for (const [zone, z] of Object.entries(stats.zones || {})) {
      if (z.stats) sample.zones[zone] = { density: z.stats.packing_density, empty: z.stats.empty_hosts_pct };
    }
    view.history.push(sample);
    if (view.history.length > HISTORY_SAMPLES) view.history.splice(0, view.history.length - HISTORY_SAMPLES);
  }

  // ---------------------------------------------------------------- rendering

  function render() {
    renderServices();
    renderTiles();
    for (const z of view.zones.values()) renderZone(z);
    renderPackingChart();
    renderRateChart();
    renderSources();
    renderQuality();
  }

  const fmt = {
    int: (n) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en') : '-'),
    pct: (x, digits = 1) => (Number.isFinite(x) ? `${(100 * x).toFixed(digits)}%` : '-'),
    num: (x, digits = 3) => (Number.isFinite(x) ? x.toFixed(digits) : '-'),
    duration(s) {
      if (!Number.isFinite(s)) return '-';
      const a = Math.abs(s);
      const text = a < 90 ? `${Math.round(a)} s` : a < 5400 ? `${Math.round(a / 60)} min`
        : a < 172800 ? `${(a / 3600).toFixed(1)} h` : `${(a / 86400).toFixed(1)} d`;
      return s < 0 ? `-${text}` : text;
    },
    // Allocator times are Unix seconds in a live system, trace seconds in a replay.
    time(s) {
      if (!Number.isFinite(s)) return '-';
      if (s > 1e9) return new Date(s * 1000).toLocaleString();
      return `t = ${fmt.duration(s)}`;
    },
  };

  function renderServices() {
    const list = $('services');
    list.replaceChildren();
    const stats = view.stats;
    for (const server of stats.inference_servers || []) {
      list.append(el('li', { class: `badge ${server.healthy ? 'ok' : 'down'}`, title: server.url }, `inference ${shortUrl(server.url)}`));
    }
    for (const zone of view.zoneList.zones) {
      for (const agent of zone.agents) {
        list.append(el('li', { class: `badge ${agent.ready ? 'ok' : 'down'}`, title: agent.url }, `${zone.zone} allocator ${shortUrl(agent.url)}`));
      }
    }
    if (stats.safeguard && stats.safeguard.active) {
      list.append(el('li', { class: 'badge warn' }, `safeguard on (${fmt.duration(stats.safeguard.cooldown_remaining_s)} left)`));
    }
    const quality = stats.quality;
    if (quality && quality.gate_enabled) {
      list.append(el('li', { class: `badge ${quality.gated ? 'warn' : 'ok'}`, title: quality.reason || '' },
        quality.gated ? 'quality gate closed' : 'quality gate open'));
    }
  }

  function shortUrl(url) {
    return url.replace(/^https?:\/\//, '');
  }

  function rate(field) {
    const h = view.history;
    if (h.length < 2) return NaN;
    const a = h[h.length - 2];
    const b = h[h.length - 1];
    return (b[field] - a[field]) / Math.max(b.t - a.t, 1e-3);
  }

  function renderTiles() {
    const stats = view.stats;
    let vms = 0;
    let hosts = 0;
    let empty = 0;
    let cores = 0;
    let capacity = 0;
    for (const z of Object.values(stats.zones || {})) {
      if (!z.stats) continue;
      vms += z.stats.vms;
      hosts += z.stats.hosts;
      empty += z.stats.empty_hosts;
      cores += z.stats.allocated_cores;
      capacity += z.stats.capacity_cores;
    }
    const tiles = [
      ['Requests / s', Number.isFinite(rate('requests')) ? rate('requests').toFixed(1) : '-'],
      ['Placed', fmt.int(stats.placed)],
      ['Rejected', fmt.int(stats.rejected)],
      ['Failed', fmt.int(stats.failed)],
      ['VMs running', fmt.int(vms)],
      ['Hosts (empty)', `${fmt.int(hosts)} (${fmt.int(empty)})`],
      ['Cores allocated', capacity ? fmt.pct(cores / capacity) : '-'],
      ['Cache hit rate', fmt.pct(stats.cache ? stats.cache.hit_rate : NaN)],
    ];
    $('tiles').replaceChildren(...tiles.map(([label, value]) =>
      el('div', { class: 'tile' }, el('div', { class: 'value' }, value), el('div', { class: 'label' }, label))));
  }

  function zoneSection(z) {
    if (z.section) return z.section;
    const canvas = el('canvas', { class: 'host-grid', 'data-zone': z.zone, tabindex: '0',
      'aria-label': `Hosts of zone ${z.zone}: arrow keys select a host (its details in the Host panel), Enter asks why a VM would not go there` });
    const figures = el('span', { class: 'figures' });
    const legend = el('div', { class: 'legend' });
    const wrap = el('div', { class: 'grid-wrap' }, canvas);
    const consolidationLine = el('div', { class: 'consolidation' });
    const section = el('section', { class: 'zone', id: `zone-${z.zone}` },
      el('div', { class: 'zone-head' }, el('h2', {}, `Zone ${z.zone}`), figures), consolidationLine, legend, wrap);
    $('zones').append(section);
    Object.assign(z, { section, canvas, figures, consolidationLine, legend, wrap });
    canvas.addEventListener('mousemove', (event) => onHover(z, event));
    canvas.addEventListener('mouseleave', () => hideTooltip());
    canvas.addEventListener('click', (event) => {
      const host = hostAtEvent(z, event);
      if (host) selectHost(z, host);
    });
    // Without a mouse: the arrows move the selection over the grid, Enter asks why not.
    canvas.addEventListener('keydown', (event) => {
      if (!z.layout || !z.hosts.length) return;
      const moves = { ArrowLeft: -1, ArrowRight: 1, ArrowUp: -z.layout.columns, ArrowDown: z.layout.columns };
      const explain = event.key === 'Enter' || event.key === ' ';
      if (!(event.key in moves) && !explain) return;
      event.preventDefault();
      const current = view.selected && view.selected.zone === z.zone ? z.byId.get(view.selected.hostId) : undefined;
      if (explain) {
        if (current !== undefined) selectHost(z, z.hosts[current]);
        return;
      }
      const next = current === undefined ? 0 : Math.min(Math.max(current + moves[event.key], 0), z.hosts.length - 1);
      view.selected = { zone: z.zone, hostId: z.hosts[next].host_id };
      renderZone(z);
      showHostPanel(z, z.hosts[next]);
    });
    return section;
  }

  /** Cells get smaller as the zone grows, so that 10,000 hosts fit on a laptop screen. */
  function layoutFor(z) {
    const n = z.hosts.length;
    const width = Math.max(z.wrap.clientWidth - 2, 200);
    const cell = n <= 64 ? 28 : n <= 400 ? 20 : n <= 1500 ? 14 : n <= 5000 ? 9 : 7;
    const gap = cell >= 9 ? 2 : 1;
    const columns = Math.max(1, Math.floor((width + gap) / cell));
    const rows = Math.ceil(n / columns);
    return { cell, gap, columns, rows, width: columns * cell, height: Math.max(rows * cell, cell) };
  }

  function fillOf(host) {
    const used = host.used || {};
    const capacity = host.capacity || {};
    let fill = 0;
    for (const kind of ['cores', 'memory_gib']) {
      if (capacity[kind] > 0) fill = Math.max(fill, (used[kind] || 0) / capacity[kind]);
    }
    return Math.min(fill, 1);
  }

  function lavaOf(host) {
    return host.policy_state && host.policy_state.policy === 'lava' ? host.policy_state.state : null;
  }

  function scaleColour(x) {
    for (let i = 1; i < FILL_SCALE.length; i += 1) {
      const [x1, c1] = FILL_SCALE[i];
      const [x0, c0] = FILL_SCALE[i - 1];
      if (x <= x1) {
        const f = (x - x0) / (x1 - x0);
        return `rgb(${c0.map((c, k) => Math.round(c + f * (c1[k] - c))).join(',')})`;
      }
    }
    return 'rgb(253,234,69)';
  }

  /** The colour and the digit of a host's filled part under the chosen colouring. */
  function paintOf(host) {
    if (view.colourBy === 'fill') return { colour: scaleColour(fillOf(host)), digit: null, whole: true };
    if (view.colourBy === 'lava') {
      const lava = lavaOf(host);
      if (!lava) return { colour: CLASS_COLOURS[Math.min(host.lifetime_class, 5)], digit: host.lifetime_class };
      return { colour: LAVA_COLOURS[lava.state] || EMPTY, digit: lava.state === 'empty' ? null : lava.class,
        mark: lava.state === 'recycling' };
    }
    return { colour: CLASS_COLOURS[Math.min(host.lifetime_class, 5)], digit: host.lifetime_class };
  }

  function renderZone(z) {
    zoneSection(z);
    const zs = view.stats.zones && view.stats.zones[z.zone];
    const s = zs && zs.stats;
    const stale = z.error ? `HOSTS AS LAST SEEN, the allocator did not answer (${z.error}) · ` : '';
    z.section.classList.toggle('stale', Boolean(z.error));
    z.figures.textContent = stale + (s
      ? `${s.policy} · ${fmt.int(s.hosts)} hosts (${fmt.int(s.available_hosts)} available, ${fmt.int(s.empty_hosts)} empty) · `
        + `${fmt.int(s.vms)} VMs (${fmt.int(s.vms_long)} long) · packing density ${fmt.pct(s.packing_density)} · `
        + `rejected ${fmt.int(Object.values(s.rejections || {}).reduce((a, b) => a + b, 0))}`
      : `statistics unavailable: ${(zs && zs.error) || 'no answer'}`);
    renderConsolidation(z);
    renderLegend(z);
    const layout = layoutFor(z);
    const ratio = window.devicePixelRatio || 1;
    const canvas = z.canvas;
    if (canvas.width !== Math.round(layout.width * ratio) || canvas.height !== Math.round(layout.height * ratio)) {
      canvas.width = Math.round(layout.width * ratio);
      canvas.height = Math.round(layout.height * ratio);
      canvas.style.width = `${layout.width}px`;
      canvas.style.height = `${layout.height}px`;
    }
    z.layout = layout;
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, layout.width, layout.height);
    const size = layout.cell - layout.gap;
    const digits = size >= 18;
    if (digits) {
      ctx.font = `${Math.round(size * 0.5)}px system-ui, sans-serif`;
      ctx.textAlign = 'center';
      ctx.textBaseline = 'middle';
    }
    // Batch by colour: one path per colour is much cheaper than a fill per cell.
    const batches = new Map();
    const add = (colour, x, y, w, h) => {
      let list = batches.get(colour);
      if (!list) batches.set(colour, (list = []));
      list.push(x, y, w, h);
    };
    const marks = [];
    z.hosts.forEach((host, i) => {
      const x = (i % layout.columns) * layout.cell;
      const y = Math.floor(i / layout.columns) * layout.cell;
      add(EMPTY, x, y, size, size);
      const fill = fillOf(host);
      const paint = paintOf(host);
      if (host.vm_count > 0 || paint.whole) {
        const h = paint.whole ? size : Math.max(1, Math.round(fill * size));
        add(paint.colour, x, y + size - h, size, h);
      }
      if (host.state !== 'available' || (digits && paint.digit !== null && host.vm_count > 0) || paint.mark) {
        marks.push([host, x, y, paint]);
      }
    });
    for (const [colour, list] of batches) {
      ctx.fillStyle = colour;
      ctx.beginPath();
      for (let k = 0; k < list.length; k += 4) ctx.rect(list[k], list[k + 1], list[k + 2], list[k + 3]);
      ctx.fill();
    }
    ctx.lineWidth = 1;
    for (const [host, x, y, paint] of marks) {
      ctx.strokeStyle = INK;
      if (host.state === 'failed') {
        // A cross: failed.
        ctx.beginPath();
        ctx.moveTo(x + 1, y + 1);
        ctx.lineTo(x + size - 1, y + size - 1);
        ctx.moveTo(x + size - 1, y + 1);
        ctx.lineTo(x + 1, y + size - 1);
        ctx.stroke();
      } else if (host.state === 'unavailable') {
        // A dashed frame: drained (or being emptied by consolidation).
        ctx.setLineDash([2, 2]);
        ctx.strokeRect(x + 0.5, y + 0.5, size - 1, size - 1);
        ctx.setLineDash([]);
      }
      if (paint.mark && size >= 5) {
        // A dot: recycling (LAVA), so that the state is not told by colour alone.
        ctx.fillStyle = '#ffffff';
        ctx.fillRect(x + 1, y + 1, Math.max(2, size / 4), Math.max(2, size / 4));
      }
      if (digits && paint.digit !== null && host.vm_count > 0) {
        // A white halo keeps the digit readable on dark fills and on empty space alike.
        ctx.lineWidth = 3;
        ctx.strokeStyle = '#ffffff';
        ctx.strokeText(String(paint.digit), x + size / 2, y + size / 2);
        ctx.fillStyle = INK;
        ctx.fillText(String(paint.digit), x + size / 2, y + size / 2);
        ctx.lineWidth = 1;
      }
    }
    if (view.selected && view.selected.zone === z.zone) {
      const i = z.byId.get(view.selected.hostId);
      if (i !== undefined) {
        ctx.lineWidth = 2;
        ctx.strokeStyle = INK;
        ctx.strokeRect((i % layout.columns) * layout.cell - 1, Math.floor(i / layout.columns) * layout.cell - 1, size + 2, size + 2);
      }
    }
  }

  /** One line on the zone's consolidation: its budget, the hosts being emptied and its
   *  migrations (hidden where it is off). */
  function renderConsolidation(z) {
    const c = z.consolidationReport;
    const line = z.consolidationLine;
    line.hidden = !c;
    if (!c) return;
    if (c.error) {
      line.textContent = `Consolidation: unavailable (${c.error})`;
      return;
    }
    const hosts = c.hosts.map((h) => `${h.host} (${h.queue.length} to move, ${h.moved} moved)`);
    const counters = c.counters;
    line.textContent = `Consolidation${c.paused ? ' (paused)' : ''}: ${c.config.chooser}, `
      + `${fmt.num(c.config.budget_per_host_day, 2)} migrations per host-day · budget ${fmt.num(c.budget, 1)} migrations · `
      + `${fmt.int(c.hosts.length)} hosts being emptied${hosts.length ? `: ${hosts.slice(0, 5).join(', ')}${hosts.length > 5 ? ', ...' : ''}` : ''} · `
      + `${fmt.int(c.in_flight.length)} migrations in flight · spent ${fmt.int(counters.migrations_started)} `
      + `(${fmt.int(counters.migrations_completed)} completed, ${fmt.int(counters.wasted)} wasted) · `
      + `${fmt.int(counters.hosts_emptied)} hosts emptied`;
  }

  function renderLegend(z) {
    const swatch = (colour, label) => el('span', {}, el('span', { class: 'swatch', style: `background:${colour}` }), label);
    const items = [];
    if (view.colourBy === 'fill') {
      items.push(swatch(scaleColour(0), 'empty'), swatch(scaleColour(0.5), 'half full'), swatch(scaleColour(1), 'full'));
    } else if (view.colourBy === 'lava') {
      items.push(swatch(LAVA_COLOURS.empty, 'empty'), swatch(LAVA_COLOURS.open, 'open (digit: class)'),
        swatch(LAVA_COLOURS.recycling, 'recycling (white corner)'));
      items.push(el('span', {}, 'filled height: fill'));
    } else {
      const classes = Math.max(2, ...z.hosts.map((h) => h.lifetime_class + 1));
      for (let c = 0; c < Math.min(classes, 6); c += 1) {
        items.push(swatch(CLASS_COLOURS[c], c === 0 ? 'class 0 (shortest)' : `class ${c}`));
      }
      items.push(el('span', {}, 'filled height: fill (cores or memory)'));
    }
    items.push(el('span', {}, '✖ failed'), el('span', {}, '▭ dashed: drained or being emptied'));
    z.legend.replaceChildren(...items);
  }

  // ---------------------------------------------------------------- hover, click, explain

  function hostIndexAt(z, event) {
    if (!z.layout) return -1;
    const rect = z.canvas.getBoundingClientRect();
    const column = Math.floor((event.clientX - rect.left) / z.layout.cell);
    const row = Math.floor((event.clientY - rect.top) / z.layout.cell);
    if (column < 0 || column >= z.layout.columns || row < 0) return -1;
    const i = row * z.layout.columns + column;
    return i < z.hosts.length ? i : -1;
  }

  function hostAtEvent(z, event) {
    const i = hostIndexAt(z, event);
    return i < 0 ? null : z.hosts[i];
  }

  function hostSummary(host) {
    const lava = lavaOf(host);
    const rows = [
      ['Host', `${host.host_id} (rack ${host.rack_id}, ${host.hardware})`],
      ['State', host.state],
      ['Cores', `${fmt.num(host.used.cores, 0)} of ${fmt.num(host.capacity.cores, 0)}`],
      ['Memory', `${fmt.num(host.used.memory_gib, 0)} of ${fmt.num(host.capacity.memory_gib, 0)} GiB`],
      ['VMs', host.vm_count],
      ['Lifetime class', host.lifetime_class],
      ['Predicted empty', host.predicted_exit_s !== undefined ? fmt.time(host.predicted_exit_s) : host.vm_count ? 'unbounded' : 'now'],
    ];
    if (lava) {
      rows.push(['LAVA', `${lava.state}, class ${lava.class}${lava.deadline_s !== undefined ? `, deadline ${fmt.time(lava.deadline_s)}` : ''}`]);
    }
    return el('table', {}, ...rows.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, v))));
  }

  function vmTable(detail) {
    const vms = detail.vms.slice(0, 12);
    const table = el('table', {}, el('tr', {}, el('th', {}, 'VM'), el('th', {}, 'tenant'), el('th', { class: 'num' }, 'cores'),
      el('th', {}, 'prediction'), el('th', {}, 'predicted exit')));
    for (const vm of vms) {
      const p = vm.prediction;
      const lifetime = p && Number.isFinite(p.expected_lifetime_s) ? p.expected_lifetime_s : null;
      const prediction = p ? `${p.class} (p ${fmt.num(p.p_long, 2)}, ${p.source.replace(/_/g, ' ')})` : 'none';
      const exit = lifetime !== null ? fmt.time(vm.placed_at_s + lifetime) : p && p.class === 'long' ? 'long-lived' : '-';
      table.append(el('tr', {}, el('td', {}, vm.vm_id), el('td', {}, vm.tenant_id), el('td', { class: 'num' }, fmt.num(vm.demand.cores, 0)),
        el('td', {}, prediction), el('td', {}, exit)));
    }
    const more = detail.vms.length - vms.length;
    return more > 0 ? el('div', {}, table, el('p', { class: 'muted' }, `and ${more} more`)) : table;
  }

  async function hostDetail(z, hostId) {
    const key = `${z.zone}/${hostId}`;
    if (!view.detailCache.has(key)) {
      view.detailCache.set(key, request(`/v1/zones/${encodeURIComponent(z.zone)}/hosts/${encodeURIComponent(hostId)}`));
    }
    return view.detailCache.get(key);
  }

  let hoverTimer = null;

  function onHover(z, event) {
    const host = hostAtEvent(z, event);
    const tip = $('tooltip');
    if (!host) {
      hideTooltip();
      return;
    }
    tip.replaceChildren(hostSummary(host));
    tip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(event.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = `${Math.max(x, 4)}px`;
    tip.style.top = `${Math.max(y, 4)}px`;
    if (view.hover === host.host_id) return;
    view.hover = host.host_id;
    clearTimeout(hoverTimer);
    hoverTimer = setTimeout(() => showHostPanel(z, host), 120);
  }

  function hideTooltip() {
    $('tooltip').hidden = true;
    view.hover = null;
  }

  async function showHostPanel(z, host) {
    const panel = $('host');
    const head = el('h2', {}, `Host ${host.host_id}`);
    panel.replaceChildren(head, hostSummary(host));
    if (!host.vm_count) return;
    try {
      const detail = await hostDetail(z, host.host_id);
      if (view.hover !== host.host_id && !(view.selected && view.selected.hostId === host.host_id)) return;
      panel.replaceChildren(head, hostSummary(host), el('h2', {}, 'Its VMs'), vmTable(detail));
    } catch (error) {
      panel.append(el('p', { class: 'muted' }, `VMs unavailable: ${error.message}`));
    }
  }

  function explainVm(zone) {
    const cores = Math.max(1, Number($('x-cores').value) || 1);
    const memory = Math.max(1, Number($('x-memory').value) || 1);
    const long = $('x-lifetime').value === 'long';
    return {
      vm_id: 'dashboard-explain',
      tenant_id: 'dashboard',
      vm_type: 'explain',
      zone,
      demand: { cores, memory_gib: memory },
      prediction: {
        p_long: long ? 0.95 : 0.05,
        class: long ? 'long' : 'short',
        expected_lifetime_s: long ? 4 * 86400 : 1800,
        source: 'model',
      },
    };
  }

  async function selectHost(z, host) {
    view.selected = { zone: z.zone, hostId: host.host_id };
    renderZone(z);
    showHostPanel(z, host);
    await explainSelected();
  }

  async function explainSelected() {
    if (!view.selected) return;
    const { zone, hostId } = view.selected;
    const panel = $('explain');
    const result = $('explain-result');
    panel.setAttribute('data-host', hostId);
    panel.setAttribute('data-state', 'loading');
    try {
      const body = { vm: explainVm(zone), why_not: hostId, top: 5 };
      const answer = await request(`/v1/zones/${encodeURIComponent(zone)}/explain`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
      });
      if (view.selected.hostId !== hostId) return;
      result.replaceChildren(...explanation(answer, hostId));
      panel.setAttribute('data-state', 'done');
    } catch (error) {
      result.replaceChildren(el('p', { class: 'verdict lost' }, `No explanation: ${error.message}`));
      panel.setAttribute('data-state', 'error');
    }
  }

  function explanation(answer, hostId) {
    const verdict = answer.why_not || {};
    const chosen = answer.would_pick === hostId;
    const nodes = [
      el('p', { class: `verdict ${chosen ? 'won' : 'lost'}` },
        chosen ? `${hostId}: the allocator would pick this host.`
          : `${hostId}: ${verdict.explanation || 'not chosen.'}`),
      el('p', {}, answer.would_pick ? `It would pick ${answer.would_pick}` : 'No host would take this VM now',
        ` (VM lifetime class ${answer.lifetime_class}, ${answer.ties} tied at the best score).`),
    ];
    if (verdict.rejected_by) nodes.push(el('p', {}, `Rejected by the rule ${verdict.rejected_by}.`));
    if (verdict.outranked_at) nodes.push(el('p', {}, `Outranked at the preference ${verdict.outranked_at}.`));
    if (answer.top && answer.top.length) {
      const rules = answer.top[0].scores.map((s) => s.rule);
      const table = el('table', {}, el('tr', {}, el('th', {}, 'best hosts'), ...rules.map((r) => el('th', { class: 'num' }, r))));
      const rows = answer.top.slice();
      if (verdict.scores && verdict.scores.length && !rows.some((r) => r.host_id === hostId)) {
        rows.push({ host_id: `${hostId} (this)`, scores: verdict.scores });
      }
      for (const ranked of rows) {
        table.append(el('tr', {}, el('td', {}, ranked.host_id), ...ranked.scores.map((s) => el('td', { class: 'num' }, s.score))));
      }
      nodes.push(table, el('p', { class: 'muted' }, 'Scores per preference rule, in order; lower is better.'));
    }
    return nodes;
  }

  // ---------------------------------------------------------------- charts

  const LINE_STYLES = [
    { colour: '#0072B2', dash: '' },
    { colour: '#D55E00', dash: '6 3' },
    { colour: '#009E73', dash: '2 2' },
    { colour: '#CC79A7', dash: '8 3 2 3' },
    { colour: '#E69F00', dash: '1 3' },
  ];

  function lineChart(svg, legend, series, { yMax, format }) {
    const width = svg.clientWidth || 400;
    const height = svg.clientHeight || 170;
    const pad = { left: 40, right: 8, top: 6, bottom: 18 };
    svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
    const ns = 'http://www.w3.org/2000/svg';
    const node = (tag, attrs) => {
      const n = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
      return n;
    };
    const points = series.flatMap((s) => s.points);
    const t0 = points.length ? Math.min(...points.map((p) => p[0])) : 0;
    const t1 = points.length ? Math.max(...points.map((p) => p[0])) : 1;
    const top = yMax !== undefined ? yMax : Math.max(1, ...points.map((p) => p[1]) ) * 1.1;
    const x = (t) => pad.left + ((t - t0) / Math.max(t1 - t0, 1)) * (width - pad.left - pad.right);
    const y = (v) => height - pad.bottom - (v / top) * (height - pad.top - pad.bottom);
    const children = [];
    for (const f of [0, 0.5, 1]) {
      children.push(node('line', { class: 'axis', x1: pad.left, x2: width - pad.right, y1: y(f * top), y2: y(f * top) }));
      const label = node('text', { x: pad.left - 4, y: y(f * top) + 3, 'text-anchor': 'end' });
      label.textContent = format(f * top);
      children.push(label);
    }
    const span = node('text', { x: width - pad.right, y: height - 4, 'text-anchor': 'end' });
    span.textContent = points.length ? `last ${fmt.duration(t1 - t0)}` : 'waiting for data';
    children.push(span);
    series.forEach((s, i) => {
      if (!s.points.length) return;
      const style = LINE_STYLES[i % LINE_STYLES.length];
      const d = s.points.map((p, k) => `${k ? 'L' : 'M'}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join('');
      children.push(node('path', { d, fill: 'none', stroke: style.colour, 'stroke-width': 2, 'stroke-dasharray': style.dash }));
    });
    svg.replaceChildren(...children);
    legend.replaceChildren(...series.map((s, i) => {
      const style = LINE_STYLES[i % LINE_STYLES.length];
      const last = s.points.length ? format(s.points[s.points.length - 1][1]) : '-';
      return el('span', {}, el('span', { class: 'line-key', style: `border-top:3px ${style.dash ? 'dashed' : 'solid'} ${style.colour}` }),
        `${s.name}: ${last}`);
    }));
  }

  function renderPackingChart() {
    const series = [];
    for (const zone of view.zones.keys()) {
      series.push({ name: `${zone} density`, points: view.history.filter((h) => h.zones[zone]).map((h) => [h.t, 100 * h.zones[zone].density]) });
      series.push({ name: `${zone} empty hosts`, points: view.history.filter((h) => h.zones[zone]).map((h) => [h.t, h.zones[zone].empty]) });
    }
    lineChart($('chart-packing'), $('legend-packing'), series, { yMax: 100, format: (v) => `${v.toFixed(0)}%` });
  }

  function renderRateChart() {
    const rates = (field) => {
      const points = [];
      for (let i = 1; i < view.history.length; i += 1) {
        const a = view.history[i - 1];
        const b = view.history[i];
        points.push([b.t, Math.max(0, (b[field] - a[field]) / Math.max(b.t - a.t, 1e-3))]);
      }
      return points;
    };
    lineChart($('chart-rate'), $('legend-rate'),
      [{ name: 'placed', points: rates('placed') }, { name: 'rejected', points: rates('rejected') }, { name: 'failed', points: rates('failed') }],
      { format: (v) => (v >= 10 ? v.toFixed(0) : v.toFixed(1)) });
  }

  function renderSources() {
    const counts = Object.entries(view.stats.predictions_by_source || {});
    const total = counts.reduce((a, [, n]) => a + n, 0);
    if (!total) {
      $('sources').replaceChildren(el('p', { class: 'muted' }, 'No predictions yet.'));
      return;
    }
    counts.sort((a, b) => b[1] - a[1]);
    const rows = counts.map(([source, n]) => {
      const fallback = source !== 'model' && source !== 'cache';
      return el('div', { class: 'hbar' }, el('span', {}, `${source.replace(/_/g, ' ')}${fallback ? ' (short)' : ''}`),
        el('div', { class: 'track' }, el('div', { class: `fill${fallback ? ' fallback' : ''}`, style: `width:${(100 * n) / total}%` })),
        el('span', { class: 'num' }, `${fmt.int(n)} (${fmt.pct(n / total)})`));
    });
    const safeguard = view.stats.safeguard || {};
    rows.push(el('p', { class: 'muted' },
      `Safeguard: ${safeguard.active ? 'ON' : 'off'}, tripped ${fmt.int(safeguard.trips)} times; long-lived share ${fmt.pct(safeguard.long_share)} `
      + `of ${fmt.int(safeguard.window_predictions)} recent model predictions.`));
    $('sources').replaceChildren(...rows);
  }

  function renderQuality() {
    const q = view.stats.quality;
    if (!q || !q.versions || !q.versions.length) {
      $('quality').replaceChildren(el('p', { class: 'muted' }, 'No resolved outcomes yet: quality appears as VMs exit or outlive the long-lived threshold.'));
      return;
    }
    const table = el('table', {}, el('tr', {}, ...['version', 'role', 'resolved', 'ROC AUC', 'AP', 'precision', 'recall', 'long: real / predicted']
      .map((h, i) => el('th', { class: i >= 2 ? 'num' : '' }, h))));
    for (const v of q.versions) {
      const f = v.figures;
      const role = v.version === q.stable_version ? 'stable' : v.version === q.canary_version ? 'canary' : '';
      table.append(el('tr', {}, el('td', {}, v.version), el('td', {}, role), el('td', { class: 'num' }, fmt.int(f.resolved)),
        el('td', { class: 'num' }, fmt.num(f.roc_auc)), el('td', { class: 'num' }, fmt.num(f.average_precision)),
        el('td', { class: 'num' }, fmt.num(f.precision)), el('td', { class: 'num' }, fmt.num(f.recall)),
        el('td', { class: 'num' }, `${fmt.pct(f.realized_long_share, 0)} / ${fmt.pct(f.predicted_long_share, 0)}`)));
    }
    const nodes = [table];
    if (q.gate_enabled) {
      nodes.push(el('p', {}, q.gated ? `Quality gate CLOSED: ${q.reason || ''}` : 'Quality gate open.',
        ` Trips ${fmt.int(q.trips)}, recoveries ${fmt.int(q.recoveries)}.`));
    }
    if (q.last_canary_decision) {
      const d = q.last_canary_decision;
      nodes.push(el('p', { class: 'muted' },
        `Last canary decision: ${d.verdict} ${d.canary_version} against ${d.stable_version} (AP ${fmt.num(d.canary_average_precision)} `
        + `vs ${fmt.num(d.stable_average_precision)}, standard error ${fmt.num(d.standard_error)}, ${fmt.int(d.canary_resolved)} / `
        + `${fmt.int(d.stable_resolved)} resolved)${d.applied ? '' : `, not applied: ${d.detail || ''}`}.`));
    }
    $('quality').replaceChildren(...nodes);
  }

  // ---------------------------------------------------------------- test hooks

  function cellCenter(zone, hostId) {
    const z = view.zones.get(zone);
    if (!z || !z.layout) return null;
    const i = z.byId.get(hostId);
    if (i === undefined) return null;
    const size = z.layout.cell - z.layout.gap;
    const cx = (i % z.layout.columns) * z.layout.cell + size / 2;
    const cy = Math.floor(i / z.layout.columns) * z.layout.cell + size / 2;
    let rect = z.canvas.getBoundingClientRect();
    if (rect.top + cy < 60 || rect.top + cy > window.innerHeight - 10) {
      window.scrollTo(0, window.scrollY + rect.top + cy - window.innerHeight / 2);
      z.wrap.scrollTop = Math.max(0, cy - z.wrap.clientHeight / 2);
      rect = z.canvas.getBoundingClientRect();
    }
    return { x: rect.left + cx, y: rect.top + cy };
  }

  function hostOfVm(zone, vmId) {
    const z = view.zones.get(zone);
    const host = z && z.hosts.find((h) => h.vms.includes(vmId));
    return host ? host.host_id : null;
  }

  // ---------------------------------------------------------------- start

  function start() {
    $('poll').textContent = fmt.duration(POLL_MS / 1000);
    $('colour-by').value = view.colourBy;
    $('colour-by').addEventListener('change', (event) => {
      view.colourBy = event.target.value;
      for (const z of view.zones.values()) renderZone(z);
    });
    $('pause').addEventListener('click', (event) => {
      view.paused = !view.paused;
      event.target.setAttribute('aria-pressed', String(view.paused));
      event.target.textContent = view.paused ? 'Resume' : 'Pause';
    });
    $('key-form').addEventListener('submit', (event) => {
      event.preventDefault();
      view.key = $('key').value.trim();
      sessionStorage.setItem('lava-operator-key', view.key);
      $('key-form').hidden = true;
      refresh().catch(() => {});
    });
    for (const id of ['x-cores', 'x-memory', 'x-lifetime']) $(id).addEventListener('change', () => explainSelected());
    let resizeTimer = null;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => view.stats && render(), 150);
    });
    const loop = async () => {
      if (!view.paused && !document.hidden) await refresh().catch(() => {});
      setTimeout(loop, POLL_MS);
    };
    loop();
  }

  start();
})();
