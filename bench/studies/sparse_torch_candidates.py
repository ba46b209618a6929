"""Time the pure-PyTorch candidates for the sparse kept-path estimator (the `torch` sparse
backend keeps the fastest; docs/notes/sparse.md, "Sparse kept-path estimator", has the result).

    glai-bench sparse-torch-candidates [--repeats 5] [--batches 16 256]
    (or `python -m bench.studies.sparse_torch_candidates ...`)

Candidates, all in the transposed [rows, B] form (a kept entry then reads B contiguous
values of x), accumulating in float32 for half inputs:
  gather: Zg = index_add over entry_groups of x^T[inputs] * v ([K, B] materialised);
          backward by gathers and index_add.
  segment: as gather, with torch.segment_reduce over group_ptr for Zg.
  csr:    Zg = CSR [G, I] (group_ptr, inputs, v) @ x^T, the Z-form over a torch.sparse
          matrix with only the non-empty (o, s) rows; dx = CSR [I, G] @ (dy act)_g;
          dvalues by torch.sparse.sampled_addmm.
Shapes: B1 (I=1281, P=320, O=128, μ=0.86%) and A1 (I=385, P=128, O=37, μ=3%), the
weights random, the mask uniformly random at μ. Repeats are the interleaved rounds of
bench/harness/timing.py, so a slow spell of the shared machine hits every candidate alike;
the minimum (the round least disturbed by the other processes) and the median are reported.
"""

from __future__ import annotations

import argparse
import functools
import warnings

import torch

from bench.cli_types import positive_int
from bench.harness.timing import MIN_BLOCK_S, time_interleaved, warm
from glai_kernels.contract import accumulation_dtype
from glai_kernels.sparse import from_dense
from glai_kernels.sparse.layout import KeptIndex

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
warnings.filterwarnings("ignore", message="Sparse invariant checks")


def _t(t: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    return t.t().to(acc).contiguous()


def _out(zg: torch.Tensor, at: torch.Tensor, ix: KeptIndex, outputs: int) -> torch.Tensor:
    per_group = zg * at.index_select(0, ix.group_paths)
    return per_group.new_zeros(outputs, zg.shape[1]).index_add_(0, ix.group_outputs, per_group)


def zg_gather(xt, v, ix):
    terms = xt.index_select(0, ix.inputs) * v[:, None]
    return terms.new_zeros(ix.groups, xt.shape[1]).index_add_(0, ix.entry_groups, terms)


def zg_segment(xt, v, ix):
    terms = xt.index_select(0, ix.inputs) * v[:, None]
    return torch.segment_reduce(terms, "sum", offsets=ix.group_ptr.long(), axis=0)


def zg_csr(xt, v, ix):
    csr = torch.sparse_csr_tensor(ix.group_ptr, ix.inputs, v, size=(ix.groups, xt.shape[0]))
    return csr @ xt


def make(zg_fn, grads_fn):
    def fwd_bwd(x, act, values, ix, dy):
        acc = accumulation_dtype(x.dtype)
        xt, at, v = _t(x, acc), _t(act, acc), values.to(acc)
        zg = zg_fn(xt, v, ix)
        y = _out(zg, at, ix, ix.shape[0]).t().to(x.dtype)
        if dy is None:
            return y
        return y, grads_fn(_t(dy, acc), xt, at, v, ix, zg)
    return fwd_bwd


def grads_gather(dyt, xt, at, v, ix, zg):
    a_g = dyt.index_select(0, ix.group_outputs) * at.index_select(0, ix.group_paths)
    a_k = a_g.index_select(0, ix.entry_groups)
    dvalues = (a_k * xt.index_select(0, ix.inputs)).sum(1)
    dxt = xt.new_zeros(xt.shape).index_add_(0, ix.inputs, a_k * v[:, None])
    dactt = at.new_zeros(at.shape).index_add_(
        0, ix.group_paths, dyt.index_select(0, ix.group_outputs) * zg)
    return dxt, dactt, dvalues


def grads_csr(dyt, xt, at, v, ix, zg):
    a_g = dyt.index_select(0, ix.group_outputs) * at.index_select(0, ix.group_paths)
    order = ix.input_entries
    csr_t = torch.sparse_csr_tensor(ix.input_ptr, ix.entry_groups.index_select(0, order),
                                    v.index_select(0, order), size=(xt.shape[0], ix.groups))
    dxt = csr_t @ a_g
    pattern = torch.sparse_csr_tensor(ix.group_ptr, ix.inputs, v, size=(ix.groups, xt.shape[0]))
    dvalues = torch.sparse.sampled_addmm(pattern, a_g, xt.t(), beta=0.0).values()
    dactt = at.new_zeros(at.shape).index_add_(
        0, ix.group_paths, dyt.index_select(0, ix.group_outputs) * zg)
    return dxt, dactt, dvalues


CANDIDATES = {
    "gather": make(zg_gather, grads_gather),
    "segment": make(zg_segment, grads_gather),
    "csr": make(zg_csr, grads_csr),
}
SHAPES = {"B1": (1281, 320, 128, 0.0086), "A1": (385, 128, 37, 0.03)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glai-bench sparse-torch-candidates",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--batches", type=positive_int, nargs="+", default=[16, 256])
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, (inputs, paths, outputs, mu) in SHAPES.items():
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(outputs, inputs, paths, generator=gen)
        sw = from_dense(weight, torch.rand(outputs, inputs, paths, generator=gen) < mu)
        values = sw.values.detach()
        for batch in args.batches:
            x = torch.randn(batch, inputs, generator=gen)
            act = (torch.rand(batch, paths, generator=gen) < 0.5).float()
            dy = torch.randn(batch, outputs, generator=gen)
            reference = CANDIDATES["gather"](x, act, values, sw.index, dy)
            for cand in CANDIDATES.values():  # same answers before timing
                got = cand(x, act, values, sw.index, dy)
                torch.testing.assert_close(got[0], reference[0], rtol=1e-4, atol=1e-4)
                for g, e in zip(got[1], reference[1], strict=True):
                    torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
            for pass_, grad in (("forward", None), ("fwd+bwd", dy)):
                calls = {c: functools.partial(cand, x, act, values, sw.index, grad)
                         for c, cand in CANDIDATES.items()}
                per_call = {c: warm(call, x.device)[1] for c, call in calls.items()}
                times = time_interleaved(calls, per_call, MIN_BLOCK_S * args.repeats,
                                         args.repeats)
                cells = "  ".join(f"{c} {1e3 * t.min_s:7.2f} ({1e3 * t.median_s:.1f}) ms"
                                  for c, t in times.items())
                print(f"{name} K={sw.nnz} G={sw.index.groups} B={batch:3d} {pass_:8s} {cells}")

    return 0

if __name__ == "__main__":
    raise SystemExit(main())
