"""`orchestra eval`'s command line: the argparse parser, the `EvalRequest` built from its arguments, and `main`
(`python -m orchestra_jax.evaluate`). The only module of the eval that sees an argparse Namespace."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from orchestra_jax import configs as config_lib
from orchestra_jax.errors import UserError
from orchestra_jax.evaluate.run import EvalRequest, run_eval
from orchestra_jax.evaluate.tasks import BENCHMARKS, EvalSettings


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
  """Adds `eval` to the `orchestra` sub-command parsers; returns its parser."""
  p = subparsers.add_parser(
      "eval", help="evaluate an orchestrator on FRAMES, HLE or tau2 (accuracy, cost, latency, tool use)",
      formatter_class=argparse.RawDescriptionHelpFormatter,
      description="Run an orchestrator (our checkpoint, or any OpenAI-compatible model) on a benchmark, grade it "
                  "(exact match, then an LLM judge) and report accuracy, cost, latency and tool-call shares. Results "
                  "go to OUT/results.jsonl item by item; a rerun with the same --out resumes.",
      epilog="examples:\n"
             "  orchestra eval --config orchestrator_8b --benchmark frames --model runs/ckpt --limit 50 \\\n"
             "      --judge-endpoint http://127.0.0.1:8200 --judge-model Qwen/Qwen3-32B\n"
             "  orchestra eval --config tiny --benchmark hle --hle-path ~/hle.parquet \\\n"
             "      --orchestrator-endpoint http://127.0.0.1:8101 --orchestrator-model gpt-5 --out runs/eval/hle-gpt5\n"
             "settings (config section 'eval', all optional): "
             + ", ".join(f.name for f in dataclasses.fields(EvalSettings)))
  p.add_argument("--config", required=True, metavar="NAME|FILE",
                 help="a packaged config by name (demo, tiny, orchestrator_8b) or a config file (configs/*.py); its "
                      "optional 'eval' section holds the settings below; any field can be overridden with "
                      "--config.FIELD.PATH=VALUE")
  p.add_argument("--benchmark", required=True, metavar="NAME", help=f"one of {', '.join(BENCHMARKS)}")
  p.add_argument("--model", metavar="DIR", help="orchestrator checkpoint (or HF Qwen3 directory, or orchestra train "
                                                 "WORKDIR[/checkpoints/STEP]), run by the sampler")
  p.add_argument("--orchestrator-endpoint", metavar="URL",
                 help="OpenAI-compatible endpoint of an orchestrator model (instead of --model), for baselines")
  p.add_argument("--orchestrator-model", metavar="NAME", help="model name to send to --orchestrator-endpoint")
  p.add_argument("--orchestrator-api-key-env", metavar="VAR",
                 help="NAME of the environment variable holding the orchestrator endpoint's API key")
  p.add_argument("--limit", type=int, metavar="N", help="evaluate the first N items only")
  p.add_argument("--out", metavar="DIR", help="output directory (default runs/eval/BENCHMARK-ORCHESTRATOR)")
  p.add_argument("--judge-endpoint", metavar="URL", help="OpenAI-compatible endpoint of the LLM judge")
  p.add_argument("--judge-model", metavar="NAME", help="judge model name")
  p.add_argument("--judge-api-key-env", metavar="VAR", help="NAME of the environment variable with the judge's key")
  p.add_argument("--judge-prompt", metavar="STYLE",
                 help="judge prompt: hle (extract the final answer, correct: yes/no) or reference (is the response "
                      "equivalent to the gold answer? yes/no); default hle for hle, reference otherwise")
  p.add_argument("--hle-path", metavar="FILE", help="your own copy of HLE (JSONL, JSON or parquet); never shipped")
  p.add_argument("--tasks", metavar="FILE",
                 help="evaluate these records (training-data JSONL, e.g. with alias_map / preference) instead of the "
                      "benchmark's own items")
  p.add_argument("--catalog", metavar="FILE", help="tool catalog JSON (default configs/tools/default_catalog.json)")
  p.add_argument("--corpus", metavar="FILE", help="JSONL corpus ({id, contents}) for search, indexed with BM25")
  p.add_argument("--retriever-url", metavar="URL", help="remote /retrieve endpoint for search (instead of --corpus)")
  p.add_argument("--user-endpoint", metavar="URL", help="tau2: OpenAI-compatible endpoint of the user simulator")
  p.add_argument("--user-model", metavar="NAME", help="tau2: user simulator model name")
  p.add_argument("--user-api-key-env", metavar="VAR", help="tau2: NAME of the variable with the user endpoint's key")
  p.add_argument("--compare", nargs="+", default=[], metavar="DIR",
                 help="other eval output directories (or summary.json files) to add to the table and the plot")
  p.add_argument("--quiet", action="store_true", help="no progress bar")
  return p


def request_from_args(args: argparse.Namespace) -> EvalRequest:
  """The EvalRequest of parsed `eval` arguments (each flag is the field of the same name)."""
  values = {f.name: getattr(args, f.name) for f in dataclasses.fields(EvalRequest)}
  values["compare"] = tuple(values["compare"] or ())
  return EvalRequest(**values)


def run_eval_command(args: argparse.Namespace, config_overrides: Sequence[str] = ()) -> dict:
  """`orchestra eval` after parsing: `run_eval` on the request the arguments make."""
  return run_eval(request_from_args(args), config_overrides)


def main(argv: list[str] | None = None) -> int:
  """`python -m orchestra_jax.evaluate ...` (the same as `orchestra eval ...`)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(prog="orchestra")
  add_eval_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
  try:
    overrides, rest = config_lib.split_config_overrides(argv)
    args = parser.parse_args(["eval", *rest])
    run_eval_command(args, overrides)
  except UserError as e:
    print(f"orchestra: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  return 0
