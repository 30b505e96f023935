"""care kernels vs torch eager vs torch.compile for the GRPO step (SPEC §9-10).

    python benches/gpu/compare_torch.py                # CUDA when torch sees a GPU, else CPU
    python benches/gpu/compare_torch.py --smoke        # small sizes (the CPU smoke check)
    python benches/gpu/compare_torch.py --out r.json   # also write every row as JSON

Needs torch, numpy and the care_rl package (`pip install ./python`, or the abi3 wheel that
`scripts/gpu-check.sh prepare` ships). For each size it reports the median time (CUDA events,
50 timed runs after warm-up on a GPU; wall clock on the CPU), bytes moved by the minimal algorithm,
effective GB/s, that as a percentage of the device-to-device copy bandwidth measured in the
same run, and the extra peak memory of one call (CUDA only). Every implementation's result is
checked against torch eager before it is timed.

Advantages: `(r - mean_g) / (std_g + eps)` per group, unbiased std, all-equal groups 0 (verl
preset numbers). Loss: token-mean clipped-ratio loss with `eps = 0.2`, clamp 20, padded `[B, L]`
layout with `L = 1024` and a response mask (first tenth masked), per-sequence advantages;
timed as forward + backward (the gradient w.r.t. `logp`).

Implementations named `care_rl.torch` go through the custom ops (`torch.ops.care.*`, what a
trainer calls); `care_rl._care direct` calls the extension function under the op with
preallocated buffers (no op dispatch, no allocation; on CUDA no synchronization): the closest
Python gets to a bare kernel launch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.dlpack import to_dlpack

try:
    import care_rl
    import care_rl.torch as ct
    from care_rl import _care
except ImportError as e:  # pragma: no cover - a setup error, said plainly
    sys.exit(f"compare_torch.py needs the care_rl package (pip install ./python): {e}")

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


def _dl(t):
    return None if t is None else to_dlpack(t)


def _stream(device) -> int:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def _workspace(device):
    if device.type != "cuda":
        return None
    return torch.empty(_care.WORKSPACE_BYTES // 4, dtype=torch.int32, device=device)


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
    opts = care_rl.advantage_options("verl")
    sizes = [8192, 65536] if args.smoke else [8192, 65536, 1 << 20, 1 << 22]
    for n in sizes:
        for g in (8, 16, 64):
            gen = torch.Generator().manual_seed(n + g)
            r = (torch.randint(0, 31, (n,), generator=gen).float() / 30).to(device)
            want = adv_torch(r, g)
            out = torch.empty_like(r)
            ws = _workspace(device)

            def care():
                _care.group_advantages(
                    _dl(r), _dl(out), opts, g, None, None, None, _stream(device), _dl(ws)
                )

            care()
            got_api = ct.advantages(r, group_size=g, preset="verl")
            if device.type == "cuda":
                torch.cuda.synchronize()
            torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(got_api, want, atol=2e-5, rtol=1e-4)
            impls = [
                ("torch eager", lambda: adv_torch(r, g)),
                ("care_rl.torch (op)", lambda: ct.advantages(r, group_size=g, preset="verl")),
                ("care_rl._care direct", care),
            ]
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
                         bytes=nbytes, model=nbytes if name.startswith("care_rl") else None, gbps=nbytes / t / 1e9, pct_copy=100 * nbytes / t / copy_bw,
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
            lc = ct.policy_loss(logp, old, adv, mask=mask)
            (gc,) = torch.autograd.grad(lc, logp)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert abs(lc.item() - le.item()) <= tol * max(1.0, abs(le.item())), (lc, le)
            torch.testing.assert_close(gc.float(), ge.float(), atol=tol / t * 10, rtol=tol)

            def eager():
                logp.grad = None
                loss_torch(logp, old, adv, mask).backward()

            def care_api():
                logp.grad = None
                ct.policy_loss(logp, old, adv, mask=mask).backward()

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
            launch, grad_direct = care_launch(logp, old, adv, mask)
            launch()
            torch.testing.assert_close(
                grad_direct.view(b, length).float(), ge.float(), atol=tol / t * 10, rtol=tol
            )
            impls.append(("care_rl._care direct (fwd, dL/dlogp)", launch))
            impls.append(("care_rl.torch fwd+bwd", care_api))

            def care_kl_cov():
                # KL-Cov: the same pass plus the covariance selection's pre-passes (the cost of
                # the call-wide top-k, to set against the row above).
                logp.grad = None
                ct.policy_loss(logp, old, adv, mask=mask, preset="verl_kl_cov").backward()

            impls.append(("care_rl.torch fwd+bwd, kl_cov", care_kl_cov))
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
                         bytes=nbytes, model=nbytes if name.startswith("care_rl") else None,
                         gbps=nbytes / sec / 1e9,
                         pct_copy=100 * nbytes / sec / copy_bw, vs_eager=base / sec,
                         peak_extra=peak_extra(device, fn))
                )  # fmt: skip
            # Free this size before the next one is allocated (64M tokens is GiBs).
            impls.clear()
            logp = old = mask = adv = ge = gc = None


def care_launch(logp, old, adv, mask):
    """The extension call under the loss op on preallocated buffers: loss and dL/dlogp (on CUDA
    in the log-prob dtype, with no statistics read and no synchronization; the host gradient is
    float32). Returns the call and the gradient buffer it writes."""
    device = logp.device
    t = logp.numel()
    b, length = logp.shape
    offs = (torch.arange(b + 1, device=device) * length).to(torch.int32)
    m = mask.reshape(-1)
    x = logp.detach().reshape(-1)
    o = old.reshape(-1)
    cuda = device.type == "cuda"
    grad = torch.empty(t, dtype=logp.dtype if cuda else torch.float32, device=device)
    stats_dtype = torch.float32 if device.type == "cuda" else torch.float64
    stats = torch.empty(len(_care.LOSS_STATS_FIELDS), dtype=stats_dtype, device=device)
    ws = _workspace(device)
    opts = care_rl.loss_options()

    def run():
        _care.policy_loss(
            _dl(x), _dl(adv), _dl(offs), _dl(grad), _dl(stats), opts, False, _dl(o), None,
            _dl(m), length, _stream(device), _dl(ws), grad_in_input_dtype=cuda,
        )  # fmt: skip

    return run, grad


# ---------------------------------------------------------------------------------------------
# Selective log-softmax (issue 10): logits [N, V] -> logp[N], forward and forward + backward.


def lsm_torch(x, y, t):
    """torch eager, as verl/TRL write it for f32: log_softmax + gather."""
    return torch.log_softmax(x.float() / t, dim=-1).gather(-1, y[:, None])[:, 0]


def lsm_torch_chunked(x, y, t, chunk=1024):
    """Row-chunked like the trainers (OpenRLHF/TRL loop over row blocks to bound memory)."""
    out = [lsm_torch(x[i : i + chunk], y[i : i + chunk], t) for i in range(0, x.shape[0], chunk)]
    return torch.cat(out)


def lsm_liger():
    """Liger Kernel's Triton forward (`fused_selective_log_softmax`, no gradient) and its
    fused GRPO loss (`triton_grpo_loss`), or (None, None) when Liger/Triton is not installed."""
    try:
        from liger_kernel.ops.grpo_loss import fused_selective_log_softmax
    except Exception as e:  # noqa: BLE001 - report and go on without the column
        print(f"# liger_kernel unavailable: {e}", file=sys.stderr)
        return None, None
    try:
        from liger_kernel.transformers.grpo_loss import triton_grpo_loss
    except Exception:  # noqa: BLE001
        triton_grpo_loss = None
    return fused_selective_log_softmax, triton_grpo_loss


def bench_logsoftmax(args, device, timer, copy_bw, rows):
    """`[8192, 151936]` and `[32768, 151936]` bf16 logits at temperature 0.6: the forward
    (logp of the targets) and forward + backward (dlogits in bf16), care against torch eager,
    row-chunked torch, torch.compile and Liger's Triton kernels (forward; and logits -> GRPO loss
    fwd+bwd), and logits -> GRPO loss -> dlogits by torch eager, care's three-kernel path and
    care's one-pass path (`logits_policy_loss_fused`, out of place and in place). `bytes` is the
    true minimum traffic of the op, whatever the implementation: the forward reads the logits
    once; forward + backward (and logits -> loss) reads them once and writes dlogits once (the
    one-pass kernel does; a separate backward reads them twice). `model` is what care's kernels
    move by the bytes model of docs/KERNELS.md (three kernels: 3 V per row for fwd + bwd; the
    one-pass path: 2 V), printed as a multiple of the minimum next to each time."""
    t_temp = 0.6
    v = 151936
    sizes = [(64, 1000), (256, 4099)] if args.smoke else [(8192, v), (32768, v)]
    compiled = maybe_compile(lsm_torch, args.compile)
    liger_fwd, liger_loss = lsm_liger() if device.type == "cuda" else (None, None)
    for n, vocab in sizes:
        dtype = torch.bfloat16
        gen = torch.Generator().manual_seed(n)
        # One spare row at the end: Liger's kernels take [B, L + 1, V] logits.
        full = (torch.randn(n + 1, vocab, generator=gen) * 2).to(dtype).to(device)
        x = full[:n]
        y = torch.randint(0, vocab, (n,), generator=gen).to(device)
        g = torch.randn(n, generator=gen).to(device)
        el = x.element_size()
        size = f"[{n}, {vocab}]"

        want = lsm_torch(x, y, t_temp)
        got = ct.selective_log_softmax(x, y, temperature=t_temp)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-5)

        # ---- forward
        impls = [
            ("torch eager", lambda: lsm_torch(x, y, t_temp)),
            ("torch chunked (1024 rows)", lambda: lsm_torch_chunked(x, y, t_temp)),
        ]
        if compiled is not None:
            try:
                torch.testing.assert_close(compiled(x, y, t_temp), want, atol=2e-4, rtol=1e-5)
                impls.append(("torch.compile", lambda: compiled(x, y, t_temp)))
            except Exception as e:  # noqa: BLE001
                print(f"# torch.compile failed for log-softmax: {e}", file=sys.stderr)
        if liger_fwd is not None:
            lx, ly = full.view(1, n + 1, vocab), y.view(1, n)
            try:
                lp_liger = liger_fwd(lx, ly, t_temp)[0]
                torch.testing.assert_close(lp_liger, want, atol=2e-4, rtol=1e-5)
                impls.append(("liger triton (fwd only)", lambda: liger_fwd(lx, ly, t_temp)))
            except Exception as e:  # noqa: BLE001
                print(f"# liger fused_selective_log_softmax failed: {e}", file=sys.stderr)
        launch, lp_direct, _ = lsm_care_launch(x, y, t_temp)
        launch()
        torch.testing.assert_close(lp_direct, want, atol=2e-4, rtol=1e-5)
        impls.append(("care_rl._care direct", launch))
        impls.append(("care_rl.torch", lambda: ct.selective_log_softmax(x, y, temperature=t_temp)))
        nbytes = n * vocab * el + 12 * n
        _lsm_rows(rows, impls, timer, device, copy_bw, "logsoftmax fwd", size, nbytes, nbytes)

        # ---- forward + backward (gradient w.r.t. the bf16 logits)
        xr = x.detach().clone().requires_grad_(True)

        def eager_fb():
            xr.grad = None
            (lsm_torch(xr, y, t_temp) * g).sum().backward()

        def chunked_fb():
            xr.grad = None
            (lsm_torch_chunked(xr, y, t_temp) * g).sum().backward()

        def care_fb():
            xr.grad = None
            lp = ct.selective_log_softmax(xr, y, temperature=t_temp)
            (lp * g).sum().backward()

        eager_fb()
        ge = xr.grad.float()
        care_fb()
        torch.testing.assert_close(xr.grad.float(), ge, atol=2e-3, rtol=2e-2)
        impls = [("torch eager", eager_fb), ("torch chunked (1024 rows)", chunked_fb)]
        if compiled is not None:

            def comp_fb():
                xr.grad = None
                (compiled(xr, y, t_temp) * g).sum().backward()

            try:
                comp_fb()
                impls.append(("torch.compile", comp_fb))
            except Exception as e:  # noqa: BLE001
                print(f"# torch.compile failed for log-softmax fwd+bwd: {e}", file=sys.stderr)
        launch, _, dlogits = lsm_care_launch(x, y, t_temp, g=g)
        launch()
        torch.testing.assert_close(dlogits.float(), ge, atol=2e-3, rtol=2e-2)
        impls.append(("care_rl._care direct (fwd + bwd)", launch))
        impls.append(("care_rl.torch", care_fb))
        xr.grad = None
        _lsm_rows(rows, impls, timer, device, copy_bw, "logsoftmax fwd+bwd", size,
                  2 * n * vocab * el + 16 * n, 3 * n * vocab * el + 16 * n)  # fmt: skip

        # ---- logits -> GRPO loss, forward + backward, as sequences of up to 1024 tokens:
        # torch eager, care's three-kernel path (ct.logits_policy_loss and its backward), care's
        # one-pass path (ct.logits_policy_loss_fused: one kernel reads each row once and writes
        # dlogits; out of place, in place, and the bare extension call), and Liger's fused loss
        # when installed (in place over its own copy of the logits).
        length = min(1024, n)
        b = n // length
        noise = 0.1 * torch.randn(b, length, generator=gen).to(device)
        old = (want.detach().view(b, length) + noise).float()
        adv = torch.randn(b, generator=gen).to(device)
        maskb = torch.ones(b, length, dtype=torch.bool, device=device)
        ids = y.view(b, length)
        xs = x.detach().view(b, length, vocab)

        def eager_loss_fb(xe):
            xe.grad = None
            lp = torch.log_softmax(xe.float() / t_temp, dim=-1).gather(-1, ids[..., None])[..., 0]
            loss_torch(lp, old, adv, maskb).backward()

        xe = xs.clone().requires_grad_(True)
        xc = xs.clone().requires_grad_(True)

        def care_three_fb():
            xc.grad = None
            ct.logits_policy_loss(xc, ids, old, adv, mask=maskb, temperature=t_temp).backward()

        def care_one_pass():
            return ct.logits_policy_loss_fused(xs, ids, old, adv, mask=maskb, temperature=t_temp)

        eager_loss_fb(xe)
        care_three_fb()
        ref = xe.grad.float()
        tol = dict(atol=2e-2 * ref.abs().max().item(), rtol=2e-2)
        torch.testing.assert_close(xc.grad.float(), ref, **tol)
        _, d1 = care_one_pass()
        torch.testing.assert_close(d1.float(), ref, **tol)
        impls = [("torch eager", lambda: eager_loss_fb(xe)),
                 ("care_rl.torch logits_policy_loss (3 kernels)", care_three_fb),
                 ("care_rl.torch logits_policy_loss_fused", care_one_pass)]  # fmt: skip
        if device.type == "cuda":
            xi = xs.clone()
            ct.logits_policy_loss_fused(xi, ids, old, adv, mask=maskb, temperature=t_temp, in_place=True)
            torch.testing.assert_close(xi, d1, atol=0, rtol=0)  # in place == out of place

            def care_in_place():
                # Each call overwrites the previous gradient: the same traffic, finite values.
                ct.logits_policy_loss_fused(xi, ids, old, adv, mask=maskb, temperature=t_temp, in_place=True)

            impls.append(("care_rl.torch logits_policy_loss_fused (in place)", care_in_place))
            impls.append(("care_rl._care direct (one pass)", fused_care_launch(xs, ids, old, adv, t_temp)))
        if liger_loss is not None:
            xl = torch.empty(b, length + 1, vocab, dtype=dtype, device=device)
            xl[:, :length] = xs
            xl[:, length] = 0
            lmask = maskb.to(torch.int32)

            def liger_fb():
                xl.grad = None
                out = liger_loss(xl.requires_grad_(True), old, None, ids, adv, lmask,
                                 temperature=t_temp, beta=0.0, eps_low=0.2, eps_high=0.2,
                                 inplace=True)  # fmt: skip
                (out[0] if isinstance(out, tuple) else out).backward()

            impls.insert(1, ("liger triton_grpo_loss (in place)", liger_fb))
        try:
            _lsm_rows(rows, impls, timer, device, copy_bw, "logits->loss fwd+bwd", size,
                      2 * n * vocab * el + 20 * n, 3 * n * vocab * el + 20 * n,
                      one_pass=2 * n * vocab * el + 20 * n)  # fmt: skip
        except Exception as e:  # noqa: BLE001
            print(f"# logits->loss comparison failed: {e}", file=sys.stderr)
        xe = xc = xi = xl = xs = None
        impls = []
        full = x = xr = None


def _lsm_rows(rows, impls, timer, device, copy_bw, op, size, nbytes, care_model, one_pass=None):
    """`nbytes`: the op's minimum traffic; `care_model`: the bytes care's kernels move by the
    model of docs/KERNELS.md (set on the care rows only); `one_pass`: that of the one-pass
    path, for the rows whose name says so."""
    base = None
    for name, fn in impls:
        sec = timer.median(fn)
        base = base or sec
        model = care_model if name.startswith("care_rl") else None
        if one_pass is not None and ("fused" in name or "one pass" in name):
            model = one_pass
        rows.append(
            dict(op=op, size=size, dtype="bfloat16", impl=name, secs=sec, bytes=nbytes,
                 model=model, gbps=nbytes / sec / 1e9, pct_copy=100 * nbytes / sec / copy_bw,
                 vs_eager=base / sec, peak_extra=peak_extra(device, fn))
        )  # fmt: skip


def lsm_care_launch(x, y, t, g=None):
    """The extension calls under the ops on preallocated buffers (no status read, on CUDA no
    synchronization): the forward, and with an upstream gradient `g` (d loss / d logp) also the
    backward pass into a preallocated dlogits (care_rl writes it out of place: outputs never
    alias inputs). Returns the call and its logp and dlogits (None without `g`) buffers."""
    device = x.device
    n, vocab = x.shape
    logp = torch.empty(n, dtype=torch.float32, device=device)
    lse = torch.empty_like(logp)
    dlogits = None if g is None else torch.empty_like(x)
    ws = _workspace(device)
    stream = _stream(device)

    def run():
        _care.selective_log_softmax(
            _dl(x), _dl(y), _dl(logp), _dl(lse), t, None, None, stream, _dl(ws)
        )
        if g is not None:
            _care.selective_log_softmax_backward(
                _dl(x), _dl(y), _dl(dlogits), _dl(lse), t, None, None, _dl(g), None, stream
            )

    return run, logp, dlogits


def fused_care_launch(x, ids, old, adv, t):
    """The extension call under `ct.logits_policy_loss_fused` on preallocated buffers (no op
    dispatch, no allocation, no status read): logits `[B, L, V]` to the statistics and dlogits
    in one kernel. Returns the call."""
    device = x.device
    b, length, vocab = x.shape
    x2 = x.reshape(-1, vocab)
    y = ids.reshape(-1)
    o = old.reshape(-1)
    offs = (torch.arange(b + 1, device=device) * length).to(torch.int32)
    dlogits = torch.empty_like(x2)
    stats = torch.empty(len(_care.LOSS_STATS_FIELDS), dtype=torch.float32, device=device)
    ws = _workspace(device)
    opts = care_rl.loss_options()
    stream = _stream(device)

    def run():
        _care.logits_policy_loss_fused(
            _dl(x2), _dl(y), _dl(adv), _dl(offs), _dl(stats), opts, False, t, _dl(o), None, None,
            _dl(dlogits), None, None, stream, _dl(ws),
        )  # fmt: skip

    return run


def print_rows(rows, device, copy_bw):
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke check)"
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {name}, "
        f"torch {torch.__version__}, care_rl {care_rl.__version__}, "
        f"copy bandwidth {copy_bw / 1e9:.1f} GB/s (read + write, measured in this run)\n"
    )
    print("GB/s and % copy BW count the op's minimum bytes; model / min is the traffic of care's")
    print("kernels by the bytes model of docs/KERNELS.md, as a multiple of that minimum.\n")
    print("| op | size | dtype | impl | median | min bytes | model / min | GB/s | % copy BW "
          "| vs eager | extra peak MiB |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        pk = "" if r["peak_extra"] is None else f"{r['peak_extra'] / 2**20:.1f}"
        model = r.get("model")
        mm = "" if model is None else f"{model / r['bytes']:.2f}x"
        print(
            f"| {r['op']} | {r['size']} | {r['dtype']} | {r['impl']} | {r['secs'] * 1e3:.3f} ms "
            f"| {r['bytes'] / 1e6:.1f} MB | {mm} | {r['gbps']:.1f} | {r['pct_copy']:.0f}% "
            f"| {r['vs_eager']:.2f}x | {pk} |"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="small sizes, few iterations")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--iters", type=int, default=None, help="timed runs (50 on CUDA, 5 on CPU)")
    ap.add_argument("--only", choices=["advantages", "loss", "logsoftmax"], default=None)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not ct.gpu_available():
        sys.exit("care_rl reports no usable GPU (no CUDA driver for the care kernels)")
    iters = args.iters or (50 if cuda else (3 if args.smoke else 5))
    timer = Timer(device, iters, warmup=5 if cuda else 2)
    copy_bw = copy_bandwidth(device, timer, (1 << 30) if cuda and not args.smoke else (1 << 26))
    rows = []
    if args.only in (None, "advantages"):
        bench_advantages(args, device, timer, copy_bw, rows)
    if args.only in (None, "loss"):
        bench_loss(args, device, timer, copy_bw, rows)
    if args.only in (None, "logsoftmax"):
        bench_logsoftmax(args, device, timer, copy_bw, rows)
    print_rows(rows, device, copy_bw)
    if args.out:
        Path(args.out).write_text(
            json.dumps({"device": str(device), "copy_bw": copy_bw, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
