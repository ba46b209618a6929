"""Embeddings for the six heads, offline: users' own files, a synthetic teacher, sklearn digits.

The paper's heads sit on frozen backbones, so a head's inputs are embeddings [N, n0].

Users' own embeddings (`load_embeddings`): one `.npz` (numpy) or `.pt` (torch.save of a dict)
file holding

    x_train [N_train, n0] float    y_train [N_train] int (class ids)
    x_val   [N_val, n0]   float    y_val   [N_val]   int
    x_test  [N_test, n0]  float    y_test  [N_test]  int      (optional: x_test/y_test)
    description           str      (optional, shown in the reports)

Family B (contrastive) ignores the labels, which may then be left out. Family C (few-shot)
draws N-way episodes from the classes of each split: give the validation/test splits classes
the training split does not have, as a few-shot benchmark does. Run it with
`python -m bench.pipeline --data A1=path/to/a1.npz ...`.

Built-in, no download:
  * `synthetic`: embeddings from a planted nonlinear teacher with each head's n0 (see
    `synthetic`).
  * `digits`: scikit-learn's bundled 8x8 digits (1,797 real images, shipped inside the
    package), lifted to n0 dimensions by a frozen random ReLU feature map (a stand-in backbone).
"""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from glai_kernels.glai.embeddings import SPLITS, EmbeddingSplits
from glai_kernels.paper_heads import PaperHead


def _as_tensor(value, what: str, path: pathlib.Path) -> torch.Tensor:
    tensor = torch.as_tensor(np.asarray(value) if not torch.is_tensor(value) else value)
    if tensor.numel() == 0:
        raise ValueError(f"{path}: {what} is empty")
    return tensor


def load_embeddings(path: str | pathlib.Path, *, need_labels: bool = True) -> EmbeddingSplits:
    """Read the layout in the module docstring from a .npz or .pt file."""
    path = pathlib.Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as raw:
            content = {k: raw[k] for k in raw.files}
    elif path.suffix == ".pt":
        content = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(content, dict):
            raise ValueError(f"{path}: a .pt file must hold a dict of arrays")
    else:
        raise ValueError(f"{path}: embeddings must be a .npz or .pt file")
    x, y = {}, {}
    for split in SPLITS:
        if f"x_{split}" not in content:
            if split == "test":
                continue
            raise ValueError(f"{path}: missing x_{split} (keys: {sorted(content)})")
        x[split] = _as_tensor(content[f"x_{split}"], f"x_{split}", path).to(torch.float32)
        if x[split].dim() != 2:
            raise ValueError(f"{path}: x_{split} must be [N, n0], got {list(x[split].shape)}")
        if f"y_{split}" in content:
            y[split] = _as_tensor(content[f"y_{split}"], f"y_{split}", path).to(torch.int64)
            if y[split].shape != x[split].shape[:1]:
                raise ValueError(f"{path}: y_{split} must be [{len(x[split])}], got "
                                 f"{list(y[split].shape)}")
        elif need_labels:
            raise ValueError(f"{path}: missing y_{split} (labels are needed for families A, C)")
        else:
            y[split] = None
    dims = {t.shape[1] for t in x.values()}
    if len(dims) != 1:
        raise ValueError(f"{path}: every split must have the same n0, got {sorted(dims)}")
    description = content.get("description", f"user embeddings from {path.name}")
    description = str(np.asarray(description).item() if not isinstance(description, str)
                      else description)
    return EmbeddingSplits(x, y, path.stem, description)


def save_embeddings(path: str | pathlib.Path, splits: EmbeddingSplits) -> None:
    """Write `splits` in the documented layout (.npz or .pt by the suffix)."""
    path = pathlib.Path(path)
    content: dict = {}
    for split, x in splits.x.items():
        content[f"x_{split}"] = x.numpy()
        if splits.y.get(split) is not None:
            content[f"y_{split}"] = splits.y[split].numpy()
    if path.suffix == ".npz":
        np.savez(path, description=np.asarray(splits.description), **content)
    elif path.suffix == ".pt":
        torch.save({**{k: torch.from_numpy(v) for k, v in content.items()},
                    "description": splits.description}, path)
    else:
        raise ValueError(f"{path}: use a .npz or .pt suffix")


# ---------------------------------------------------------------------------------------------
# synthetic teacher

LATENT = 32


def _embed(z: torch.Tensor, n0: int, gen: torch.Generator) -> torch.Tensor:
    """A fixed nonlinear 'backbone': latent z [N, 32] -> embeddings [N, n0], standardised."""
    lift = torch.randn(LATENT, 4 * LATENT, generator=gen) / LATENT ** 0.5
    mix = torch.randn(4 * LATENT, n0, generator=gen) / (4 * LATENT) ** 0.5
    x = torch.relu(z @ lift + 0.3) @ mix
    x = x + 0.1 * torch.randn(x.shape, generator=gen)
    return (x - x.mean(0)) / x.std(0).clamp_min(1e-6)


MODES = 3  # latent clusters per class in family A: classes are not convex, so not linear
# Family B: items come in neighbourhoods (near-duplicates, as augmented or semantically close
# images are), B_CLUSTERS latent clusters of spread B_SPREAD, so a batch of 16 holds
# confusable negatives and the validation InfoNCE settles on a floor (B1: ~0.077, early
# stopping at 40 epochs, seed 0). With z ~ N(0, I) every item was far from every other: the
# loss crept towards 0 (0.0025 at epoch 60, still falling ~1.5% an epoch), so the paper's
# min delta of 1e-5 never stopped the B1 MLP before its 60-epoch cap.
B_CLUSTERS, B_SPREAD = 128, 0.05


def synthetic(head: PaperHead, sizes: dict[str, int], *, seed: int = 0,
              classes_c: tuple[int, int, int] = (48, 12, 12)) -> EmbeddingSplits:
    """Synthetic embeddings with the head's n0 from a planted nonlinear teacher (seeded).

    Every family: latent z in R^32 through a fixed random ReLU map to n0 dimensions, plus
    noise, standardised (a frozen-backbone stand-in). Then
      A: n2 classes, each a mixture of 3 latent clusters (centres ~ N(0, I), spread 0.6),
         balanced; `sizes` 'train'/'val'/'test' samples;
      B: z from B_CLUSTERS latent clusters (centres ~ N(0, I), spread B_SPREAD), no labels
         (contrastive); same sizes;
      C: classes are single latent clusters (spread 0.6); train/val/test classes are disjoint
         (`classes_c`), `sizes['per_class']` samples each.
    """
    gen = torch.Generator().manual_seed(10_000 + seed)
    family = head.family
    if family == "C":
        total = sum(classes_c)
        centres = torch.randn(total, LATENT, generator=gen)
        per = sizes["per_class"]
        label = torch.arange(total).repeat_interleave(per)
        z = centres[label] + 0.6 * torch.randn(total * per, LATENT, generator=gen)
        x_all = _embed(z, head.n0, gen)
        bounds = np.cumsum([0, *classes_c])
        x, y, classes = {}, {}, {}
        for k, split in enumerate(SPLITS):
            pick = (label >= bounds[k]) & (label < bounds[k + 1])
            x[split], y[split] = x_all[pick], label[pick]
            classes[split] = list(range(bounds[k], bounds[k + 1]))
        return EmbeddingSplits(x, y, "synthetic", _SYNTHETIC_NOTE, classes)
    counts = [sizes[s] for s in SPLITS]
    n = sum(counts)
    y_all = None
    if family == "A":
        centres = torch.randn(head.n2 * MODES, LATENT, generator=gen)
        y_all = torch.arange(n) % head.n2  # balanced
        y_all = y_all[torch.randperm(n, generator=gen)]
        mode = torch.randint(0, MODES, (n,), generator=gen)
        z = centres[y_all * MODES + mode] + 0.6 * torch.randn(n, LATENT, generator=gen)
    else:
        centres = torch.randn(B_CLUSTERS, LATENT, generator=gen)
        member = torch.randint(0, B_CLUSTERS, (n,), generator=gen)
        z = centres[member] + B_SPREAD * torch.randn(n, LATENT, generator=gen)
    x_all = _embed(z, head.n0, gen)
    x, y = {}, {}
    start = 0
    for split, count in zip(SPLITS, counts, strict=True):
        x[split] = x_all[start:start + count]
        y[split] = None if y_all is None else y_all[start:start + count]
        start += count
    return EmbeddingSplits(x, y, "synthetic", _SYNTHETIC_NOTE)


_SYNTHETIC_NOTE = (
    "synthetic embeddings (a planted nonlinear teacher): latent z in R^32 -> fixed random ReLU "
    "map -> n0 dims + noise, standardised; A: balanced classes, each a mixture of 3 latent "
    "clusters (not linearly separable in z); B: 128 tight latent clusters (near-duplicates), "
    "unlabeled; C: one latent cluster "
    "per class, disjoint train/val/test classes")
# ---------------------------------------------------------------------------------------------
# scikit-learn digits

def digits(head: PaperHead, *, seed: int = 0) -> EmbeddingSplits:
    """sklearn's bundled digits (offline) as embeddings for `head`.

    Pixels (64, 0..16) are standardised and lifted to n0 dims by a frozen random ReLU map
    (seed 0: the same 'backbone' for every run), then standardised. Splits:
      A: the classes 0..min(n2,10)-1, stratified 60/20/20 (A2, with 4 outputs, sees digits 0-3);
      B: every image, labels dropped, 60/20/20;
      C: train on digits 0-4, validate and test on digits 5-9 (novel classes), half each.
    """
    from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

    raw = load_digits()
    pixels = torch.as_tensor(raw.data, dtype=torch.float32)
    labels = torch.as_tensor(raw.target, dtype=torch.int64)
    pixels = (pixels - pixels.mean(0)) / pixels.std(0).clamp_min(1e-6)
    gen = torch.Generator().manual_seed(0)
    lift = torch.randn(64, head.n0, generator=gen) / 8
    x_all = torch.relu(pixels @ lift + 0.1 * torch.randn(head.n0, generator=gen))
    x_all = (x_all - x_all.mean(0)) / x_all.std(0).clamp_min(1e-6)
    split_gen = torch.Generator().manual_seed(1_000 + seed)
    note = ("scikit-learn digits (1,797 real 8x8 images, bundled), standardised pixels -> "
            "frozen random ReLU map to n0 dims")
    x, y, classes = {}, {}, {}
    if head.family == "C":
        novel = labels >= 5
        order = torch.randperm(len(labels), generator=split_gen)
        val_rows = [r for r in order.tolist() if novel[r]]
        half = len(val_rows) // 2
        picks = {"train": (~novel).nonzero().flatten(),
                 "val": torch.tensor(sorted(val_rows[:half])),
                 "test": torch.tensor(sorted(val_rows[half:]))}
        for split, rows in picks.items():
            x[split], y[split] = x_all[rows], labels[rows]
            classes[split] = sorted(set(labels[rows].tolist()))
        return EmbeddingSplits(x, y, "digits", note + "; C: train on 0-4, val/test on 5-9",
                               classes)
    keep = labels < (min(head.n2, 10) if head.family == "A" else 10)
    rows = keep.nonzero().flatten()
    rows = rows[torch.randperm(len(rows), generator=split_gen)]
    parts = {"train": [], "val": [], "test": []}
    for c in labels[rows].unique().tolist():  # stratified 60/20/20
        members = rows[labels[rows] == c]
        a, b = int(0.6 * len(members)), int(0.8 * len(members))
        parts["train"].append(members[:a])
        parts["val"].append(members[a:b])
        parts["test"].append(members[b:])
    for split in SPLITS:
        chosen = torch.cat(parts[split]).sort().values
        x[split] = x_all[chosen]
        y[split] = labels[chosen] if head.family == "A" else None
    return EmbeddingSplits(x, y, "digits", note)
