"""Hostile checkpoints against the BUILT engine: for every case of tests/hostile/make_hostile.py
(model directories) and tests/hostile/make_hostile_gguf.py (GGUF files),
`modserve-generate --model DIR --prompt_ids 1,2,3` must exit with status 1 (no signal, no
sanitizer report, no hang; a case marked may_succeed, legal but extreme, may also exit 0) and
print a message naming the file and the problem, also under an
address-space limit that a valid checkpoint runs within. The server, `modserve --model DIR
--port 0`, must refuse the same checkpoints the same way before it listens. It does not judge the
messages' wording beyond the fragments each case lists.

The binaries are $MODSERVE_BUILD_DIR/bin/modserve-generate and bin/modserve (default build/);
without them the tests skip.
"""
import os
import resource
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "hostile"))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
import make_hostile  # noqa: E402
import make_hostile_gguf  # noqa: E402
from loopback import is_sanitized  # noqa: E402

BUILD = os.environ.get("MODSERVE_BUILD_DIR", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD if os.path.isabs(BUILD) else os.path.join(ROOT, BUILD), "bin")
BINARY = os.path.join(BIN, "modserve-generate")
SERVER = os.path.join(BIN, "modserve")
# Address-space cap for each run. The valid base checkpoint needs about 450 MiB of address space
# (mostly the 256 MiB KV pool that EngineOptions reserves, untouched); a loader that sizes
# anything from a hostile number blows through 1 GiB at once.
MEMORY_LIMIT_BYTES = 1 << 30
TIMEOUT_S = 60  # a hang (a FIFO opened for reading blocks forever) is a failure, not a wait

pytestmark = pytest.mark.skipif(
    not os.access(BINARY, os.X_OK),
    reason=f"{BINARY} is not built (set MODSERVE_BUILD_DIR to a build folder)")


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def run(model_dir, limit_memory):
    return subprocess.run(
        [BINARY, "--model", model_dir, "--prompt_ids", "1,2,3", "--max_new_tokens", "2",
         "--threads", "1"],
        capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S,
        preexec_fn=_limit if limit_memory else None)


def serve(model_dir):
    """Starts the server on the checkpoint. Returns (exit status, stderr); a server that came up
    (it prints its port) is stopped with SIGTERM and reported as None."""
    proc = subprocess.Popen(
        [SERVER, "--model", model_dir, "--port", "0", "--metrics_port", "-1", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        line = proc.stdout.readline()  # the "listening on" line, or EOF when it exits
        if line.startswith("modserve listening on"):
            proc.terminate()
            proc.communicate(timeout=TIMEOUT_S)
            return None, ""
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
        return proc.returncode, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def cases_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("limit_memory", [False, True], ids=["unlimited", "memory_limited"])
def test_valid_base_checkpoint_generates(limit_memory):
    """The control: the unmodified bases load and generate, also under the memory limit, so the
    hostile cases fail for their own reason and not because the limit is too tight."""
    if limit_memory and is_sanitized(BINARY):
        pytest.skip("sanitizer build: RLIMIT_AS would break the shadow memory")
    for base in (make_hostile.BASE, make_hostile.SHARDED_BASE):
        r = run(base, limit_memory)
        assert r.returncode == 0, (base, r.returncode, r.stderr[-2000:])


def _params():
    for case in make_hostile.CASES:
        for limit_memory in (False, True):
            if not (case.mem_limited if limit_memory else case.unlimited):
                continue
            marks = []
            if case.known_bug:
                marks.append(pytest.mark.xfail(strict=True, reason=case.known_bug))
            yield pytest.param(case, limit_memory, marks=marks,
                               id=f"{case.name}-{'memory_limited' if limit_memory else 'unlimited'}")


@pytest.mark.parametrize("case,limit_memory", list(_params()))
def test_hostile_checkpoint_fails_cleanly(case, limit_memory, cases_dir):
    if limit_memory and is_sanitized(BINARY):
        pytest.skip("sanitizer build: RLIMIT_AS would break the shadow memory")
    d = make_hostile.write_case(case, os.path.join(cases_dir, "memory" if limit_memory else "plain"))
    try:
        r = run(d, limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case.name}: modserve-generate hung for {TIMEOUT_S} s")
    stderr = r.stderr
    assert r.returncode >= 0, f"{case.name}: killed by signal {-r.returncode}\n{stderr[-3000:]}"
    for crash in ("Sanitizer", "runtime error:", "terminate called", "std::bad_alloc"):
        assert crash not in stderr, f"{case.name}: {crash}\n{stderr[-3000:]}"
    if case.may_succeed and r.returncode == 0:
        return
    assert r.returncode == 1, f"{case.name}: exit {r.returncode}\n{stderr[-3000:]}"
    assert stderr.startswith("modserve-generate: "), stderr[-3000:]
    for fragment in case.expect:
        fragment = fragment.replace("{dir}", d)
        assert fragment in stderr, f"{case.name}: {fragment!r} not in stderr:\n{stderr[-3000:]}"


server_required = pytest.mark.skipif(not os.access(SERVER, os.X_OK),
                                     reason=f"{SERVER} is not built")


@server_required
def test_server_serves_the_valid_base_checkpoints():
    for base in (make_hostile.BASE, make_hostile.SHARDED_BASE):
        code, stderr = serve(base)
        assert code is None, (base, code, stderr[-2000:])


@server_required
@pytest.mark.parametrize("case", [c for c in make_hostile.CASES if c.unlimited and
                                  not c.may_succeed and not c.known_bug], ids=lambda c: c.name)
def test_server_refuses_hostile_checkpoint_before_listening(case, cases_dir):
    d = make_hostile.write_case(case, os.path.join(cases_dir, "server"))
    try:
        code, stderr = serve(d)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case.name}: modserve hung for {TIMEOUT_S} s")
    assert code is not None, f"{case.name}: modserve started serving a hostile checkpoint"
    assert code == 1, f"{case.name}: exit {code}\n{stderr[-3000:]}"
    for crash in ("Sanitizer", "runtime error:", "terminate called", "std::bad_alloc"):
        assert crash not in stderr, f"{case.name}: {crash}\n{stderr[-3000:]}"
    assert stderr.startswith("modserve: "), stderr[-3000:]
    for fragment in case.expect:
        fragment = fragment.replace("{dir}", d)
        assert fragment in stderr, f"{case.name}: {fragment!r} not in stderr:\n{stderr[-3000:]}"


# ---- GGUF files (tests/hostile/make_hostile_gguf.py) ----

@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hostile_gguf"))


@pytest.mark.parametrize("limit_memory", [False, True], ids=["unlimited", "memory_limited"])
def test_valid_base_gguf_generates(limit_memory, gguf_dir):
    """The control: the valid GGUF base loads and generates, also under the memory limit."""
    if limit_memory and is_sanitized(BINARY):
        pytest.skip("sanitizer build: RLIMIT_AS would break the shadow memory")
    r = run(make_hostile_gguf.write_base(gguf_dir), limit_memory)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


def _gguf_params():
    for case in make_hostile_gguf.CASES:
        for limit_memory in (False, True):
            if not (case.mem_limited if limit_memory else case.unlimited):
                continue
            marks = []
            if case.known_bug:
                marks.append(pytest.mark.xfail(strict=True, reason=case.known_bug))
            yield pytest.param(case, limit_memory, marks=marks,
                               id=f"{case.name}-{'memory_limited' if limit_memory else 'unlimited'}")


def _check_refusal(case, path, code, stderr, prefix):
    assert code >= 0, f"{case.name}: killed by signal {-code}\n{stderr[-3000:]}"
    for crash in ("Sanitizer", "runtime error:", "terminate called", "std::bad_alloc"):
        assert crash not in stderr, f"{case.name}: {crash}\n{stderr[-3000:]}"
    assert code == 1, f"{case.name}: exit {code}\n{stderr[-3000:]}"
    assert stderr.startswith(prefix), stderr[-3000:]
    for fragment in case.expect:
        fragment = fragment.replace("{file}", path)
        assert fragment in stderr, f"{case.name}: {fragment!r} not in stderr:\n{stderr[-3000:]}"


@pytest.mark.parametrize("case,limit_memory", list(_gguf_params()))
def test_hostile_gguf_fails_cleanly(case, limit_memory, gguf_dir):
    if limit_memory and is_sanitized(BINARY):
        pytest.skip("sanitizer build: RLIMIT_AS would break the shadow memory")
    path = make_hostile_gguf.write_case(
        case, os.path.join(gguf_dir, "memory" if limit_memory else "plain"))
    try:
        r = run(path, limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case.name}: modserve-generate hung for {TIMEOUT_S} s")
    if case.may_succeed and r.returncode == 0:
        return
    _check_refusal(case, path, r.returncode, r.stderr, "modserve-generate: ")


@server_required
def test_server_serves_the_valid_base_gguf(gguf_dir):
    code, stderr = serve(make_hostile_gguf.write_base(gguf_dir))
    assert code is None, (code, stderr[-2000:])


@server_required
@pytest.mark.parametrize("case", [c for c in make_hostile_gguf.CASES if c.unlimited and
                                  not c.may_succeed and not c.known_bug], ids=lambda c: c.name)
def test_server_refuses_hostile_gguf_before_listening(case, gguf_dir):
    path = make_hostile_gguf.write_case(case, os.path.join(gguf_dir, "server"))
    try:
        code, stderr = serve(path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case.name}: modserve hung for {TIMEOUT_S} s")
    assert code is not None, f"{case.name}: modserve started serving a hostile GGUF file"
    _check_refusal(case, path, code, stderr, "modserve: ")
