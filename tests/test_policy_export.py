"""A trained policy out of an `orchestra train` workdir: loaded, exported to HF, and the errors a user meets.

One real (tiny, 2-step) training run is shared by the module; everything reads its workdir.
"""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import max_rel_err
from orchestra_jax import checkpoint, cli
from orchestra_jax.model import qwen3

# tests/test_trainer.py's flags, smaller still (~40 s on 2 cores): 2 steps, a checkpoint after each, one eval task,
# one turn, no KL term (saves compiling the reference log-prob pass).
SMALL = ["--config.steps=2", "--config.checkpoint_every=1", "--config.prompts_per_step=1", "--config.group_size=2",
         "--config.sft.steps=0", "--config.eval_every=100", "--config.env.num_eval_tasks=1",
         "--config.env.num_train_tasks=8", "--config.rollout.batch_size=2", "--config.rollout.max_turns=1",
         "--config.rollout.max_new_tokens=8", "--config.train.mini_batch_size=8", "--config.train.kl_coef=0",
         # A random policy earns no reward, so its advantages are 0; keeping every group and turn still runs one
         # AdamW step per RL step, whose weight decay moves every param away from the reference.
         "--config.reward.std_threshold=-1", "--config.reward.require_tool_call=False"]


def leaves_equal(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(trainer, workdir) after a real 2-step `orchestra train` of the demo config."""
  from orchestra_jax import trainer
  from orchestra_jax.configs import load_config

  workdir = tmp_path_factory.mktemp("run")
  cfg = load_config("configs/demo.py", [*SMALL, f"--config.workdir={workdir}"])
  t = trainer.Trainer(cfg, quiet=True)
  t.run()
  records = [r for r in t.metrics.read() if r["kind"] == "train"]
  assert [r["step"] for r in records] == [1, 2] and all(r["turn_samples"] > 0 for r in records)
  return t, workdir


def test_run_saves_its_resolved_config(run):
  from orchestra_jax.configs import load_config
  t, workdir = run
  saved = load_config(workdir / "run_config.json")
  assert saved.to_dict() == t.cfg.to_dict()  # overrides included
  assert saved.steps == 2 and saved.workdir == str(workdir)


def trainer_state(t, step):
  """The full TrainState of `step`, restored as the trainer itself resumes (params, opt_state, step)."""
  import orbax.checkpoint as ocp
  from orchestra_jax.rl.train import init_train_state, train_state_shardings

  abstract = jax.eval_shape(lambda: init_train_state(t.model_config, qwen3.abstract_params(t.model_config),
                                                     t.train_config))
  shardings = train_state_shardings(t.model_config, t.train_config, t.sharding)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  manager = t._manager()
  try:
    return manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
  finally:
    manager.close()


def test_step_dir_loads_the_trained_params(run):
  t, workdir = run
  config, params = checkpoint.load_model(workdir / "checkpoints" / "2")
  assert config == t.model_config  # from reference/model_config.json
  state = trainer_state(t, 2)
  assert jax.tree.structure(params) == jax.tree.structure(state.params)
  assert leaves_equal(params, state.params)
  _, reference = checkpoint.load_model(workdir / "reference")
  changed = [not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference))]
  assert all(changed), "training left some params untouched"
  # Onto a mesh: each array arrives with the model's shardings, values unchanged.
  _, sharded = checkpoint.load_model(workdir / "checkpoints" / "2", t.sharding)
  want = qwen3.param_shardings(config, t.sharding)
  assert all(a.sharding == s for a, s in zip(jax.tree.leaves(sharded), jax.tree.leaves(want)))
  assert leaves_equal(sharded, params)


def test_workdir_loads_its_latest_finished_step(run, tmp_path):
  t, workdir = run
  assert sorted(checkpoint.train_checkpoint_steps(workdir)) == [0, 1, 2]
  # What orbax leaves while a save is under way is no step (atomic rename from this name).
  (workdir / "checkpoints" / "3.orbax-checkpoint-tmp-1700000000").mkdir()
  try:
    found = checkpoint.find_train_checkpoint(workdir)
    assert found.step == 2 and found.path == workdir / "checkpoints" / "2"
    _, latest = checkpoint.load_model(workdir)
  finally:
    (workdir / "checkpoints" / "3.orbax-checkpoint-tmp-1700000000").rmdir()
  _, step2 = checkpoint.load_model(workdir / "checkpoints" / "2")
  _, step1 = checkpoint.load_model(workdir / "checkpoints" / "1")
  assert leaves_equal(latest, step2) and not leaves_equal(latest, step1)
  assert checkpoint.read_model_config(workdir) == t.model_config


def test_convert_step_to_hf_matches_our_forward(run, tmp_path, capsys):
  import torch
  import transformers

  _, workdir = run
  assert cli.main(["convert", "jax-to-hf", str(workdir / "checkpoints" / "2"), str(tmp_path / "hf")]) == 0
  assert "wrote" in capsys.readouterr().out
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
  config, params = checkpoint.load_model(workdir / "checkpoints" / "2")
  tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, 7))
  with torch.no_grad():
    ref = hf(torch.tensor(tokens)).logits.numpy()
  with jax.default_matmul_precision("highest"):
    ours, _ = qwen3.forward(config, params, jnp.asarray(tokens))
  assert max_rel_err(ours, ref) < 1e-5
  # the run's tokenizer ships with the export (the trainer saves it next to the reference model)
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  assert tok.convert_tokens_to_ids("<|im_end|>") == 151645


def one_line_error(capsys, argv) -> str:
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and "Traceback" not in err, err
  return lines[0]


def test_missing_step_lists_the_available_ones(run, tmp_path, capsys):
  _, workdir = run
  with pytest.raises(checkpoint.CheckpointError, match=r"checkpoints/7 does not exist; .*: 0, 1, 2$"):
    checkpoint.load_model(workdir / "checkpoints" / "7")
  line = one_line_error(capsys, ["convert", "jax-to-hf", str(workdir / "checkpoints" / "7"), str(tmp_path / "hf")])
  assert "checkpoints/7 does not exist" in line and "0, 1, 2" in line
  assert not (tmp_path / "hf").exists()
  for argv in (["generate", "--model", str(workdir / "checkpoints" / "7"), "--prompt", "hi"],
               ["serve", "--model", str(workdir / "checkpoints" / "7")]):
    line = one_line_error(capsys, argv)
    assert "checkpoints/7 does not exist" in line and "0, 1, 2" in line, argv


def test_workdir_without_checkpoints(tmp_path, capsys):
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  with pytest.raises(checkpoint.CheckpointError, match="without a finished checkpoint"):
    checkpoint.load_model(tmp_path / "run")
  line = one_line_error(capsys, ["convert", "jax-to-hf", str(tmp_path / "run"), str(tmp_path / "hf")])
  assert "orchestra train workdir without a finished checkpoint" in line


def test_workdir_without_reference_config(run, tmp_path):
  _, workdir = run
  shutil.copytree(workdir / "checkpoints" / "2", tmp_path / "run" / "checkpoints" / "2")
  with pytest.raises(checkpoint.CheckpointError, match=r"reference/model_config.json is missing"):
    checkpoint.load_model(tmp_path / "run")


@pytest.mark.parametrize("override,needle", [
    (dict(tie_word_embeddings=False), "params missing lm_head"),  # a key the run's params lack
    (dict(mlp_dim=256), "of another shape layers.mlp.down_proj (2, 128, 64) (config: (2, 256, 64))"),
])
def test_config_that_does_not_fit_the_state(run, override, needle):
  _, workdir = run
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.load_model(workdir / "checkpoints" / "2", **override)
  assert needle in str(e.value) and "\n" not in str(e.value) and "does not match" in str(e.value)


def test_serve_names_a_run_by_workdir_and_step(run):
  """`orchestra serve --model WORKDIR[/checkpoints/N]` serves the trained params as '<workdir name>-step<N>'."""
  import json
  import urllib.request

  from orchestra_jax import serve
  _, workdir = run
  for path in (workdir, workdir / "checkpoints" / "1"):
    args = cli.build_parser().parse_args(["serve", "--model", str(path), "--port", "0", "--no-warmup", "--quiet"])
    step = 2 if path == workdir else 1
    with serve.build_server(args).start() as server:
      assert server.model_name == f"{workdir.name}-step{step}"
      with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/models", timeout=30) as resp:
        assert [m["id"] for m in json.loads(resp.read())["data"]] == [server.model_name]
