"""Each Triton kernel against the equivalent composition of torch operations, on a GPU.

    python benchmarks/kernels.py [--quick] [--markdown docs/gpu.md]

Production sizes (K = 2048, max_model_len 32K-128K, up to 1024 rows), timed
with CUDA events by ``triton.testing.do_bench`` (median of many runs after
warm-up, L2 flushed between runs). Memory-bound kernels also report achieved
bandwidth (bytes that must move: each input read once, each output written
once) against a device-to-device copy measured in the same run. The torch
composition is checked against the kernel's output before it is timed, so a
row of this table never compares two different computations.

Needs a CUDA device: the Triton interpreter measures Python, not kernels.
``--markdown FILE`` rewrites the section ``kernels:cuda`` of FILE with the table.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from _common import table
from _markdown import command_line, write_section

GiB = 1 << 30


@dataclass
class Row:
    kernel: str
    shape: str
    triton_us: float
    torch_us: float
    moved_bytes: int | None = None  # None: compute-bound, no bandwidth column

    def cells(self, copy_gbps: float) -> list[str]:
        bw = "-"
        if self.moved_bytes is not None:
            gbps = self.moved_bytes / (self.triton_us * 1e-6) / 1e9
            bw = f"{gbps:.0f} GB/s ({100 * gbps / copy_gbps:.0f}%)"
        return [
            self.kernel,
            self.shape,
            f"{self.triton_us:.1f}",
            f"{self.torch_us:.1f}",
            f"{self.torch_us / self.triton_us:.2f}x",
            bw,
        ]


def bench_us(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return 1e3 * do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy, counting bytes read and written."""
    src = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = bench_us(lambda: dst.copy_(src))
    return 2 * GiB / (us * 1e-6) / 1e9


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


# ---------------------------------------------------------------------------
# one function per kernel: build inputs, check torch == triton, time both
# ---------------------------------------------------------------------------


def top_k(rows: int, n: int, k: int) -> Row:
    from attnfuzz.kernels.indexer_ops import top_k_per_row

    g = gen(0)
    # Integer-valued logits: many ties, as the indexer's real scores have.
    logits = torch.randint(-64, 64, (rows, n), generator=g, device="cuda").float()
    lengths = torch.randint(1, n + 1, (rows,), generator=g, device="cuda", dtype=torch.int32)
    cols = torch.arange(n, device="cuda")

    def composed() -> torch.Tensor:
        masked = logits.masked_fill(cols[None, :] >= lengths[:, None], float("-inf"))
        values, idx = masked.topk(k, dim=1)
        return torch.where(values == float("-inf"), -1, idx).to(torch.int32)

    got = top_k_per_row(logits, lengths, k)
    want = composed()
    # Same selected logits per row (order and ties are free), same -1 count.
    pick = lambda ix: torch.where(ix >= 0, logits.gather(1, ix.clamp(min=0).long()), -1e9)  # noqa: E731
    assert torch.equal(pick(got).sort(1).values, pick(want).sort(1).values), "top-k differs"
    return Row(
        "top_k_per_row",
        f"{rows} x {n}, K={k}",
        bench_us(lambda: top_k_per_row(logits, lengths, k)),
        bench_us(composed),
        rows * n * 4 + rows * 4 + rows * k * 4,
    )


def paged_logits(batch: int, decode_len: int, max_model_len: int, heads: int, dim: int) -> Row:
    from attnfuzz.kernels.indexer_ops import paged_mqa_logits

    g = gen(1)
    bs = 64
    width = max_model_len // bs
    num_blocks = batch * width
    dtype = torch.bfloat16
    q = torch.randint(-2, 3, (batch, decode_len, heads, dim), generator=g, device="cuda").to(dtype)
    w = torch.randint(-2, 3, (batch, decode_len, heads), generator=g, device="cuda").to(dtype)
    kv = torch.randint(-2, 3, (num_blocks, bs, dim), generator=g, device="cuda").to(dtype)
    table_ = torch.randperm(num_blocks, generator=g, device="cuda").view(batch, width).int()
    seq = torch.randint(max_model_len // 2, max_model_len + 1, (batch,), generator=g, device="cuda")
    j = torch.arange(decode_len, device="cuda")
    ctx = (seq[:, None] - decode_len + 1 + j[None, :]).clamp(min=0).int().contiguous()
    keys_pos = torch.arange(max_model_len, device="cuda")

    def composed() -> torch.Tensor:
        keys = kv[table_.long()].view(batch, max_model_len, dim)  # gather every page
        s = torch.einsum("blhd,bmd->blhm", q.float(), keys.float()).relu_()
        out = torch.einsum("blhm,blh->blm", s, w.float())
        out = out.masked_fill(keys_pos[None, None, :] >= ctx[:, :, None], float("-inf"))
        return out.view(batch * decode_len, max_model_len)

    got = paged_mqa_logits(q, kv, w, ctx, table_, max_model_len)
    torch.testing.assert_close(got, composed())  # integer data: exact in fp32
    flops = 2 * int(ctx.sum()) * heads * dim
    row = Row(
        "paged_mqa_logits (bf16 in)",
        f"B={batch} L={decode_len} M={max_model_len} H={heads} D={dim}",
        bench_us(lambda: paged_mqa_logits(q, kv, w, ctx, table_, max_model_len)),
        bench_us(composed),
    )
    row.shape += f", {flops / (row.triton_us * 1e-6) / 1e12:.1f} TFLOP/s"
    return row


def pack_unpack(batch: int, decode_len: int, heads: int, dim: int) -> list[Row]:
    from attnfuzz.kernels.indexer_ops import pack_seq, unpack_seq

    g = gen(2)
    d = torch.randint(1, decode_len + 1, (batch,), generator=g, device="cuda", dtype=torch.int32)
    qsl = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    qsl[1:] = d.cumsum(0)
    tokens = int(qsl[-1])
    x = torch.randn(tokens, heads, dim, generator=g, device="cuda", dtype=torch.bfloat16)
    b_idx = torch.repeat_interleave(torch.arange(batch, device="cuda"), d.long())
    j_idx = torch.arange(tokens, device="cuda") - qsl[:-1].long()[b_idx]

    def pack_torch() -> torch.Tensor:
        out = x.new_zeros((batch, decode_len, heads, dim))
        out[b_idx, j_idx] = x
        return out

    packed = pack_seq(x, qsl, d, decode_len)
    assert torch.equal(packed, pack_torch()), "pack differs"
    assert torch.equal(unpack_seq(packed, qsl, d, tokens), x), "unpack differs"
    elem = x.element_size() * heads * dim
    shape = f"B={batch} L={decode_len} H={heads} D={dim} bf16"
    return [
        Row(
            "pack_seq",
            shape,
            bench_us(lambda: pack_seq(x, qsl, d, decode_len)),
            bench_us(pack_torch),
            tokens * elem + batch * decode_len * elem,
        ),
        Row(
            "unpack_seq",
            shape,
            bench_us(lambda: unpack_seq(packed, qsl, d, tokens)),
            bench_us(lambda: packed[b_idx, j_idx]),
            2 * tokens * elem,
        ),
    ]


def write_back(rows: int, k: int) -> Row:
    from attnfuzz.kernels.indexer_ops import write_rows

    g = gen(3)
    buffer = torch.full((2 * rows, k), -7, dtype=torch.int32, device="cuda")
    src = torch.randint(0, 1 << 20, (rows, k), generator=g, device="cuda", dtype=torch.int32)
    write_rows(buffer, src)
    assert torch.equal(buffer[:rows], src) and (buffer[rows:] == -7).all()
    return Row(
        "write_rows",
        f"{rows} x {k} int32",
        bench_us(lambda: write_rows(buffer, src)),
        bench_us(lambda: buffer[:rows].copy_(src)),
        2 * rows * k * 4,
    )


def context_lens(batch: int, decode_len: int) -> list[Row]:
    from attnfuzz.kernels.indexer_ops import decode_context_lens
    from attnfuzz.kernels.mtp_seq_lens import write_context_lens

    g = gen(4)
    seq = torch.randint(0, 131072, (batch,), generator=g, device="cuda", dtype=torch.int32)
    d = torch.randint(1, decode_len + 1, (batch,), generator=g, device="cuda", dtype=torch.int32)
    j = torch.arange(decode_len, device="cuda", dtype=torch.int32)
    flat = torch.empty(batch * decode_len, dtype=torch.int32, device="cuda")
    out = flat.view(batch, decode_len)

    def indexer_torch() -> torch.Tensor:
        ctx = seq[:, None] - d[:, None] + j[None, :] + 1
        return torch.where(j[None, :] < d[:, None], ctx, 0).int()

    def mtp_torch() -> torch.Tensor:
        return (seq[:, None] - decode_len + 1 + j[None, :]).clamp(min=0).int()

    assert torch.equal(decode_context_lens(seq, d, decode_len), indexer_torch())
    write_context_lens(seq, out)
    assert torch.equal(out, mtp_torch())
    shape = f"B={batch} L={decode_len}"
    return [
        Row(
            "decode_context_lens",
            shape,
            bench_us(lambda: decode_context_lens(seq, d, decode_len, out=flat)),
            bench_us(indexer_torch),
        ),
        Row(
            "mtp write_context_lens",
            shape,
            bench_us(lambda: write_context_lens(seq, out)),
            bench_us(mtp_torch),
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one size per kernel")
    parser.add_argument(
        "--markdown", type=Path, default=None, help="docs page whose kernels:cuda section to update"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA device (nothing to time under the interpreter)")
        return 2
    import triton

    torch.backends.cuda.matmul.allow_tf32 = False  # the torch side computes in true fp32
    copy_gbps = copy_bandwidth()
    rows: list[Row] = []
    for n in [32768] if args.quick else [32768, 131072]:
        for r in [64] if args.quick else [64, 1024]:
            rows.append(top_k(r, n, 2048))
    for m, b in [(32768, 16)] if args.quick else [(32768, 16), (32768, 64), (131072, 8)]:
        rows.append(paged_logits(b, 2, m, 64, 128))
    rows += pack_unpack(512, 2, 64, 128)
    rows.append(write_back(1024, 2048))
    rows += context_lens(1024, 4)

    device = torch.cuda.get_device_name()
    header = (
        f"{device}; torch {torch.__version__}, triton {triton.__version__}, "
        f"python {platform.python_version()}; device-to-device copy {copy_gbps:.0f} GB/s"
    )
    text = table(
        ["kernel", "shape", "triton us", "torch us", "speed-up", "triton bandwidth (of copy)"],
        [row.cells(copy_gbps) for row in rows],
    )
    print(header + "\n\n" + text)
    if args.markdown is not None:
        command = command_line("kernels", sys.argv[1:])
        lines = [f"{header}: `{command}`.", "", *text.splitlines()]
        write_section(args.markdown, "kernels", "cuda", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
