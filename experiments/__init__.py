"""Experiments: train Llama-style language models under FP4 recipes, compare them with BF16, fit scaling laws.

The folder ``experiments/`` installs as the package ``fp4jax_experiments``; each module with a command line is also a
console script, ``fp4jax-<module>`` with ``-`` for ``_`` (``fp4jax-train``, ``fp4jax-scaling-law``, ...).

Modules (one concept each):
  model        the decoder and its size table; projections take an FP4 dot chosen per layer by recipe name
  data         token corpora (byte-level default, nanoGPT ``.bin``) and the resumable batch stream
  prepare      builders for corpora: text files, the standard-library corpus, the linux-6.12 corpus
  optimizer    AdamW with clipping and the warmup + cosine schedule
  diagnostics  per-layer quantization error of the FP4 projections
  train        the training loop and its command line
  lowering     JAX config values a jitted step is lowered under (the GPU's threefry as kernels)
  compare      the main job: tiny model, several recipes, one plot and one table
  sweep        grids of runs (sizes x tokens-per-parameter x recipes), resumable, several GPUs
  scaling_law  Quartet and Chinchilla loss laws, Huber fit on log residuals, bootstrap intervals
  plots        loss curves, loss vs compute, fitted curves, efficiency bars
"""
