"""Per-device HBM plan for RL training of a preset (default `qwen3_8b`) on TPU meshes, without allocating anything.

Every number comes from shapes and dtypes (`jax.eval_shape`, `jax.ShapeDtypeStruct`) and from the shardings the
code itself builds (`rl.train.train_state_shardings`, `qwen3.KV_CACHE_NAMES` through `sharding.logical_to_spec`)
on a `jax.sharding.AbstractMesh` of the requested (data, fsdp, tensor) shape, so no TPU is needed: each array's
bytes per device = prod(`NamedSharding.shard_shape`) x itemsize, i.e. its bytes divided by the product of the
mesh axes it is sharded over (a mesh axis that does not divide a dim is dropped there, as the rules do).

Each row is planned for one param dtype (--param-dtype; default: the preset's, bfloat16 for qwen3_8b, and
float32). The compute dtype (`model.dtype`, activations and KV cache) stays the preset's. bfloat16 params do not
train at the design's lr 1e-6 (`rl.optimizer.precision_problem`: AdamW's updates round away), so float32 master weights
with bfloat16 compute are the configuration that learns; the bfloat16 rows show what that costs.

Columns (GB = 1e9 bytes, per device):
* param dtype the TrainState params' dtype for the row (`model.param_dtype`).
* params      the TrainState params, in that dtype.
* ref         the frozen reference params the trainer keeps for the KL term (restored with the model config, so
              same dtype and sharding as params); 0 with --no-ref (kl_coef = 0).
* sampler     the rollout sampler's weights: with param dtype == compute dtype it shares the train params (0);
              otherwise it holds `rollout.sampler.compute_params` (every weight but the norm scales cast to the
              compute dtype, sharded like the params), so decoding reads half the bytes.
* opt         `jax.eval_shape(tx.init, abstract_params)` for `rl.optimizer.make_optimizer()`, sharded like the
              params (AdamW mu and nu; optax keeps them in the param dtype: bfloat16 or float32).
* grads       `rl.train.accumulated_grads`: a float32 accumulator sharded like the params plus one micro-batch
              gradient in the param dtype (6 bytes per parameter for bf16 params, 8 for f32, before sharding).
* act saved   activations saved for the backward pass of one micro-batch of --rows-per-device rows x --seq-len
              tokens per (data x fsdp) shard, for the remat policy of the row. Measured, not guessed: JAX's own
              `saved_residuals` (what `jax.ad_checkpoint.print_saved_residuals` prints) of the real RL loss
              (`rl.train.make_loss_fn`: model + chunked LM head + PPO/KL loss), minus the arguments (params, batch),
              traced with the row's param dtype: float32 params add their compute-dtype casts (remat none saves
              each layer's; counted sharded like the params) and float32 norm scales promote a few saved
              activations to float32.
              Tensor sharding is applied by tracing the per-tensor-shard model (heads, kv heads and mlp dim divided
              by the tensor axis, as the rules `act_q_heads`/`act_kv_heads`/`act_mlp` -> tensor split them; the
              residual stream `act_embed` stays replicated). XLA fusion may drop a few f32 copies; it cannot drop
              the attention terms. Closed forms (bytes; B rows, T tokens, L layers, per tensor shard N, K, F):
                full : L*B*T*2D                      (each layer's bf16 input)            + once B*T*T (mask)
                dots : L*B*T*2(3D + NH + 2KH + 2F)   (input, q, k, v, o_proj out, gate, up)  + once B*T*T
                none : L*B*(T*(16D + 10NH + 10KH + 12F) + 6*N*T*T)  + once 5*B*N*T*T   (attention is
                       materialised: f32 masked scores + bf16 probs per layer, [B, K, G, T, T])
              plus, for all, ~B*T*(4D + 2D + 2D) for the final norm and the LM-head input chunks.
* bwd work    working set of the backward pass on top of the saved residuals: max(one layer's full residual set,
              traced with remat none = what a recomputed layer holds while its gradient is taken; for full/dots
              it includes that layer's T x T attention scores), 3 x B x chunk x V/tensor x 4 (LM-head chunk:
              logits, probs, their cotangent in f32)). A lower bound: cotangent buffers of the layer come on top.
* KV cache    `qwen3.init_cache(config, --kv-seqs, --kv-len)` (k and v [L, B, S, K, H] in the activation dtype +
              the [B, S] filled mask) sharded by `KV_CACHE_NAMES` (batch over data x fsdp, kv heads over tensor).
              The trainer's Sampler allocates it (and its weights) once and keeps them for the whole run, so they
              coexist with the update's memory: total = the sum of all columns.

Hardware assumption: slice names count TensorCores; v5p and v4 chips are megacore (2 TensorCores shown to JAX
as one device), so v5p-64 = v4-64 = 32 chips = 32 JAX devices, and the default meshes have 32 devices.
HBM per chip: v5p 95 GB (HBM2e), v4 32 GB (32 GiB = 34.4 GB; 32 GB is used, slightly conservative). "fits" is
total <= HBM, with no allowance for XLA scratch, fragmentation or the runtime's reserve (keep ~10% headroom).

    .venv/bin/python benchmarks/memory_plan.py [--meshes 1,32,1 2,16,1 1,8,4] [--rows-per-device 1]
        [--seq-len 32768] [--remat none,full,dots] [--kv-seqs 64] [--kv-len 32768] [--preset qwen3_8b]
        [--param-dtype bfloat16,float32]
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, AxisType

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig, preset
from orchestra_jax.rl.loss import batch_totals
from orchestra_jax.rl.optimizer import make_optimizer
from orchestra_jax.rl.train import TrainConfig, make_loss_fn, train_state_shardings
from orchestra_jax.rollout.compiled import compute_params
from orchestra_jax.sharding import MESH_AXES, ShardingConfig

GB = 1e9


def _saved_residuals():
  try:
    from jax.ad_checkpoint import saved_residuals  # public in some JAX versions
  except ImportError:
    from jax._src.ad_checkpoint import saved_residuals  # what print_saved_residuals uses
  return saved_residuals


def abstract_sharding(shape: tuple[int, int, int]) -> ShardingConfig:
  mesh = AbstractMesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))
  return ShardingConfig(mesh)


def per_device_bytes(shapes, shardings) -> int:
  """Σ over leaves of prod(shard shape) x itemsize (leaves: ShapeDtypeStructs; shardings: matching NamedShardings)."""
  flat_a = jax.tree.leaves(shapes)
  flat_s = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.NamedSharding))
  assert len(flat_a) == len(flat_s), (len(flat_a), len(flat_s))
  return sum(math.prod(s.shard_shape(a.shape)) * np.dtype(a.dtype).itemsize for a, s in zip(flat_a, flat_s))


def tensor_shard_config(config: ModelConfig, t: int) -> ModelConfig:
  """The model one tensor shard computes: the dims the rules shard over `tensor` divided by t (when t divides)."""
  n = config.num_heads // t if config.num_heads % t == 0 else config.num_heads
  k = config.num_kv_heads // t if config.num_kv_heads % t == 0 else config.num_kv_heads
  f = config.mlp_dim // t if config.mlp_dim % t == 0 else config.mlp_dim
  if n % k:
    raise SystemExit(f"tensor={t}: shards {config.num_heads} query heads but not {config.num_kv_heads} kv heads; "
                     "this plan does not model that layout")
  return config.replace(num_heads=n, num_kv_heads=k, mlp_dim=f)


@functools.lru_cache(maxsize=None)
def traced_residuals(config: ModelConfig, rows: int, length: int) -> tuple[int, int, int, int]:
  """(total bytes of the non-argument residuals, bytes of the layer-stacked ones, bytes of the weight casts among
  all, among the stacked ones) of the RL loss's backward.

  Weight casts: with param_dtype != dtype the model's `w.astype(dtype)` outputs are residuals (a bf16 copy of each
  layer's matrices for remat none), not arguments. They are told from activations by shape (a param's shape, no
  batch or length dim) and dtype, so the caller can shard them like the params."""
  train_config = TrainConfig()
  loss_fn = make_loss_fn(config, train_config)
  S = jax.ShapeDtypeStruct
  bt = (rows, length)
  batch = {"tokens": S(bt, jnp.int32), "positions": S(bt, jnp.int32), "segment_ids": S(bt, jnp.int32),
           "response_mask": S(bt, jnp.float32), "advantages": S((rows,), jnp.float32),
           "old_logprobs": S(bt, jnp.float32), "ref_logprobs": S(bt, jnp.float32)}

  def loss(params, b):
    return loss_fn(params, b, batch_totals(b["response_mask"] > 0))[0]

  param_shapes = set()
  if config.param_dtype != config.dtype:
    param_shapes = {tuple(a.shape) for a in jax.tree.leaves(qwen3.abstract_params(config))}
  total = stacked = weights = stacked_weights = 0
  for aval, source in _saved_residuals()(loss, qwen3.abstract_params(config), batch):
    if "argument" in source:  # params and batch: counted elsewhere
      continue
    nbytes = math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
    total += nbytes
    is_stacked = bool(aval.shape) and aval.shape[0] == config.num_layers and "scan" in source
    is_weight = tuple(aval.shape) in param_shapes and aval.dtype == config.jnp_dtype
    stacked += nbytes * is_stacked
    weights += nbytes * is_weight
    stacked_weights += nbytes * (is_stacked and is_weight)
  return total, stacked, weights, stacked_weights


def activation_bytes(config: ModelConfig, remat: str, t: int, rows: int, length: int, chunk: int, fsdp: int = 1
                     ) -> tuple[int, int]:
  """(saved residuals, backward working set) per device for `rows` x `length` tokens per (data x fsdp) shard.

  Weight casts among the residuals (float32 params) count sharded like their params: over tensor already (the
  trace is of one tensor shard) and over fsdp on the embed dim, as the SPMD partitioner keeps an elementwise cast's
  output in its input's sharding and gathers it again for the backward matmuls, as it does bfloat16 params. The
  backward working set leaves a layer's gathered weights out for every param dtype."""
  shard = tensor_shard_config(config, t)
  saved, _, weights, _ = traced_residuals(shard.replace(remat=remat), rows, length)
  if config.embed_dim % fsdp == 0:
    saved -= weights - weights // fsdp
  _, stacked_none, _, stacked_weights = traced_residuals(shard.replace(remat="none"), rows, length)
  layer = (stacked_none - stacked_weights) // config.num_layers
  vocab = config.vocab_size // t if config.vocab_size % t == 0 else config.vocab_size
  head = 3 * rows * min(chunk, length) * vocab * 4
  return saved, max(layer, head)


def plan_row(config: ModelConfig, mesh_shape, remat: str, args) -> dict:
  sharding = abstract_sharding(mesh_shape)
  train_config = TrainConfig()
  state_sh = train_state_shardings(config, train_config, sharding)
  abstract = qwen3.abstract_params(config)
  params = per_device_bytes(abstract, state_sh.params)
  opt_shapes = jax.eval_shape(make_optimizer(train_config.optimizer).init, abstract)
  opt = per_device_bytes(opt_shapes, state_sh.opt_state)
  grads_f32 = per_device_bytes(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32), abstract),
                               state_sh.params)
  grads = grads_f32 + params  # f32 accumulator + one micro-batch gradient in the param dtype
  ref = 0 if args.no_ref else params
  sampler = 0  # the Sampler holds the train params themselves
  if config.param_dtype != config.dtype:  # ... or its own compute-dtype copy (f32 master weights)
    sampler = per_device_bytes(jax.eval_shape(lambda p: compute_params(config, p), abstract), state_sh.params)

  cache_shapes = jax.eval_shape(lambda: qwen3.init_cache(config, args.kv_seqs, args.kv_len))
  cache_sh = jax.tree.map(lambda n, a: sharding.sharding(a.shape, n), qwen3.KV_CACHE_NAMES, cache_shapes,
                          is_leaf=lambda x: isinstance(x, tuple))
  kv = per_device_bytes(cache_shapes, cache_sh)

  t = mesh_shape[2]
  act, work = activation_bytes(config, remat, t, args.rows_per_device, args.seq_len, train_config.logprob_chunk_size,
                               fsdp=mesh_shape[1])
  total = params + ref + sampler + opt + grads + act + work + kv
  return dict(mesh=mesh_shape, remat=remat, params=params, ref=ref, sampler=sampler, opt=opt, grads=grads, act=act,
              work=work, kv=kv, total=total)


def longest_fitting(config: ModelConfig, mesh_shape, remat: str, args, hbm: float, step: int = 1024,
                    limit: int = 262144) -> int:
  """The largest multiple of `step` (≤ limit) for --seq-len whose total fits in `hbm` bytes; 0 if none."""
  def fits(length):
    sub = argparse.Namespace(**{**vars(args), "seq_len": length})
    return plan_row(config, mesh_shape, remat, sub)["total"] <= hbm

  lo, hi = 0, limit // step  # fits(lo * step) assumed (0 = nothing), find the largest hi with fits
  if not fits(step):
    return 0
  lo = 1
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if fits(mid * step):
      lo = mid
    else:
      hi = mid - 1
  return lo * step


def _gb(x: float) -> str:
  return f"{x / GB:,.1f}"


def _fit(total: float, hbm: float) -> str:
  return f"yes ({total / hbm:.0%})" if total <= hbm else f"no ({total / hbm:.0%})"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="qwen3_8b", help="model preset (default qwen3_8b)")
  parser.add_argument("--meshes", nargs="+", default=["1,32,1", "2,16,1", "1,8,4"],
                      help="(data,fsdp,tensor) mesh shapes, e.g. 1,32,1 (default: 1,32,1 2,16,1 1,8,4 = 32 devices)")
  parser.add_argument("--rows-per-device", type=int, default=1,
                      help="micro-batch rows per (data x fsdp) shard, i.e. per device row of the mesh (default 1)")
  parser.add_argument("--seq-len", type=int, default=32768, help="tokens per micro-batch row (default 32768)")
  parser.add_argument("--remat", default=None,
                      help="comma-separated remat policies to plan (none, full, dots); default: all three, the "
                           "preset's own marked '(configured)'")
  parser.add_argument("--kv-seqs", type=int, default=64, help="rollout sequences in the KV cache (default 64)")
  parser.add_argument("--kv-len", type=int, default=32768, help="KV cache positions per sequence (default 32768)")
  parser.add_argument("--no-ref", action="store_true", help="no reference params (kl_coef = 0)")
  parser.add_argument("--param-dtype", default=None,
                      help="comma-separated param dtypes to plan (float32, bfloat16, float16); the compute dtype "
                           "stays the preset's. Default: the preset's param_dtype, then float32 (master weights)")
  parser.add_argument("--hbm-v5p", type=float, default=95.0, help="HBM per v5p chip in GB (default 95)")
  parser.add_argument("--hbm-v4", type=float, default=32.0, help="HBM per v4 chip in GB (default 32)")
  parser.add_argument("--no-search", action="store_true",
                      help="skip the second table (longest --seq-len that fits, per mesh and policy)")
  args = parser.parse_args()

  wall = time.perf_counter()
  config = preset(args.preset)
  policies = args.remat.split(",") if args.remat else ["none", "full", "dots"]
  param_dtypes = args.param_dtype.split(",") if args.param_dtype else [config.param_dtype, "float32"]
  param_dtypes = list(dict.fromkeys(param_dtypes))
  try:
    configs = [config.replace(param_dtype=d) for d in param_dtypes]
  except ValueError as e:
    raise SystemExit(f"--param-dtype: {e}") from None
  meshes = [tuple(int(x) for x in m.split(",")) for m in args.meshes]
  for m in meshes:
    if len(m) != 3:
      raise SystemExit(f"mesh {m}: give three sizes (data,fsdp,tensor)")
  hbm = {"v5p": args.hbm_v5p * GB, "v4": args.hbm_v4 * GB}

  print(f"{args.preset}: {config.num_params() / 1e9:.2f}B params, param_dtype {config.param_dtype} (planned: "
        f"{', '.join(param_dtypes)}), dtype {config.dtype}, configured remat '{config.remat}'")
  print(f"micro-batch per (data x fsdp) shard: {args.rows_per_device} x {args.seq_len} tokens; KV cache: "
        f"{args.kv_seqs} seqs x {args.kv_len} positions; reference params: {'no' if args.no_ref else 'yes'}")
  print("v5p-64 and v4-64 = 32 chips = 32 JAX devices (megacore); GB = 1e9 bytes, per device")
  print()
  print("| mesh (data,fsdp,tensor) | remat | param dtype | params | ref | sampler | opt | grads | act saved "
        f"| bwd work | KV cache | total | fits v5p ({args.hbm_v5p:g} GB) | fits v4 ({args.hbm_v4:g} GB) |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for m in meshes:
    for remat in policies:
      for c in configs:
        r = plan_row(c, m, remat, args)
        mark = " (configured)" if remat == config.remat else ""
        print(f"| {m} | {remat}{mark} | {c.param_dtype} | {_gb(r['params'])} | {_gb(r['ref'])} "
              f"| {_gb(r['sampler'])} | {_gb(r['opt'])} | {_gb(r['grads'])} | {_gb(r['act'])} | {_gb(r['work'])} "
              f"| {_gb(r['kv'])} | {_gb(r['total'])} | {_fit(r['total'], hbm['v5p'])} "
              f"| {_fit(r['total'], hbm['v4'])} |")

  if not args.no_search:
    print()
    print(f"longest micro-batch row (--seq-len, multiple of 1024) whose total fits, same other settings "
          f"({args.rows_per_device} row(s) per shard):")
    print("| mesh (data,fsdp,tensor) | remat | param dtype | v5p | v4 |")
    print("|---|---|---|---|---|")
    for m in meshes:
      for remat in policies:
        for c in configs:
          cells = []
          for chip in ("v5p", "v4"):
            n = longest_fitting(c, m, remat, args, hbm[chip])
            cells.append(f"{n:,}" if n else "< 1,024")
          print(f"| {m} | {remat} | {c.param_dtype} | {cells[0]} | {cells[1]} |")
  print(f"\n(plan computed in {time.perf_counter() - wall:.0f} s, nothing allocated)")


if __name__ == "__main__":
  main()
