"""`orchestra`: the command line. Each sub-command is a thin wrapper over a library function.

Errors a user can fix (bad config key, missing checkpoint, malformed file) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import jax

from orchestra_jax import checkpoint, configs, convert, distributed, generate, preflight, tokenizer, trainer
from orchestra_jax.data.cli import add_data_parser, run_data
from orchestra_jax.errors import UserError
from orchestra_jax.evaluate.cli import add_eval_parser, run_eval_command
from orchestra_jax.model import qwen3
from orchestra_jax.serve.cli import add_serve_parser, run_serve
from orchestra_jax.synth.cli import add_synth_parser, run_synth

_EPILOG = textwrap.dedent("""\
    examples:
      orchestra init-random --config tiny --out runs/tiny
      orchestra generate --model runs/tiny --prompt "What is 17 * 23?" --chat
      orchestra convert hf-to-jax ~/Qwen3-8B runs/qwen3-8b
      orchestra convert jax-to-hf runs/qwen3-8b exports/qwen3-8b --max-shard-size 5GB --dtype bfloat16
      orchestra convert jax-to-hf runs/demo exports/demo     # a trained run: its latest checkpoint
    """)


def _add_config_args(p: argparse.ArgumentParser, default: str | None):
  p.add_argument("--config", default=default, metavar="NAME|FILE",
                 help="a packaged config by name (demo, tiny, orchestrator_8b), a config file (a .py defining "
                      "get_config(), e.g. configs/tiny.py) or a run's saved WORKDIR/run_config.json. Any field can be "
                      "overridden with --config.FIELD.PATH=VALUE, e.g. --config.model.num_layers=4"
                      + (f" (default: {default})" if default else ""))


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="orchestra", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
      description="orchestra-jax: train, run and convert Qwen3 tool orchestrators in JAX.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  # convert
  convert = sub.add_parser("convert", help="convert checkpoints between Hugging Face and orchestra (orbax) formats",
                           description="Convert checkpoints. Both directions stream tensor by tensor.")
  conv_sub = convert.add_subparsers(dest="direction", required=True, metavar="DIRECTION")
  h2j = conv_sub.add_parser("hf-to-jax", help="HF Qwen3 directory (config.json + safetensors) -> orbax checkpoint")
  h2j.add_argument("hf_dir", metavar="HF_DIR", help="directory with config.json and *.safetensors (+ tokenizer files)")
  h2j.add_argument("out_dir", metavar="OUT_DIR", help="where to write the orchestra checkpoint (must not exist yet)")
  h2j.add_argument("--param-dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="store weights in this dtype (default: the dtype in config.json)")
  j2h = conv_sub.add_parser("jax-to-hf", help="orchestra checkpoint -> HF directory loadable by transformers and vLLM")
  j2h.add_argument("ckpt_dir", metavar="CKPT_DIR",
                   help="orchestra checkpoint (model_config.json + params/), or a trained policy: an orchestra train "
                        "WORKDIR (its latest checkpoint) or WORKDIR/checkpoints/STEP")
  j2h.add_argument("out_dir", metavar="OUT_DIR", help="output directory for safetensors shards, config and tokenizer")
  j2h.add_argument("--max-shard-size", default="5GB",
                   help="largest safetensors shard, e.g. 5GB, 500MB, 2GiB or bytes (default: 5GB)")
  j2h.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="dtype of the exported weights and of config.json's dtype/torch_dtype (default: the "
                        "checkpoint's param_dtype). Use bfloat16 to serve a run trained with float32 master "
                        "weights (model.param_dtype=float32) in vLLM at half the size; each weight is rounded "
                        "to the nearest value of that dtype")

  # generate
  gen = sub.add_parser("generate", help="generate text from a checkpoint or HF directory",
                       description="Generate a completion for one prompt (greedy when --temperature 0).")
  gen.add_argument("--model", required=True, metavar="DIR",
                   help="orchestra checkpoint, HF Qwen3 directory, or orchestra train WORKDIR[/checkpoints/STEP]")
  gen.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt text")
  gen.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate at most (default 64)")
  gen.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sampling temperature; 0 means greedy (default 0)")
  gen.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message with the tokenizer's chat template and stop at <|im_end|>")
  gen.add_argument("--seed", type=int, default=0, help="PRNG seed for sampling (default 0)")
  gen.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="tokenizer directory (default: the model directory, else the bundled Qwen3 tokenizer)")

  # init-random
  init = sub.add_parser("init-random", help="write a randomly initialised model checkpoint (for tests and demos)",
                        description="Create a random Qwen3 checkpoint from a config, with the bundled Qwen3 tokenizer.")
  _add_config_args(init, "tiny")
  init.add_argument("--out", required=True, metavar="DIR", help="output checkpoint directory (must not exist yet)")
  init.add_argument("--seed", type=int, default=None, help="PRNG seed (default: the config's seed)")

  train = sub.add_parser("train", help="RL-train an orchestrator (GRPO with the multi-objective reward)",
                         description="Run the RL loop of a config; resumes from the latest checkpoint in its workdir.")
  _add_config_args(train, "demo")
  train.add_argument("--quiet", action="store_true", help="no progress bars")
  train.add_argument("--check", action="store_true",
                     help="check everything the run needs without training: the config, the starting checkpoint's "
                          "architecture (its config only), the workdir, the data (env section) and every endpoint "
                          "the run will call (GET /v1/models: catalog backends incl. records' alias maps, the tau2 "
                          "user simulator, the judge); prints a table; exit 0 when all pass, 2 otherwise")

  add_serve_parser(sub)
  add_synth_parser(sub)
  add_data_parser(sub)

  add_eval_parser(sub)
  return parser


def _cmd_convert(args) -> None:
  if args.direction == "hf-to-jax":
    out = convert.hf_to_jax(args.hf_dir, args.out_dir, param_dtype=args.param_dtype)
  else:
    out = convert.jax_to_hf(args.ckpt_dir, args.out_dir, max_shard_size=args.max_shard_size, dtype=args.dtype)
  print(f"wrote {out}")


def _cmd_generate(args) -> None:
  checkpoint.find_train_checkpoint(args.model)  # a run's missing step: one line naming the finished ones
  if not Path(args.model).is_dir():
    raise checkpoint.CheckpointError(f"model directory {args.model} does not exist")
  tok_dir = args.tokenizer
  if tok_dir is None and any((Path(args.model) / f).is_file() for f in checkpoint.TOKENIZER_FILES):
    tok_dir = args.model
  tok = tokenizer.load_tokenizer(tok_dir)
  config, params = checkpoint.load_model(args.model)
  if args.chat:
    prompt_ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
    stop = tuple(t for t in (tok.eos_id, config.eos_token_id) if t is not None)
  else:
    prompt_ids = tok.encode(args.prompt)
    stop = tuple(t for t in (config.eos_token_id,) if t is not None)
  start = time.perf_counter()
  out = generate.generate(config, params, prompt_ids, args.max_new_tokens, args.temperature, stop, args.seed)
  seconds = time.perf_counter() - start
  print(tok.decode(out, skip_special_tokens=args.chat))
  finish = "stop" if out and out[-1] in stop else "length"
  print(f"[{len(prompt_ids)} prompt tokens, {len(out)} generated, finish={finish}, {seconds:.1f}s incl. compile]",
        file=sys.stderr)


def _cmd_init_random(args, overrides) -> None:
  cfg = configs.load_config(args.config, overrides)
  model_config = configs.model_config(cfg)
  seed = cfg.seed if args.seed is None else args.seed
  params = qwen3.init_params(model_config, jax.random.key(seed))
  tok_dir = cfg.tokenizer_dir or str(tokenizer.qwen3_tokenizer_dir())
  out = checkpoint.save_model(args.out, model_config, params, tokenizer_dir=tok_dir)
  print(f"wrote random {model_config.num_params() / 1e6:.1f}M-parameter model to {out}")


def _cmd_train(args, overrides) -> None:
  cfg = configs.load_config(args.config, overrides)  # config errors before any JAX start-up
  if args.check:
    print(preflight.check_or_raise(cfg))
    return
  distributed.maybe_initialize()
  summary = trainer.Trainer(cfg, quiet=args.quiet).run()
  if jax.process_index() == 0:  # one summary per job, not per process
    print(trainer.format_summary(summary))


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = build_parser()
  try:
    overrides, rest = configs.split_config_overrides(argv)
    args = parser.parse_args(rest)
    if overrides and not hasattr(args, "config"):
      parser.error(f"{args.command} takes no --config overrides (got {overrides[0]})")
    if args.command == "convert":
      _cmd_convert(args)
    elif args.command == "generate":
      _cmd_generate(args)
    elif args.command == "init-random":
      _cmd_init_random(args, overrides)
    elif args.command == "train":
      _cmd_train(args, overrides)
    elif args.command == "serve":
      run_serve(args)
    elif args.command == "eval":
      run_eval_command(args, overrides)
    elif args.command == "synth":
      run_synth(args)
    elif args.command == "data":
      run_data(args)
  except UserError as e:
    print(f"orchestra: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
