"""Weight-update vs quantization-error diagnostics (QuRL Appendix A, Eq. 13-14).

QuRL's weight update problem: between two syncs the full-precision actor moves
by ‖θ_{t+1} − θ_t‖, far less than the rounding error ‖Q(θ) − θ‖ of the
quantized copy the rollout samples from, so the rollout barely sees training.
These functions measure both sides on our params trees, and the fraction of
quantized weights that actually changed between two syncs.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rljax.quant import params as qparams_lib
from rljax.quant.qtensor import QTensor

Params = dict[str, Any]


def _is_qtensor(x) -> bool:
  return isinstance(x, QTensor)


def _sq(x: jax.Array, axes=None) -> jax.Array:
  return jnp.sum(jnp.square(x.astype(jnp.float32)), axis=axes)


def _sq_moved(a: jax.Array, b: jax.Array) -> jax.Array:
  """‖b − a‖², the difference taken in float32."""
  return _sq(b.astype(jnp.float32) - a.astype(jnp.float32))


def _sq_error(w: jax.Array, q: QTensor, axes=None) -> jax.Array:
  """‖Q(W) − W‖² (over `axes`; all of them by default)."""
  return _sq(q.dequantize() - w.astype(jnp.float32), axes=axes)


@jax.jit
def normalized_weight_update(prev_params: Any, new_params: Any) -> jax.Array:
  """‖θ_{t+1} − θ_t‖²_F / ‖θ_t‖²_F over all leaves (QuRL Eq. 13).

  Args:
    prev_params: θ_t, a pytree of float arrays.
    new_params: θ_{t+1}, same structure and shapes.

  Returns:
    float32 scalar.
  """
  prev_leaves, prev_def = jax.tree.flatten(prev_params, is_leaf=_is_qtensor)
  new_leaves, new_def = jax.tree.flatten(new_params, is_leaf=_is_qtensor)
  if prev_def != new_def:
    raise ValueError(
      "normalized_weight_update: prev_params and new_params have different "
      f"tree structures:\n{prev_def}\nvs\n{new_def}"
    )
  num = jnp.float32(0)
  den = jnp.float32(0)
  for a, b in zip(prev_leaves, new_leaves):
    if _is_qtensor(a) or _is_qtensor(b):
      raise TypeError(
        "normalized_weight_update: got a QTensor leaf; pass full-precision "
        "params (use quantized_change_fraction for quantized trees)"
      )
    if a.shape != b.shape:
      raise ValueError(
        f"normalized_weight_update: leaf shapes differ: {a.shape} vs {b.shape}"
      )
    num += _sq_moved(a, b)
    den += _sq(a)
  return num / den


def _quant_pairs(params: Params, qparams: Params, where: str):
  pairs = []
  for path, q in qparams_lib.iter_qtensors(qparams):
    try:
      w = qparams_lib.get_path(params, path)
    except (KeyError, TypeError):
      raise ValueError(
        f"{where}: qparams has a QTensor at {'/'.join(path)} but params has "
        "no leaf there"
      ) from None
    if isinstance(w, QTensor) or w.shape != q.value.shape:
      raise ValueError(
        f"{where}: params/{'/'.join(path)} should be a float array of shape "
        f"{q.value.shape}, got {type(w).__name__} "
        f"{getattr(w, 'shape', None)}"
      )
    pairs.append(("/".join(path), w, q))
  if not pairs:
    raise ValueError(f"{where}: qparams holds no QTensor leaves")
  return pairs


def normalized_quant_error(params: Params, qparams: Params) -> jax.Array:
  """‖Q(θ) − θ‖²_F / ‖θ‖²_F over the quantized kernels (QuRL Eq. 14).

  Args:
    params: full-precision params θ.
    qparams: `quantize_params(config, params, ...)`; its QTensor leaves select
      which kernels count.

  Returns:
    float32 scalar. Invariant to rescaling θ (so to UAQ's fold), because
    per-channel absmax quantization commutes with scaling.
  """
  pairs = _quant_pairs(params, qparams, "normalized_quant_error")
  err, norm = _quant_error_sums(
    [w for _, w, _ in pairs], [q for _, _, q in pairs]
  )
  return sum(jnp.sum(e) for e in err) / sum(jnp.sum(n) for n in norm)


def normalized_quant_error_per_layer(
  params: Params, qparams: Params
) -> dict[str, jax.Array]:
  """Eq. 14 per quantized kernel and per block.

  Returns:
    `{"layers/q_proj/kernel": [L] array, ..., "lm_head/kernel": scalar}`:
    for stacked kernels `[L, in, out]` one value per block.
  """
  pairs = _quant_pairs(params, qparams, "normalized_quant_error_per_layer")
  err, norm = _quant_error_sums(
    [w for _, w, _ in pairs], [q for _, _, q in pairs]
  )
  return {name: e / n for (name, _, _), e, n in zip(pairs, err, norm)}


def absolute_quant_error(
  params: Params, qparams: Params
) -> dict[str, jax.Array]:
  """‖Q(W) − W‖_F per quantized kernel (all blocks together)."""
  pairs = _quant_pairs(params, qparams, "absolute_quant_error")
  return {name: jnp.sqrt(_sq_error(w, q)) for name, w, q in pairs}


def quantized_change_fraction(
  prev_qparams: Params, new_qparams: Params
) -> jax.Array:
  """Fraction of quantized weight codes that changed between two syncs.

  Counts elements whose integer (or e4m3) code differs. A channel whose absmax
  moved gets a new scale too, a uniform relative change of about
  ‖Δw‖∞ / max|w| that a code flip would exceed, so it is not counted by
  itself. Without UAQ this is typically ~0: the rollout does not see the
  update (QuRL Fig. 4a).

  Returns:
    float32 scalar in [0, 1].
  """
  prev = dict(qparams_lib.iter_qtensors(prev_qparams))
  new = dict(qparams_lib.iter_qtensors(new_qparams))
  if prev.keys() != new.keys():
    raise ValueError(
      "quantized_change_fraction: the trees quantize different kernels: "
      f"{sorted(prev)} vs {sorted(new)}"
    )
  if not prev:
    raise ValueError("quantized_change_fraction: no QTensor leaves")
  for k in prev:
    if prev[k].value.shape != new[k].value.shape:
      raise ValueError(
        f"quantized_change_fraction: {'/'.join(k)} shapes differ: "
        f"{prev[k].value.shape} vs {new[k].value.shape}"
      )
  keys = sorted(prev)
  return _change_fraction([prev[k] for k in keys], [new[k] for k in keys])


@jax.jit
def _change_fraction(prev, new):
  changed = sum(
    _changed_codes(_code_bits(a), _code_bits(b)) for a, b in zip(prev, new)
  )
  total = sum(a.value.size for a in prev)
  return changed.astype(jnp.float32) / total


def _code_bits(q: QTensor) -> jax.Array:
  """A QTensor's codes as int8 bit patterns: int8 codes as they are, e4m3
  codes bit-cast, so that two codes are equal exactly when the integers are."""
  if q.value.dtype == jnp.int8:
    return q.value
  return jax.lax.bitcast_convert_type(q.value, jnp.int8)


def _changed_codes(a: jax.Array, b: jax.Array) -> jax.Array:
  """How many entries of two int8 code arrays differ, as an int32 scalar.

  min(|a − b|, 1) is 1 exactly where two integer codes differ. XLA's CPU
  backend vectorises this float reduction, not a count of `a != b` (6.5x
  slower: 71 against 11 ms per 26 M codes on a Zen 3 core pair). The row
  sums are exact in float32 (a row is far shorter than 2^24); the total is
  summed in int32.
  """
  d = jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))
  rows = jnp.sum(jnp.minimum(d, 1.0).reshape(-1, a.shape[-1]), axis=-1)
  return jnp.sum(rows.astype(jnp.int32))


def _leaf_paths(tree: Params) -> list[tuple[tuple[str, ...], jax.Array]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(tuple(k.key for k in kp), leaf) for kp, leaf in flat]


# The sums SyncDiagnostics (and the Eq. 14 functions above) need, as
# programs of one kind of reduction each.
# On XLA's CPU backend, one program computing them all ran 3x slower than
# these, one per kernel 2x (docs/performance.md, "The trainer's sync").


@jax.jit
def _quant_error_sums(kernels, qtensors):
  """‖Q(W) − W‖² and ‖W‖² per quantized kernel and block (Eq. 14's parts)."""
  err = [_sq_error(w, q, axes=(-2, -1)) for w, q in zip(kernels, qtensors)]
  return err, [_sq(w, axes=(-2, -1)) for w in kernels]


@jax.jit
def _update_sums(prev_params, params):
  """‖θ_{t+1} − θ_t‖² and ‖θ_t‖² per leaf (Eq. 13's parts), as two trees."""
  moved = jax.tree.map(_sq_moved, prev_params, params)
  return moved, jax.tree.map(_sq, prev_params)


@jax.jit
def _codes_moved(prev_codes, qtensor):
  """How many of `qtensor`'s codes differ from `prev_codes` (int8 bits)."""
  return _changed_codes(prev_codes, _code_bits(qtensor))


@jax.jit
def _copy(params, qtensors):
  """θ and the codes (as int8 bits), for the next sync, in fresh buffers."""
  return jax.tree.map(jnp.copy, params), [
    jnp.copy(_code_bits(q)) for q in qtensors
  ]


@functools.partial(jax.jit, donate_argnums=(0, 1))
def _copy_into(prev_params, prev_codes, params, qtensors):
  """θ and the codes written into the buffers of the last copies (donated).

  Fresh output buffers are what made the copy slow on a CPU: θ and the
  codes (646 MB) took ~0.25 s into new pages, ~0.07 s into the pages of the
  last copy (SmolLM2-135M, a Zen 3 core pair; docs/performance.md, "The
  sync's copy in place"). A whole-array `dynamic_update_slice` of a donated
  operand is what XLA updates in place; `jnp.copy` would not reuse it.
  """
  return jax.tree.map(_overwrite, prev_params, params), [
    _overwrite(c, _code_bits(q)) for c, q in zip(prev_codes, qtensors)
  ]


def _overwrite(dst: jax.Array, src: jax.Array) -> jax.Array:
  return jax.lax.dynamic_update_slice(dst, src, (0,) * src.ndim)


def _same_layout(prev: Any, new: Any) -> bool:
  """Whether `prev` can take `new`'s values in place: one tree structure,
  and per leaf one shape, dtype and sharding."""
  if prev is None or jax.tree.structure(prev) != jax.tree.structure(new):
    return False
  return all(
    x.shape == y.shape and x.dtype == y.dtype and x.sharding == y.sharding
    for x, y in zip(jax.tree.leaves(prev), jax.tree.leaves(new))
  )


def _require_same_tree(prev: Params, new: Params) -> None:
  """Eq. 13 compares θ leaf by leaf with the last sync's: one structure,
  and per leaf one shape."""
  a, b = dict(_leaf_paths(prev)), dict(_leaf_paths(new))
  if a.keys() != b.keys():
    raise ValueError(
      "SyncDiagnostics: the params' leaves changed since the last sync: "
      f"{sorted('/'.join(k) for k in a.keys() ^ b.keys())} are in only one "
      "of the two trees"
    )
  for k, x in a.items():
    if x.shape != b[k].shape:
      raise ValueError(
        f"SyncDiagnostics: params leaf {'/'.join(k)} has shape "
        f"{b[k].shape}; the last sync's had {x.shape}"
      )


class SyncDiagnostics:
  """Per-sync QuRL diagnostics; call it with the params pushed to the rollout.

  Example:
    diag = SyncDiagnostics()
    for step ...:
      qparams = quant.quantize_params(config, params, "int8")
      metrics.update(diag(params, qparams))   # dict of floats
      push qparams to the rollout engine

  Keys (`nan` at the first call, which has no previous sync):
    quant/normalized_quant_error     Eq. 14 over the quantized kernels
    quant/normalized_weight_update   Eq. 13 over all params since last call
    quant/normalized_kernel_update   Eq. 13 over the quantized kernels only
    quant/update_to_quant_error      kernel update / quant error (UAQ: × s²)
    quant/quantized_change_fraction  share of quantized weights that changed
    quant/normalized_quant_error/<kernel>  Eq. 14 per projection

  The values are those of `normalized_quant_error`, `..._per_layer`,
  `normalized_weight_update` and `quantized_change_fraction` (the tests hold
  them equal), but each sum is taken once: Eq. 14's total comes from the
  per-block sums, the kernel update from the per-leaf ones, and the sums are
  added in float64 on the host.

  It keeps a copy of the previous params (the trainer may donate its
  buffers), i.e. one extra set of full-precision weights in memory, and of
  the previous codes (one byte per quantized weight), not of Q(θ)'s other
  leaves. From the second sync on the copy is written in place, into the
  buffers of the one before. The params must keep their leaves and shapes
  from sync to sync (a ValueError names the leaf that did not).
  """

  def __init__(self):
    self._prev_params = None
    self._prev_codes = None

  @property
  def previous_params(self) -> Params | None:
    """The params of the last call (the next call's reference), or None
    before the first: what a resumed run must call with again to continue
    the same series (`train.checkpoint.save_step`)."""
    return self._prev_params

  def __call__(self, params: Params, qparams: Params) -> dict[str, float]:
    pairs = _quant_pairs(params, qparams, "SyncDiagnostics")
    paths = [tuple(name.split("/")) for name, _, _ in pairs]
    # Every program below starts on finished inputs: a launch on
    # mesh-sharded params issued while the (collective) programs that
    # produce them may still run was, as an eager per-leaf copy on 8 fake
    # CPU devices, twice seen to never return (BUILD_NOTES, "Known hang").
    params, qtensors = jax.block_until_ready((params, [q for _, _, q in pairs]))
    err, norm = _quant_error_sums([w for _, w, _ in pairs], qtensors)
    sums = {"err": err, "norm": norm}
    if self._prev_params is not None:
      _require_same_tree(self._prev_params, params)
      sums["update"] = _update_sums(self._prev_params, params)
      sums["changed"] = [
        _codes_moved(c, q) for c, q in zip(self._prev_codes, qtensors)
      ]
    # Copies, because the trainer donates its buffers; of the codes only,
    # not of Q(θ)'s other leaves. From the second sync on they are written
    # into the last sync's copies, whose reads above were dispatched first.
    codes = [
      jax.ShapeDtypeStruct(q.value.shape, jnp.int8, sharding=q.value.sharding)
      for q in qtensors
    ]
    if _same_layout(self._prev_params, params) and _same_layout(
      self._prev_codes, codes
    ):
      self._prev_params, self._prev_codes = _copy_into(
        self._prev_params, self._prev_codes, params, qtensors
      )
    else:
      self._prev_params, self._prev_codes = _copy(params, qtensors)
    sums = jax.device_get(sums)
    quant_err = _ratio(sums["err"], sums["norm"])
    out = {"quant/normalized_quant_error": quant_err}
    for path, e, n in zip(paths, sums["err"], sums["norm"]):
      out[f"quant/normalized_quant_error/{path[-2]}"] = float(np.mean(e / n))
    if "update" not in sums:
      for k in (
        "normalized_weight_update",
        "normalized_kernel_update",
        "update_to_quant_error",
        "quantized_change_fraction",
      ):
        out[f"quant/{k}"] = math.nan
      return out
    moved, prev_norm = (dict(_leaf_paths(t)) for t in sums["update"])
    kernel_update = _ratio(
      [moved[p] for p in paths], [prev_norm[p] for p in paths]
    )
    out["quant/normalized_weight_update"] = _ratio(
      list(moved.values()), list(prev_norm.values())
    )
    out["quant/normalized_kernel_update"] = kernel_update
    out["quant/update_to_quant_error"] = kernel_update / quant_err
    out["quant/quantized_change_fraction"] = float(
      sum(int(c) for c in sums["changed"])
    ) / sum(q.value.size for q in qtensors)
    return out


def _ratio(nums, dens) -> float:
  """Σ nums / Σ dens, summed in float64 on the host."""
  num = sum(np.sum(x, dtype=np.float64) for x in nums)
  return float(num / sum(np.sum(x, dtype=np.float64) for x in dens))
