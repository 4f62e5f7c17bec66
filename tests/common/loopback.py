"""Helpers of the tests that drive built binaries: a `modserve` process on free loopback ports,
its /metrics parsed, polling with a deadline, whether a binary is a sanitizer build, and the CPU
model for benchmark tables. It starts
nothing by itself and never leaves a process behind when a Server is used as a context manager.
"""

import functools
import math
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

# The lines `modserve` prints on stdout once each listener is up: "modserve <what> on HOST:PORT".
_PORT_LINE = re.compile(r"modserve (listening|metrics|health|http) on \S+:(\d+)")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def cpu_model():
    """The CPU's model name from /proc/cpuinfo, for printing beside a benchmark's numbers."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


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


@functools.lru_cache(maxsize=None)
def is_sanitized(binary):
    """Whether `binary` was built with AddressSanitizer or ThreadSanitizer (its RSS and address
    space say nothing then: shadow memory and quarantine)."""
    with open(binary, "rb") as f:
        blob = f.read()
    return b"__asan_init" in blob or b"__tsan_init" in blob


class Server:
    """One `modserve` process on --port 0 (and --metrics_port 0 unless `metrics` is False), with the
    ports it prints. `extra` are more flags; a "--health_port" among them adds `health_port`, an
    "--http_port" `http_port` (the OpenAI-compatible HTTP API).
    `stderr` is where the server's log goes (default: discarded). A thread reads and drops later
    stdout lines, so the pipe never fills."""

    def __init__(self, binary, model, *extra, metrics=True, stderr=subprocess.DEVNULL):
        args = [binary, "--model", model, "--port", "0"]
        if metrics:
            args += ["--metrics_port", "0"]
        self.proc = subprocess.Popen(args + list(extra), stdout=subprocess.PIPE, stderr=stderr,
                                     text=True)
        want = {"listening"} | ({"metrics"} if metrics else set()) | \
            ({"health"} if "--health_port" in extra else set()) | \
            ({"http"} if "--http_port" in extra else set())
        ports = {}
        for line in self.proc.stdout:
            m = _PORT_LINE.match(line)
            if m:
                ports[m.group(1)] = int(m.group(2))
            if want <= ports.keys():
                break
        self.port = ports.get("listening")
        self.metrics_port = ports.get("metrics")
        self.health_port = ports.get("health")
        self.http_port = ports.get("http")
        if not want <= ports.keys():
            self.stop()
            raise RuntimeError(f"{binary} did not print its ports {sorted(want - ports.keys())} "
                               f"(exit {self.proc.returncode})")
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for _ in self.proc.stdout:
            pass

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

    def terminate(self, timeout):
        """SIGTERM (drain), then the exit code; TimeoutExpired if it does not exit in time."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self):
        """SIGKILL if still running (idempotent): no drain, only no leftover process."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if getattr(self, "_reader", None) is not None:
            self._reader.join()
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
