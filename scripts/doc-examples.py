#!/usr/bin/env python3
"""Runs the README's and the docs' quick-start examples as a newcomer would: executable docs.

Every ```sh, ```bash and ```python block of README.md, and of the sections of docs/*.md whose
heading says "Quick start", is run in order on a fresh copy of the tree (the tracked files and
the untracked ones git does not ignore; no leftover report, cache or binary), so an example that
went stale fails CI, and so does a file the examples leave in the tree that git would show as
untracked. The blocks run with the repository copy as the working directory and a
scratch HOME, cache directory and `cargo install` root, so `care` is the one the README installs.
Where `unshare -rn` works, each block runs in its own network namespace with only loopback
(no network beyond 127.0.0.1; its ports never collide with the machine's).

A block that cannot run here says so with a marker, an HTML comment on the line(s) right
before its fence (invisible on GitHub), and the marker itself is checked:

  <!-- doc-check: not-run REASON -->     not run: syntax-checked (bash -n, compile()), and every
                                         `care SUBCOMMAND --flag` in it must be a flag of that
                                         subcommand's --help; REASON must be given
  <!-- doc-check: ci-runs COMMAND -->    the line COMMAND of the block is not run here because
                                         .ci/run runs it (checked: the block and .ci/run both
                                         have that exact line)

A marker that is not right before a block in scope, or that names an unknown kind, is an error.

  python3 scripts/doc-examples.py                 check and run everything
  python3 scripts/doc-examples.py --check-only    markers and syntax only (seconds; no build)
  python3 scripts/doc-examples.py --list          what would run, and why not where not

Environment: CARE_PYTHON runs the Python blocks (default: python3; it needs care_rl, and torch
for the torch lines); CARGO_TARGET_DIR (or ./target) is shared with the copy as its target/
so builds are reused; CARE_DOC_CLONE places the copy (default:
${XDG_CACHE_HOME:-~/.cache}/care-ci/doc-clone). Everything else named CARE_* is removed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL = {"sh", "bash", "shell"}
PYTHON = {"python", "py"}
MARKER = re.compile(r"^<!--\s*doc-check:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(```+)\s*([A-Za-z0-9_+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
BLOCK_TIMEOUT_S = 1800  # the first block may build the release binaries from scratch


@dataclass
class Block:
    file: str
    line: int  # 1-based line of the opening fence
    lang: str  # "sh" or "python"
    code: str
    not_run: str | None = None
    ci_runs: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


class DocError(Exception):
    pass


def in_scope_sections(path: Path) -> bool:
    return path.name == "README.md"


def scan(path: Path, errors: list[str]) -> list[Block]:
    """The shell and Python blocks of `path` in scope, with their markers."""
    rel = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    whole = in_scope_sections(path)
    blocks: list[Block] = []
    scope_level: int | None = None  # the level of the "Quick start" heading we are under
    pending: list[tuple[int, str]] = []  # markers waiting for their fence
    i = 0
    while i < len(lines):
        text = lines[i]
        h = HEADING.match(text)
        if h:
            level = len(h.group(1))
            if scope_level is not None and level <= scope_level:
                scope_level = None
            if "quick start" in h.group(2).lower():
                scope_level = level
        m = MARKER.match(text.strip())
        if m:
            pending.append((i + 1, m.group(1)))
            i += 1
            continue
        f = FENCE.match(text)
        if f:
            ticks, lang = f.group(1), f.group(2).lower()
            j = i + 1
            while j < len(lines) and not lines[j].startswith(ticks):
                j += 1
            code = "\n".join(lines[i + 1 : j]) + "\n"
            kind = "sh" if lang in SHELL else "python" if lang in PYTHON else None
            in_scope = whole or scope_level is not None
            if kind and in_scope:
                b = Block(rel, i + 1, kind, code)
                for line_no, spec in pending:
                    apply_marker(b, line_no, spec, errors)
                blocks.append(b)
            elif pending:
                where = "a block out of scope" if kind else f"a ```{lang or 'plain'} block"
                for line_no, _ in pending:
                    errors.append(f"{rel}:{line_no}: doc-check marker before {where} (markers only go before the shell and Python blocks that are checked)")
            pending = []
            i = j + 1
            continue
        if pending and text.strip():
            for line_no, _ in pending:
                errors.append(f"{rel}:{line_no}: doc-check marker not directly before a code block")
            pending = []
        i += 1
    for line_no, _ in pending:
        errors.append(f"{rel}:{line_no}: doc-check marker at the end of the file")
    return blocks


def apply_marker(b: Block, line_no: int, spec: str, errors: list[str]) -> None:
    kind, _, rest = spec.partition(" ")
    rest = rest.strip()
    where = f"{b.file}:{line_no}"
    if kind == "not-run":
        if not rest:
            errors.append(f"{where}: `not-run` needs a reason (what the block needs that CI lacks)")
        b.not_run = rest or "?"
    elif kind == "ci-runs":
        if not rest:
            errors.append(f"{where}: `ci-runs` needs the command line")
        b.ci_runs.append(rest)
    else:
        errors.append(f"{where}: unknown doc-check marker {kind!r} (use not-run or ci-runs)")


def strip_comment(line: str) -> str:
    """A shell line without its trailing `# comment` (quotes respected) and spaces."""
    out, quote = [], None
    for k, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (k == 0 or line[k - 1].isspace()):
            break
        out.append(c)
    return "".join(out).strip()


def command_lines(code: str) -> list[str]:
    """The block's commands, continuation lines joined, comments removed."""
    joined, cur = [], ""
    for raw in code.splitlines():
        line = strip_comment(raw)
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            joined.append(" ".join(cur.split()))
        cur = ""
    if cur.strip():
        joined.append(" ".join(cur.split()))
    return joined


def check_static(blocks: list[Block], errors: list[str]) -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_lines = {" ".join(strip_comment(x).split()) for x in ci}
    for b in blocks:
        if b.lang == "sh":
            r = subprocess.run(["bash", "-n"], input=b.code, text=True, capture_output=True)
            if r.returncode != 0:
                errors.append(f"{b.where}: bash -n: {r.stderr.strip()}")
        else:
            try:
                compile(b.code, b.where, "exec")
            except SyntaxError as e:
                errors.append(f"{b.where}: {e}")
        for cmd in b.ci_runs:
            if b.lang != "sh" or cmd not in command_lines(b.code):
                errors.append(f"{b.where}: ci-runs {cmd!r}: the block has no such command line")
            if cmd not in ci_lines:
                errors.append(f"{b.where}: ci-runs {cmd!r}: .ci/run has no such line")
        if b.not_run and b.ci_runs:
            errors.append(f"{b.where}: a not-run block needs no ci-runs marker")


def care_flags_used(code: str) -> list[tuple[str, list[str]]]:
    """(subcommand, [--flags]) of every `care SUB ...` command of a shell block."""
    out = []
    for cmd in command_lines(code):
        for part in re.split(r"\s*(?:&&|\|\||\||;)\s*", cmd):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            if len(words) >= 2 and words[0] == "care":
                flags = [w.split("=", 1)[0] for w in words[2:] if w.startswith("--")]
                out.append((words[1], flags))
    return out


def check_not_run_flags(blocks: list[Block], care: str | None, env: dict, errors: list[str]) -> None:
    for b in blocks:
        if not b.not_run or b.lang != "sh":
            continue
        for sub, flags in care_flags_used(b.code):
            if care is None:
                errors.append(f"{b.where}: no care binary to check `care {sub}` flags against")
                continue
            r = subprocess.run([care, sub, "--help"], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                errors.append(f"{b.where}: `care {sub}` is not a subcommand: {r.stderr.strip()}")
                continue
            for fl in flags:
                if not re.search(rf"(^|[\s,]){re.escape(fl)}([\s=,<]|$)", r.stdout, re.M):
                    errors.append(f"{b.where}: `care {sub}` has no flag {fl} (see care {sub} --help)")


def sources() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fresh_copy(dest: Path, target: Path) -> set[str]:
    """`dest` holds exactly the tree's files (tracked, and untracked but not ignored), with
    their modification times (so cargo's fingerprints stay valid), and `dest/target` is a link
    to the shared target directory."""
    dest.mkdir(parents=True, exist_ok=True)
    for child in dest.iterdir():
        if child.name == "target":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    copied = set()
    for rel in filter(None, listed):
        src = ROOT / rel
        if not src.is_file() or src.is_symlink():
            continue  # deleted in the working tree, or a link (none in this repository)
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
        copied.add(rel)
    link = dest / "target"
    target.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        if link.is_symlink() and Path(os.readlink(link)) == target:
            return copied
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        else:
            link.unlink()
    link.symlink_to(target)
    return copied


def left_behind(clone: Path, copied: set[str]) -> list[str]:
    """Files the blocks wrote into the copy that git would show as untracked (not ignored):
    what a newcomer following the docs would find cluttering their clone."""
    new = []
    for dirpath, dirnames, filenames in os.walk(clone):
        rel_dir = Path(dirpath).relative_to(clone)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d != "target"]
        for name in filenames:
            rel = str(rel_dir / name) if rel_dir != Path(".") else name
            if rel not in copied:
                new.append(rel)
    if not new:
        return []
    r = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT, input="\n".join(new) + "\n", capture_output=True, text=True,
    )  # fmt: skip
    ignored = set(r.stdout.split("\n"))
    return sorted(x for x in new if x not in ignored)


def sandbox_env(scratch: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARE_") and k != "CARGO_TARGET_DIR"}
    home = Path(os.environ.get("HOME", str(Path.home())))
    env.setdefault("CARGO_HOME", str(home / ".cargo"))
    env.setdefault("RUSTUP_HOME", str(home / ".rustup"))
    for d in ("home", "cache", "config", "data", "install/bin"):
        (scratch / d).mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(scratch / "home"),
        XDG_CACHE_HOME=str(scratch / "cache"),
        XDG_CONFIG_HOME=str(scratch / "config"),
        XDG_DATA_HOME=str(scratch / "data"),
        CARGO_INSTALL_ROOT=str(scratch / "install"),
        PATH=f"{scratch / 'install' / 'bin'}:{env.get('PATH', '')}",
    )
    return env


def isolation_works() -> bool:
    try:
        r = subprocess.run(
            ["unshare", "-rn", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=20
        )
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_block(b: Block, clone: Path, env: dict, python: str, isolate: bool, scratch: Path) -> tuple[bool, str]:
    script = scratch / "block"
    if b.lang == "sh":
        drop = set(b.ci_runs)
        kept = []
        for raw in b.code.splitlines():
            if " ".join(strip_comment(raw).split()) in drop:
                kept.append(f": ci-runs  # {raw.strip()}")
            else:
                kept.append(raw)
        script.write_text("\n".join(kept) + "\n")
        argv = ["bash", "-e", "-o", "pipefail", str(script)]
    else:
        script.write_text(b.code)
        argv = [python, str(script)]
    if isolate:
        inner = "ip link set lo up && exec " + " ".join(shlex.quote(a) for a in argv)
        argv = ["unshare", "-rn", "sh", "-c", inner]
        env = dict(env, CARGO_NET_OFFLINE="true")
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        ok = proc.returncode == 0
        note = "" if ok else f"exit status {proc.returncode}"
    except subprocess.TimeoutExpired:
        ok, note = False, f"timed out after {BLOCK_TIMEOUT_S} s"
        out = b""
    # A block must not leave a process behind (a server it forgot to stop); one it stopped
    # gets a few seconds to finish its shutdown.
    left = False
    deadline = time.monotonic() + 10
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            left = True
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    if left and ok:
        ok, note = False, "left a process running (stop what the block started)"
    proc.wait()
    text = out.decode("utf-8", "replace")
    took = time.monotonic() - started
    return ok, f"{note} ({took:.0f} s)\n{text[-6000:]}" if not ok else f"({took:.0f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-only", action="store_true", help="markers and syntax, run nothing")
    ap.add_argument("--list", action="store_true", help="list the blocks and what happens to each")
    ap.add_argument("--no-isolate", action="store_true", help="run without a network namespace")
    args = ap.parse_args()

    errors: list[str] = []
    blocks: list[Block] = []
    for p in sources():
        blocks += scan(p, errors)
    check_static(blocks, errors)
    if args.list:
        for b in blocks:
            what = f"not run: {b.not_run}" if b.not_run else "run" + (f" (CI runs: {'; '.join(b.ci_runs)})" if b.ci_runs else "")
            print(f"{b.where:28} {b.lang:6} {what}")
    if errors:
        print("doc-examples: " + "\n doc-examples: ".join(errors), file=sys.stderr)
        return 1
    if args.check_only or args.list:
        print(f"doc-examples: {len(blocks)} blocks, markers and syntax ok")
        return 0

    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target").resolve()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    clone = Path(os.environ.get("CARE_DOC_CLONE") or cache / "care-ci" / "doc-clone").resolve()
    python = os.environ.get("CARE_PYTHON") or "python3"
    copied = fresh_copy(clone, target)
    isolate = not args.no_isolate and isolation_works()
    print(f"doc-examples: {len(blocks)} blocks on a fresh copy at {clone} (target/ -> {target}); "
          + ("each in a network namespace with loopback only" if isolate
             else "NOT network-isolated (unshare -rn unavailable or --no-isolate)"))  # fmt: skip
    failed = 0
    with tempfile.TemporaryDirectory(prefix="care-doc-examples-") as tmp:
        scratch = Path(tmp)
        env = sandbox_env(scratch)
        for b in blocks:
            if b.not_run:
                print(f"  {b.where}: not run ({b.not_run}); syntax and care flags checked")
                continue
            ok, note = run_block(b, clone, env, python, isolate, scratch)
            print(f"  {b.where}: {'ok' if ok else 'FAILED'} {note}")
            failed += not ok
        care = shutil.which("care", path=env["PATH"])
        check_not_run_flags(blocks, care, env, errors)
    for rel in left_behind(clone, copied):
        errors.append(f"the examples leave {rel} in the tree, untracked and not ignored (write it under target/, or ignore it)")
    for e in errors:
        print(f"doc-examples: {e}", file=sys.stderr)
    if failed or errors:
        print(f"doc-examples: {failed} blocks failed, {len(errors)} marker errors", file=sys.stderr)
        return 1
    print(f"doc-examples: every example of the README and the docs' quick starts works")
    return 0


if __name__ == "__main__":
    sys.exit(main())
