"""Helpers of the deploy tests: a built `modserve` on free loopback ports, its /metrics parsed, and
polling with a deadline. It starts nothing by itself and never leaves a process behind when used
as a context manager.
"""

import math
import re
import socket
import subprocess
import time
import urllib.request

_LISTENING = re.compile(r"modserve listening on 127\.0\.0\.1:(\d+)")
_METRICS = re.compile(r"modserve metrics on 127\.0\.0\.1:(\d+)/metrics")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def wait_for(condition, timeout, what, interval=0.05):
    """Polls `condition` until it returns a truthy value (returned) or `timeout` s pass (raises)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(interval)


def free_port():
    """A port nothing listens on right now (for programs that cannot pick their own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text):
    """Prometheus text format -> [(name, {label: value}, float)]."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def metric_sum(samples, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    return sum(v for n, l, v in samples
               if n == name and all(l.get(k) == want for k, want in labels.items()))


def histogram_quantile(q, buckets):
    """Prometheus's histogram_quantile over [(le, cumulative count)]: linear inside the bucket
    (the first bucket starts at 0), the highest finite bound if the rank falls in +Inf. Written
    from the PromQL documentation, to check Prometheus's answer against."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_bound
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return buckets[-2][0]


class Server:
    """One `modserve` process on --port 0 / --metrics_port 0 (the ports it prints)."""

    def __init__(self, binary, model, *extra):
        self.proc = subprocess.Popen(
            [binary, "--model", model, "--port", "0", "--metrics_port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.port = self.metrics_port = None
        for line in self.proc.stdout:
            m = _LISTENING.match(line)
            if m:
                self.port = int(m.group(1))
            m = _METRICS.match(line)
            if m:
                self.metrics_port = int(m.group(1))
                break
        if self.port is None or self.metrics_port is None:
            self.stop()
            raise RuntimeError(f"{binary} did not print its ports (exit {self.proc.poll()})")

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def metrics(self):
        """The parsed /metrics of this server."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return parse_metrics(resp.read().decode())

    def successes(self):
        return metric_sum(self.metrics(), "modserve_request_success_total")

    def stop(self):
        """SIGKILL (idempotent): the tests need no drain, only no leftover process."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
