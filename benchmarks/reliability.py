"""Failure cases of the reliability issues, reproduced one by one on real processes.

For each case it prints the case's name, the exception now given (type, and the message's first
300 characters with temporary paths shortened to their basenames) and the time to fail: wall
seconds from starting the operation to the error; and a note of what else the case measured.
The same tables go to ``benchmarks/results/reliability.md``: issue 22's cases (22.N, with its
three probes 22.12-22.14) and the first reliability issue's.

Every case runs in a fresh process (this script with ``--case NAME``) under a timeout, so that
one hang cannot stop the others; a case that cannot be reproduced says why in its row. The cases
live in ``benchmarks/faults/``; their material is the tests' own (``tests/support``: the fake S3
and HTTP stores, the corpus, files edited in place, cut-off tars, EXIF JPEGs, hostile texts, the
scripts run in processes of their own; ``zephon.testing``: the GPT-2 tokenizer, synthetic data).

    python benchmarks/reliability.py                 # every case (ten minutes or so on 2 CPUs)
    python benchmarks/reliability.py --only 22.2-local-edit-in-place 18-s3-503-forever
    python benchmarks/reliability.py --list
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks.faults, from a source checkout

from benchmarks.common import write_result  # noqa: E402
from benchmarks.faults import CASES, Outcome, earlier, issue22  # noqa: E402, F401  (they register cases)

ENV = dict(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
    HF_HUB_OFFLINE="1",
    HF_HUB_DISABLE_TELEMETRY="1",
    TOKENIZERS_PARALLELISM="false",
)


def shorten(text: str, tmp: str, limit: int = 300) -> str:
    """Temporary paths as their basenames, the repository's relative, on one line, first
    ``limit`` characters."""
    root = os.path.dirname(tmp)  # the cases' folders and the tokenizer's
    text = re.sub(
        re.escape(root) + r"[^\s'\",:;)\]]*", lambda m: os.path.basename(m.group(0).rstrip("/")), text
    )
    return " ".join(text.replace(ROOT + os.sep, "").split())[:limit]


def run_case(name: str, tmp: str, gpt2: str) -> None:
    """In the case's own process: run it, print one RESULT line of JSON."""
    fn = CASES[name][0]
    try:
        error, seconds, note = fn(tmp, gpt2)
    except Outcome as e:
        error, seconds, note = None, None, f"not reproduced: {e}"
    if isinstance(error, Outcome):
        error, note = None, f"not reproduced: {error}; {note}"
    if error is None:
        kind, message = "(no error)", ""
    else:
        kind = getattr(error, "kind", None) or (
            type(error).__module__.replace("builtins", "") + "." + type(error).__qualname__
        )
        message = " ".join([str(error), *getattr(error, "__notes__", [])])
    row = {
        "exception": kind.lstrip("."),
        "message": shorten(message, tmp),
        "seconds": seconds,
        "note": shorten(note, tmp, limit=600),
    }
    print("RESULT " + json.dumps(row), flush=True)


def spawn(name: str, root: str, gpt2: str) -> dict:
    """Runs one case in a fresh process (its own process group), under its timeout."""
    _, timeout, drop_root = CASES[name]
    tmp = os.path.join(root, re.sub(r"[^\w.-]", "_", name))
    os.makedirs(tmp)
    command = [sys.executable, os.path.abspath(__file__), "--case", name, "--tmp", tmp, "--gpt2", gpt2]
    if drop_root and os.geteuid() == 0 and shutil.which("setpriv"):  # root writes anywhere otherwise
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **ENV},
        cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {
            "exception": "(hang)",
            "message": "",
            "seconds": None,
            "note": f"killed after {timeout} s: no error came",
        }
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the case left running
    found = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
    if found:
        return json.loads(found[-1])
    tail = shorten(err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}", tmp)
    return {"exception": "(not run)", "message": "", "seconds": None,
            "note": f"the case failed in {time.monotonic() - start:.0f} s: {tail}"}  # fmt: skip


def markdown(rows: list[tuple[str, dict]]) -> str:
    out = [
        "# Reliability: the errors zephon gives now, and the time to give them",
        "",
        f"- machine: {platform.node()}, {platform.platform()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        "- command: `python benchmarks/reliability.py`",
        "",
        "Time to fail: wall seconds from starting the operation to the error (each case in a fresh "
        "process; messages cut to 300 characters, temporary paths cut to their basenames). An exception "
        "`exit N` is a process's exit status, its message the last line the process wrote.",
    ]
    for title, part in (("Issue 22", True), ("The first reliability issue", False)):
        chosen = [(name, r) for name, r in rows if name.startswith("22.") == part]
        if chosen:
            out += ["", f"## {title}", "", *_table(chosen)]
    return "\n".join(out) + "\n"


def _table(rows: list[tuple[str, dict]]) -> list[str]:
    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    out = ["| case | exception | message | time to fail (s) | note |", "|---|---|---|---|---|"]
    for name, r in rows:
        seconds = "" if r["seconds"] is None else f"{r['seconds']:.3f}"
        out.append(
            f"| {name} | {cell(r['exception'])} | {cell(r['message'])} | {seconds} | {cell(r['note'])} |"
        )
    return out


def order(name: str) -> tuple[int, int, str]:
    """Issue 22's cases first, each issue's by number then letter."""
    issue, number, letter = re.match(r"(22\.)?(\d+)([a-z]?)", name).groups()
    return (0 if issue else 1), int(number), letter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", help="run one case in this process (used by the script itself)")
    parser.add_argument("--tmp", help="the case's temporary folder")
    parser.add_argument("--gpt2", help="the GPT-2 tokenizer folder")
    parser.add_argument("--only", nargs="*", help="run only these cases (the results file is not written)")
    parser.add_argument("--list", action="store_true", help="list the cases")
    args = parser.parse_args()
    if args.case:
        return run_case(args.case, args.tmp, args.gpt2)
    if args.list:
        print("\n".join(sorted(CASES, key=order)))
        return None
    unknown = [name for name in args.only or [] if name not in CASES]
    if unknown:
        parser.error(f"no such case(s) {unknown}: --list lists them")
    from zephon.testing import gpt2_tokenizer_dir

    root = tempfile.mkdtemp(prefix="zephon-reliability-")
    os.chmod(root, 0o755)
    rows = []
    try:
        gpt2 = gpt2_tokenizer_dir(os.path.join(root, "gpt2"))
        for name in args.only or sorted(CASES, key=order):
            row = spawn(name, root, gpt2)
            rows.append((name, row))
            seconds = "-" if row["seconds"] is None else f"{row['seconds']:.3f} s"
            print(f"{name}: {row['exception']}: {row['message']} [{seconds}] {row['note']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.only:
        return None  # a part of the cases: the results file keeps the whole table
    path = write_result("reliability.md", markdown(rows), echo=False)
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return None


if __name__ == "__main__":
    main()
