"""End to end with a real Prometheus: `modserve` on free loopback ports, Debian's `prometheus`
scraping it every second with the job of deploy/prometheus/prometheus.yml (target swapped for the
server's metrics port), load from `modserve-loadgen`, then TTFT p90, tokens/s and KV usage read
back through Prometheus's HTTP API and checked against the loadgen's own numbers and the raw
/metrics. It builds no image and skips when /usr/bin/prometheus is missing.

    python3 tests/deploy/prometheus_e2e_test.py MODSERVE LOADGEN CHECKPOINT_DIR
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from loopback import Server, free_port, histogram_quantile, metric_sum, wait_for  # noqa: E402

MODSERVE = LOADGEN = CHECKPOINT = None
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE_CONFIG = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")
LOAD_SECONDS = 5
TTFT = "modserve_time_to_first_token_seconds"


def _prometheus_config(metrics_port):
    """deploy/prometheus/prometheus.yml with its modserve job pointed at 127.0.0.1:metrics_port,
    scraped every second, and the alert rules by absolute path (checks they load too)."""
    import yaml  # Debian's python3-yaml; imported here so a missing one fails only this test
    with open(SCRAPE_CONFIG) as f:
        config = yaml.safe_load(f)
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [os.path.join(os.path.dirname(SCRAPE_CONFIG), r)
                            for r in config.get("rule_files", [])]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "modserve"]
    (static,) = job["static_configs"]
    static["targets"] = [f"127.0.0.1:{metrics_port}"]
    return yaml.safe_dump(config), static.get("labels", {})


class Prometheus:
    """A `prometheus` process with its own storage and a free port; killed on exit."""

    def __init__(self, workdir, config_text):
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(config_text)
        self.port = free_port()
        self.log = open(os.path.join(workdir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path, **params):
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.read().decode()

    def ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}")
        try:
            self.get("/-/ready")
            return True
        except OSError:  # connection refused, or 503 while starting
            return False

    def query(self, expr, at=None):
        """The instant vector of `expr` (at unix time `at`): [(labels, float)]."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = json.loads(self.get("/api/v1/query", **params))
        assert body["status"] == "success", body
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def scalar(self, expr, at=None):
        """The value of a one-series query, or None when it has no series."""
        result = self.query(expr, at)
        assert len(result) <= 1, (expr, result)
        return result[0][1] if result else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


@unittest.skipUnless(os.access(PROMETHEUS, os.X_OK), "Debian's prometheus is not installed")
class PrometheusEndToEndTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        # A small KV cache (4 MiB) so the usage ratio under load is well above zero.
        self.server = Server(MODSERVE, CHECKPOINT, "--threads", "1", "--kv_cache_bytes",
                             str(4 << 20))
        self.addCleanup(self.tmp.cleanup)
        self.addCleanup(self.server.stop)
        config, self.labels = _prometheus_config(self.server.metrics_port)
        self.prom = Prometheus(self.tmp.name, config)
        self.addCleanup(self.prom.stop)

    def test_ttft_tokens_per_second_and_kv_usage_through_prometheus(self):
        prom, job = self.prom, '{job="modserve"}'
        wait_for(prom.ready, 30, "prometheus /-/ready")
        # Scraping before the load starts: the rate windows below begin at a zero sample.
        up = wait_for(lambda: prom.query("up" + job), 30, "first scrape of the modserve job")
        self.assertEqual(len(up), 1)
        metric, value = up[0]
        self.assertEqual(value, 1.0)
        self.assertEqual(metric["instance"], f"127.0.0.1:{self.server.metrics_port}")
        for name, value in self.labels.items():  # the static labels of the shipped config
            self.assertEqual(metric.get(name), value)
        # A sample before the load (zero: the server is fresh), so the rate windows below start
        # at zero and Prometheus extrapolates nothing at their start.
        wait_for(lambda: prom.query("modserve_generation_tokens_total" + job), 30,
                 "a sample of modserve_generation_tokens_total")

        prompts = os.path.join(self.tmp.name, "prompts.txt")
        with open(prompts, "w") as f:
            f.write("Once upon a time\nThe trouble with computers is\nids:1,17,42,99,5\n")
        out = os.path.join(self.tmp.name, "loadgen.json")
        start = time.time()
        loadgen = subprocess.Popen(
            [LOADGEN, "--server", self.server.address, "--prompts", prompts, "--concurrency", "4",
             "--duration", f"{LOAD_SECONDS}s", "--max_new_tokens", "64", "--json_out", out],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: loadgen.poll() is None and loadgen.kill())
        # KV usage as Prometheus holds it while the load runs.
        kv_during = []
        while loadgen.poll() is None:
            kv = prom.scalar("modserve_kv_cache_usage_ratio" + job)
            if kv is not None:
                kv_during.append(kv)
            time.sleep(0.2)
        end = time.time()
        log, _ = loadgen.communicate()
        self.assertEqual(loadgen.returncode, 0, log)
        with open(out) as f:
            load = json.load(f)
        self.assertEqual(load["errors"], {}, log)
        self.assertGreater(load["requests_ok"], 0, log)

        # Evaluate at the first scrape after the load ended, over a window reaching back to a
        # scrape before it started, so the window holds the whole load and nothing else.
        def scrape_after_load():
            ts = prom.scalar(f"timestamp(modserve_generation_tokens_total{job})")
            return ts if ts is not None and ts >= end else None
        at = wait_for(scrape_after_load, 10, "a scrape after the load")
        window = f"{math.ceil(at - start + 1.5)}s"
        served = self.server.metrics()

        # The counter Prometheus stored is the token count the loadgen received.
        tokens = prom.scalar("modserve_generation_tokens_total" + job, at)
        self.assertEqual(tokens, load["tokens"], log)
        self.assertEqual(tokens, metric_sum(served, "modserve_generation_tokens_total"))

        # Tokens/s: the rate over the window, which is longer than the load by 1.5 to 3.5 s.
        rate = prom.scalar(f"sum(rate(modserve_generation_tokens_total{job}[{window}]))", at)
        self.assertIsNotNone(rate)
        self.assertGreater(rate, 0.0)
        self.assertLess(rate, 2.0 * load["tokens_per_second"], (rate, load, window))
        self.assertGreater(rate, 0.4 * load["tokens_per_second"], (rate, load, window))

        # TTFT p90: what histogram_quantile computes from the bucket rates equals the quantile of
        # the raw bucket counts (every bucket starts the window at 0, so rates are proportional
        # to counts), and lies inside the bucket that holds the loadgen's slowest first token
        # (the server's clock starts later than the client's, so it is never slower).
        p90 = prom.scalar(
            f"histogram_quantile(0.9, sum by (le) (rate({TTFT}_bucket{job}[{window}])))", at)
        buckets = [(float(l["le"]), v) for n, l, v in served if n == TTFT + "_bucket"]
        self.assertEqual(metric_sum(served, TTFT + "_count"), load["requests_ok"])
        self.assertAlmostEqual(p90, histogram_quantile(0.9, buckets), delta=1e-9 + 1e-6 * p90)
        self.assertGreater(p90, 0.0)
        client_max = load["ttft_seconds"]["max"]
        bound = min(le for le, _ in buckets if le >= client_max)
        self.assertLessEqual(p90, bound, (p90, client_max))

        # KV usage: a ratio, above zero while requests held pages, and Prometheus's maximum over
        # the load is the largest value the polls above saw at least.
        self.assertTrue(kv_during, "no KV usage sample while the load ran")
        self.assertTrue(all(0.0 <= kv <= 1.0 for kv in kv_during), kv_during)
        self.assertGreater(max(kv_during), 0.0, kv_during)
        kv_max = prom.scalar(f"max_over_time(modserve_kv_cache_usage_ratio{job}[{window}])", at)
        self.assertGreaterEqual(kv_max, max(kv_during))
        self.assertLessEqual(kv_max, 1.0)
        print(f"\nprometheus over {window}: ttft p90 {p90 * 1e3:.2f} ms (loadgen max "
              f"{client_max * 1e3:.2f} ms), {rate:.0f} tokens/s (loadgen "
              f"{load['tokens_per_second']:.0f}), kv usage max {kv_max:.4f}", file=sys.stderr)


if __name__ == "__main__":
    MODSERVE, LOADGEN, CHECKPOINT = sys.argv[1:4]
    unittest.main(argv=sys.argv[:1])
