"""What open dashboards cost the allocator (docs/benchmarks.md, "The operator's console").

Allocates and releases one VM at a time through the control service and reports the allocation
latency percentiles, while a second thread fetches a zone's whole host page (what one dashboard
update reads) every POLL seconds; POLL 0 fetches nothing, the reference. Standard library only.

    python3 scripts/bench/dashboard_load.py CONTROL_URL POLL N [ZONE]
    e.g. python3 scripts/bench/dashboard_load.py http://127.0.0.1:8080 0.5 3000 zone-1

Alternate POLL 0 and POLL > 0 rows in one session: the ratio holds, absolute times do not.
"""

import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse
import uuid


def main():
    url = urllib.parse.urlparse(sys.argv[1])
    poll, n = float(sys.argv[2]), int(sys.argv[3])
    zone = sys.argv[4] if len(sys.argv) > 4 else "zone-1"
    host, port = url.hostname, url.port or 80
    run = uuid.uuid4().hex[:8]
    stop = threading.Event()
    fetches = []

    def poller():
        conn = http.client.HTTPConnection(host, port)
        while not stop.is_set():
            started = time.perf_counter()
            conn.request("GET", f"/v1/zones/{zone}/hosts?limit=10000")
            conn.getresponse().read()
            fetches.append(time.perf_counter() - started)
            stop.wait(poll)

    if poll > 0:
        threading.Thread(target=poller, daemon=True).start()
    conn = http.client.HTTPConnection(host, port)
    latencies = []
    for i in range(n):
        vm_id = f"load-{run}-{i}"
        body = json.dumps({"vm": {"vm_id": vm_id, "tenant_id": f"t{i % 20}", "vm_type": "D2", "zone": zone,
                                  "demand": {"cores": 2, "memory_gib": 8}}})
        started = time.perf_counter()
        conn.request("POST", "/allocate", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        latencies.append(time.perf_counter() - started)
        if response.status not in (200, 201):
            sys.exit(f"allocation {vm_id} answered {response.status}")
        conn.request("DELETE", f"/allocate/{vm_id}")
        conn.getresponse().read()
    stop.set()
    latencies.sort()

    def ms(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    page = statistics.median(fetches) * 1000 if fetches else 0.0
    print(f"poll={poll}s n={n} p50={ms(0.5):.2f}ms p99={ms(0.99):.2f}ms p99.9={ms(0.999):.2f}ms "
          f"max={latencies[-1] * 1000:.1f}ms host-page fetches={len(fetches)} (median {page:.1f} ms)")


if __name__ == "__main__":
    main()
