"""The RL update of docs/design.md section 6.

- `logprobs`: per-token log-probs and entropies from hidden states, LM head applied in chunks.
- `loss`: PPO surrogate (clip-low 0.2, clip-high 0.28, dual clip 10), KL estimators and loss aggregations
  (registries: the `kl` and `aggregation` categories of orchestra_jax/registry.py).
- `optimizer`: AdamW + global-norm clip from a config dataclass; `precision_problem` for lost updates.
- `train`: the batch format, TrainState, the jitted sharded `train_step` with gradient accumulation,
  `compute_logprobs` for old / reference log-probs, and `is_finite(metrics)`.
"""

from orchestra_jax.rl.logprobs import DEFAULT_CHUNK_SIZE, lm_head, logprobs_from_hidden, token_logprobs
from orchestra_jax.rl.loss import (AGGREGATIONS, KL_ESTIMATORS, LossConfig, Totals, aggregate, batch_totals,
                                   kl_penalty, ppo_token_loss, register_aggregation, register_kl, rl_loss)
from orchestra_jax.rl.optimizer import OptimizerConfig, learning_rate_schedule, make_optimizer, precision_problem
from orchestra_jax.rl.train import (BATCH_KEYS, REQUIRED_KEYS, Batch, TrainConfig, TrainState, accumulated_grads,
                                    batch_shardings, init_train_state, is_finite, make_compute_logprobs,
                                    make_grad_fn, make_loss_fn, make_train_step, shard_batch, train_state_shardings)

__all__ = [
    "AGGREGATIONS", "BATCH_KEYS", "Batch", "DEFAULT_CHUNK_SIZE", "KL_ESTIMATORS", "LossConfig", "OptimizerConfig",
    "REQUIRED_KEYS", "Totals", "TrainConfig", "TrainState", "accumulated_grads", "aggregate", "batch_shardings",
    "batch_totals", "init_train_state", "is_finite", "kl_penalty", "learning_rate_schedule", "lm_head",
    "logprobs_from_hidden", "make_compute_logprobs", "make_grad_fn", "make_loss_fn", "make_optimizer",
    "make_train_step", "ppo_token_loss", "precision_problem", "register_aggregation", "register_kl", "rl_loss", "shard_batch",
    "token_logprobs", "train_state_shardings",
]
