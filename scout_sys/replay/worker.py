"""Replay worker: deterministic, seeded kernels on one device, a bitwise digest and a time each.

A self-contained script (standard library and torch only; it never imports scout_sys) that the
replay launcher runs with the *rank's own* interpreter, environment, CPU set and cgroups, so the
torch it imports and the kernels torch picks are the rank's. It never joins the job: it opens no
process group and touches none of the job's files.

Protocol (lines on stdin/stdout, one JSON object per output line)::

    argv[1] = JSON spec {"device": "cpu" | "cuda:0", "size": "default" | "small", "seed": int,
                         "reps": int, "memory_bytes": int, "checkpoint": path | null}
    out: {"event": "ready", "torch": ..., "torch_file": ..., "capability": ..., "threads": ...}
    in:  "go N"   ->  out: {"event": "round", "round": N, "kernels": {name: {"digest", "seconds",
                                                                           "stable"}}}
         ("seconds": wall time of the kernel's repetitions, digests excluded)
    in:  "quit" or end of input -> exits
    any failure -> out: {"event": "error", "error": "one line"}, exit status 3

Digests: the output's raw bytes are folded on the device (64-bit words XOR-folded to 256 words),
then the folded words, dtype and shape are hashed with 64-bit FNV-1a on the host. A result that
differs in one bit gives another digest. Inputs are small integers scaled by a power of two, so
they are bit-identical on every device whatever its random-number kernels.
"""

from __future__ import annotations

import json
import os
import sys
import time

FOLD_WORDS = 256
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1

# Kernel sizes: "default" takes the tuned (blocked, vectorised, multi-threaded) paths of real
# training; "small" is for tests (milliseconds per kernel).
SIZES = {
    "default": {"gemm": 1024, "gemm_gpu": 4096, "bmm": (32, 256, 256), "rows": 1024, "cols": 1024,
                "reduce": 1 << 22, "block": (4, 128, 256), "ckpt_rows": 256, "ckpt_max": 2048, "ckpt_tensors": 4},
    "small": {"gemm": 96, "gemm_gpu": 256, "bmm": (4, 32, 32), "rows": 64, "cols": 128,
              "reduce": 1 << 18, "block": (2, 16, 32), "ckpt_rows": 16, "ckpt_max": 96, "ckpt_tensors": 2},
}


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def fnv1a64(data: bytes, h: int = FNV_OFFSET) -> int:
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


def digest(torch, t) -> str:  # noqa: ANN001 (torch is the rank's module)
    """Fold ``t``'s bytes on its device to FOLD_WORDS 64-bit words, then FNV-1a 64 on the host."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % (8 * FOLD_WORDS)
    if pad:
        raw = torch.cat([raw, torch.zeros(pad, dtype=torch.uint8, device=raw.device)])
    words = raw.view(torch.int64).reshape(-1, FOLD_WORDS)
    rows = words.shape[0]
    p2 = 1 << (rows - 1).bit_length()
    if p2 != rows:
        words = torch.cat([words, torch.zeros(p2 - rows, FOLD_WORDS, dtype=torch.int64, device=words.device)])
    while words.shape[0] > 1:
        half = words.shape[0] // 2
        words = torch.bitwise_xor(words[:half], words[half:])
    h = fnv1a64(f"{t.dtype}|{tuple(t.shape)}|".encode())
    for w in words[0].cpu().tolist():
        h = fnv1a64((w & MASK64).to_bytes(8, "little"), h)
    return f"{h:016x}"


def combine(parts: list[str]) -> str:
    return f"{fnv1a64('|'.join(parts).encode()):016x}"


def exact_input(torch, gen, shape, dtype, device):  # noqa: ANN001
    """Integers in [-1024, 1024] / 1024: exactly representable, identical on every device."""
    x = torch.randint(-1024, 1025, shape, generator=gen, dtype=torch.int32)
    return (x.to(torch.float32) * (1.0 / 1024)).to(dtype).to(device)


def kernels(torch, spec: dict, dev, gen_seed: int) -> list:  # noqa: ANN001
    """(name, thunk) pairs; every thunk returns the tensor (or list of tensors) to digest."""
    F = torch.nn.functional
    sz = SIZES[spec.get("size", "default")]
    gpu = dev.type == "cuda"
    gen = torch.Generator().manual_seed(gen_seed)

    def inp(shape, dtype=torch.float32):
        return exact_input(torch, gen, shape, dtype, dev)

    out = []
    n = sz["gemm_gpu"] if gpu else sz["gemm"]
    gemm_dtypes = [torch.bfloat16, torch.float16, torch.float32] if gpu else [torch.float32]
    for dt in gemm_dtypes:
        a, b = inp((n, n), dt), inp((n, n), dt)
        out.append((f"gemm_{str(dt).replace('torch.', '')}", lambda a=a, b=b: a @ b))
    dt = torch.bfloat16 if gpu else torch.float32
    bb, bm, bn = sz["bmm"]
    x, y = inp((bb, bm, bn), dt), inp((bb, bn, bm), dt)
    out.append(("bmm", lambda: torch.bmm(x, y)))
    rows, cols = sz["rows"], sz["cols"]
    z = inp((rows, cols))
    w_ln, b_ln = inp((cols,)), inp((cols,))
    out.append(("softmax", lambda: torch.softmax(z * 4.0, dim=-1)))
    out.append(("layer_norm", lambda: F.layer_norm(z, (cols,), w_ln, b_ln)))
    out.append(("gelu", lambda: F.gelu(z * 3.0)))
    out.append(("silu", lambda: F.silu(z * 3.0)))
    # Scaled by a non-dyadic constant (one correctly rounded multiply: the same bits everywhere), so
    # the partial sums are inexact and their order (threads, vector width) shows in the result.
    r = inp((sz["reduce"],)) * 0.7310585786300049
    out.append(("reductions", lambda: torch.stack([r.sum(), r.abs().mean(), r.norm(), (r * r).sum()])))
    out.append(("block_fwd_bwd", _block(torch, inp, sz["block"], dt)))
    return out


def _block(torch, inp, shape, dtype):  # noqa: ANN001
    """A transformer-like block (layer norm, attention, GELU MLP) forward and backward."""
    F = torch.nn.functional
    batch, seq, d = shape
    params = {k: inp(s, dtype).requires_grad_(True) for k, s in (
        ("wqkv", (3 * d, d)), ("wo", (d, d)), ("w1", (4 * d, d)), ("w2", (d, 4 * d)))}
    x0 = inp((batch, seq, d), dtype)

    def run():
        for p in params.values():
            p.grad = None
        x = x0.clone().requires_grad_(True)
        h = F.layer_norm(x, (d,))
        q, k, v = F.linear(h, params["wqkv"] * 0.05).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d ** 0.5), dim=-1)
        x = x + F.linear(att @ v, params["wo"] * 0.05)
        h = F.layer_norm(x, (d,))
        x = x + F.linear(F.gelu(F.linear(h, params["w1"] * 0.05)), params["w2"] * 0.05)
        loss = (x.float() ** 2).mean()
        loss.backward()
        return [loss.detach()] + [params[k].grad for k in sorted(params)]

    return run


def checkpoint_kernels(torch, spec: dict, dev, gen_seed: int) -> tuple[list, list[str]]:  # noqa: ANN001
    """GEMMs with the checkpoint's own largest 2-D weights (bounded), read without pickle code."""
    path = spec.get("checkpoint")
    if not path:
        return [], []
    sz = SIZES[spec.get("size", "default")]
    notes: list[str] = []
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.endswith((".pt", ".pth", ".bin", ".safetensors")))
    tensors: dict[str, object] = {}
    for f in files[:1]:
        if f.endswith(".safetensors"):
            try:
                from safetensors.torch import load_file
            except ImportError:
                return [], [f"{f}: safetensors is not installed in the rank's environment"]
            tensors = dict(load_file(f))
        else:
            try:
                obj = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # noqa: BLE001 - the reason goes back as a note
                return [], [f"{f}: not loadable with weights_only=True ({str(e).splitlines()[0][:200]})"]
            flatten(torch, obj, "", tensors)
    if not files:
        return [], [f"{path}: no .pt/.pth/.bin/.safetensors file (DCP folders: use certify)"]
    mats = [(k, t) for k, t in tensors.items() if t.dim() == 2 and t.is_floating_point()]
    mats.sort(key=lambda kv: -kv[1].numel())
    gen = torch.Generator().manual_seed(gen_seed + 1)
    out = []
    cap = sz["ckpt_max"]
    for name, w in mats[: sz["ckpt_tensors"]]:
        w = w[:cap, :cap].to(dev).contiguous()
        x = exact_input(torch, gen, (sz["ckpt_rows"], w.shape[1]), w.dtype, dev)
        out.append((f"ckpt:{name}", lambda x=x, w=w: x @ w.t()))
    if not mats:
        notes.append(f"{path}: no 2-D floating tensor to replay")
    return out, notes


def flatten(torch, obj, prefix: str, out: dict) -> None:  # noqa: ANN001
    """Every tensor of a nested state dict, by dotted name (certify uses it too)."""
    if isinstance(obj, torch.Tensor):
        out[prefix or "<tensor>"] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten(torch, v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten(torch, v, f"{prefix}.{i}" if prefix else str(i), out)


def run_kernel(torch, fn, reps: int, sync) -> dict:  # noqa: ANN001
    """Run ``fn`` ``reps`` times: the first digest, whether every repetition gave it, and the time
    all repetitions took. A fixed amount of work over a wall clock, not the fastest repetition: a
    device held to a CPU quota runs some repetitions at full speed and waits between them."""
    digests, times = [], []
    for _ in range(max(1, reps)):
        sync()
        t0 = time.perf_counter()
        res = fn()
        sync()
        times.append(time.perf_counter() - t0)
        parts = res if isinstance(res, list) else [res]
        digests.append(combine([digest(torch, p) for p in parts]) if len(parts) > 1 else digest(torch, parts[0]))
    return {"digest": digests[0], "seconds": round(sum(times), 6), "stable": len(set(digests)) == 1}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        emit({"event": "error", "error": f"cannot import torch in the rank's environment: {e}"})
        return 3
    try:
        torch.use_deterministic_algorithms(True)
        dev = torch.device(spec.get("device", "cpu"))
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
            total = torch.cuda.get_device_properties(dev).total_memory
            if spec.get("memory_bytes"):
                torch.cuda.set_per_process_memory_fraction(min(1.0, spec["memory_bytes"] / total), dev)
            sync = lambda: torch.cuda.synchronize(dev)  # noqa: E731
            name = torch.cuda.get_device_name(dev)
        else:
            sync = lambda: None  # noqa: E731
            name = "cpu"
        seed = int(spec.get("seed", 1234))
        ks = kernels(torch, spec, dev, seed)
        ck, notes = checkpoint_kernels(torch, spec, dev, seed)
        ks += ck
    except Exception as e:  # noqa: BLE001 - one line back to the launcher
        emit({"event": "error", "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
        return 3
    cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
    emit({"event": "ready", "pid": os.getpid(), "uid": os.getuid(), "torch": torch.__version__, "torch_file": torch.__file__,
          "capability": cap, "threads": torch.get_num_threads(), "device": str(dev), "device_name": name,
          "kernels": [k for k, _ in ks], "notes": notes})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] != "go":
            continue
        rnd = int(cmd[1]) if len(cmd) > 1 else 0
        try:
            res = {name: run_kernel(torch, fn, int(spec.get("reps", 3)), sync) for name, fn in ks}
        except Exception as e:  # noqa: BLE001
            emit({"event": "error", "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
            return 3
        emit({"event": "round", "round": rnd, "kernels": res})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
