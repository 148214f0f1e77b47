#!/usr/bin/env python3
"""The soak bench (issue 31; docs/benchmarks.md, "Soak"): the whole stack for a long run at half its
sustainable rate, watching for what only time shows (memory or descriptors that leak, a store that
grows without bound, latency that creeps up).

    python3 scripts/bench/soak.py [--minutes 60] [--warmup-minutes 30] [--swaps 2] [--rate REQUESTS_PER_S]
                                  [--out target/soak]

1. Builds the binaries (release) and trains a second bundle for the model swap (seed 43, about
   25 s) unless it exists in OUT/bundles/swap.
2. Unless --rate is given, finds the sustainable rate: a fresh stack (scripts/stack.sh, SQLite
   store, credentials on, the checked-in configs but a zone of --hosts hosts, its models in
   OUT/models), vmreplay with no rate cap and 8 requests in flight for --probe-vms VMs; the rate is
   allocations plus releases per second.
3. The soak, on a fresh stack: vmreplay of the seeded synthetic trace from the default bundle's
   training cut-off on, at half that rate (each VM allocated, then released at its trace end), for
   --warmup-minutes (not judged: the capped structures fill, the population of running VMs grows
   to its steady state) and then --minutes (judged); meanwhile
   - the dashboard's reads every 2 s (zones, stats, stats history, the zone's host page);
   - the allocator repredicts remaining lifetimes (NILAS, the checked-in policy) as it always does;
   - --swaps model swaps, spread evenly over the judged time (at 25% and 75% of it for two): a
     bundle (the seed-43 one, then the default again, alternately, each under a new name) is copied
     into the models directory and made stable in rollout.toml, which the inference server and the
     allocator follow; 10 s after the inference server serves it, the bundle it replaced is removed
     from the directory (a bundle that stayed referenced would show as a step at every swap);
   - every 10 s: RSS, open file descriptors and CPU time of each service, the allocator's store size
     (SQLite file and WAL), its repredictions counter.
4. Writes OUT/resources.csv, OUT/replay.json (vmreplay's summary, with the client latency per
   minute), OUT/soak.md (the tables and the verdict) and OUT/soak.svg (the plot), and prints soak.md.

Flat means: the level of the last 10 minutes (median of its samples) within 10% of the level of
the first 10 minutes after the warm-up, for each service's RSS; for its descriptors and the
per-minute p99, at most 10% above it (a leak only grows; descriptors are mostly connections in
flight, fewer when the machine is quieter). Standard library
only; the services are the stack's own (scripts/stack.sh), so the figures are the ones a user gets.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STACK_DIR = os.path.join(ROOT, "target", "stack")
BIN = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release")
SERVICES = ["inference-server", "allocator", "control-service"]
CONTROL = "http://127.0.0.1:8080"
INFERENCE = "http://127.0.0.1:8081"
ALLOCATOR = "http://127.0.0.1:8082"
SERVICE_URLS = {"inference-server": INFERENCE, "allocator": ALLOCATOR, "control-service": CONTROL}
# Synthetic VMs per trace day at the generator's defaults (about 10,900): days enough for the run.
VMS_PER_DAY = 10000
SAMPLE_S = 10.0
DASHBOARD_POLL_S = 2.0
FLAT_WINDOW_S = 600.0
FLAT_TOLERANCE = 0.10


def log(message):
    print(f"soak: {message}", file=sys.stderr, flush=True)


def run(args, **kwargs):
    log("$ " + " ".join(args))
    subprocess.run(args, check=True, cwd=ROOT, **kwargs)


def stack(action, out):
    env = dict(os.environ, STACK_MODELS_DIR=os.path.join(out, "models"), STACK_CONFIGS=os.path.join(out, "configs"))
    run(["scripts/stack.sh", *action], env=env)


def prepare_configs(out, hosts, journal_events, retention_days):
    """The checked-in configs, with a zone of `hosts` hosts, the safeguard off and the bounded
    state's caps scaled to the compressed clock. The synthetic trace at its own density keeps about
    45,000 cores busy, half of 2,000 hosts of 48 cores (200, the demo's zone, would turn most
    requests away as full). The caps: every bounded structure must be full within the first
    minutes, or the first 10 minutes' level is that of a structure still filling (measured with the
    defaults: the inference server's history journal of 1,000,000 events took 43 minutes to fill at
    468 requests/s and its RSS rose from 50 to 190 MiB meanwhile, and flat after); the exits the
    allocator keeps expire on the model's clock, which the replay runs 2,000 times faster."""
    configs = os.path.join(out, "configs")
    os.makedirs(configs, exist_ok=True)
    for service in SERVICES:
        with open(os.path.join(ROOT, "configs", f"{service}.toml"), encoding="utf-8") as f:
            text = f.read()
        lines = text.splitlines()
        if service == "allocator":
            at = next(i for i, line in enumerate(lines) if line.startswith("hosts = "))
            lines[at] = f"hosts = {hosts}"
        if service == "control-service":
            # The safeguard counts on the wall clock: a replay that compresses months into an hour
            # trips it at once (every tenant is new for an hour, and the default model calls most
            # new tenants long-lived), and for its 10-minute cooldown the requests skip the model,
            # which would make the first minutes unlike the rest. Off, every request takes the
            # steady path: cache or inference server.
            start = lines.index("[safeguard]")
            at = next(i for i in range(start, len(lines)) if lines[i].startswith("enabled = "))
            lines[at] = "enabled = false"
        if service == "inference-server":
            lines += ["", "[history]", f"max_journal = {journal_events}"]
        if service == "allocator":
            lines += ["", "[export]", f"retention_s = {retention_days * 86400}"]
        text = "\n".join(lines) + "\n"
        with open(os.path.join(configs, f"{service}.toml"), "w", encoding="utf-8") as f:
            f.write(text)


def token():
    with open(os.path.join(STACK_DIR, "service-token"), encoding="utf-8") as f:
        return f.read().strip()


def get(url, headers=None, timeout=10):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def prepare_models(out):
    """OUT/models/default (the checked-in bundle) and OUT/bundles/swap (trained once, seed 43)."""
    models = os.path.join(out, "models")
    shutil.rmtree(models, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "models", "default"), os.path.join(models, "default"))
    swap = os.path.join(out, "bundles", "swap")
    if not os.path.exists(os.path.join(swap, "manifest.json")):
        trace = os.path.join(out, "bundles", "seed43.csv.gz")
        os.makedirs(os.path.dirname(swap), exist_ok=True)
        run([f"{BIN}/vmtrace", "generate", "--out", trace, "--days", "14", "--seed", "43"])
        run([f"{BIN}/lifetime-train", "--train", trace, "--out", swap, "--name", "swap", "--version",
             "swap-1", "--iterations", "100", "--num-leaves", "31", "--max-remaining-vms", "30000"])
    return models, swap


def cutoff_s():
    """The default bundle's training cut-off: the inference server journals only the history events
    after it (to apply again over a newer bundle), so a replay that starts before it would fill the
    journal only once it got there, in the middle of the run."""
    with open(os.path.join(ROOT, "models", "default", "manifest.json"), encoding="utf-8") as f:
        return json.load(f)["training"]["cutoff_s"]


def replay(out, name, vms, rate, concurrency, sample_s):
    """vmreplay of the synthetic trace's first `vms` VMs after the default bundle's cut-off, as fast
    as `rate` (None: no cap) allows."""
    from_s = math.ceil(cutoff_s())
    days = math.ceil(vms / VMS_PER_DAY) + math.ceil(from_s / 86400) + 2
    path = os.path.join(out, f"{name}.json")
    args = [f"{BIN}/vmreplay", "--control", CONTROL, "--synthetic-days", str(days), "--max-vms", str(vms),
            "--from-s", str(from_s),
            "--speed", "1000000", "--concurrency", str(concurrency), "--sample-every-s", str(sample_s),
            "--vm-id-prefix", name, "--json", path]
    if rate is not None:
        args += ["--max-rate", f"{rate:.1f}"]
    with open(os.path.join(out, f"{name}.txt"), "w", encoding="utf-8") as summary:
        run(args, stdout=summary)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def requests_per_s(summary):
    return (summary["requests"]["total"] + summary["releases"]["requests"]) / summary["run"]["wall_s"]


def pids():
    found = {}
    for service in SERVICES:
        with open(os.path.join(STACK_DIR, f"{service}.pid"), encoding="utf-8") as f:
            found[service] = int(f.read().strip())
    return found


def process_sample(pid):
    """RSS (KiB) with its anonymous (heap) and file-backed (mapped files, the binary) parts, open
    descriptors and CPU seconds of a process, from /proc."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        status = {line.split(":")[0]: line.split()[1] for line in f if line.startswith(("VmRSS:", "RssAnon:", "RssFile:"))}
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return int(status["VmRSS"]), int(status.get("RssAnon", 0)), int(status.get("RssFile", 0)), fds, cpu_s


def store_bytes():
    return sum(os.path.getsize(os.path.join(STACK_DIR, name)) for name in os.listdir(STACK_DIR)
               if name.startswith("allocator.db"))


def heap_sample(url):
    """(bytes of the C heap in use, bytes it keeps free) from a service's /metrics
    (service-common's heap gauges), or (None, None) if it did not answer."""
    found = {}
    try:
        for line in get(f"{url}/metrics").decode().splitlines():
            if line.startswith(("process_heap_in_use_bytes ", "process_heap_free_bytes ")):
                name, value = line.split()
                found[name] = int(float(value))
    except OSError:
        pass
    return found.get("process_heap_in_use_bytes"), found.get("process_heap_free_bytes")


def repredictions():
    for line in get(f"{ALLOCATOR}/metrics").decode().splitlines():
        if line.startswith("allocator_repredictions_total"):
            return int(float(line.split()[-1]))
    return None


class Background:
    """The samplers, the dashboard and the swap, each on a thread, until `stop`."""

    def __init__(self, out, warmup_minutes, minutes, swaps, models, bundles):
        self.out, self.models, self.bundles = out, models, bundles
        self.stop = threading.Event()
        self.start = time.monotonic()
        self.swap_at_s = [(warmup_minutes + minutes * (i + 0.5) / swaps) * 60 for i in range(swaps)]
        self.samples, self.dashboard, self.events = [], {"polls": 0, "errors": 0, "seconds": []}, []
        self.pids = pids()
        self.threads = [threading.Thread(target=target, daemon=True)
                        for target in (self.sample_loop, self.dashboard_loop, self.swap_loop)]
        for thread in self.threads:
            thread.start()

    def elapsed(self):
        return time.monotonic() - self.start

    def sample_loop(self):
        while not self.stop.is_set():
            row = {"elapsed_s": round(self.elapsed(), 1), "store_bytes": store_bytes()}
            for service, pid in self.pids.items():
                (row[f"{service}_rss_kib"], row[f"{service}_rss_anon_kib"], row[f"{service}_rss_file_kib"],
                 row[f"{service}_fds"], row[f"{service}_cpu_s"]) = process_sample(pid)
                row[f"{service}_heap_in_use"], row[f"{service}_heap_free"] = heap_sample(SERVICE_URLS[service])
            try:
                row["repredictions"] = repredictions()
            except OSError:
                row["repredictions"] = None
            self.samples.append(row)
            self.stop.wait(SAMPLE_S)

    def dashboard_loop(self):
        """What one open dashboard reads every 2 s (control-service/assets/dashboard/app.js)."""
        paths = ["/v1/zones", "/v1/stats", "/v1/stats/history", "/v1/zones/zone-1/hosts?limit=10000&offset=0"]
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                for path in paths:
                    get(CONTROL + path)
                self.dashboard["seconds"].append(time.monotonic() - started)
            except OSError as err:
                self.dashboard["errors"] += 1
                self.events.append((self.elapsed(), f"dashboard read failed: {err}"))
            self.dashboard["polls"] += 1
            self.stop.wait(DASHBOARD_POLL_S)

    def swap_loop(self):
        """The swaps, as an operator makes them: copy under a hidden name, rename, make it stable,
        and once it serves, clear the bundle it replaced out of the directory."""
        serving = "default"
        for i, at_s in enumerate(self.swap_at_s):
            if self.stop.wait(max(0.0, at_s - self.elapsed())):
                return
            name = f"swap-{i + 1}"
            hidden = os.path.join(self.models, f".{name}.tmp")
            shutil.copytree(self.bundles[i % len(self.bundles)], hidden)
            os.rename(hidden, os.path.join(self.models, name))
            rollout = os.path.join(self.models, ".rollout.toml.tmp")
            with open(rollout, "w", encoding="utf-8") as f:
                f.write(f'stable = "{name}"\n')
            os.rename(rollout, os.path.join(self.models, "rollout.toml"))
            swapped = self.elapsed()
            self.events.append((swapped, f"model swap: bundle `{name}` copied in and made stable"))
            headers = {"authorization": f"Bearer {token()}"}
            while not self.stop.wait(0.2):
                models = json.loads(get(f"{INFERENCE}/v1/models", headers))
                if any(m.get("bundle") == name and m.get("state") == "stable" for m in models):
                    self.events.append((self.elapsed(), f"inference server serves `{name}` as stable "
                                                        f"({self.elapsed() - swapped:.1f} s after the swap)"))
                    break
            # The services hold every bundle present (for instant rollbacks): the retired one leaves.
            if self.stop.wait(10):
                return
            retired = os.path.join(self.models, f".{serving}.retired")
            os.rename(os.path.join(self.models, serving), retired)
            shutil.rmtree(retired)
            self.events.append((self.elapsed(), f"the old bundle `{serving}` removed from the models directory"))
            serving = name

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join()


def median_in(points, lo, hi):
    values = [v for t, v in points if lo <= t <= hi and v is not None]
    return statistics.median(values) if values else None


def flatness(points, judged_from_s, duration_s):
    """(the level of the first 10 judged minutes, the last 10 minutes' level, their ratio)."""
    first = median_in(points, judged_from_s, judged_from_s + FLAT_WINDOW_S)
    last = median_in(points, duration_s - FLAT_WINDOW_S, duration_s)
    ratio = last / first if first and last is not None else None
    return first, last, ratio


def verdict_rows(samples, minutes_p99, judged_from_s, duration_s, population):
    rows = []
    for service in SERVICES:
        for key, unit, scale in (("rss_kib", "MiB", 1 / 1024), ("fds", "", 1)):
            points = [(s["elapsed_s"], s[f"{service}_{key}"] * scale) for s in samples]
            rows.append((f"{service} {'RSS' if key == 'rss_kib' else 'descriptors'}", unit,
                         *flatness(points, judged_from_s, duration_s)))
        # Where RSS went: the heap, or mapped files (the binary, a store's pages).
        for key, part, scale in (("rss_anon_kib", "RSS, anonymous part", 1 / 1024),
                                 ("rss_file_kib", "RSS, file-backed part", 1 / 1024),
                                 ("heap_in_use", "heap in use by the program", 1 / 2**20),
                                 ("heap_free", "heap free inside it (fragmentation)", 1 / 2**20)):
            points = [(s["elapsed_s"], s[f"{service}_{key}"] * scale) for s in samples
                      if s.get(f"{service}_{key}") is not None]
            rows.append((f"{service} {part} (not judged)", "MiB", *flatness(points, judged_from_s, duration_s)))
    # What the allocator's memory holds in proportion: a trace's running VMs are not constant.
    rows.append(("running VMs (not judged: the trace's own)", "", *flatness(population, judged_from_s, duration_s)))
    rows.append(("POST /allocate p99 per minute (client)", "ms", *flatness(minutes_p99, judged_from_s, duration_s)))
    points = [(s["elapsed_s"], s["store_bytes"] / 2**20) for s in samples]
    rows.append(("allocator store (not judged: grows until exits age out)", "MiB",
                 *flatness(points, judged_from_s, duration_s)))
    return rows


def svg_plot(path, panels, duration_s, events):
    """Stacked line panels: [(title, unit, [(label, [(t, v)])])], time in minutes on x."""
    width, panel_h, left, right, top = 900, 170, 70, 190, 30
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    height = top + len(panels) * (panel_h + 40)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11"><rect width="100%" height="100%" fill="white"/>']
    x_of = lambda t: left + (width - left - right) * t / max(duration_s, 1)
    for i, (title, unit, series) in enumerate(panels):
        y0 = top + i * (panel_h + 40)
        values = [v for _, pts in series for _, v in pts if v is not None]
        hi = max(values) * 1.1 if values and max(values) > 0 else 1
        y_of = lambda v: y0 + panel_h - panel_h * v / hi
        out.append(f'<text x="{left}" y="{y0 - 8}" font-size="13">{title} ({unit})</text>')
        out.append(f'<rect x="{left}" y="{y0}" width="{width - left - right}" height="{panel_h}" fill="none" stroke="#999"/>')
        for k in range(5):
            v = hi * k / 4
            out.append(f'<text x="{left - 6}" y="{y_of(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
        for minute in range(0, int(duration_s / 60) + 1, 10):
            x = x_of(minute * 60)
            out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + panel_h}" stroke="#eee"/>')
            out.append(f'<text x="{x:.1f}" y="{y0 + panel_h + 14}" text-anchor="middle">{minute} min</text>')
        for t, _ in events:
            out.append(f'<line x1="{x_of(t):.1f}" y1="{y0}" x2="{x_of(t):.1f}" y2="{y0 + panel_h}" stroke="#aaa" '
                       'stroke-dasharray="4 3"/>')
        for j, (label, pts) in enumerate(series):
            colour = colours[j % len(colours)]
            line = " ".join(f"{x_of(t):.1f},{y_of(v):.1f}" for t, v in pts if v is not None)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{line}"/>')
            out.append(f'<text x="{width - right + 10}" y="{y0 + 14 + 16 * j}" fill="{colour}">{label}</text>')
    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


def report(out, args, rate, sustainable, summary, background):
    samples = background.samples
    duration_s = summary["run"]["wall_s"]
    minutes = [(p["elapsed_s"], p["interval_latency"]) for p in summary["series"] if p.get("interval_latency")]
    p99 = [(t, lat["p99_ms"]) for t, lat in minutes if lat["count"] > 0]
    p50 = [(t, lat["p50_ms"]) for t, lat in minutes if lat["count"] > 0]
    with open(os.path.join(out, "resources.csv"), "w", encoding="utf-8") as f:
        keys = list(samples[0])
        f.write(",".join(keys) + "\n")
        for s in samples:
            f.write(",".join("" if s[k] is None else str(s[k]) for k in keys) + "\n")
    judged_from_s = args.warmup_minutes * 60
    events = [(t, text) for t, text in background.events]
    if judged_from_s > 0:
        events.insert(0, (judged_from_s, "warm-up over: the judged time starts"))
    svg_plot(os.path.join(out, "soak.svg"), [
        ("RSS", "MiB", [(svc, [(s["elapsed_s"], s[f"{svc}_rss_kib"] / 1024) for s in samples]) for svc in SERVICES]),
        ("open file descriptors", "count", [(svc, [(s["elapsed_s"], s[f"{svc}_fds"]) for s in samples]) for svc in SERVICES]),
        ("C heap in use by the program (a leak if it climbs)", "MiB",
         [(svc, [(s["elapsed_s"], s[f"{svc}_heap_in_use"] / 2**20) for s in samples
                 if s.get(f"{svc}_heap_in_use") is not None]) for svc in SERVICES]),
        ("allocator store (SQLite + WAL)", "MiB", [("store", [(s["elapsed_s"], s["store_bytes"] / 2**20) for s in samples])]),
        ("POST /allocate latency per minute (client)", "ms", [("p99", p99), ("p50", p50)]),
    ], duration_s, events)

    req, rel = summary["requests"], summary["releases"]
    first, last = samples[0], samples[-1]
    cpu = {svc: last[f"{svc}_cpu_s"] - first[f"{svc}_cpu_s"] for svc in SERVICES}
    lines = [
        f"# Soak: {duration_s / 60:.1f} minutes at {rate:.0f} requests/s "
        f"({args.warmup_minutes:g} of warm-up, then {(duration_s - judged_from_s) / 60:.1f} judged)",
        "",
        f"- rate: {rate:.0f} requests/s (allocations and releases), "
        + (f"half the sustainable {sustainable:.0f}/s measured by the probe" if sustainable else "given with --rate"),
        f"- allocations: {req['total']} ({req['placed']} placed, {req['rejected']} rejected, {req['errors']} errors); "
        f"releases: {rel['requests']} ({rel['released']} released, {rel['not_found']} not found, {rel['errors']} errors)",
        f"- client latency of the whole run: p50 {summary['latency']['client']['p50_ms']:.2f} ms, "
        f"p99 {summary['latency']['client']['p99_ms']:.2f} ms, max {summary['latency']['client']['max_ms']:.1f} ms",
        f"- repredictions (allocator counter): {first.get('repredictions')} at the start, {last.get('repredictions')} at the end",
        f"- dashboard: {background.dashboard['polls']} polls every {DASHBOARD_POLL_S:.0f} s, "
        f"{background.dashboard['errors']} failed, each (4 reads) p50 "
        f"{statistics.median(background.dashboard['seconds']) * 1000:.1f} ms" if background.dashboard["seconds"] else "- dashboard: no poll",
        "- CPU seconds over the run: " + ", ".join(f"{svc} {cpu[svc]:.0f}" for svc in SERVICES),
    ]
    lines += [f"- at {t / 60:.1f} min: {text}" for t, text in events]
    lines += ["", "| what | unit | first 10 judged min (median) | last 10 min (median) | last / first | flat (RSS within 10%; descriptors and p99 at most 10% higher) |",
              "|---|---|---:|---:|---:|---|"]
    judged_ok = True
    population = [(p["elapsed_s"], p["vms_alive"]) for p in summary["series"] if p.get("vms_alive") is not None]
    for name, unit, lo, hi, ratio in verdict_rows(samples, p99, judged_from_s, duration_s, population):
        judged = "not judged" not in name
        # Latency that falls is no drift to worry about, and neither are descriptors that fall (they
        # are mostly connections in flight, fewer when the machine is quieter: a leak only grows);
        # memory must stay level either way.
        one_sided = "p99" in name or "descriptors" in name
        flat = ratio is not None and ((ratio - 1) if one_sided else abs(ratio - 1)) <= FLAT_TOLERANCE
        if judged and not flat:
            judged_ok = False
        fmt = lambda v: "n/a" if v is None else f"{v:.2f}"
        lines.append(f"| {name} | {unit} | {fmt(lo)} | {fmt(hi)} | {fmt(ratio)} | "
                     f"{('yes' if flat else 'NO') if judged else '-'} |")
    lines += ["", "| minute | requests/s | p50 ms | p99 ms | RSS MiB (inference, allocator, control) | fds | store MiB | running VMs |",
              "|---:|---:|---:|---:|---|---|---:|---:|"]
    by_minute = {}
    for t, lat in minutes:
        by_minute[int(round(t / 60))] = lat
    for minute in range(5, int(duration_s / 60) + 1, 5):
        s = min(samples, key=lambda s: abs(s["elapsed_s"] - minute * 60))
        lat = by_minute.get(minute, {})
        rps = lat.get("count", 0) * 2 / 60
        lines.append(f"| {minute} | {rps:.0f} | {lat.get('p50_ms') or 0:.2f} | {lat.get('p99_ms') or 0:.2f} | "
                     + ", ".join(f"{s[f'{svc}_rss_kib'] / 1024:.1f}" for svc in SERVICES) + " | "
                     + ", ".join(str(s[f"{svc}_fds"]) for svc in SERVICES) + f" | {s['store_bytes'] / 2**20:.1f} | "
                     + f"{min(population, key=lambda p: abs(p[0] - minute * 60), default=(0, 0))[1]} |")
    lines += ["", "verdict: " + ("flat" if judged_ok else "NOT flat"), ""]
    text = "\n".join(lines)
    with open(os.path.join(out, "soak.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return judged_ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60, help="the judged time")
    parser.add_argument("--warmup-minutes", type=float, default=30,
                        help="run before the judged time, not judged (the capped structures fill)")
    parser.add_argument("--swaps", type=int, default=2, help="model swaps, spread evenly over the judged time")
    parser.add_argument("--rate", type=float, help="requests/s; default: half the probe's sustainable rate")
    parser.add_argument("--probe-vms", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=8,
                        help="requests in flight (more than the control service's max_concurrency get 503s)")
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--journal-events", type=int, default=100_000,
                        help="the inference server's [history] max_journal (default config: 1,000,000)")
    parser.add_argument("--exit-retention-days", type=int, default=7,
                        help="the allocator's [export] retention_s in days of the model's clock (default config: 30)")
    parser.add_argument("--out", default=os.path.join(ROOT, "target", "soak"))
    parser.add_argument("--no-build", action="store_true")
    args = parser.parse_args()
    if not args.minutes > 0:
        parser.error("--minutes must be positive")
    if args.warmup_minutes < 0 or args.swaps < 0:
        parser.error("--warmup-minutes and --swaps must not be negative")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if not args.no_build:
        run(["cargo", "build", "--release", "-p", "allocator", "-p", "inference-server", "-p", "control-service",
             "-p", "replay", "-p", "traces", "-p", "lifetime-train", "--bins"])
    models, swap = prepare_models(out)
    prepare_configs(out, args.hosts, args.journal_events, args.exit_retention_days)

    sustainable = None
    rate = args.rate
    if rate is None:
        stack(["up", "--fresh"], out)
        try:
            probe = replay(out, "probe", args.probe_vms, None, args.concurrency, 5)
        finally:
            stack(["down"], out)
        sustainable = requests_per_s(probe)
        rate = sustainable / 2
        log(f"sustainable {sustainable:.0f} requests/s; the soak runs at {rate:.0f}/s")

    models, swap = prepare_models(out)
    vms = int(rate * (args.warmup_minutes + args.minutes) * 60 / 2)
    stack(["up", "--fresh"], out)
    try:
        bundles = [swap, os.path.join(ROOT, "models", "default")]
        background = Background(out, args.warmup_minutes, args.minutes, args.swaps, models, bundles)
        try:
            summary = replay(out, "replay", vms, rate, args.concurrency, 60)
        finally:
            background.finish()
    finally:
        stack(["down"], out)
    flat = report(out, args, rate, sustainable, summary, background)
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
