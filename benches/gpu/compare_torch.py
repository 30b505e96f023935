"""care kernels vs torch eager vs torch.compile for the GRPO step (SPEC §9-10).

    python benches/gpu/compare_torch.py                # CUDA when torch sees a GPU, else CPU
    python benches/gpu/compare_torch.py --smoke        # small sizes (the CPU smoke check)
    python benches/gpu/compare_torch.py --out r.json   # also write every row as JSON

Needs torch and numpy in the Python environment and libcare (`cargo build --release -p
care-ffi`, or `CARE_LIB`). For each size it reports the median time (CUDA events, 50 timed
runs after warm-up on a GPU; wall clock on the CPU), bytes moved by the minimal algorithm,
effective GB/s, that as a percentage of the device-to-device copy bandwidth measured in the
same run, and the extra peak memory of one call (CUDA only). Every implementation's result is
checked against torch eager before it is timed.

Advantages: `(r - mean_g) / (std_g + eps)` per group, unbiased std, all-equal groups 0 (verl
preset numbers). Loss: token-mean clipped-ratio loss with `eps = 0.2`, clamp 20, padded `[B, L]`
layout with `L = 1024` and a response mask (first tenth masked), per-sequence advantages;
timed as forward + backward (the gradient w.r.t. `logp`).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import care_torch  # noqa: E402
from care_torch import _lib  # noqa: E402

EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# The formulas with tensor ops (what a trainer writes today)


def adv_torch(r, g: int):
    x = r.view(-1, g)
    mean = x.mean(dim=1, keepdim=True)
    std = x.std(dim=1, keepdim=True)  # unbiased, as every anchor
    a = (x - mean) / (std + EPS)
    same = (x == x[:, :1]).all(dim=1, keepdim=True)
    return torch.where(same, torch.zeros_like(a), a).view(-1)


def loss_torch(logp, logp_old, adv_seq, mask):
    delta = torch.clamp(logp.float() - logp_old.float(), -20.0, 20.0)
    rho = torch.exp(delta)
    a = adv_seq[:, None]
    pg1 = -a * rho
    pg2 = -a * torch.clamp(rho, 0.8, 1.2)
    m = mask.float()
    return (torch.maximum(pg1, pg2) * m).sum() / m.sum()


# ---------------------------------------------------------------------------------------------
# Timing


class Timer:
    def __init__(self, device, iters, warmup):
        self.cuda = device.type == "cuda"
        self.iters, self.warmup = iters, warmup

    def median(self, fn):
        for _ in range(self.warmup):
            fn()
        times = []
        if self.cuda:
            torch.cuda.synchronize()
            for _ in range(self.iters):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) / 1e3)
        else:
            for _ in range(self.iters):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def peak_extra(device, fn):
    """Extra peak bytes allocated by one call (CUDA only; None on the CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - base


def copy_bandwidth(device, timer, nbytes):
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    t = timer.median(lambda: y.copy_(x))
    return 2 * nbytes / t  # read + write


# ---------------------------------------------------------------------------------------------


def maybe_compile(fn, enabled):
    if not enabled:
        return None
    try:
        return torch.compile(fn, dynamic=False)
    except Exception as e:  # noqa: BLE001 - report and go on without the compiled column
        print(f"# torch.compile unavailable: {e}", file=sys.stderr)
        return None


def bench_advantages(args, device, timer, copy_bw, rows):
    compiled = maybe_compile(adv_torch, args.compile)
    lib = _lib.lib()
    sizes = [8192, 65536] if args.smoke else [8192, 65536, 1 << 20, 1 << 22]
    for n in sizes:
        for g in (8, 16, 64):
            gen = torch.Generator().manual_seed(n + g)
            r = (torch.randint(0, 31, (n,), generator=gen).float() / 30).to(device)
            want = adv_torch(r, g)
            out = torch.empty_like(r)
            opts = _lib.advantage_options("verl")
            if device.type == "cuda":
                ws = torch.empty(16, dtype=torch.int32, device=device)

                def care():
                    stream = torch.cuda.current_stream(device).cuda_stream
                    _lib.check(
                        lib.care_gpu_group_advantages(
                            r.data_ptr(), n, None, 0, g, None, 0, ctypes.byref(opts),
                            out.data_ptr(), n, None, 0, ws.data_ptr(), 64, stream,
                        ),
                        "care_gpu_group_advantages",
                    )  # fmt: skip
            else:

                def care():
                    _lib.check(
                        lib.care_group_advantages(
                            r.data_ptr(), n, None, 0, g, None, 0, ctypes.byref(opts),
                            out.data_ptr(), n, None, 0,
                        ),
                        "care_group_advantages",
                    )  # fmt: skip

            care()
            got_api = care_torch.advantages(r, group_size=g, preset="verl")
            if device.type == "cuda":
                torch.cuda.synchronize()
            torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(got_api, want, atol=2e-5, rtol=1e-4)
            impls = [("torch eager", lambda: adv_torch(r, g)), ("care", care)]
            if compiled is not None:
                torch.testing.assert_close(compiled(r, g), want, atol=2e-5, rtol=1e-4)
                impls.insert(1, ("torch.compile", lambda: compiled(r, g)))
            nbytes = 8 * n  # read r, write A (f32)
            base = None
            for name, fn in impls:
                t = timer.median(fn)
                base = base or t
                rows.append(
                    dict(op="advantages", size=f"N={n} G={g}", dtype="f32", impl=name, secs=t,
                         bytes=nbytes, gbps=nbytes / t / 1e9, pct_copy=100 * nbytes / t / copy_bw,
                         vs_eager=base / t, peak_extra=peak_extra(device, fn))
                )  # fmt: skip


def bench_loss(args, device, timer, copy_bw, rows):
    compiled_fn = maybe_compile(loss_torch, args.compile)
    length = 1024
    sizes = [1 << 16, 1 << 20] if args.smoke else [1 << 20, 1 << 22, 1 << 24, 1 << 26]
    for t in sizes:
        for dtype in (torch.float32, torch.bfloat16):
            b = t // length
            gen = torch.Generator().manual_seed(t)
            logp0 = -torch.rand(b, length, generator=gen) * 4
            old = (logp0 + 0.15 * torch.randn(b, length, generator=gen)).to(dtype).to(device)
            # A copy: `.to` may return logp0 itself, and old must not share its autograd graph.
            logp = logp0.to(dtype).to(device).clone().requires_grad_(True)
            mask = torch.ones(b, length, dtype=torch.bool)
            mask[:, : length // 10] = False
            mask = mask.to(device)
            adv = torch.randn(b, generator=gen).to(device)

            # Correctness once: care's loss and gradient against eager autograd.
            le = loss_torch(logp, old, adv, mask)
            (ge,) = torch.autograd.grad(le, logp)
            lc = care_torch.policy_loss(logp, old, adv, mask=mask)
            (gc,) = torch.autograd.grad(lc, logp)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert abs(lc.item() - le.item()) <= tol * max(1.0, abs(le.item())), (lc, le)
            torch.testing.assert_close(gc.float(), ge.float(), atol=tol / t * 10, rtol=tol)

            def eager():
                logp.grad = None
                loss_torch(logp, old, adv, mask).backward()

            def care_api():
                logp.grad = None
                care_torch.policy_loss(logp, old, adv, mask=mask).backward()

            impls = [("torch eager", eager)]
            if compiled_fn is not None:

                def comp():
                    logp.grad = None
                    compiled_fn(logp, old, adv, mask).backward()

                try:
                    comp()
                    impls.append(("torch.compile", comp))
                except Exception as e:  # noqa: BLE001
                    print(f"# torch.compile failed for the loss: {e}", file=sys.stderr)
            if device.type == "cuda":
                impls.append(("care kernel (launch only)", care_launch(logp, old, adv, mask)))
            impls.append(("care_torch fwd+bwd", care_api))
            el = logp.element_size()
            # Minimal traffic: read logp, logp_old, mask, write grad (input dtype); per-seq adv.
            nbytes = t * (2 * el + 1 + el) + 4 * b
            base = None
            for name, fn in impls:
                sec = timer.median(fn)
                base = base or sec
                rows.append(
                    dict(op="loss fwd+bwd", size=f"T={t >> 20 or t}{'M' if t >= 1 << 20 else ''}",
                         dtype=str(dtype).replace("torch.", ""), impl=name, secs=sec,
                         bytes=nbytes, gbps=nbytes / sec / 1e9,
                         pct_copy=100 * nbytes / sec / copy_bw, vs_eager=base / sec,
                         peak_extra=peak_extra(device, fn))
                )  # fmt: skip
            # Free this size before the next one is allocated (64M tokens is GiBs).
            impls.clear()
            logp = old = mask = adv = ge = gc = None


def care_launch(logp, old, adv, mask):
    """The bare kernel call on preallocated buffers (no stats read, so no synchronization)."""
    lib = _lib.lib()
    device = logp.device
    t = logp.numel()
    b, length = logp.shape
    code, _ = {torch.float32: (0, 0), torch.bfloat16: (1, 0), torch.float16: (2, 0)}[logp.dtype]
    offs = (torch.arange(b + 1, device=device) * length).to(torch.int32)
    m = mask.reshape(-1).to(torch.uint8)
    grad = torch.empty(t, dtype=logp.dtype, device=device)
    stats = torch.empty(14, dtype=torch.int32, device=device)
    ws = torch.empty(16, dtype=torch.int32, device=device)
    opts = _lib.loss_options()
    stream = torch.cuda.current_stream(device).cuda_stream
    _lib.check(lib.care_gpu_loss_stats_reset(stats.data_ptr(), 56, stream), "stats reset")
    x = logp.detach()

    def run():
        _lib.check(
            lib.care_gpu_policy_loss(
                code, x.data_ptr(), t, old.data_ptr(), t, None, 0, offs.data_ptr(), b + 1,
                m.data_ptr(), t, adv.data_ptr(), b, _lib.ADV_PER_SEQUENCE, ctypes.byref(opts),
                length, grad.data_ptr(), t, 1, stats.data_ptr(), 56, ws.data_ptr(), 64, stream,
            ),
            "care_gpu_policy_loss",
        )  # fmt: skip

    return run


def print_rows(rows, device, copy_bw):
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke check)"
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {name}, "
        f"torch {torch.__version__}, "
        f"copy bandwidth {copy_bw / 1e9:.1f} GB/s (read + write, measured in this run)\n"
    )
    print("| op | size | dtype | impl | median | GB/s | % copy BW | vs eager | extra peak MiB |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        pk = "" if r["peak_extra"] is None else f"{r['peak_extra'] / 2**20:.1f}"
        print(
            f"| {r['op']} | {r['size']} | {r['dtype']} | {r['impl']} | {r['secs'] * 1e3:.3f} ms "
            f"| {r['gbps']:.1f} | {r['pct_copy']:.0f}% | {r['vs_eager']:.2f}x | {pk} |"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="small sizes, few iterations")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--iters", type=int, default=None, help="timed runs (50 on CUDA, 5 on CPU)")
    ap.add_argument("--only", choices=["advantages", "loss"], default=None)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not care_torch.gpu_available():
        sys.exit("libcare reports no usable GPU (care_gpu_available)")
    iters = args.iters or (50 if cuda else (3 if args.smoke else 5))
    timer = Timer(device, iters, warmup=5 if cuda else 2)
    copy_bw = copy_bandwidth(device, timer, (1 << 30) if cuda and not args.smoke else (1 << 26))
    rows = []
    if args.only in (None, "advantages"):
        bench_advantages(args, device, timer, copy_bw, rows)
    if args.only in (None, "loss"):
        bench_loss(args, device, timer, copy_bw, rows)
    print_rows(rows, device, copy_bw)
    if args.out:
        Path(args.out).write_text(
            json.dumps({"device": str(device), "copy_bw": copy_bw, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
