"""Deployment files (Dockerfile, deploy/): they parse, are wired to each other and to the repo, use
only the metric names of the server contract (README.md, "Metrics"), and the alert rules and
dashboard queries compute what they claim (promtool). Builds no image and reaches no cluster; the
live-server check needs a built build/bin/modserve and skips without one; the promtool checks skip
without promtool.
"""
import glob
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

yaml = pytest.importorskip(
    "yaml", reason="PyYAML missing: install Debian's python3-yaml (tools/install_deps.sh)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
PROM = os.path.join(DEPLOY, "prometheus")
K8S = os.path.join(DEPLOY, "k8s")
DASHBOARD = os.path.join(DEPLOY, "grafana", "dashboards", "modserve.json")
BUILD = os.path.join(ROOT, os.environ.get("MODSERVE_BUILD_DIR", "build"))

# The metric contract (README.md, "Metrics"): name -> (type, labels). The dashboard, the alerts
# and the autoscaler may use these names and no others.
CONTRACT = {
    "modserve_time_to_first_token_seconds": ("histogram", set()),
    "modserve_inter_token_latency_seconds": ("histogram", set()),
    "modserve_e2e_request_latency_seconds": ("histogram", set()),
    "modserve_request_queue_time_seconds": ("histogram", set()),
    "modserve_request_prefill_time_seconds": ("histogram", set()),
    "modserve_request_decode_time_seconds": ("histogram", set()),
    "modserve_prompt_tokens_total": ("counter", set()),
    "modserve_generation_tokens_total": ("counter", set()),
    "modserve_num_requests_running": ("gauge", set()),
    "modserve_num_requests_waiting": ("gauge", set()),
    "modserve_kv_cache_usage_ratio": ("gauge", set()),
    "modserve_num_preemptions_total": ("counter", set()),
    "modserve_request_success_total": ("counter", {"finish_reason"}),
    "modserve_request_failure_total": ("counter", {"code"}),
    "modserve_layer_tokens_total": ("counter", {"layer", "decision"}),
    "modserve_layer_batch_skips_total": ("counter", {"layer"}),
    "modserve_kv_bytes_per_token": ("gauge", set()),
    "modserve_kv_bytes_per_token_dense": ("gauge", set()),
    "modserve_step_duration_seconds": ("histogram", {"phase"}),
    "modserve_prefix_cache_queries_total": ("counter", set()),
    "modserve_prefix_cache_hits_total": ("counter", set()),
    "modserve_spec_decode_num_drafts_total": ("counter", set()),
    "modserve_spec_decode_num_draft_tokens_total": ("counter", set()),
    "modserve_spec_decode_num_accepted_tokens_total": ("counter", set()),
    "modserve_spec_decode_num_accepted_tokens_per_pos_total": ("counter", {"position"}),
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
METRIC_TOKEN = re.compile(r"\bmodserve_[a-z0-9_]+\b")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _deploy_files(*exts):
    out = []
    for dirpath, _, files in os.walk(DEPLOY):
        out += [os.path.join(dirpath, f) for f in files if f.endswith(exts)]
    return sorted(out)


def _contract_name(series_name):
    """The contract metric of a series name (histograms add _bucket/_sum/_count), or None."""
    if series_name in CONTRACT:
        return series_name
    for suffix in HISTOGRAM_SUFFIXES:
        base = series_name[: -len(suffix)]
        if series_name.endswith(suffix) and CONTRACT.get(base, ("",))[0] == "histogram":
            return base
    return None


# ---------------------------------------------------------------------------------------------
# Every file parses

def test_every_yaml_and_json_file_under_deploy_parses():
    files = _deploy_files(".yml", ".yaml", ".json")
    assert len(files) >= 15, files
    for path in files:
        if path.endswith(".json"):
            doc = json.loads(_read(path))
            assert isinstance(doc, dict), path
        else:
            docs = [d for d in yaml.safe_load_all(_read(path)) if d is not None]
            assert docs and all(isinstance(d, dict) for d in docs), path


# ---------------------------------------------------------------------------------------------
# Dockerfile and .dockerignore

def _dockerfile_instructions(path):
    """[(INSTRUCTION, rest)] with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for raw in _read(path).splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continuation line"
    return out


def _dockerfile_stages(path):
    """{name: {"base": str, "instr": [...]}} in file order, plus the global ARG defaults."""
    stages, args, current = {}, {}, None
    for word, rest in _dockerfile_instructions(path):
        if word == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.IGNORECASE)
            assert m, f"every stage is named: FROM {rest}"
            base = re.sub(r"\$\{(\w+)\}", lambda a: args.get(a.group(1), a.group(0)), m.group(1))
            current = m.group(2).lower()
            stages[current] = {"base": base, "instr": []}
        elif current is None:
            if word == "ARG":
                name, _, value = rest.partition("=")
                args[name] = value
        else:
            stages[current]["instr"].append((word, rest))
    return stages, args


def _chain(stages, name):
    """The stage and the stages it is built FROM, child first."""
    chain = []
    while name in stages:
        chain.append(stages[name])
        name = stages[name]["base"]
    return chain, name


def _effective(stages, name, word):
    for stage in _chain(stages, name)[0]:
        found = [rest for w, rest in stage["instr"] if w == word]
        if found:
            return found[-1]
    return None


def _dockerignore_excludes(patterns, path):
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    def to_regex(pattern):
        rx, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**", i):
                rx, i = rx + ".*", i + 2
                if pattern.startswith("/", i):
                    rx, i = rx + "(?:/)?", i + 1
            elif pattern[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pattern[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pattern[i]), i + 1
        return re.compile(rx + r"\Z")

    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        rx = to_regex(os.path.normpath(raw.lstrip("!").strip("/")))
        if any(rx.match(p) for p in prefixes):
            excluded = not negate
    return excluded


def _dockerignore():
    lines = [l.strip() for l in _read(os.path.join(ROOT, ".dockerignore")).splitlines()]
    return [l for l in lines if l and not l.startswith("#")]


def test_dockerignore_matcher_follows_docker_rules():
    pats = ["build-*", "models/*", "!models/demo", "**/__pycache__"]
    assert _dockerignore_excludes(pats, "build-lead/bin/modserve")
    assert not _dockerignore_excludes(pats, "build.txt")
    assert _dockerignore_excludes(pats, "models/demo-dense/config.json")
    assert not _dockerignore_excludes(pats, "models/demo/config.json")
    assert _dockerignore_excludes(pats, "tools/modref/__pycache__/x.pyc")


@pytest.fixture(scope="module")
def dockerfile():
    return _dockerfile_stages(os.path.join(ROOT, "Dockerfile"))


def test_dockerfile_has_builder_runtime_and_cpu_stages(dockerfile):
    stages, _ = dockerfile
    assert list(stages)[-1] == "cuda", "a plain `docker build .` gives the CUDA runtime image"
    for name in ("build-base", "cpu-builder", "cuda-builder", "runtime-base", "cpu", "cuda"):
        assert name in stages, name
    # Builders on full Debian 12, runtimes on debian:12-slim: the Debian package names of
    # tools/install_deps.sh resolve in both.
    assert _chain(stages, "cuda-builder")[1] == "debian:12"
    assert _chain(stages, "cpu")[1] == "debian:12-slim"
    assert _chain(stages, "cuda")[1] == "debian:12-slim"
    cuda_builder = " ".join(r for w, r in stages["cuda-builder"]["instr"] if w == "RUN")
    assert "cuda-nvcc-" in cuda_builder and "libcublas-dev-" in cuda_builder
    assert "-DMODSERVE_CUDA=ON" in cuda_builder
    cpu_builder = " ".join(r for w, r in stages["cpu-builder"]["instr"] if w == "RUN")
    assert "-DMODSERVE_CUDA=OFF" in cpu_builder
    cuda_runtime = " ".join(r for w, r in stages["cuda"]["instr"] if w == "RUN")
    assert "cuda-cudart-" in cuda_runtime and "libcublas-" in cuda_runtime
    assert "nvcc" not in cuda_runtime and "-dev" not in cuda_runtime, "runtime has no toolkit"


def test_dockerfile_installs_with_the_ci_dependency_script(dockerfile):
    stages, _ = dockerfile
    script = _read(os.path.join(ROOT, "tools", "install_deps.sh"))
    modes = set(re.findall(r"^\s*(\w+)\)", script, re.MULTILINE))
    assert {"runtime", "build"} <= modes
    for stage, mode in (("build-base", "build"), ("runtime-base", "runtime")):
        runs = [r for w, r in stages[stage]["instr"] if w == "RUN"]
        assert any(f"MODSERVE_DEPS={mode} bash tools/install_deps.sh" in r for r in runs), stage
    # The configure step is tools/test.sh's: same generator and build type.
    test_sh = _read(os.path.join(ROOT, "tools", "test.sh"))
    for flag in ("-G Ninja", "-DCMAKE_BUILD_TYPE=Release"):
        assert flag in test_sh
        for stage in ("cpu-builder", "cuda-builder"):
            assert flag in " ".join(r for w, r in stages[stage]["instr"] if w == "RUN"), stage


def test_dockerfile_builds_and_copies_targets_that_exist(dockerfile):
    stages, _ = dockerfile
    cmake_text = ""
    for dirpath, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(("build", ".", "models", "tests"))]
        if "CMakeLists.txt" in files:
            cmake_text += _read(os.path.join(dirpath, "CMakeLists.txt"))
    executables = set(re.findall(r"add_executable\(\s*([\w-]+)", cmake_text))
    for builder in ("cpu-builder", "cuda-builder"):
        run = " ".join(r for w, r in stages[builder]["instr"] if w == "RUN")
        targets = re.search(r"--target\s+([\w\s-]+?)(?:&&|$)", run).group(1).split()
        assert "modserve" in targets and "modserve-client" in targets
        assert set(targets) <= executables, set(targets) - executables
    for final, builder in (("cpu", "cpu-builder"), ("cuda", "cuda-builder")):
        copies = [r for w, r in stages[final]["instr"] if w == "COPY" and "--from=" in r]
        assert copies and all(f"--from={builder}" in r for r in copies), final
        run = " ".join(r for w, r in stages[builder]["instr"] if w == "RUN")
        built = set(re.search(r"--target\s+([\w\s-]+?)(?:&&|$)", run).group(1).split())
        for r in copies:
            srcs = shlex.split(r)[1:-1]
            for src in srcs:
                assert src.startswith("/src/build/bin/") and os.path.basename(src) in built, src


def test_dockerfile_copy_sources_exist_and_are_in_the_build_context(dockerfile):
    stages, _ = dockerfile
    ignore = _dockerignore()
    for name, stage in stages.items():
        for word, rest in stage["instr"]:
            if word not in ("COPY", "ADD") or "--from=" in rest:
                continue
            srcs = [s for s in shlex.split(rest)[:-1] if not s.startswith("--")]
            for src in srcs:
                if re.match(r"https?://|\$\{", src):
                    continue  # ADD of a URL (the CUDA keyring) or a build-arg URL
                path = os.path.normpath(os.path.join(ROOT, src))
                assert os.path.exists(path), f"{name}: COPY source {src} is not in the repo"
                if src == ".":
                    continue  # the whole context: what the build needs is checked below
                files = ([path] if os.path.isfile(path) else
                         [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs])
                for f in files:
                    rel = os.path.relpath(f, ROOT)
                    assert not _dockerignore_excludes(ignore, rel), f"{rel} is .dockerignored"
    # `COPY . .` in build-base must carry what the CMake build reads (tests are OFF there).
    root_cmake = _read(os.path.join(ROOT, "CMakeLists.txt"))
    needed = ["CMakeLists.txt", "cmake/ModserveTargets.cmake", "cmake/ModserveCuda.cmake",
              "tools/install_deps.sh"]
    for sub in re.findall(r"add_subdirectory\((\w+)\)", root_cmake):
        if sub != "tests":
            needed.append(f"{sub}/CMakeLists.txt")
    for demo in os.listdir(os.path.join(ROOT, "models", "demo")):
        needed.append(f"models/demo/{demo}")
    for rel in needed:
        assert os.path.exists(os.path.join(ROOT, rel)), rel
        assert not _dockerignore_excludes(ignore, rel), f"{rel} is .dockerignored"
    for rel in ("build/bin/modserve", ".venv/bin/python", ".git/HEAD", "models/demo-dense/x"):
        assert _dockerignore_excludes(ignore, rel), f"{rel} would bloat the build context"


def _cmd_flags(cmd_json):
    args = json.loads(cmd_json)
    return {a.split("=")[0]: (a.split("=", 1)[1] if "=" in a else args[i + 1])
            for i, a in enumerate(args) if a.startswith("--")}


@pytest.mark.parametrize("target,backend", [("cpu", "cpu"), ("cuda", "cuda")])
def test_runtime_images_run_as_non_root_with_a_grpc_healthcheck(dockerfile, target, backend):
    stages, _ = dockerfile
    user = _effective(stages, target, "USER")
    assert user and re.fullmatch(r"\d+(:\d+)?", user), f"numeric USER (runAsNonRoot): {user}"
    uid = int(user.split(":")[0])
    assert uid != 0
    runs = " ".join(r for s in _chain(stages, target)[0] for w, r in s["instr"] if w == "RUN")
    assert f"--uid {uid}" in runs, "USER is the uid the image creates"
    assert _effective(stages, target, "ENTRYPOINT") == '["modserve"]'
    flags = _cmd_flags(_effective(stages, target, "CMD"))
    assert flags["--backend"] == backend
    assert flags["--host"] == "0.0.0.0", "reachable from outside the container"
    health = _effective(stages, target, "HEALTHCHECK")
    assert health and "CMD" in health
    probe = json.loads(health[health.index("CMD") + 3:].strip())
    assert probe[0] == "modserve-client" and probe[-1] == "health"
    assert probe[probe.index("--server") + 1] == f"127.0.0.1:{flags['--port']}"
    exposed = " ".join(r for s in _chain(stages, target)[0] for w, r in s["instr"] if w == "EXPOSE")
    assert {flags["--port"], flags["--metrics_port"]} <= set(exposed.split())
    # The demo checkpoint is in the image where --model points.
    copies = [r for s in _chain(stages, target)[0] for w, r in s["instr"] if w == "COPY"]
    workdir = _effective(stages, "runtime-base", "WORKDIR")
    assert any(shlex.split(c) == ["models/demo", "models/demo"] for c in copies)
    assert flags["--model"] == f"{workdir}/models/demo"


def _runtime_packages():
    script = _read(os.path.join(ROOT, "tools", "install_deps.sh"))
    m = re.search(r"runtime_pkgs=\(([^)]*)\)", script)
    return m.group(1).split()


def test_runtime_packages_provide_every_shared_library_of_the_built_server():
    """The runtime images install only MODSERVE_DEPS=runtime: each library the built binaries
    load must come from those packages or their dependencies."""
    binaries = [os.path.join(BUILD, "bin", b) for b in ("modserve", "modserve-client")]
    if not all(os.access(b, os.X_OK) for b in binaries):
        pytest.skip(f"no built server in {BUILD}/bin (run tools/test.sh first)")
    if not (shutil.which("ldd") and shutil.which("dpkg") and shutil.which("apt-cache")):
        pytest.skip("needs ldd, dpkg and apt-cache (Debian)")
    deps = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
         "--no-breaks", "--no-replaces", "--no-enhances"] + _runtime_packages(),
        capture_output=True, text=True, check=True).stdout
    closure = {l.strip().split(":")[0] for l in deps.splitlines() if l and not l.startswith(" ")}
    libs = {}
    for binary in binaries:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        assert "not found" not in out, out
        for lib in re.findall(r"=> (/\S+)", out):
            # usrmerge: dpkg may know the file under /usr/lib or by its real name.
            libs[lib] = {lib, os.path.realpath(lib), "/usr" + lib}
    assert libs
    # One dpkg call for all paths (it prints `package: path` for those it knows).
    found = subprocess.run(["dpkg", "-S", *sorted(set().union(*libs.values()))],
                           capture_output=True, text=True).stdout
    owner_of = {}
    for line in found.splitlines():
        pkgs, _, path = line.partition(": ")
        owner_of[path.strip()] = pkgs.split(",")[0].split(":")[0].strip()
    for lib, candidates in sorted(libs.items()):
        owners = {owner_of[c] for c in candidates if c in owner_of}
        assert owners, f"{lib} belongs to no Debian package"
        if any("cuda" in o or "cublas" in o for o in owners):
            continue  # NVIDIA's packages: the cuda stage installs them itself
        assert owners & closure, f"{lib} comes from {owners}, not in MODSERVE_DEPS=runtime"


# ---------------------------------------------------------------------------------------------
# Metric names

def _metric_tokens(text):
    return set(METRIC_TOKEN.findall(text))


def _dashboard_exprs():
    dash = json.loads(_read(DASHBOARD))
    exprs = {}
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            exprs[(panel["title"], t["refId"])] = t["expr"]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs[("$" + var["name"], "var")] = var["definition"]
    return exprs


def _alert_rules():
    return [r for g in _load_yaml(os.path.join(PROM, "alerts.yml"))["groups"] for r in g["rules"]]


def _deploy_texts(*exts):
    """The text of each file under deploy/; JSON as its decoded strings (no escaped quotes)."""
    def strings(node):
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    for path in _deploy_files(*exts):
        text = _read(path)
        yield path, "\n".join(strings(json.loads(text))) if path.endswith(".json") else text


def _used_series(exts=(".yml", ".yaml", ".json")):
    """Every modserve_ series name written in deploy/'s queries, rules and autoscaler configs
    (with ".md", also in the docs, which may name a histogram by its family name)."""
    used = set()
    for _, text in _deploy_texts(*exts):
        used |= _metric_tokens(text)
    return used


def test_every_metric_name_under_deploy_is_in_the_server_contract():
    unknown = sorted(n for n in _used_series((".yml", ".yaml", ".json", ".md"))
                     if _contract_name(n) is None)
    assert not unknown, f"not in the metrics contract: {unknown}"
    dash = {_contract_name(n) for e in _dashboard_exprs().values() for n in _metric_tokens(e)}
    assert dash == set(CONTRACT), f"dashboard lacks {sorted(set(CONTRACT) - dash)}"
    alerts = {_contract_name(n) for r in _alert_rules() for n in _metric_tokens(r["expr"])}
    assert {"modserve_time_to_first_token_seconds", "modserve_num_requests_waiting",
            "modserve_kv_cache_usage_ratio", "modserve_request_failure_total",
            "modserve_request_success_total"} <= alerts
    # Histograms are queried through their series, never by the bare family name.
    for name in _used_series():
        if name in CONTRACT and CONTRACT[name][0] == "histogram":
            pytest.fail(f"{name} is a histogram family; query {name}_bucket/_sum/_count")


def _label_requirements():
    """(series, label, [values]) from every `label="v"` or `label=~"a|b"` matcher under deploy/
    whose values are literal (no Grafana $variables, no regex syntax)."""
    reqs = set()
    selector = re.compile(r"\b(modserve_[a-z0-9_]+)\{([^}]*)\}")
    matcher = re.compile(r'(\w+)\s*(=~|!~|=|!=)\s*"([^"]*)"')
    for _, text in _deploy_texts(".yml", ".yaml", ".json"):
        for series, body in selector.findall(text):
            for label, op, value in matcher.findall(body):
                if "$" in value or label in ("job", "instance", "namespace", "pod", "service"):
                    continue
                values = value.split("|") if op in ("=~", "!~") else [value]
                if all(re.fullmatch(r"[\w.-]+", v) for v in values):
                    reqs.add((series, label, tuple(values)))
    return reqs


def test_label_matchers_use_the_contract_labels():
    reqs = _label_requirements()
    assert ("modserve_layer_tokens_total", "decision", ("computed",)) in reqs
    for series, label, _ in reqs:
        assert label in CONTRACT[_contract_name(series)][1] | {"le"}, (series, label)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse_exposition(text):
    """{series name: [labels dict]} of a Prometheus text exposition."""
    series = {}
    line_rx = re.compile(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+\S+")
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_rx.match(line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        series.setdefault(m.group(1), []).append(labels)
    return series


@pytest.fixture(scope="module")
def live_metrics():
    binary = os.path.join(BUILD, "bin", "modserve")
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{binary} not built: the live /metrics check needs the server "
                    "(run tools/test.sh, or set MODSERVE_BUILD_DIR)")
    metrics_port = _free_port()
    proc = subprocess.Popen(
        [binary, "--model", os.path.join(ROOT, "models", "demo"), "--port", "0",
         "--metrics_port", str(metrics_port), "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = queue.Queue()
    # A reader thread, so a server that hangs before printing cannot hang the test.
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    try:
        deadline, seen = time.monotonic() + 60, []
        while not any(l.startswith("modserve listening on") for l in seen):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail("modserve did not report its port within 60 s: " + "".join(seen))
            if line is None:
                pytest.fail(f"modserve exited ({proc.wait()}): " + "".join(seen))
            seen.append(line)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            body = r.read().decode()
        return _parse_exposition(body)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_every_metric_name_used_under_deploy_is_on_a_live_server(live_metrics):
    missing = sorted(n for n in _used_series() if n not in live_metrics)
    assert not missing, f"not on the live /metrics: {missing}"
    for name, (kind, labels) in CONTRACT.items():
        series = name + "_bucket" if kind == "histogram" else name
        assert series in live_metrics, series
        for label in labels:
            assert any(label in s for s in live_metrics[series]), (series, label)


def test_every_literal_label_value_under_deploy_is_on_a_live_server(live_metrics):
    for series, label, values in _label_requirements():
        live = {s.get(label) for s in live_metrics[series]}
        for v in values:
            if label == "le":
                continue
            exported = sorted(live - {None})
            assert v in live, f'{series}{{{label}="{v}"}}: the server exports {exported}'


# ---------------------------------------------------------------------------------------------
# Prometheus: promtool

def _promtool():
    tool = shutil.which("promtool")
    if not tool:
        pytest.skip("promtool not found: add Debian's `prometheus` package to "
                    "tools/install_deps.sh so CI checks deploy/prometheus")
    return tool


def _run_promtool(*args, cwd=PROM):
    return subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_promtool_checks_the_scrape_configs():
    r = _run_promtool("check", "config", "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run_promtool("check", "config", "prometheus-k8s.yml")
    if "kubernetes_sd_configs not found" in r.stdout + r.stderr:
        pytest.skip("this promtool is built without Kubernetes discovery (Debian's is): "
                    "prometheus-k8s.yml is checked by the YAML tests only")
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_checks_the_alert_rules():
    r = _run_promtool("check", "rules", "alerts.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 5 rules found" in r.stdout


def test_promtool_unit_tests_of_the_alerts_pass():
    tests = sorted(glob.glob(os.path.join(PROM, "tests", "*.yml")))
    assert tests
    r = _run_promtool("test", "rules", *tests)
    assert r.returncode == 0, r.stdout + r.stderr


def test_each_alert_has_a_firing_and_a_quiet_unit_test():
    alerts = {r["alert"] for r in _alert_rules()}
    assert alerts == {"ModserveTimeToFirstTokenP99High", "ModserveWaitingQueueGrowing",
                      "ModserveKVCacheNearlyFull", "ModserveErrorRatioHigh", "ModserveTargetDown"}
    fires, quiet = set(), set()
    for path in glob.glob(os.path.join(PROM, "tests", "*.yml")):
        for test in _load_yaml(path)["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert fires == alerts and quiet == alerts, (alerts - fires, alerts - quiet)


def test_prometheus_configs_load_the_alert_rules_and_scrape_job_modserve():
    for name in ("prometheus.yml", "prometheus-k8s.yml"):
        cfg = _load_yaml(os.path.join(PROM, name))
        assert cfg["rule_files"] == ["alerts.yml"], name
        jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
        assert "modserve" in jobs, name
    assert "static_configs" in _load_yaml(os.path.join(PROM, "prometheus.yml"))["scrape_configs"][0]
    k8s = _load_yaml(os.path.join(PROM, "prometheus-k8s.yml"))["scrape_configs"][0]
    assert k8s["kubernetes_sd_configs"][0]["role"] == "pod"
    # The adapter rule selects on namespace and pod: both setups must attach them.
    targets = {r.get("target_label") for r in k8s["relabel_configs"]}
    assert {"namespace", "pod"} <= targets


def test_prometheusrule_mirrors_the_alert_rules():
    rule = _load_yaml(os.path.join(K8S, "prometheusrule.yaml"))
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == _load_yaml(os.path.join(PROM, "alerts.yml"))["groups"]


# ---------------------------------------------------------------------------------------------
# Grafana

def _substitute(expr):
    """A dashboard query as Prometheus sees it from Grafana with every instance selected."""
    return (expr.replace("$__rate_interval", "5m").replace("$job", ".*")
            .replace("$instance", ".*"))


def test_dashboard_has_the_panels_of_issue_6():
    dash = json.loads(_read(DASHBOARD))
    assert dash["uid"] and dash["title"]
    panels = {p["title"]: p for p in dash["panels"] if p["type"] != "row"}

    def uses(title, *names):
        exprs = " ".join(t["expr"] for t in panels[title]["targets"])
        for n in names:
            assert n in exprs, (title, n)
        return exprs

    for title, metric in (("Time to first token", "modserve_time_to_first_token_seconds_bucket"),
                          ("Inter-token latency", "modserve_inter_token_latency_seconds_bucket")):
        exprs = [t["expr"] for t in panels[title]["targets"]]
        assert [e.split(",")[0] for e in exprs] == [
            "histogram_quantile(0.5", "histogram_quantile(0.9", "histogram_quantile(0.99"], title
        assert all(metric in e for e in exprs)
    uses("End-to-end request latency", "modserve_e2e_request_latency_seconds_bucket")
    uses("Queue time", "modserve_request_queue_time_seconds_bucket")
    uses("Running and waiting requests", "modserve_num_requests_running",
         "modserve_num_requests_waiting")
    uses("Tokens/s", "rate(modserve_prompt_tokens_total", "rate(modserve_generation_tokens_total")
    uses("KV cache usage", "modserve_kv_cache_usage_ratio")
    uses("Preemptions/s", "modserve_num_preemptions_total")
    assert "sum by (code)" in uses("Errors by code", "modserve_request_failure_total")
    assert "sum by (layer)" in uses("Computed fraction per routed layer",
                                    'modserve_layer_tokens_total{decision="computed"')
    uses("KV bytes per token: MoD vs dense", "modserve_kv_bytes_per_token{",
         "modserve_kv_bytes_per_token_dense{")
    uses("Whole-batch layer skips", "modserve_layer_batch_skips_total")
    uses("Prefix cache hit rate", "rate(modserve_prefix_cache_hits_total",
         "rate(modserve_prefix_cache_queries_total")
    uses("Speculative acceptance rate", "rate(modserve_spec_decode_num_accepted_tokens_total",
         "rate(modserve_spec_decode_num_draft_tokens_total")
    assert "sum by (position)" in uses("Acceptance rate by draft position",
                                       "rate(modserve_spec_decode_num_accepted_tokens_per_pos_total",
                                       "rate(modserve_spec_decode_num_drafts_total")
    uses("Speculative tokens/s", "modserve_spec_decode_num_draft_tokens_total",
         "modserve_spec_decode_num_accepted_tokens_total", "modserve_spec_decode_num_drafts_total")
    # Layout: unique ids, inside the 24-column grid, no two panels overlapping.
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))
    # Every query goes to the datasource variable (provisioned uid `prometheus`).
    for p in dash["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_dashboard_queries_are_valid_promql(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": _substitute(e)}
        for i, ((title, _), e) in enumerate(sorted(_dashboard_exprs().items()))
        if not title.startswith("$")]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    r = _run_promtool("check", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_mod_and_latency_queries_compute_what_they_show(tmp_path):
    """Feeds synthetic counters (per minute, two instances) through the dashboard's own queries in
    promtool and compares with the arithmetic done here."""
    exprs = _dashboard_exprs()
    per_min = {  # (layer, instance) -> (computed, skipped) tokens per minute
        ("0", "a"): (100, 0), ("0", "b"): (60, 0),                 # dense layer: never skips
        ("1", "a"): (10, 90), ("1", "b"): (30, 70),
        ("3", "a"): (25, 75), ("3", "b"): (25, 75),
        ("5", "a"): (0, 100), ("5", "b"): (0, 60),
    }
    steps_per_min = {("a", "decode"): 60, ("a", "prefill"): 20, ("b", "decode"): 40,
                     ("b", "mixed"): 0}
    batch_skips_per_min = {("0", "a"): 0, ("1", "a"): 40, ("1", "b"): 10, ("3", "a"): 8,
                           ("5", "a"): 80, ("5", "b"): 40}
    kv = {"a": (300.0, 1536.0), "b": (500.0, 1536.0)}
    # TTFT buckets per minute, split over both instances: 50 under 10 ms, 30 more under 20 ms,
    # 20 more under 50 ms. p90 = rank 90 in (0.02, 0.05]: 0.02 + 0.03 * (90 - 80) / 20 = 0.035.
    ttft = {"0.01": (30, 20), "0.02": (50, 30), "0.05": (60, 40), "+Inf": (60, 40)}

    series = []
    lab = 'job="modserve",instance="{}:9400"'
    for (layer, inst), (c, s) in per_min.items():
        for decision, v in (("computed", c), ("skipped", s)):
            series.append({"series": f'modserve_layer_tokens_total{{{lab.format(inst)},'
                                     f'layer="{layer}",decision="{decision}"}}',
                           "values": f"0+{v}x15"})
    for (inst, phase), v in steps_per_min.items():
        series.append({"series": f'modserve_step_duration_seconds_count{{{lab.format(inst)},'
                                 f'phase="{phase}"}}', "values": f"0+{v}x15"})
    for (layer, inst), v in batch_skips_per_min.items():
        series.append({"series": f'modserve_layer_batch_skips_total{{{lab.format(inst)},'
                                 f'layer="{layer}"}}', "values": f"0+{v}x15"})
    for inst, (mod, dense) in kv.items():
        series.append({"series": f"modserve_kv_bytes_per_token{{{lab.format(inst)}}}",
                       "values": f"{mod}x15"})
        series.append({"series": f"modserve_kv_bytes_per_token_dense{{{lab.format(inst)}}}",
                       "values": f"{dense}x15"})
    # Prefix cache: instance a looks up 200 prompt tokens a minute and finds 150, b 100 and 20.
    prefix = {"a": (200, 150), "b": (100, 20)}
    for inst, (q, h) in prefix.items():
        series.append({"series": f"modserve_prefix_cache_queries_total{{{lab.format(inst)}}}",
                       "values": f"0+{q}x15"})
        series.append({"series": f"modserve_prefix_cache_hits_total{{{lab.format(inst)}}}",
                       "values": f"0+{h}x15"})
    for le, (va, vb) in ttft.items():
        for inst, v in (("a", va), ("b", vb)):
            series.append({"series": f'modserve_time_to_first_token_seconds_bucket{{'
                                     f'{lab.format(inst)},le="{le}"}}', "values": f"0+{v}x15"})

    def rounded(x):  # promtool compares floats exactly; round(v, 0.001) on both sides
        return round(x * 1000) / 1000

    fraction, skips = [], []
    total_steps = sum(steps_per_min.values())
    for layer in sorted({l for l, _ in per_min}):
        c = sum(v[0] for (l, _), v in per_min.items() if l == layer)
        s = sum(v[1] for (l, _), v in per_min.items() if l == layer)
        if s == 0:
            continue  # dense layers are left out
        fraction.append({"labels": f'{{layer="{layer}"}}', "value": rounded(c / (c + s))})
        b = sum(v for (l, _), v in batch_skips_per_min.items() if l == layer)
        skips.append({"labels": f'{{layer="{layer}"}}', "value": rounded(b / total_steps)})
    mod_avg = sum(m for m, _ in kv.values()) / len(kv)
    dense_avg = sum(d for _, d in kv.values()) / len(kv)
    assert [f["value"] for f in fraction] == [0.2, 0.25, 0.0]  # what the inputs mean
    cases = [
        (("Computed fraction per routed layer", "A"), fraction),
        (("Whole-batch layer skips", "A"), skips),
        (("KV held vs dense", "A"), [{"labels": "{}", "value": rounded(mod_avg / dense_avg)}]),
        # p50: rank 50 is the last of the first bucket, its upper bound 0.01.
        (("Time to first token", "A"), [{"labels": "{}", "value": 0.01}]),
        (("Time to first token", "B"), [{"labels": "{}", "value": 0.035}]),
        (("Prefix cache hit rate", "A"),
         [{"labels": f'{{instance="{inst}:9400"}}', "value": rounded(h / q)}
          for inst, (q, h) in sorted(prefix.items())]),
    ]
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": f"round({_substitute(exprs[title])}, 0.001)",
                              "eval_time": "10m", "exp_samples": samples}
                             for title, samples in cases]}]}
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    r = _run_promtool("test", "rules", str(path), cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus():
    ds = _load_yaml(os.path.join(DEPLOY, "grafana", "provisioning", "datasources",
                                 "prometheus.yml"))["datasources"]
    assert [d["uid"] for d in ds] == ["prometheus"] and ds[0]["type"] == "prometheus"
    dash = json.loads(_read(DASHBOARD))
    dsvar = [v for v in dash["templating"]["list"] if v["type"] == "datasource"][0]
    assert dsvar["current"]["value"] == "prometheus"
    provider = _load_yaml(os.path.join(DEPLOY, "grafana", "provisioning", "dashboards",
                                       "modserve.yml"))["providers"][0]
    compose = _load_yaml(os.path.join(DEPLOY, "docker-compose.yml"))
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    host, port = re.fullmatch(r"http://([\w-]+):(\d+)", ds[0]["url"]).groups()
    assert host in compose["services"]
    assert f"{port}:{port}" in compose["services"][host]["ports"]


# ---------------------------------------------------------------------------------------------
# docker-compose

def test_compose_wires_server_prometheus_and_grafana(dockerfile):
    stages, _ = dockerfile
    compose = _load_yaml(os.path.join(DEPLOY, "docker-compose.yml"))
    gpu = _load_yaml(os.path.join(DEPLOY, "docker-compose.gpu.yml"))
    services = compose["services"]
    assert {"modserve", "prometheus", "grafana"} <= set(services)
    build = services["modserve"]["build"]
    assert os.path.isfile(os.path.join(DEPLOY, build["context"], build["dockerfile"]))
    assert build["target"] == "cpu" and gpu["services"]["modserve"]["build"]["target"] == "cuda"
    for svc in (services["modserve"], gpu["services"]["modserve"]):
        assert svc["build"]["target"] in stages
    # Prometheus scrapes the compose service on the port the server's command opens.
    target = _load_yaml(os.path.join(PROM, "prometheus.yml"))["scrape_configs"][0][
        "static_configs"][0]["targets"][0]
    host, port = target.split(":")
    assert host == "modserve"
    for svc in (services["modserve"], gpu["services"]["modserve"]):
        flags = _cmd_flags(json.dumps(svc["command"]))
        assert flags["--metrics_port"] == port and flags["--host"] == "0.0.0.0"
    assert "--backend" in gpu["services"]["modserve"]["command"]
    assert _cmd_flags(json.dumps(gpu["services"]["modserve"]["command"]))["--backend"] == "cuda"
    devices = gpu["services"]["modserve"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    # Every host path mounted exists; Prometheus reads the config we test.
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert os.path.exists(os.path.join(DEPLOY, src)), (name, src)
    prom_mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"])
    assert prom_mounts["./prometheus"] == "/etc/prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    # Docker's stop grace outlasts the server's drain.
    drain = int(_cmd_flags(json.dumps(services["modserve"]["command"]))["--drain_timeout"][:-1])
    assert int(services["modserve"]["stop_grace_period"][:-1]) > drain


# ---------------------------------------------------------------------------------------------
# Kubernetes

def _k8s():
    objs = {}
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        doc = _load_yaml(path)
        if "kind" in doc:
            objs[(doc["kind"], os.path.basename(path))] = doc
    return objs


def _k8s_kind(kind):
    found = [o for (k, _), o in _k8s().items() if k == kind]
    assert len(found) == 1, kind
    return found[0]


def test_kustomization_lists_existing_manifests():
    kust = _load_yaml(os.path.join(K8S, "kustomization.yaml"))
    for res in kust["resources"]:
        assert os.path.isfile(os.path.join(K8S, res)), res
    kinds = {_load_yaml(os.path.join(K8S, r))["kind"] for r in kust["resources"]}
    assert kinds == {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                     "ServiceMonitor", "PrometheusRule"}
    assert "keda-scaledobject.yaml" not in kust["resources"], "KEDA replaces the HPA"
    if shutil.which("kubectl"):
        r = subprocess.run(["kubectl", "kustomize", K8S], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
        assert len(rendered) == len(kust["resources"])


def test_deployment_requests_a_gpu_and_probes_grpc_health(dockerfile):
    stages, _ = dockerfile
    dep = _k8s_kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= \
        dep["spec"]["template"]["metadata"]["labels"].items()
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    flags = {a.split("=")[0]: a.split("=", 1)[1] for a in c["args"]}
    assert flags["--backend"] == "cuda" and flags["--host"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert str(ports["grpc"]) == flags["--port"]
    assert str(ports["metrics"]) == flags["--metrics_port"]
    # The probes use the health-only port (plaintext, no token), so TLS or auth on the gRPC
    # port never breaks them.
    assert str(ports["health"]) == flags["--health_port"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["health"], probe
    drain = int(flags["--drain_timeout"].rstrip("s"))
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > drain, \
        "liveness must not restart a pod that is draining (NOT_SERVING)"
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > drain + pre_stop
    # Non-root as the image's USER, so runAsNonRoot can verify it.
    image_uid = int(_effective(stages, "cuda", "USER").split(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == image_uid
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert flags["--model"] == _cmd_flags(_effective(stages, "cuda", "CMD"))["--model"]


def test_service_is_headless_and_selects_the_pods():
    dep, svc = _k8s_kind("Deployment"), _k8s_kind("Service")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["clusterIP"] == "None", "headless: clients balance over pod IPs"
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= container_ports
    assert {p["name"] for p in svc["spec"]["ports"]} == {"grpc", "metrics"}


def test_pdb_servicemonitor_and_autoscalers_target_the_deployment():
    dep, svc = _k8s_kind("Deployment"), _k8s_kind("Service")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    pdb = _k8s_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    mon = _k8s_kind("ServiceMonitor")
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    hpa = _k8s_kind("HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", dep["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2, "the PDB's one disruption leaves a pod serving"
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert name == "modserve_num_requests_waiting"
    adapter = _load_yaml(os.path.join(K8S, "prometheus-adapter-values.yaml"))
    (rule,) = adapter["rules"]["custom"]
    assert rule["name"]["as"] == name and name in rule["seriesQuery"]
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    keda = _load_yaml(os.path.join(K8S, "keda-scaledobject.yaml"))
    assert keda["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert name in keda["spec"]["triggers"][0]["metadata"]["query"]
