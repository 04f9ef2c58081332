"""The sampler: greedy parity with transformers' generate, log-probs, continuous batching, stops, extension,
sharding. Tiny random float32 models (weights std 0.2), highest matmul precision."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from conftest import max_rel_err
from orchestra_jax import checkpoint
from orchestra_jax.model import qwen3
from orchestra_jax.rollout.sampler import Sampler, SamplingParams, default_buckets
from orchestra_jax.rollout.sampling import inverse_cdf_sample
from orchestra_jax.sharding import ShardingConfig, make_mesh

pytestmark = pytest.mark.usefixtures("highest_precision")

NO_STOPS = dict(stop_ids=())


@pytest.fixture(scope="module")
def models(hf_dirs):
  """name -> (torch model, config, params)."""
  return {name: (model, *checkpoint.load_model(path)) for name, (model, path) in hf_dirs.items()}


def _prompts(vocab, lengths, seed=0):
  rng = np.random.RandomState(seed)
  return [rng.randint(0, vocab, n).tolist() for n in lengths]


def _hf_greedy(model, prompt, n):
  model.generation_config.eos_token_id = None
  with torch.no_grad():
    ids = torch.tensor([prompt])  # an explicit mask: HF would otherwise mask prompt tokens equal to pad_token_id
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, pad_token_id=0)
  return out[0, len(prompt):].tolist()


def _hf_greedy_batch(model, prompts, n):
  """HF generate on a left-padded batch with an attention mask."""
  width = max(map(len, prompts))
  ids = torch.zeros((len(prompts), width), dtype=torch.long)
  mask = torch.zeros_like(ids)
  for i, p in enumerate(prompts):
    ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
  model.generation_config.eos_token_id = None
  with torch.no_grad():
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                         pad_token_id=0)
  return out[:, width:].tolist()


@functools.lru_cache(maxsize=None)
def _jit_forward(config):
  return jax.jit(lambda p, t, seg: qwen3.forward(config, p, t, segment_ids=seg)[0])


def _full_logits(config, params, tokens, width=32):
  """Logits [T, V] of one sequence (right-padded to a fixed width: one compile per model)."""
  padded, seg = np.zeros((1, width), np.int32), np.zeros((1, width), np.int32)
  padded[0, :len(tokens)], seg[0, :len(tokens)] = tokens, 1
  return np.asarray(_jit_forward(config)(params, padded, seg)[0, :len(tokens)], np.float64)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# --- greedy parity -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,lengths,batch", [
    ("untied_gqa2", (7,), 1),
    ("untied_gqa2", (3, 11, 6, 1), 4),  # one prefill of mixed lengths
    ("tied_mha", (5, 9, 2, 12, 4, 6, 3), 4),  # more sequences than slots: continuous batching
])
def test_greedy_matches_transformers_generate(models, name, lengths, batch):
  model, config, params = models[name]
  prompts = _prompts(config.vocab_size, lengths, seed=len(lengths))
  sampler = Sampler(config, params, max_len=32, batch_size=batch, chunk_steps=4, **NO_STOPS)
  results = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=9))
  for prompt, r in zip(prompts, results):
    assert r.tokens == _hf_greedy(model, prompt, 9)
    assert r.finish_reason == "length"
  if len(prompts) == batch:
    assert [r.tokens for r in results] == _hf_greedy_batch(model, prompts, 9)


def test_greedy_chunked_prefill_matches_transformers(models):
  """Prompts longer than the largest bucket are prefilled in pieces."""
  model, config, params = models["untied_gqa4_wide_heads"]
  prompts = _prompts(config.vocab_size, (19, 6), seed=5)
  sampler = Sampler(config, params, max_len=32, batch_size=2, chunk_steps=4, prompt_buckets=(4, 8), **NO_STOPS)
  results = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=7))
  for prompt, r in zip(prompts, results):
    assert r.tokens == _hf_greedy(model, prompt, 7)


def test_default_buckets():
  assert default_buckets(100) == (16, 32, 64, 100)
  assert default_buckets(4096) == (16, 32, 64, 128, 256, 512, 1024)
  assert default_buckets(8, minimum=16) == (8,)


# --- log-probs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_match_full_forward(models, temperature):
  _, config, params = models["untied_gqa2"]
  prompts = _prompts(config.vocab_size, (4, 8, 3), seed=11)
  sampler = Sampler(config, params, max_len=32, batch_size=4, chunk_steps=4, **NO_STOPS)
  results = sampler.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=8), seeds=[1, 2, 3])
  for prompt, r in zip(prompts, results):
    logits = _full_logits(config, params, prompt + r.tokens)[len(prompt) - 1:-1]  # predicts each new token
    ref = _log_softmax(logits / (temperature or 1.0))[np.arange(len(r.tokens)), r.tokens]
    assert max_rel_err(r.logprobs, ref) < 1e-5
    if temperature == 0.0:
      assert r.tokens == logits.argmax(-1).tolist()


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.6), (7, 0.8)])
def test_top_k_top_p_logprobs_are_under_the_filtered_distribution(models, top_k, top_p):
  _, config, params = models["untied_gqa2"]
  prompts = _prompts(config.vocab_size, (5, 2), seed=12)
  sampler = Sampler(config, params, max_len=32, batch_size=4, chunk_steps=4, **NO_STOPS)
  temperature = 0.9
  results = sampler.generate(prompts, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                                     max_new_tokens=6), seeds=[3, 4])
  for prompt, r in zip(prompts, results):
    logits = _full_logits(config, params, prompt + r.tokens)[len(prompt) - 1:-1] / temperature
    order = np.argsort(-logits, axis=-1)
    for t, (row, tok) in enumerate(zip(logits, r.tokens)):
      vals = row[order[t]]
      k = top_k or len(vals)
      probs = np.exp(_log_softmax(vals[:k]))
      n_keep = int(np.sum(np.cumsum(probs) - probs < top_p))
      kept = np.where(row >= vals[n_keep - 1], row, -np.inf)
      assert np.isfinite(kept[tok]), "sampled a token outside the top-k / top-p set"
      ref = _log_softmax(kept)[tok]
      assert abs(r.logprobs[t] - ref) <= 1e-5 * max(1.0, abs(ref))


# --- continuous batching -------------------------------------------------------------------------------

def test_continuous_batching_matches_sequences_run_alone(models):
  _, config, params = models["tied_mha"]
  lengths = (6, 2, 9, 4, 11, 3, 7)
  prompts = _prompts(config.vocab_size, lengths, seed=21)
  sampling = [SamplingParams(temperature=1.0, top_k=0 if i % 2 else 20, max_new_tokens=3 + (5 * i) % 9)
              for i in range(len(prompts))]
  seeds = [100 + 7 * i for i in range(len(prompts))]
  sampler = Sampler(config, params, max_len=32, batch_size=4, chunk_steps=4, **NO_STOPS)
  together = sampler.generate(prompts, sampling, seeds)  # 7 sequences through 4 slots
  for i, prompt in enumerate(prompts):
    (single,) = sampler.generate([prompt], sampling[i], [seeds[i]])
    assert single.tokens == together[i].tokens
    assert len(single.tokens) == sampling[i].max_new_tokens
    np.testing.assert_allclose(single.logprobs, together[i].logprobs, rtol=1e-5, atol=1e-6)
  # Same seed and prompt in another position of the batch: same sample; another seed: a different one.
  again = sampler.generate([prompts[1], prompts[0]], [sampling[0], sampling[0]], [seeds[0], seeds[0]])
  assert again[1].tokens == together[0].tokens
  other = sampler.generate([prompts[0]], sampling[0], [seeds[0] + 1])
  assert other[0].tokens != together[0].tokens


# --- stops ---------------------------------------------------------------------------------------------

def test_stop_tokens_and_max_tokens_set_finish_reasons(models):
  _, config, params = models["untied_gqa2"]
  (prompt,) = _prompts(config.vocab_size, (5,), seed=31)
  sampler = Sampler(config, params, max_len=32, batch_size=1, chunk_steps=4, stop_ids=(), tool_call_ids=())
  greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
  (ref,) = sampler.generate([prompt], greedy)
  assert ref.finish_reason == "length" and len(ref.tokens) == 10

  stop_at = 4  # choose the stop id so the first occurrence is at index >= 1
  stop_id = ref.tokens[stop_at]
  first = ref.tokens.index(stop_id)
  (r,) = sampler.generate([prompt], dataclasses.replace(greedy, stop_ids=(stop_id,)))
  assert r.finish_reason == "stop" and r.tokens == ref.tokens[:first + 1]

  tool = Sampler(config, params, max_len=32, batch_size=1, chunk_steps=4, stop_ids=(stop_id, 319),
                 tool_call_ids=(stop_id,))
  (r,) = tool.generate([prompt], greedy)
  assert r.finish_reason == "tool_call" and r.tokens == ref.tokens[:first + 1]

  # Stop on the very first token (decided in the prefill), and max_new_tokens=1.
  (r,) = sampler.generate([prompt], dataclasses.replace(greedy, stop_ids=(ref.tokens[0],)))
  assert (r.tokens, r.finish_reason) == (ref.tokens[:1], "stop")
  (r,) = sampler.generate([prompt], dataclasses.replace(greedy, max_new_tokens=1))
  assert (r.tokens, r.finish_reason) == (ref.tokens[:1], "length")

  # A full cache row ends the turn with "length": 16 prompt tokens + 16 sampled fill max_len 32, and one more
  # is sampled (the pending token, never written).
  (long_prompt,) = _prompts(config.vocab_size, (16,), seed=32)
  (r,) = sampler.generate([long_prompt], dataclasses.replace(greedy, max_new_tokens=100))
  assert (len(r.tokens), r.finish_reason) == (17, "length")


# --- extension -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_extend_matches_prefilling_the_concatenation(models, temperature):
  _, config, params = models["untied_gqa4_wide_heads"]
  prompt, tool_response, other = _prompts(config.vocab_size, (6, 5, 9), seed=41)
  sampling = SamplingParams(temperature=temperature, max_new_tokens=5)
  s = Sampler(config, params, max_len=32, batch_size=2, chunk_steps=4, **NO_STOPS)
  s.start(1, prompt, sampling, seed=9, tag="conv")
  s.start(0, other, sampling, seed=5)  # a neighbour that keeps running while slot 1 is extended
  turns = {}
  while s.slot_state(1) != "finished":
    turns.update({t.tag: t for t in s.step()})
  first = turns["conv"]
  assert s.conversation(1) == prompt + first.tokens
  s.extend(1, tool_response, SamplingParams(temperature=temperature, max_new_tokens=6))
  assert s.slot_state(1) == "staged"
  second = None
  while second is None:
    second = next((t for t in s.step() if t.slot == 1), None)
  conversation = prompt + first.tokens + tool_response
  assert s.conversation(1) == conversation + second.tokens

  fresh = Sampler(config, params, max_len=32, batch_size=2, chunk_steps=4, **NO_STOPS)
  (ref,) = fresh.generate([conversation], SamplingParams(temperature=temperature, max_new_tokens=6), seeds=[9])
  assert second.tokens == ref.tokens
  np.testing.assert_allclose(second.logprobs, ref.logprobs, rtol=1e-5, atol=1e-6)

  # truncate back to the prompt and extend with the tool response: same as prefilling prompt + tool_response.
  s.truncate(1, len(prompt))
  s.extend(1, tool_response)
  third = None
  while third is None:
    third = next((t for t in s.step() if t.slot == 1), None)
  (ref,) = fresh.generate([prompt + tool_response], SamplingParams(temperature=temperature, max_new_tokens=6),
                          seeds=[9])
  assert third.tokens == ref.tokens


def test_slot_api_errors(models):
  _, config, params = models["untied_gqa2"]
  s = Sampler(config, params, max_len=32, batch_size=1, chunk_steps=4, **NO_STOPS)
  with pytest.raises(ValueError, match="do not fit"):
    s.start(0, list(range(33)))
  with pytest.raises(ValueError, match="token ids"):
    s.start(0, [config.vocab_size])
  s.start(0, [1, 2, 3], SamplingParams(temperature=0.0, max_new_tokens=2))
  with pytest.raises(RuntimeError, match="only a finished slot"):
    s.extend(0, [4])
  (turn,) = s.step()
  assert turn.finish_reason == "length"
  with pytest.raises(ValueError, match="do not fit"):
    s.extend(0, list(range(28)))
  s.start(0, [1])
  with pytest.raises(RuntimeError, match="idle"):
    s.generate([[1, 2]])
  with pytest.raises(ValueError):
    SamplingParams(top_p=0.0)


# --- sharding ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (1, 2, 4)])
def test_sharded_sampler_matches_single_device(models, mesh_shape):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=8")
  _, config, params = models["tied_mha"]
  prompts = _prompts(config.vocab_size, (5, 9, 2, 7, 4, 6), seed=51)
  sampling = SamplingParams(temperature=0.9, top_k=30, max_new_tokens=6)
  kw = dict(max_len=32, batch_size=4, chunk_steps=4, **NO_STOPS)
  ref = Sampler(config, params, **kw).generate(prompts, sampling)
  sharding = ShardingConfig(make_mesh(mesh_shape))
  sharded = Sampler(config, params, sharding=sharding, **kw)
  out = sharded.generate(prompts, sampling)
  assert sharded._cache.k.sharding.mesh.shape == dict(zip(("data", "fsdp", "tensor"), mesh_shape))
  for a, b in zip(out, ref):
    assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-6)


def test_inverse_cdf_sampling_matches_the_distribution():
  """Frequencies of 20000 draws over a 3000-token distribution (several blocks) match its probabilities."""
  rng = np.random.RandomState(0)
  logits = np.full((1, 3000), -np.inf, np.float32)
  support = rng.choice(3000, 12, replace=False)
  logits[0, support] = rng.randn(12)
  probs = jax.nn.softmax(jnp.asarray(logits), axis=-1)
  u = jax.random.uniform(jax.random.key(0), (20000,), minval=1e-7)
  draws = np.asarray(jax.vmap(lambda x: inverse_cdf_sample(probs, x[None])[0])(u))
  assert set(draws) <= set(support.tolist())
  freq = np.bincount(draws, minlength=3000)[support] / len(draws)
  np.testing.assert_allclose(freq, np.asarray(probs)[0, support], atol=0.012)
