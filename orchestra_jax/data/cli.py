"""`orchestra data`: write, split, merge and inspect training-data files (the format of `data.format`).

Wired into the main CLI with `add_data_parser(subparsers)` and `run_data(args)`. The files it writes are what
`orchestra train` reads with `env.name="data"`, `env.train_data=FILE.jsonl` (and `env.eval_data`).

* `convert`: FRAMES, a built-in tau2 domain or ToolScale-layout rows -> records, randomised per sample
  (offered aliases, alias_map with prices, preference and its text; seeded by (seed, id), so a record's
  randomisation does not depend on which other records were converted with it).
* `split`: a seeded train / eval split, stratified by kind/domain.
* `merge`: several files into one (ids must be unique across them).
* `stats`: markdown tables of what a file holds.

HLE is deliberately not a source: it is gated, evaluation-only data (`orchestra eval --benchmark hle`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import textwrap
from collections import Counter
from pathlib import Path

from orchestra_jax.data import converters
from orchestra_jax.data.format import read_jsonl, write_jsonl
from orchestra_jax.data.preferences import randomize_samples
from orchestra_jax.tau2.synth_domain import load_domain_dir
from orchestra_jax.errors import UserError
from orchestra_jax.tools.catalog import Catalog

__all__ = ["SOURCES", "DataCliError", "add_data_parser", "run_data"]

SOURCES = ("frames", "tau2-mock", "tau2-airline", "tau2-retail", "toolscale")
# tau2 domains the paper evaluates on; their test split is what `orchestra eval` should be run on.
_BENCHMARK_DOMAINS = ("airline", "retail")

_EPILOG = textwrap.dedent("""\
    example pipeline:
      orchestra data convert --source tau2-airline --split train --out data/airline.jsonl
      orchestra data convert --source tau2-retail --split train --out data/retail.jsonl
      orchestra data convert --source frames --limit 300 --out data/frames.jsonl
      orchestra data merge data/airline.jsonl data/retail.jsonl data/frames.jsonl --out data/all.jsonl
      orchestra data split data/all.jsonl --eval-fraction 0.1 --seed 0 --train data/train.jsonl --eval data/eval.jsonl
      orchestra data stats data/train.jsonl data/eval.jsonl
    """)


class DataCliError(UserError, ValueError):
  """A bad `orchestra data` argument or input; printed as one line."""


# --- parser -------------------------------------------------------------------------------------------------
def _add_out(p: argparse.ArgumentParser, flag: str = "--out", what: str = "the output JSONL file") -> None:
  p.add_argument(flag, required=True, metavar="FILE", help=f"{what}; written atomically, refused if it exists "
                                                           "unless --force")


def _add_convert_parser(sub) -> None:
  p = sub.add_parser(
      "convert", help="convert a source dataset to training records (randomised by default)",
      description="Convert FRAMES, a built-in tau2 domain or ToolScale-layout rows to the training-data format. "
                  "With --randomize (the default) every record gets a random subset of the catalog's aliases, an "
                  "alias_map (which model each alias stands for, with jittered prices and latency) and a user "
                  "preference with its text, seeded by (--seed, record id): the same seed gives the same file.",
      epilog="HLE is not a source: it is gated, evaluation-only data (use `orchestra eval --benchmark hle`).\n"
             "examples:\n"
             "  orchestra data convert --source tau2-airline --split train --out data/airline.jsonl\n"
             "  orchestra data convert --source frames --limit 300 --exclude-ids runs/eval/frames/results.jsonl \\\n"
             "      --out data/frames.jsonl\n"
             "  orchestra data convert --source toolscale --toolscale-file data/synth/bank/rows.jsonl \\\n"
             "      --domain-dir data/synth/bank --out data/bank.jsonl",
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--source", required=True, metavar="NAME",
                 help=f"the dataset to convert: one of {', '.join(SOURCES)}. frames = the shipped 824 FRAMES "
                      "questions (qa records); tau2-* = the tasks of a built-in tau2 domain; toolscale = rows in "
                      "the ToolScale layout (needs --toolscale-file and --domain-dir)")
  p.add_argument("--split", metavar="NAME",
                 help="tau2 sources only: convert the tasks of this split of split_tasks.json (train, test or "
                      "base; default: every task). Train on 'train' and evaluate on 'test'")
  p.add_argument("--toolscale-file", metavar="FILE",
                 help="--source toolscale: the rows (JSONL, JSON list or parquet; parquet needs pyarrow)")
  p.add_argument("--domain-dir", metavar="DIR",
                 help="--source toolscale: the synthesised domain the tasks run in (a directory written by "
                      "`orchestra synth --out DIR`); stored in each record relative to the output file's folder")
  p.add_argument("--domain", metavar="NAME",
                 help="--source toolscale: domain name of rows that do not name one "
                      "(default: each row's user_scenario.instructions.domain)")
  p.add_argument("--randomize", action=argparse.BooleanOptionalAction, default=True,
                 help="give each record random offered aliases, alias_map and preference (default: on); "
                      "--no-randomize writes plain records, which training gives env.default_preference")
  p.add_argument("--seed", type=int, default=0, metavar="N",
                 help="seed of the randomisation; each record is seeded by (N, its id) (default 0; no effect with "
                      "--no-randomize)")
  p.add_argument("--catalog", metavar="FILE",
                 help="tool catalog JSON whose aliases, models and prices are drawn from (default "
                      "configs/tools/default_catalog.json); train with the same catalog (env.catalog)")
  p.add_argument("--keep-prob", type=float, metavar="P",
                 help="probability that each alias of a tool is offered; every tool keeps at least one alias "
                      "(0 < P <= 1; default 0.75)")
  p.add_argument("--limit", type=int, metavar="N",
                 help="keep the first N records in source order (after --exclude-ids)")
  p.add_argument("--exclude-ids", metavar="FILE",
                 help="leave out the records whose ids this file lists, e.g. an evaluation set: a JSONL of "
                      "records or `orchestra eval` results (lines with an 'id'), or one id per line")
  _add_out(p)
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def _add_split_parser(sub) -> None:
  p = sub.add_parser(
      "split", help="split a file into seeded train and eval files",
      description="Split the records of a file into a training and an evaluation file. The evaluation share is "
                  "taken from every kind/domain in proportion (so each is evaluated), and which records go to "
                  "evaluation depends only on --seed and the record ids. Both files keep the input order.")
  p.add_argument("input", metavar="IN.jsonl", help="the training-data file to split")
  size = p.add_mutually_exclusive_group(required=True)
  size.add_argument("--eval-fraction", type=float, metavar="F",
                    help="share of the records for evaluation, 0 < F < 1 (rounded; at least one record)")
  size.add_argument("--eval-count", type=int, metavar="N",
                    help="number of records for evaluation (fewer than the file holds)")
  p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the split (default 0)")
  _add_out(p, "--train", "the training records' JSONL file (for env.train_data)")
  _add_out(p, "--eval", "the evaluation records' JSONL file (for env.eval_data)")
  p.add_argument("--force", action="store_true", help="overwrite --train / --eval if they exist")


def _add_merge_parser(sub) -> None:
  p = sub.add_parser(
      "merge", help="concatenate training-data files (ids must be unique across them)",
      description="Concatenate training-data files in the order given. Every record is validated, and an id "
                  "that occurs in two inputs is refused, naming both places.")
  p.add_argument("inputs", nargs="+", metavar="IN.jsonl", help="the files to merge, in order")
  _add_out(p)
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def _add_stats_parser(sub) -> None:
  p = sub.add_parser(
      "stats", help="markdown tables of what training-data files hold",
      description="Validate training-data files and print, per file, a markdown table of the records per "
                  "kind/domain (with alias_map, with a preference, mean question length) and one of the "
                  "preference features (how many records weigh each, and the mean weight).")
  p.add_argument("files", nargs="+", metavar="FILE", help="training-data JSONL files")


def add_data_parser(subparsers) -> argparse.ArgumentParser:
  """Add the `data` sub-command (with convert / split / merge / stats) to the main CLI; returns its parser."""
  p = subparsers.add_parser(
      "data", help="write, split, merge and inspect training-data files for `orchestra train`",
      description="Training-data files (one JSON record per line; orchestra_jax/data/format.py) for "
                  "`orchestra train` with env.name='data': env.train_data=FILE.jsonl, env.eval_data=FILE.jsonl.",
      epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
  _add_convert_parser(sub)
  _add_split_parser(sub)
  _add_merge_parser(sub)
  _add_stats_parser(sub)
  return p


def run_data(args: argparse.Namespace) -> int:
  """Run `orchestra data ACTION` for parsed arguments. Raises UserError subclasses on bad input."""
  {"convert": _convert, "split": _split, "merge": _merge, "stats": _stats}[args.data_command](args)
  return 0


# --- shared helpers -----------------------------------------------------------------------------------------
def _warn(message: str) -> None:
  print(f"orchestra: warning: {message}", file=sys.stderr)


def _check_out(path: str, force: bool, flag: str = "--out") -> Path:
  """Fail before any work: a finished file is never overwritten by accident."""
  out = Path(path)
  if out.is_dir():
    raise DataCliError(f"{flag} {out} is a directory; give a file name such as {out / 'train.jsonl'}")
  if out.exists() and not force:
    raise DataCliError(f"{flag} {out} already exists; pass --force to overwrite it")
  return out


def _group(sample) -> str:
  return sample.kind if sample.kind == "qa" else f"{sample.kind}/{sample.domain}"


def _describe(samples) -> str:
  """'20 qa, 30 tau2/airline; 50 with alias_map, 50 with a preference (21 cost, 15 latency)'."""
  groups = Counter(_group(s) for s in samples)
  kinds = ", ".join(f"{n} {g}" for g, n in sorted(groups.items()))
  with_map = sum(bool(s.alias_map) for s in samples)
  with_pref = sum(bool(s.preference) for s in samples)
  if not with_map and not with_pref:
    return f"{kinds}; not randomised (no alias_map or preference)"
  cost = sum(bool(s.preference.get("-cost")) for s in samples)
  latency = sum(bool(s.preference.get("-latency")) for s in samples)
  return (f"{kinds}; {with_map} with alias_map, {with_pref} with a preference "
          f"({cost} cost, {latency} latency)")


def _rebase_domain_dirs(samples, src_dir: Path, dst_dir: Path) -> list:
  """Training resolves a relative `metadata.domain_dir` against the folder of the record's file
  (task_families.load_task_records), so a record moved to another folder must have it rewritten."""
  out = []
  for s in samples:
    domain_dir = s.metadata.get("domain_dir")
    if isinstance(domain_dir, str) and domain_dir and not Path(domain_dir).is_absolute():
      moved = os.path.relpath((src_dir / domain_dir).resolve(), dst_dir.resolve())
      if moved != domain_dir:
        s = s.replace(metadata={**s.metadata, "domain_dir": moved})
    out.append(s)
  return out


def _folder(path: str | os.PathLike) -> Path:
  return Path(path).resolve().parent


# --- convert ------------------------------------------------------------------------------------------------
def _check_convert_args(args) -> None:
  """Every argument problem as one line, before anything is read."""
  if args.source == "hle":
    raise DataCliError("HLE is evaluation-only (gated, with a canary string) and is never training data; "
                       "evaluate on it with `orchestra eval --benchmark hle --hle-path FILE`")
  if args.source not in SOURCES:
    raise DataCliError(f"unknown --source {args.source!r}; choose one of {', '.join(SOURCES)}")
  is_tau2 = args.source.startswith("tau2-")
  if args.split is not None and not is_tau2:
    raise DataCliError(f"--split applies to tau2 sources only; {args.source} has no splits (use "
                       "`orchestra data split` on the converted file)")
  toolscale_only = {"--toolscale-file": args.toolscale_file, "--domain-dir": args.domain_dir,
                    "--domain": args.domain}
  if args.source == "toolscale":
    if not args.toolscale_file:
      raise DataCliError("--source toolscale needs --toolscale-file FILE (the rows in the ToolScale layout)")
    if not args.domain_dir:
      raise DataCliError("--source toolscale needs --domain-dir DIR: training runs each task in its synthesised "
                         "domain (a directory written by `orchestra synth --out DIR`)")
  else:
    given = [flag for flag, value in toolscale_only.items() if value is not None]
    if given:
      raise DataCliError(f"{given[0]} applies to --source toolscale only")
  if not args.randomize:
    given = [flag for flag, value in (("--catalog", args.catalog), ("--keep-prob", args.keep_prob))
             if value is not None]
    if given:
      raise DataCliError(f"{given[0]} only applies with --randomize (it shapes the randomisation)")
  if args.keep_prob is not None and not 0 < args.keep_prob <= 1:
    raise DataCliError(f"--keep-prob must be in (0, 1], got {args.keep_prob}")
  if args.limit is not None and args.limit < 1:
    raise DataCliError(f"--limit must be a positive number of records, got {args.limit}")


def _source_samples(args) -> list:
  if args.source == "frames":
    return converters.convert_frames()
  if args.source == "toolscale":
    return _toolscale_samples(args)
  domain = args.source.removeprefix("tau2-")
  try:
    return converters.convert_tau2(domain, args.split)
  except KeyError as e:  # an unknown split: the message lists the available ones
    raise DataCliError(f"--split: {e.args[0]}") from None


def _toolscale_samples(args) -> list:
  domain = load_domain_dir(args.domain_dir)  # fails early, with the file and problem, on a bad directory
  samples = converters.convert_toolscale(args.toolscale_file, domain=args.domain, domain_dir=args.domain_dir)
  other = sorted({s.domain for s in samples} - {domain.name})
  if other:
    raise DataCliError(f"{args.toolscale_file}: rows of domain {other[0]!r}, but --domain-dir {args.domain_dir} "
                       f"holds domain {domain.name!r}")
  return samples


def _warn_benchmark(args, count: int) -> None:
  """Training on a benchmark the paper evaluates on silently inflates its scores: say so once."""
  if args.source == "frames":
    _warn("FRAMES is an evaluation benchmark in the paper (`orchestra eval --benchmark frames`); training on it "
          "contaminates that evaluation. Train on a subset (--limit N) and keep the evaluated questions out with "
          "--exclude-ids FILE (an eval's results.jsonl or the --eval file of `orchestra data split`), or use the "
          "file as env.eval_data instead")
  elif args.source.removeprefix("tau2-") in _BENCHMARK_DOMAINS and args.split != "train":
    which = f"its {args.split!r} split" if args.split else f"all {count} tasks"
    _warn(f"tau2-bench is an evaluation benchmark in the paper and this converts {which}; pass --split train and "
          "evaluate on the test split (eval.tau2_split=test)")


def _read_ids(path: str) -> set[str]:
  """Ids from a JSONL of objects with an 'id' (records, eval results), JSON strings, or plain lines."""
  try:
    text = Path(path).read_text(encoding="utf-8")
  except FileNotFoundError:
    raise DataCliError(f"--exclude-ids file not found: {path}") from None
  except OSError as e:
    raise DataCliError(f"cannot read --exclude-ids file {path}: {e.strerror or e}") from None
  ids: set[str] = set()
  for lineno, line in enumerate(text.splitlines(), 1):
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    if line[0] not in '{"':
      ids.add(line)
      continue
    try:
      value = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataCliError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    if isinstance(value, dict):
      value = value.get("id")
    if not isinstance(value, (str, int)) or isinstance(value, bool):
      raise DataCliError(f"{path}:{lineno}: a JSON line needs a string 'id'")
    ids.add(str(value))
  return ids


def _exclude(samples: list, ids: set[str], path: str) -> list:
  kept = [s for s in samples if s.id not in ids]
  if ids and samples and len(kept) == len(samples):
    # Most likely the ids lack the source prefix ('12' instead of 'frames/12'): nothing was kept out.
    _warn(f"none of the {len(ids)} ids in {path} matches a converted record (their ids look like "
          f"{samples[0].id!r}); nothing was excluded")
  return kept


def _load_catalog(args):
  return Catalog.load(args.catalog) if args.catalog else Catalog.default()


def _randomize(samples: list, catalog, args) -> list:
  keep_prob = 0.75 if args.keep_prob is None else args.keep_prob
  out = randomize_samples(samples, args.seed, catalog, keep_prob=keep_prob)
  # The seed in each record makes a file's randomisation reproducible from the file alone.
  return [s.replace(metadata={**s.metadata, "randomize_seed": args.seed}) for s in out]


def _convert(args) -> None:
  _check_convert_args(args)
  out = _check_out(args.out, args.force)
  # Every input is read before the conversion, so a typo in one fails fast and alone.
  catalog = _load_catalog(args) if args.randomize else None
  exclude = _read_ids(args.exclude_ids) if args.exclude_ids else None
  samples = _source_samples(args)
  total = len(samples)
  if exclude is not None:
    samples = _exclude(samples, exclude, args.exclude_ids)
  excluded = total - len(samples)
  if args.limit is not None:
    samples = samples[:args.limit]
  if not samples:
    raise DataCliError(f"no records left to write from --source {args.source}"
                       + (f" after --exclude-ids {args.exclude_ids}" if args.exclude_ids else ""))
  if catalog is not None:
    samples = _randomize(samples, catalog, args)
  if args.source == "toolscale":  # the directory was given relative to the working directory
    samples = _rebase_domain_dirs(samples, Path.cwd(), _folder(out))
  write_jsonl(out, samples)
  _warn_benchmark(args, total)
  extra = f", seed {args.seed}" if args.randomize else ""
  extra += f"; excluded {excluded} by id" if args.exclude_ids else ""
  print(f"wrote {len(samples)} records to {out}: {_describe(samples)}{extra}")


# --- split --------------------------------------------------------------------------------------------------
def _order_key(seed: int, sample_id: str) -> str:
  """A record's place in the seeded order: depends on the seed and its id only, not on the other records."""
  return hashlib.sha256(f"orchestra-data-split/{seed}/{sample_id}".encode()).hexdigest()


def _eval_count(args, total: int) -> int:
  if args.eval_fraction is not None:
    if not 0 < args.eval_fraction < 1:
      raise DataCliError(f"--eval-fraction must be between 0 and 1 (exclusive), got {args.eval_fraction}")
    count = max(1, round(args.eval_fraction * total))
  else:
    count = args.eval_count
    if count < 1:
      raise DataCliError(f"--eval-count must be a positive number of records, got {count}")
  if count >= total:
    raise DataCliError(f"{args.input}: {count} evaluation records of {total} leave none for training; "
                       "ask for fewer")
  return count


def _allocate(sizes: dict[str, int], count: int) -> dict[str, int]:
  """`count` spread over groups in proportion to their sizes (largest remainder, ties by name)."""
  total = sum(sizes.values())
  exact = {g: count * n / total for g, n in sizes.items()}
  alloc = {g: int(x) for g, x in exact.items()}
  for g in sorted(sizes, key=lambda g: (alloc[g] - exact[g], g))[:count - sum(alloc.values())]:
    alloc[g] += 1
  return alloc


def _eval_ids(samples: list, count: int, seed: int) -> set[str]:
  groups: dict[str, list] = {}
  for s in samples:
    groups.setdefault(_group(s), []).append(s)
  chosen: set[str] = set()
  for g, n in _allocate({g: len(v) for g, v in groups.items()}, count).items():
    ranked = sorted(groups[g], key=lambda s: _order_key(seed, s.id))
    chosen.update(s.id for s in ranked[:n])
  return chosen


def _split(args) -> None:
  train_out = _check_out(args.train, args.force, "--train")
  eval_out = _check_out(args.eval, args.force, "--eval")
  if train_out.resolve() == eval_out.resolve():
    raise DataCliError("--train and --eval name the same file")
  samples = read_jsonl(args.input)
  if not samples:
    raise DataCliError(f"{args.input}: no records to split")
  held = _eval_ids(samples, _eval_count(args, len(samples)), args.seed)
  src = _folder(args.input)
  train = _rebase_domain_dirs([s for s in samples if s.id not in held], src, _folder(train_out))
  evals = _rebase_domain_dirs([s for s in samples if s.id in held], src, _folder(eval_out))
  write_jsonl(train_out, train)
  write_jsonl(eval_out, evals)
  print(f"wrote {len(train)} training records to {train_out} and {len(evals)} evaluation records to {eval_out} "
        f"(seed {args.seed}); eval: {', '.join(f'{n} {g}' for g, n in sorted(Counter(map(_group, evals)).items()))}")


# --- merge --------------------------------------------------------------------------------------------------
def _merge(args) -> None:
  out = _check_out(args.out, args.force)
  merged, seen, counts = [], {}, []
  for path in args.inputs:
    samples = read_jsonl(path)  # validates, and refuses an id repeated inside the file
    for s in samples:
      if s.id in seen:
        raise DataCliError(f"duplicate id {s.id!r}: in {seen[s.id]} and in {path}; ids must be unique across "
                           "the merged files")
      seen[s.id] = path
    merged.extend(_rebase_domain_dirs(samples, _folder(path), _folder(out)))
    counts.append(f"{len(samples)} from {path}")
  if not merged:
    raise DataCliError(f"no records in {', '.join(args.inputs)}")
  write_jsonl(out, merged)
  print(f"wrote {len(merged)} records to {out} ({', '.join(counts)}): {_describe(merged)}")


# --- stats --------------------------------------------------------------------------------------------------
def _pct(n: int, total: int) -> str:
  return f"{100.0 * n / total:.1f}%" if total else "-"


def _row(cells) -> str:
  return "| " + " | ".join(str(c) for c in cells) + " |"


def _group_table(samples: list) -> list[str]:
  lines = [_row(["kind/domain", "records", "share", "with alias_map", "with preference", "mean question chars"]),
           "|---|---:|---:|---:|---:|---:|"]
  groups: dict[str, list] = {}
  for s in samples:
    groups.setdefault(_group(s), []).append(s)
  total = len(samples)
  for name, members in [*sorted(groups.items()), ("**total**", samples)]:
    n = len(members)
    with_map = sum(bool(s.alias_map) for s in members)
    with_pref = sum(bool(s.preference) for s in members)
    mean_q = sum(len(s.question) for s in members) / n
    lines.append(_row([name, n, _pct(n, total), f"{with_map} ({_pct(with_map, n)})",
                       f"{with_pref} ({_pct(with_pref, n)})", f"{mean_q:.0f}"]))
  return lines


def _preference_table(samples: list) -> list[str]:
  weights: dict[str, list[float]] = {}
  for s in samples:
    for name, w in s.preference.items():
      if w:
        weights.setdefault(name, []).append(float(w))
  if not weights:
    return ["no record has a preference (training gives them env.default_preference)"]
  fixed = ["outcome", "-cost", "-latency"]  # the reward's order: aliases come before them
  order = [f for f in fixed if f in weights] + sorted(set(weights) - set(fixed))
  lines = [_row(["preference feature", "records", "share", "weight > 0", "weight < 0", "mean weight"]),
           "|---|---:|---:|---:|---:|---:|"]
  for name in order:
    ws = weights[name]
    # A tool's weight is either "prefer" (> 0) or "avoid" (< 0): the split says more than their mean.
    lines.append(_row([name, len(ws), _pct(len(ws), len(samples)), sum(w > 0 for w in ws), sum(w < 0 for w in ws),
                       f"{sum(ws) / len(ws):+.2f}"]))
  return lines


def _stats(args) -> None:
  loaded = [(path, read_jsonl(path)) for path in args.files]  # every file validated before any output
  for i, (path, samples) in enumerate(loaded):
    if i:
      print()
    print(f"## {path}: {len(samples)} records\n")
    if not samples:
      continue
    print("\n".join(_group_table(samples)))
    print()
    print("\n".join(_preference_table(samples)))
