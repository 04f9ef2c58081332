"""`orchestra synth`: synthesise a ToolScale-style domain with an OpenAI-compatible LLM.

Wired into the main CLI with `add_synth_parser(subparsers)` and `run_synth(args)`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from orchestra_jax.errors import UserError
from orchestra_jax.synth.pipeline import REPORT_FILE, TRAIN_FILE, SynthConfig, synthesize
from orchestra_jax.tools.llm_client import ChatClient

__all__ = ["add_synth_parser", "run_synth"]

_EPILOG = textwrap.dedent("""\
    The output directory receives db.json, tools.json, policy.md and tasks.json (a domain directory that
    orchestra_jax.synth.load_domain_dir loads), train.jsonl (training records) and synth_report.json (stage
    counts, token usage, dropped rows and tasks with reasons). Every task is verified before it is kept: its gold
    actions must run without error on the generated database and change it when the task requires a write.

    example:
      orchestra synth --endpoint http://127.0.0.1:8000/v1 --model Qwen/Qwen3-32B --domain bank \\
          --out data/synth/bank --num-tasks 50 --seed 0
    """)


def add_synth_parser(subparsers) -> argparse.ArgumentParser:
  """Add the `synth` sub-command to an argparse sub-parser collection; returns its parser."""
  p = subparsers.add_parser(
      "synth", help="synthesise a tool-use domain (database, tools, policy, verified tasks) with an LLM",
      description="Generate a tau2-style environment with an OpenAI-compatible LLM: tables, schemas, data model, "
                  "rows, declarative tools, policy, user intents, tasks with gold actions and harder evolved "
                  "tasks. Tasks whose gold actions do not replay on the generated database are dropped.",
      epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--endpoint", required=True, metavar="URL",
                 help="base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000 or .../v1")
  p.add_argument("--model", required=True, metavar="NAME", help="model name sent with every request")
  p.add_argument("--domain", required=True, metavar="NAME",
                 help="domain to synthesise, a lowercase name such as bank, railway or school")
  p.add_argument("--out", required=True, metavar="DIR", help="output directory for the domain and reports")
  p.add_argument("--num-tasks", type=int, default=10, metavar="N",
                 help="user intents to turn into tasks, i.e. base tasks before verification (default 10)")
  p.add_argument("--seed", type=int, default=0, metavar="S",
                 help="seed for the rows shown in prompts, the per-request sampling seed and the randomised "
                      "tools / prices / preferences of train.jsonl (default 0)")
  p.add_argument("--api-key-env", default=None, metavar="VAR",
                 help="NAME of the environment variable holding the API key (never the key itself); "
                      "omit for servers without authentication")
  p.add_argument("--rows-per-table", type=int, default=20, metavar="N",
                 help="rows to generate per table, before invalid ones are dropped (default 20)")
  p.add_argument("--evolve-rounds", type=int, default=1, metavar="R",
                 help="rounds of making each kept task harder; 0 disables evolution (default 1)")
  p.add_argument("--max-retries", type=int, default=2, metavar="K",
                 help="re-asks per stage request when the reply does not parse or validate (default 2)")
  p.add_argument("--temperature", type=float, default=0.7, metavar="T", help="sampling temperature (default 0.7)")
  p.add_argument("--max-tokens", type=int, default=4096, metavar="N",
                 help="completion token limit per request (default 4096)")
  p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                 help="read timeout per request in seconds (default 300)")
  p.add_argument("--no-randomize", action="store_true",
                 help="write train.jsonl without random tool subsets, alias prices and preferences")
  p.add_argument("--force", action="store_true", help="overwrite a domain already in --out")
  p.set_defaults(func=run_synth)
  return p


def run_synth(args: argparse.Namespace) -> int:
  """Run `orchestra synth` for parsed arguments; prints a summary. Raises UserError subclasses on bad input or
  a failed stage (the main CLI prints them as one line)."""
  config = SynthConfig(domain=args.domain, num_tasks=args.num_tasks, seed=args.seed,
                       rows_per_table=args.rows_per_table, evolve_rounds=args.evolve_rounds,
                       max_retries=args.max_retries, temperature=args.temperature, max_tokens=args.max_tokens,
                       randomize=not args.no_randomize, overwrite=args.force)
  with ChatClient(args.endpoint, args.model, api_key_env=args.api_key_env, read_timeout=args.timeout) as client:
    result = synthesize(client, config, args.out)
  c = result.report["counts"]
  print(f"wrote domain {config.domain!r} to {result.out_dir}: {c['tables']} tables, "
        f"{sum(c['rows'].values())} rows, {c['tools']} tools, {c['tasks_written']} tasks "
        f"({c['tasks_verified']}/{c['tasks_generated']} base tasks verified, "
        f"{c['evolved_verified']}/{c['evolved_generated']} evolved); "
        f"dropped {c['tasks_dropped'] + c['evolved_dropped']} tasks and {c['rows_dropped']} rows "
        f"(see {REPORT_FILE}); training records in {TRAIN_FILE}")
  return 0


def main(argv: list[str] | None = None) -> int:
  """`python -m orchestra_jax.synth.cli ...` (the same options as `orchestra synth`)."""
  parser = argparse.ArgumentParser(prog="python -m orchestra_jax.synth.cli")
  sub = parser.add_subparsers(dest="command", required=True)
  add_synth_parser(sub)
  args = parser.parse_args(argv)
  try:
    return run_synth(args)
  except UserError as e:
    print(f"orchestra: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
