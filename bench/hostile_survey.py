"""Hostile-input survey: every subcommand against a batch of hostile inputs, each in a fresh folder, as a real
process. Records exit code, stderr lines, traceback, time, peak memory and what the command created.

    .venv/bin/python bench/hostile_survey.py [--jobs 2] [--only SUBSTRING] [--out survey.json]

A case passes ("clean") when it exits 2 with one stderr line per problem and no traceback, within the time
bound, creating nothing in its folder. Not part of the test suite (tests/test_bad_input.py is): a tool to find
the classes of failure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOOD_CFG = "name: ok\nmodel: {name: tiny}\ndata: {dataset: digits}\noptim: {epochs: 1}\nschedule: {kind: static}\n"
GOOD_SPEC = ("name: ok\nbase: {model: {name: tiny}, data: {dataset: digits}, optim: {epochs: 1}, schedule: {kind: static}}\n"
             "parameters: {schedule.fw: {grid: [4, 8]}}\nresources: {cpu: 1}\n")
BOMB = "a: &a ['x','x','x','x','x','x','x','x','x']\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
    f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n" for i in range(9))
DEEP = "x: " + "[" * 3000 + "]" * 3000 + "\n"
DEEP_MAP = "".join("  " * i + f"k{i}:\n" for i in range(1500)) + "  " * 1500 + "v: 1\n"

FILES: dict[str, bytes | str] = {
    "good.yaml": GOOD_CFG,
    "spec.yaml": GOOD_SPEC,
    "bomb.yaml": BOMB,
    "deep.yaml": DEEP,
    "deepmap.yaml": DEEP_MAP,
    "latin1.yaml": b"name: caf\xe9\nmodel: {name: tiny}\n",
    "binary.yaml": bytes(range(256)) * 4,
    "nul.yaml": b"name: a\x00b\n",
    "dupkeys.yaml": GOOD_CFG + "name: other\n",
    "empty.yaml": "",
    "list.yaml": "- 1\n- 2\n",
    "scalar.yaml": "42\n",
    "pyobj.yaml": "!!python/object/apply:os.system ['echo hi']\n",
    "huge.yaml": "name: ok\n" + "# " + "x" * (40 << 20) + "\n",
    "big_seed.yaml": GOOD_CFG + "seed: 1180591620717411303424\n",
    "neg_seed.yaml": GOOD_CFG + "seed: -1\n",
    "cuda.yaml": GOOD_CFG + "device: cuda\n",
    "huge_iters.yaml": GOOD_CFG.replace("epochs: 1", "epochs: 100000000000"),
    "inf_lr.yaml": GOOD_CFG.replace("epochs: 1}", "epochs: 1, lr: .inf}"),
    "nan_lr.yaml": GOOD_CFG.replace("epochs: 1}", "epochs: 1, lr: .nan}"),
    "spec_base_devzero.yaml": "name: s\nbase: /dev/zero\nparameters: {schedule.fw: {grid: [4]}}\n",
    "spec_base_dir.yaml": "name: s\nbase: /tmp\nparameters: {schedule.fw: {grid: [4]}}\n",
    "spec_base_binary.yaml": "name: s\nbase: binary.yaml\nparameters: {schedule.fw: {grid: [4]}}\n",
    "spec_base_bomb.yaml": "name: s\nbase: bomb.yaml\nparameters: {schedule.fw: {grid: [4]}}\n",
    "spec_inf_bound.yaml": GOOD_SPEC.replace("{schedule.fw: {grid: [4, 8]}}",
                                             "{optim.lr: {uniform: [0.01, .inf]}}") + "search: {algorithm: random}\n",
    "spec_big_grid.yaml": GOOD_SPEC.replace("{schedule.fw: {grid: [4, 8]}}", "{seed: {grid: " +
                                            str(list(range(1000))) + "}, optim.lr: {grid: " +
                                            str([0.001 * (i + 1) for i in range(1000)]) + "}}"),
    "spec_asha.yaml": GOOD_SPEC + "scheduler: {kind: asha, grace_period: 50}\n",
    "spec_big_seed.yaml": GOOD_SPEC.replace("resources", "seeds: [1180591620717411303424]\nresources"),
    "spec_cuda.yaml": GOOD_SPEC.replace("schedule: {kind: static}", "schedule: {kind: static}, device: cuda"),
    "abl_inf_verdict.yaml": GOOD_SPEC.replace("parameters: {schedule.fw: {grid: [4, 8]}}\n", "") +
    "ablation: {factors: {schedule.fw: [4, 8]}, baseline: {schedule.fw: 4}, verdict: {moderate: .inf, sensitive: .inf}}\n",
    "abl_many_levels.yaml": GOOD_SPEC.replace("parameters: {schedule.fw: {grid: [4, 8]}}\n", "") +
    "ablation: {factors: {optim.lr: " + str([0.0001 * (i + 1) for i in range(20000)]) + "}, baseline: {optim.lr: 0.0001}}\n",
    "notes_bin.md": bytes(range(256)),
    "adir/keep": "",
    "afile": "x",
    "history.jsonl": '{"epoch": 0}\n',
}


def cases() -> list[tuple[str, list[str]]]:
    readers = [("validate", []), ("train", []), ("schedule", []), ("prt", []), ("sweep", []), ("ablate", []),
               ("submit", ["--address", "http://127.0.0.1:1"])]
    hostile_files = ["bomb.yaml", "deep.yaml", "deepmap.yaml", "latin1.yaml", "binary.yaml", "nul.yaml",
                     "dupkeys.yaml", "empty.yaml", "list.yaml", "scalar.yaml", "pyobj.yaml", "huge.yaml", "/dev/zero",
                     "FIFO", "adir", "nosuch.yaml"]
    out: list[tuple[str, list[str]]] = []
    for cmd, extra in readers:
        for f in hostile_files:
            out.append((f"{cmd} {f}", [cmd, f, *extra]))
    for f in ["spec_base_devzero.yaml", "spec_base_dir.yaml", "spec_base_binary.yaml", "spec_base_bomb.yaml",
              "spec_inf_bound.yaml", "spec_big_grid.yaml", "spec_asha.yaml", "spec_big_seed.yaml", "spec_cuda.yaml",
              "abl_inf_verdict.yaml", "abl_many_levels.yaml", "big_seed.yaml", "neg_seed.yaml", "cuda.yaml",
              "huge_iters.yaml", "inf_lr.yaml", "nan_lr.yaml"]:
        out.append((f"validate {f}", ["validate", f]))
    out.append(("schedule huge_iters", ["schedule", "huge_iters.yaml"]))
    out.append(("sweep spec_base_devzero", ["sweep", "spec_base_devzero.yaml"]))
    out.append(("sweep spec bad field before ray", ["sweep", "spec_base_dir.yaml"]))
    for v in ["schedule.fw=[", "schedule.fw=*x", "schedule.fw=!!python/object:os.system", "schedule.fw={a: [}",
              "=4", "schedule..fw=4", "schedule.fw.x=4", "name=\x00", "schedule.fw=" + "[" * 3000,
              "schedule.fw=&a [*a]"]:
        for cmd in ("train", "schedule", "prt"):
            out.append((f"{cmd} --set {v[:30]!r}", [cmd, "good.yaml", "--set", v]))
    for p in ["adir", "nodir/x.png", "afile/x.png", "/proc/x.png", "/dev/null/x.png"]:
        out.append((f"schedule --plot {p}", ["schedule", "good.yaml", "--plot", p]))
    for p in ["adir", "nodir/h.jsonl", "afile/h.jsonl", "/proc/h"]:
        out.append((f"train --history {p}", ["train", "good.yaml", "--history", p]))
    for p in ["afile", "afile/ck", "/proc/ck"]:
        out.append((f"train --checkpoint-dir {p}", ["train", "good.yaml", "--checkpoint-dir", p]))
    for p in ["nosuch", "afile", "adir", "binary.yaml"]:
        out.append((f"train --resume {p}", ["train", "good.yaml", "--resume", p, "--history", "history.jsonl"]))
    for p in ["adir", "nodir/r.md", "afile/r.md"]:
        out.append((f"results --out {p}", ["results", "ok", "--out", p]))
    for p in ["nosuch.md", "notes_bin.md", "/dev/zero", "adir", "FIFO"]:
        out.append((f"results --notes {p}", ["results", "ok", "--notes", p]))
    for p in ["afile", "afile/x", "/proc/x"]:
        out.append((f"report --out {p}", ["report", "ok", "--out", p]))
    out.append(("report nosuch (creates mlflow.db?)", ["report", "nosuch"]))
    out.append(("pareto nosuch", ["pareto", "nosuch"]))
    out.append(("results nosuch", ["results", "nosuch"]))
    out.append(("pareto --sweep-id quote", ["pareto", "nosuch", "--sweep-id", "x' or '1'='1"]))
    out.append(("pareto bad name", ["pareto", "../x"]))
    uris = ["http://user:s3cretpw@127.0.0.1:1", "http://[::1", "http://127.0.0.1:99999", "http://h:port",
            "sqlite:////nonexistent/dir/x.db", "sqlite:////proc/x.db", "ftp://x", "afile", "adir",
            "sqlite:///binary.yaml", "file:///tmp/x", ""]
    for u in uris:
        for cmd, extra in [("sweep", ["spec.yaml"]), ("pareto", ["ok"]), ("report", ["ok"]), ("results", ["ok"]),
                           ("ui", ["--port", "0"])]:
            out.append((f"{cmd} --tracking-uri {u[:30]!r}", [cmd, *extra, "--tracking-uri", u]))
    for a in ["127.0.0.1:99999", "[::1", "host:port", "nosuchhost.invalid:6379", "127.0.0.1:1", "", "http://x:1"]:
        out.append((f"sweep --address {a!r}", ["sweep", "spec.yaml", "--address", a]))
    for a in ["127.0.0.1:99999", "[::1", "ftp://x", "http://user:pw@127.0.0.1:1", "", "http://nosuchhost.invalid:1"]:
        out.append((f"jobs --address {a!r}", ["jobs", "--address", a]))
        out.append((f"stop --address {a!r}", ["stop", "raysubmit_x", "--address", a]))
    for h in ["[::1", "999.1.1.1", "", "example.invalid", "0.0.0.0 x"]:
        out.append((f"ui --host {h!r}", ["ui", "--host", h, "--port", "0"]))
    for p in ["-1", "70000", "x"]:
        out.append((f"ui --port {p}", ["ui", "--port", p]))
    for prec in ["9/x", "99/8", "0/0", "8/8/8", "", "fp33"]:
        out.append((f"cost --precision {prec!r}", ["cost", "--model", "tiny", "--dataset", "digits", "--precision", prec]))
    out.append(("cost --model nosuch", ["cost", "--model", "nosuch", "--dataset", "digits", "--precision", "8/8"]))
    out.append(("cost --weight-bits 99", ["cost", "--model", "tiny", "--dataset", "digits", "--precision", "8/8",
                                          "--weight-bits", "99"]))
    out.append(("sweep --storage afile", ["sweep", "spec.yaml", "--storage", "afile"]))
    out.append(("sweep --storage /proc/x", ["sweep", "spec.yaml", "--storage", "/proc/x"]))
    out.append(("sweep --resume nothing", ["sweep", "spec.yaml", "--resume"]))
    out.append(("sweep --report-dir afile", ["sweep", "spec.yaml", "--report-dir", "afile/x"]))
    out.append(("ablate --out afile", ["ablate", "abl_inf_verdict.yaml", "--out", "afile/x"]))
    out.append(("submit --job-id bad", ["submit", "spec.yaml", "--job-id", "../../x", "--address", "http://127.0.0.1:1"]))
    out.append(("stop bad id", ["stop", "'; rm -rf /", "--address", "http://127.0.0.1:1"]))
    return out


def corpus_cases() -> list[tuple[str, list[str]]]:
    """The cases of tests/data/bad, with their ``# argv:`` header (default ``validate {file}``)."""
    import re
    import shlex

    bad = ROOT / "tests" / "data" / "bad"
    out = []
    for p in sorted(bad.glob("*.yaml")):
        m = re.search(r"^# argv: (.*)$", p.read_bytes().decode(errors="replace"), flags=re.M)
        argv = shlex.split(m.group(1) if m else "validate {file}")
        out.append((p.stem, [a.replace("{file}", str(p)).replace("{bad}", str(bad)) for a in argv]))
    return out


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        try:
            st = p.lstat()
        except OSError:
            continue
        out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out


def run_case(name: str, argv: list[str], timeout: float, root: str = str(ROOT)) -> dict:
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        folder = Path(tmp)
        for rel, content in FILES.items():
            p = folder / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content if isinstance(content, bytes) else content.encode())
        os.mkfifo(folder / "FIFO")
        before = listing(folder)
        env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("MLFLOW_TRACKING_URI", None)
        env.pop("FRACTUNE_STORAGE", None)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *argv], cwd=folder, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, err = proc.communicate()
            rc = "timeout"
        wall = time.perf_counter() - t0
        after = listing(folder)
    err_text = err.decode(errors="replace")
    lines = [x for x in err_text.strip().splitlines() if x.strip()]
    created = sorted(set(after) - set(before))
    changed = sorted(k for k in before if k in after and after[k] != before[k] and k != "FIFO")
    tb = "Traceback" in err_text
    clean = rc == 2 and not tb and 1 <= len(lines) <= 3 and not created and not changed and wall < 30
    return {"name": name, "argv": argv, "rc": rc, "wall": round(wall, 1), "lines": len(lines),
            "stderr_tail": lines[-3:], "traceback": tb, "created": created[:8], "changed": changed,
            "secret": "s3cretpw" in err_text or "s3cretpw" in out.decode(errors="replace"), "clean": clean}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--out", default="hostile_survey.json")
    ap.add_argument("--root", default=str(ROOT), help="the checkout whose code runs (default: this one)")
    ap.add_argument("--corpus", action="store_true", help="run the cases of tests/data/bad (their argv headers) "
                    "instead of the built-in batch")
    args = ap.parse_args()
    todo = [(n, a) for n, a in (corpus_cases() if args.corpus else cases()) if args.only in n]
    # no process can receive a NUL byte in its arguments (exec refuses them): such cases run in process only,
    # in tests/test_bad_input.py
    unrunnable = [n for n, a in todo if any("\x00" in x for x in a)]
    todo = [(n, a) for n, a in todo if n not in unrunnable]
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # a bomb dies here instead of taking the machine
    with ThreadPoolExecutor(args.jobs) as pool:
        results = []
        for r in pool.map(lambda c: run_case(c[0], c[1], args.timeout, args.root), todo):
            results.append(r)
            with open(args.out + ".partial", "a") as fh:
                fh.write(json.dumps(r) + "\n")
    for r in results:
        flag = "ok  " if r["clean"] else "FAIL"
        print(f"{flag} {r['name'][:60]:60s} rc={r['rc']} {r['wall']:5.1f}s lines={r['lines']} "
              f"{'TB ' if r['traceback'] else ''}{'SECRET ' if r['secret'] else ''}"
              f"{'created=' + ','.join(r['created']) if r['created'] else ''}"
              f"{' changed=' + ','.join(r['changed']) if r['changed'] else ''} | "
              f"{(r['stderr_tail'][-1] if r['stderr_tail'] else '')[:150]}")
    for name in unrunnable:
        print(f"skip {name[:60]:60s} its arguments hold a NUL byte, which no process can receive")
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps({"cases": len(results), "clean": sum(r["clean"] for r in results), "skipped": len(unrunnable),
                      "out": args.out}))


if __name__ == "__main__":
    main()
