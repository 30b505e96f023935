#!/usr/bin/env python3
"""Generate kernels/ptx/*.ptx from kernels/cuda/*.cu with NVRTC, and check them with ptxas.

Run through scripts/gen-ptx.sh, which installs the pinned wheels (nvidia-cuda-nvrtc-cu12 and
nvidia-cuda-nvcc-cu12 12.2.140) into the gitignored .venv-ptx and runs this file with its python.

    gen-ptx.py            write kernels/ptx/<name>.ptx for every kernels/cuda/<name>.cu
    gen-ptx.py --check    regenerate into memory and fail on any difference with the files
    gen-ptx.py --ptxas    assemble every checked-in .ptx for sm_90 and sm_80 with ptxas -v, print
                          registers per kernel, fail on any spill, on an entry without launch
                          bounds and on registers beyond the bounds' budget

Why NVRTC 12.2: it emits PTX ISA 8.2, which the CUDA 12.2+ drivers (and the CUDA 13.0 driver of
the H200 machine) load; PTX from CUDA 13.1+ would not load there. compute_80 keeps the PTX valid
on sm_80 and newer; the driver JIT-compiles it for the actual GPU on first load.
"""
import ctypes
import difflib
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CUDA_DIR = ROOT / "kernels" / "cuda"
PTX_DIR = ROOT / "kernels" / "ptx"
OPTIONS = [b"--gpu-architecture=compute_80", b"-default-device", b"--std=c++17"]


def nvidia_dir() -> pathlib.Path:
    import nvidia  # namespace package installed by the pinned wheels

    return pathlib.Path(list(nvidia.__path__)[0])


def load_nvrtc() -> ctypes.CDLL:
    lib = nvidia_dir() / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    nvrtc = ctypes.CDLL(str(lib))
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    if (major.value, minor.value) != (12, 2):
        sys.exit(f"gen-ptx: expected NVRTC 12.2, found {major.value}.{minor.value}")
    return nvrtc


def compile_ptx(nvrtc: ctypes.CDLL, cu: pathlib.Path) -> str:
    # Headers are handed to NVRTC by name: the sources use no include paths at all.
    headers = sorted(CUDA_DIR.glob("*.cuh"))
    n = len(headers)
    hdr_src = (ctypes.c_char_p * n)(*[h.read_bytes() for h in headers])
    hdr_names = (ctypes.c_char_p * n)(*[h.name.encode() for h in headers])
    prog = ctypes.c_void_p()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), cu.read_bytes(),
                                          cu.name.encode(), n, hdr_src, hdr_names))
    opts = (ctypes.c_char_p * len(OPTIONS))(*OPTIONS)
    rc = nvrtc.nvrtcCompileProgram(prog, len(OPTIONS), opts)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace").strip()
    if rc != 0:
        sys.exit(f"gen-ptx: NVRTC failed on {cu.name}:\n{text}")
    if text:
        print(f"gen-ptx: NVRTC log for {cu.name}:\n{text}", file=sys.stderr)
    check(nvrtc, nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)))
    buf = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf))
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.value.decode()


def check(nvrtc: ctypes.CDLL, rc: int) -> None:
    if rc != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"gen-ptx: NVRTC error {rc}: {nvrtc.nvrtcGetErrorString(rc).decode()}")


def sources() -> list:
    return sorted(CUDA_DIR.glob("*.cu"))


def generate(check_only: bool) -> int:
    nvrtc = load_nvrtc()
    PTX_DIR.mkdir(exist_ok=True)
    stale = 0
    for cu in sources():
        ptx = compile_ptx(nvrtc, cu)
        out = PTX_DIR / (cu.stem + ".ptx")
        if check_only:
            old = out.read_text() if out.exists() else ""
            if old != ptx:
                stale += 1
                diff = difflib.unified_diff(old.splitlines(), ptx.splitlines(),
                                            str(out), "regenerated", lineterm="", n=1)
                print("\n".join(list(diff)[:40]))
                print(f"gen-ptx: {out.relative_to(ROOT)} is stale")
            else:
                print(f"gen-ptx: {out.relative_to(ROOT)} is fresh")
        else:
            out.write_text(ptx)
            print(f"gen-ptx: wrote {out.relative_to(ROOT)} ({len(ptx)} bytes)")
    for ptx in sorted(PTX_DIR.glob("*.ptx")):
        if not (CUDA_DIR / (ptx.stem + ".cu")).exists():
            stale += 1
            print(f"gen-ptx: {ptx.relative_to(ROOT)} has no source")
    if stale:
        print("gen-ptx: run scripts/gen-ptx.sh and commit kernels/ptx/")
    return 1 if stale else 0


def launch_bounds(ptx_text: str) -> dict:
    """{entry: (maxntid, minnctapersm)} from the PTX directives after each .entry."""
    out = {}
    for m in re.finditer(r"\.entry (\w+)\((.*?)\)\s*\n((?:\.\w+[^\n]*\n)*)", ptx_text, re.S):
        nt = re.search(r"\.maxntid (\d+), 1, 1", m.group(3))
        mb = re.search(r"\.minnctapersm (\d+)", m.group(3))
        out[m.group(1)] = (int(nt.group(1)) if nt else None, int(mb.group(1)) if mb else None)
    return out


def ptxas() -> int:
    """Assembles every checked-in PTX for sm_90 and sm_80 with ptxas -v: a spill on either, an
    entry without launch bounds, or registers beyond the bounds' budget
    (65536 / (threads * min_blocks), in multiples of 8) fail. Prints registers per entry."""
    exe = nvidia_dir() / "cuda_nvcc" / "bin" / "ptxas"
    failed = 0
    for arch in ("sm_90", "sm_80"):
        for ptx in sorted(PTX_DIR.glob("*.ptx")):
            bounds = launch_bounds(ptx.read_text())
            with tempfile.TemporaryDirectory() as tmp:
                proc = subprocess.run([str(exe), f"-arch={arch}", "-v", "-O3", str(ptx),
                                       "-o", os.path.join(tmp, "out.cubin")],
                                      capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr)
                print(f"ptxas {arch}: {ptx.name} failed to assemble")
                failed += 1
                continue
            kernel, spills = None, 0
            for line in (proc.stdout + proc.stderr).splitlines():
                m = re.search(r"Compiling entry function '(\w+)'", line)
                if m:
                    kernel = m.group(1)
                m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
                if m:
                    spills = int(m.group(1)) + int(m.group(2))
                    if spills:
                        failed += 1
                        print(f"ptxas {arch}: {ptx.name} {kernel}: SPILLS {line.strip()}")
                m = re.search(r"Used (\d+) registers", line)
                if m:
                    regs = int(m.group(1))
                    threads, blocks = bounds.get(kernel, (None, None))
                    if threads is None or blocks is None:
                        failed += 1
                        print(f"ptxas {arch}: {ptx.name} {kernel}: no __launch_bounds__(threads, "
                              "min_blocks)")
                        continue
                    budget = min(255, 65536 // (threads * blocks)) // 8 * 8
                    if regs > budget:
                        failed += 1
                        print(f"ptxas {arch}: {ptx.name} {kernel}: {regs} registers over the "
                              f"budget {budget}")
                    rest = line.split(",", 1)[1].strip() if "," in line else ""
                    print(f"ptxas {arch}: {ptx.name:16} {kernel:24} {regs:>3} registers "
                          f"(budget {budget:>3}: {threads} threads x {blocks} blocks/SM), "
                          f"{spills} bytes spilled, {rest}")
    if failed:
        print(f"ptxas: {failed} failure(s) (spills, registers over budget, missing launch "
              "bounds or assembly errors)")
    else:
        print("ptxas: every entry assembles for sm_90 and sm_80 without spills, within its "
              "register budget")
    return 1 if failed else 0


def main() -> int:
    args = sys.argv[1:]
    if args == ["--ptxas"]:
        return ptxas()
    if args == ["--check"]:
        return generate(check_only=True)
    if not args:
        return generate(check_only=False)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
