"""Loom side by side with ComfyUI itself, both driven through ComfyUI's HTTP API. Not a test: it
prints figures, and it needs a ComfyUI checkout and a Python that can run it (neither is a project
dependency; without them it says so and exits 0).

    python main.py bench vs_comfyui --comfyui /path/to/ComfyUI \\
        --comfy-python /path/to/venv/bin/python --ckpt-a A.safetensors --ckpt-b B.safetensors

Workflow: txt2img (CheckpointLoaderSimple → two CLIPTextEncode → EmptyLatentImage → KSampler →
VAEDecode → SaveImage) with checkpoint A, then B, then A again, queued one after the other on a
freshly started server (`--cpu` on both sides). Use two full-size SD1.5 files that differ (e.g.
shared/reference/comfyui/make_reference_sd15.py with two seeds); a small image and few steps keep
sampling short so that loading dominates.

Per run it prints: the peak RSS of the server process over the whole A→B→A (the kernel's VmHWM,
read from /proc from outside), the highest anonymous RSS seen while polling, the RSS after each
job, and each job's time from `POST /prompt` to its entry in `/history` (process start excluded).
Job 1 is the cold first image (the checkpoints' pages are dropped from the page cache with
posix_fadvise before each server starts); job 3 is "back to A". The sides alternate, one server at
a time; before each start the script waits until MemAvailable reaches --min-free-gib.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from nodes.bench.page_cache import drop_page_cache

ROOT = Path(__file__).resolve().parents[3]  # the repository


GIB = 2**30


@dataclass
class Side:
    """How to start one server: its name, command line (``{port}`` and ``{base}`` filled in) and
    working directory."""

    name: str
    argv: list[str]
    cwd: Path


@dataclass
class RunResult:
    side: str
    job_s: list[float] = field(default_factory=list)
    ready_s: float = 0.0  # process start until the server answered
    rss_after_job: list[int] = field(default_factory=list)
    peak_hwm: int = 0
    peak_anon: int = 0
    ok: bool = True
    error: str = ""


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS and RssAnon of a process in bytes (empty once it has gone)."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def wait_for_memory(min_bytes: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while mem_available() < min_bytes:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"only {mem_available() / GIB:.1f} GiB available after waiting {limit_s:.0f}s; "
                f"--min-free-gib is {min_bytes / GIB:.1f}"
            )
        time.sleep(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(port: int, path: str, body: dict | None = None, timeout: float = 30) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def workflow(ckpt: str, seed: int, size: int, steps: int) -> dict:
    """ComfyUI API-format txt2img graph."""
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse at dusk", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "5": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "positive": ["2", 0],
                "negative": ["3", 0],
                "latent_image": ["4", 0],
                "seed": seed,
                "steps": steps,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
            },
        },
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "bench"}},
    }


class Poller(threading.Thread):
    """Polls one process's memory every ``period`` seconds and keeps the highest values seen."""

    def __init__(self, pid: int, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.peak_anon = self.peak_hwm = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            st = proc_status(self.pid)
            self.peak_anon = max(self.peak_anon, st.get("RssAnon", 0))
            self.peak_hwm = max(self.peak_hwm, st.get("VmHWM", 0))
            time.sleep(self.period)


def wait_ready(proc: subprocess.Popen, port: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            http(port, "/system_stats", timeout=5)
            return
        except (OSError, urllib.error.URLError, ValueError):
            time.sleep(0.5)
    raise RuntimeError(f"server not ready after {limit_s:.0f}s")


def run_job(port: int, graph: dict, limit_s: float) -> float:
    start = time.perf_counter()
    prompt_id = http(port, "/prompt", {"prompt": graph, "client_id": "bench"})["prompt_id"]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        entry = http(port, f"/history/{prompt_id}").get(prompt_id)
        if entry and entry.get("status", {}).get("completed") is not None:
            elapsed = time.perf_counter() - start
            if entry["status"].get("status_str") != "success" or not entry.get("outputs"):
                raise RuntimeError(f"job failed: {json.dumps(entry.get('status'))[:2000]}")
            return elapsed
        time.sleep(0.05)
    raise RuntimeError(f"job not done after {limit_s:.0f}s")


def run_side(side: Side, ckpts: dict[str, Path], args: argparse.Namespace) -> RunResult:
    result = RunResult(side.name)
    wait_for_memory(int(args.min_free_gib * GIB), args.wait_memory_s)
    for path in ckpts.values():
        drop_page_cache(path.resolve())
    with tempfile.TemporaryDirectory(prefix=f"bench_{side.name}_") as tmp:
        base = Path(tmp)
        for sub in ("models/checkpoints", "input", "output", "temp", "user", "custom_nodes"):
            (base / sub).mkdir(parents=True)
        for name, path in ckpts.items():
            (base / "models" / "checkpoints" / name).symlink_to(path.resolve())
        port = free_port()
        argv = ["nice", "-n", str(args.nice)] + [a.format(port=port, base=base) for a in side.argv]
        log = (base / "server.log").open("w")
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=side.cwd, stdout=log, stderr=subprocess.STDOUT)
        poller = Poller(proc.pid)
        try:
            wait_ready(proc, port, args.start_limit_s)
            result.ready_s = time.perf_counter() - started
            poller.start()
            for i, name in enumerate(["A", "B", "A"]):
                graph = workflow(f"sd15_{name.lower()}.safetensors", 1000 + i, args.size, args.steps)
                result.job_s.append(run_job(port, graph, args.job_limit_s))
                result.rss_after_job.append(proc_status(proc.pid).get("VmRSS", 0))
            result.peak_hwm = proc_status(proc.pid).get("VmHWM", 0)
        except (RuntimeError, OSError, urllib.error.URLError) as exc:
            result.ok, result.error = False, f"{exc} (log tail: {tail(base / 'server.log')})"
        finally:
            poller.stop.set()
            result.peak_anon = poller.peak_anon
            result.peak_hwm = max(result.peak_hwm, poller.peak_hwm)
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                n = len(list(args.keep_logs.glob(f"{side.name}_*.log")))
                (args.keep_logs / f"{side.name}_{n + 1}.log").write_text(tail(base / "server.log", 200_000))
    return result


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def describe(r: RunResult) -> str:
    if not r.ok:
        return f"{r.side:8s} FAILED: {r.error}"
    jobs = " / ".join(f"{s:6.1f}" for s in r.job_s)
    rss = " / ".join(f"{b / GIB:4.2f}" for b in r.rss_after_job)
    return (
        f"{r.side:8s} peak RSS {r.peak_hwm / GIB:5.2f} GiB (anon {r.peak_anon / GIB:5.2f})  "
        f"jobs A/B/A {jobs} s  RSS after each {rss} GiB  (server ready after {r.ready_s:.1f} s)"
    )


def summary(results: list[RunResult]) -> list[str]:
    lines = []
    by_side: dict[str, list[RunResult]] = {}
    for r in results:
        if r.ok:
            by_side.setdefault(r.side, []).append(r)
    for side, rs in by_side.items():
        med = [statistics.median(r.job_s[i] for r in rs) for i in range(3)]
        peak = statistics.median(r.peak_hwm for r in rs) / GIB
        start = statistics.median(r.ready_s + r.job_s[0] for r in rs)
        lines.append(
            f"{side:8s} median of {len(rs)}: peak RSS {peak:.2f} GiB, cold first image {med[0]:.1f} s "
            f"(from process start {start:.1f} s), A→B {med[1]:.1f} s, back to A {med[2]:.1f} s"
        )
    if {"loom", "comfyui"} <= by_side.keys():
        loom, comfy = by_side["loom"], by_side["comfyui"]
        peak_ratio = statistics.median(r.peak_hwm for r in loom) / statistics.median(
            r.peak_hwm for r in comfy
        )
        first = statistics.median(r.job_s[0] for r in loom) / statistics.median(r.job_s[0] for r in comfy)
        back = statistics.median(r.job_s[2] for r in loom) / statistics.median(r.job_s[2] for r in comfy)
        lines.append(
            f"Loom / ComfyUI: peak RSS {peak_ratio:.2f} (target ≤ 1), cold first image {first:.2f} "
            f"(target ≤ 1), back to A {back:.2f}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="main.py bench vs_comfyui",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--comfyui", type=Path, default=Path(os.environ.get("LOOM_COMFYUI_DIR", "/work/comfyui_run"))
    )
    parser.add_argument(
        "--comfy-python", default=os.environ.get("LOOM_COMFYUI_PYTHON", "/work/comfy_venv/bin/python")
    )
    parser.add_argument("--loom-python", default=sys.executable)
    parser.add_argument("--ckpt-a", type=Path, default=ROOT / "bench_cache" / "sd15_a.safetensors")
    parser.add_argument("--ckpt-b", type=Path, default=ROOT / "bench_cache" / "sd15_b.safetensors")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side, alternating")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--sides", default="loom,comfyui")
    parser.add_argument("--loom-args", default="", help="extra flags for `main.py serve`")
    parser.add_argument("--comfy-args", default="", help="extra flags for ComfyUI's main.py")
    parser.add_argument("--min-free-gib", type=float, default=12.0)
    parser.add_argument("--wait-memory-s", type=float, default=900.0)
    parser.add_argument("--nice", type=int, default=15)
    parser.add_argument("--start-limit-s", type=float, default=300.0)
    parser.add_argument("--job-limit-s", type=float, default=900.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep-logs", type=Path, help="copy each server's log into this folder")
    args = parser.parse_args(argv)

    wanted = args.sides.split(",")
    if "comfyui" in wanted and not (args.comfyui / "main.py").is_file():
        print(f"SKIP: no ComfyUI checkout at {args.comfyui} (give --comfyui or LOOM_COMFYUI_DIR)")
        return
    if "comfyui" in wanted and not Path(args.comfy_python).is_file():
        print(f"SKIP: no Python for ComfyUI at {args.comfy_python} (give --comfy-python)")
        return
    for path in (args.ckpt_a, args.ckpt_b):
        if not path.is_file():
            print(f"SKIP: checkpoint {path} missing (make one with make_reference_sd15.py --seed N)")
            return
    ckpts = {"sd15_a.safetensors": args.ckpt_a, "sd15_b.safetensors": args.ckpt_b}
    sides = {
        "loom": Side(
            "loom",
            [args.loom_python, "main.py", "serve", "--cpu", "--port", "{port}", "--base-directory", "{base}"]
            + ["--disable-custom-nodes", "--no-demo", *args.loom_args.split()],
            ROOT,
        ),
        "comfyui": Side(
            "comfyui",
            [args.comfy_python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", "{port}"]
            + ["--base-directory", "{base}", "--disable-all-custom-nodes", "--disable-auto-launch"]
            + args.comfy_args.split(),
            args.comfyui,
        ),
    }
    print(f"{args.size}² px, {args.steps} steps, A→B→A; {os.cpu_count()} CPUs; nice {args.nice}", flush=True)
    results = []
    for rep in range(args.repeats):
        order = wanted if rep % 2 == 0 else wanted[::-1]
        for name in order:
            r = run_side(sides[name], ckpts, args)
            results.append(r)
            print(describe(r), flush=True)
    for line in summary(results):
        print(line)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))


if __name__ == "__main__":
    main()
