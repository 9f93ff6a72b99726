"""The workload of the measured batch-size-warmup example (experiments/integrations/PROTOCOL.md).

``shakespeare/transformer_char`` (batchlab's built-in: Shakespeare characters, 64-character windows,
causal Transformer, per-character cross entropy) with the model narrowed from width 128 to width 64
(2 pre-norm blocks, 4 heads, context 64: 115,028 parameters instead of 426,580) so that three arms x
five seeds fit in the time this machine had (about 1.1 ms per training example on one core instead of
3.4 ms), and the validation metric read on a fixed 1,024-sequence subset of the val split (the
built-in reads 256). Data, task (loss, metrics) and everything else are the built-in workload's own
objects, reached through :func:`batchlab.workloads.get_workload` and :func:`dataclasses.replace`.

Reference for the CLI: ``experiments/integrations/workload.py:char_transformer_w64``.
"""

from __future__ import annotations

import dataclasses
from functools import partial

from batchlab.workloads import get_workload
from batchlab.workloads.models.transformer import CharTransformer

WIDTH, LAYERS, HEADS = 64, 2, 4
VAL_EXAMPLES = 1024


def char_transformer_w64():
    """The built-in ``shakespeare/transformer_char`` with a width-64 model and 1,024 val sequences."""
    base = get_workload("shakespeare/transformer_char")
    context = base.input_shape[0]  # 64 characters, the built-in windows
    return dataclasses.replace(
        base,
        name="shakespeare/transformer_char_w64",
        summary=f"Shakespeare characters, causal Transformer: {LAYERS} pre-norm blocks, width {WIDTH}, "
                f"{HEADS} heads, context {context}",
        make_model=partial(CharTransformer, base.num_classes, context, WIDTH, LAYERS, HEADS),
        eval_examples={**base.eval_examples, "val": VAL_EXAMPLES},
        reference=None,
    )
