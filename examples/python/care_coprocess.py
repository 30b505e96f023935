"""Drive `care` as a co-process from a training loop: one JSON line in, one JSON line out.

`care` answers each line as soon as it has read it, even while stdin stays open, so a trainer can
keep one process for the whole run instead of starting one per step. Standard library only.

    python3 examples/python/care_coprocess.py            # `care` on the PATH
    CARE=target/release/care python3 examples/python/care_coprocess.py

Each step below sends one GRPO batch of rewards and reads its advantages back. Output lines carry
the input's "id" byte for byte, so answers can be matched to requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


class Care:
    """One long-lived `care <subcommand>` process: `ask` writes one line and reads its answer."""

    def __init__(self, *args: str, binary: str | None = None) -> None:
        binary = binary or os.environ.get("CARE", "care")
        self.proc = subprocess.Popen(
            [binary, *args, "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,  # line-buffered: each request leaves at its newline
        )

    def ask(self, request: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"care exited with status {self.proc.wait()}")
        return json.loads(answer)

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait()


def main() -> int:
    care = Care("advantages", "--preset", "verl")
    try:
        for step in range(3):
            rewards = [1.0, 0.0, 0.5, 0.25 * step]
            answer = care.ask({"id": f"step-{step}", "rewards": rewards, "group_size": 2})
            if "error" in answer:
                print(f"step {step}: {answer['error']['code']}: {answer['error']['message']}")
                continue
            adv = ", ".join(f"{a:+.4f}" for a in answer["advantages"])
            print(f"{answer['id']}: advantages [{adv}]")
    finally:
        status = care.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
