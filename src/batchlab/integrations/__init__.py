"""batchlab inside the user's own training: callbacks, distributed noise scale, branched measurement.

Install with ``pip install 'batchlab[integrations]'`` (PyTorch Lightning, Hugging Face ``transformers``
and ``accelerate``, TensorBoard, Weights & Biases). Guide: docs/integrations.md.

* :mod:`batchlab.integrations.schedule`: batch-size schedules in examples (or tokens), the gradient
  accumulation that reaches them and the learning-rate rescaling rules; no optional dependency.
* :mod:`batchlab.integrations.lightning`: ``NoiseScaleCallback`` and ``BatchSizeSchedule`` callbacks for
  ``lightning.Trainer`` (imports ``lightning``).
* :mod:`batchlab.integrations.huggingface`: a ``transformers.TrainerCallback`` for the noise scale and
  the way to follow a batch-size schedule in ``transformers.Trainer`` (imports ``transformers``).
* :mod:`batchlab.integrations.branched`: the branched critical batch size from the user's own
  checkpoints through a small adapter; no optional dependency.

The noise scale itself is :class:`batchlab.probes.tracker.NoiseScaleTracker` (DDP, FSDP2 and gradient
accumulation). Nothing here is imported by ``import batchlab``: each module is imported by name.
"""
