"""Sends junk HTTP methods and paths, with no key, to a running service,
and prints what they cost it: the size of /metrics and the service's RSS
before and after. Exits 1 when /metrics ends over 100 KB or the RSS grew
by 10 MB or more (docs/security.md, "Labels and logs an anonymous client
cannot grow").

    python3 tests/security/junk_probe.py URL PID [REQUESTS]
"""

import http.client
import secrets
import sys
import time
import urllib.parse


def rss_kib(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def metrics_bytes(base):
    connection = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    body = response.read()
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"/metrics answered {response.status}")
    return len(body)


def main():
    base = urllib.parse.urlsplit(sys.argv[1])
    pid = int(sys.argv[2])
    requests = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    # Warm-up: one of each kind first, so start-up allocations are not counted.
    connection = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    for method, path in [("GET", "/healthz"), ("JUNK", "/nowhere"), ("GET", "/v1/accounts")]:
        connection.request(method, path)
        connection.getresponse().read()
    metrics_before, rss_before = metrics_bytes(base), rss_kib(pid)
    started = time.monotonic()
    statuses = {}
    for i in range(requests):
        # A new method token of 40 characters and a new path each time,
        # half of them under /v1 (a route pattern with an id) and half not.
        method = "X" + secrets.token_hex(20).upper()
        if i % 2:
            path = f"/v1/accounts/{secrets.token_hex(8)}/{secrets.token_hex(12)}"
        else:
            path = f"/{secrets.token_hex(16)}?{secrets.token_hex(8)}={secrets.token_hex(8)}"
        try:
            connection.request(method, path)
            response = connection.getresponse()
            response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
            if response.getheader("connection", "").lower() == "close":
                connection.close()
                connection = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
        except (http.client.HTTPException, OSError):
            connection.close()
            connection = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
            statuses["error"] = statuses.get("error", 0) + 1
    seconds = time.monotonic() - started
    metrics_after, rss_after = metrics_bytes(base), rss_kib(pid)
    grown_mib = (rss_after - rss_before) / 1024
    print(f"junk probe: {requests} requests in {seconds:.1f} s, statuses {statuses}")
    print(f"junk probe: /metrics {metrics_before} -> {metrics_after} bytes; "
          f"RSS {rss_before / 1024:.1f} -> {rss_after / 1024:.1f} MiB ({grown_mib:+.1f} MiB)")
    failed = []
    if metrics_after >= 100 * 1024:
        failed.append(f"/metrics is {metrics_after} bytes (at most 100 KB)")
    if grown_mib >= 10:
        failed.append(f"RSS grew by {grown_mib:.1f} MiB (less than 10)")
    if failed:
        print("junk probe: FAILED: " + "; ".join(failed), file=sys.stderr)
        sys.exit(1)
    print("junk probe: ok")


if __name__ == "__main__":
    main()
