"""Exact conversion of a ReLU MLP into a GLAI head (the paper's Theorem 1, with biases).

For hidden layers 1..L (weights W_0..W_L, biases b_0..b_L) and a path column s that visits
units (j_l, ..., j_L) from start layer l, the estimator weight is the path weight

    weight[o, i, s] = W_L[o, j_L] * W_{L-1}[j_L, j_{L-1}] * ... * W_l[j_{l+1}, j_l] * in_l[j_l, i]

with in_1 = [W_0 | b_0] (inputs plus the constant-1 input that carries the first bias) and,
for l >= 2, in_l[j, n0] = b_{l-1}[j] (a bias path: only the constant input; the other inputs
are structurally zero and stay so, as a mask). The output bias b_L becomes the estimator's
bias. Then, for every x, estimator([x, 1], selector(x), weight, b_L) == mlp(x) up to rounding.
"""

from __future__ import annotations

import torch

from glai_kernels.glai.head import GLAIHead
from glai_kernels.glai.mlp import MLPLayers, parse_mlp
from glai_kernels.glai.selector import PathSelector


def _bias(linear: torch.nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias.detach()
    return linear.weight.new_zeros(linear.out_features)


@torch.no_grad()
def path_weights(layers: MLPLayers) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [O, I, P], support [O, I, P] bool or None) for every path of the MLP, in the
    column order of `selector.all_paths`; support is None when every entry is a path (L = 1).
    """
    weights = [lin.weight.detach() for lin in layers.linears]
    widths = layers.widths
    depth = layers.hidden_layers
    n0, outputs = widths[0], widths[-1]
    # chains[l][o, (j_l, ..., j_L)] = W_L[o, j_L] * ... * W_l[j_{l+1}, j_l]   (l is 1-based)
    chain = weights[depth]  # [O, n_L]
    chains = {depth: chain}
    for layer in range(depth - 1, 0, -1):
        rest = chain.shape[1] // widths[layer + 1]
        chain = torch.einsum("oar,aj->ojar", chain.view(outputs, widths[layer + 1], rest),
                             weights[layer]).reshape(outputs, -1)
        chains[layer] = chain
    first_in = torch.cat([weights[0], _bias(layers.linears[0]).unsqueeze(1)], 1)  # [n1, n0+1]
    rest = chains[1].shape[1] // widths[1]
    blocks = [torch.einsum("ojr,ji->oijr", chains[1].view(outputs, widths[1], rest),
                           first_in).reshape(outputs, n0 + 1, -1)]
    supports = [torch.ones_like(blocks[0], dtype=torch.bool)]
    for layer in range(2, depth + 1):
        bias = _bias(layers.linears[layer - 1])  # bias of the Linear that feeds layer `layer`
        rest = chains[layer].shape[1] // widths[layer]
        const = (chains[layer].view(outputs, widths[layer], rest) * bias.view(1, -1, 1))
        block = const.new_zeros(outputs, n0 + 1, const[0].numel())
        block[:, n0] = const.reshape(outputs, -1)
        support = torch.zeros_like(block, dtype=torch.bool)
        support[:, n0] = True
        blocks.append(block)
        supports.append(support)
    weight = torch.cat(blocks, 2).contiguous()
    return weight, (torch.cat(supports, 2) if depth > 1 else None)


def from_mlp(mlp: torch.nn.Module, *, backend: str | None = None) -> GLAIHead:
    """The GLAI head that computes exactly what `mlp` computes (Theorem 1), nothing pruned.

    Args:
        mlp: an nn.Sequential Linear, ReLU, [Dropout], ..., Linear (see glai_kernels.glai.mlp);
            any number of hidden layers; biases optional. It is not modified.
        backend: estimator backend for the head's calls; None follows $GLAI_BACKEND, else auto.

    Returns:
        A GLAIHead on the MLP's device and dtype: frozen selector (the MLP's hidden layers)
        and trainable path weights [O, n0+1, P]; in eval mode head(x) == mlp(x) for any x
        up to rounding. P = n1 for one hidden layer; n1*n2 + n2 for two (bias paths last).
    """
    layers = parse_mlp(mlp)
    params = [p for lin in layers.linears for p in lin.parameters()]
    if len({(p.device, p.dtype) for p in params}) != 1:
        raise ValueError("mlp: every Linear must share one device and dtype")
    weight, support = path_weights(layers)
    return GLAIHead(PathSelector.from_layers(layers), weight,
                    _bias(layers.linears[-1]) if layers.linears[-1].bias is not None else None,
                    support, backend=backend)
