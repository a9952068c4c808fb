"""What lets the real SGLang 0.5.23 server run without a GPU (tests only; the product never imports it).

SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`) falls back to plain PyTorch wherever the CPU lacks
AMX, except for two functions it imports from its kernel package unconditionally:
`assign_req_to_token_pool_cpu` (sglang/srt/mem_cache/allocation.py) and
`copy_all_layer_kv_cache_cpu` (sglang/kernels/ops/kvcache/cache_move.py). PyPI's kernel packages
are CUDA builds that cannot load here. This module, put first on the server's PYTHONPATH, gives
those two in plain PyTorch, with the semantics of the triton kernels beside their call sites.
It registers no `torch.ops.sgl_kernel` operators, so SGLang's AMX detection stays false and every
other path stays on PyTorch. Any other name imports as a function that raises NotImplementedError when called.
"""

import ctypes

import torch

__version__ = "0.0.0+cpu-stand-in"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Row by row: `req_to_token[req_pool_indices[i], start[i]:end[i]]` = the next `end[i] - start[i]`
    entries of `out_cache_loc` (the triton kernel `assign_req_to_token_pool`)."""
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """In every buffer (base address `data_ptrs[b]`, `strides[b]` bytes per row), copy row `src_loc[i]`
    to row `tgt_loc[i]` (the triton kernel `copy_all_layer_kv_cache_tiled`: all rows read, then
    written, so overlapping sets copy as it does)."""
    pairs = list(zip(src_loc.tolist(), tgt_loc.tolist()))
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + src * stride, stride) for src, _ in pairs]
        for (_, tgt), row in zip(pairs, rows):
            ctypes.memmove(base + tgt * stride, row, stride)


def __getattr__(name: str):
    """Every other name SGLang's CPU modules import at load time (speculative-decoding trees, MoE,
    quantization kernels, ...): a function that raises when called, so importing works and a path
    this stand-in does not cover fails loudly instead of computing something else."""
    if name.startswith("__"):
        raise AttributeError(name)

    def not_provided(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: the CPU test stand-in (tests/sglang_cpu/shim) provides only "
            "assign_req_to_token_pool_cpu and copy_all_layer_kv_cache_cpu"
        )

    not_provided.__name__ = name
    return not_provided
