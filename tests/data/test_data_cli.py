"""`orchestra data` (orchestra_jax/data/cli.py): convert, split, merge and stats on real data and real files.

Most runs call `cli.main(argv)` in-process (each subprocess costs an interpreter start); one success and one
error go through a real subprocess, as a user runs them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO
from orchestra_jax import cli
from orchestra_jax.data import convert_frames, read_jsonl, sample_domain
from orchestra_jax.data.cli import add_data_parser
from orchestra_jax.tau2.domain import Domain

FIXTURES = FIXTURES / "synth"


def data(capsys, *args):
  """(exit code, stdout, stderr) of `orchestra data ARGS` run in-process."""
  rc = cli.main(["data", *map(str, args)])
  out = capsys.readouterr()
  return rc, out.out, out.err


def assert_one_line_error(rc, err, *needles):
  assert rc == 2
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("orchestra: error: "), err
  for needle in needles:
    assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def frames20(tmp_path_factory):
  """FRAMES --limit 20 converted with seed 1 (randomised), seed 1 again, seed 2 and --no-randomize."""
  d = tmp_path_factory.mktemp("frames")
  runs = {"a": ["--seed", "1"], "b": ["--seed", "1"], "c": ["--seed", "2"], "plain": ["--no-randomize"]}
  for name, extra in runs.items():
    out = str(d / f"{name}.jsonl")
    assert cli.main(["data", "convert", "--source", "frames", "--limit", "20", *extra, "--out", out]) == 0
  return d


# --- convert ------------------------------------------------------------------------------------------------
def test_frames_randomised_records(frames20):
  samples = read_jsonl(frames20 / "a.jsonl")
  assert len(samples) == 20 and all(s.kind == "qa" and s.answer for s in samples)
  assert [s.id for s in samples] == [s.id for s in convert_frames()[:20]]
  for s in samples:
    assert s.alias_map and s.preference and s.preference_text
    assert set(s.alias_map) == set(s.tools)  # every offered alias is remapped, with prices
    assert all({"model", "price_in", "price_out", "latency"} <= set(v) for v in s.alias_map.values())
    assert s.preference["outcome"] == 1.0 and s.metadata["randomize_seed"] == 1
  # the randomisation is not constant: offered aliases and preferences differ between records
  assert len({tuple(s.tools) for s in samples}) > 1 and len({s.preference_text for s in samples}) > 1


def test_no_randomize_writes_plain_records(frames20):
  for s in read_jsonl(frames20 / "plain.jsonl"):
    assert not s.alias_map and not s.preference and s.preference_text == "" and s.tools == []


def test_same_seed_same_bytes_other_seed_differs(frames20):
  a, b, c = ((frames20 / f"{n}.jsonl").read_bytes() for n in "abc")
  assert a == b and a != c
  # ...but only the randomisation differs: same records, same questions
  assert [(s.id, s.question) for s in read_jsonl(frames20 / "a.jsonl")] == \
         [(s.id, s.question) for s in read_jsonl(frames20 / "c.jsonl")]


def test_frames_warns_that_it_is_a_benchmark(tmp_path, capsys):
  rc, out, err = data(capsys, "convert", "--source", "frames", "--limit", "3", "--out", tmp_path / "f.jsonl")
  assert rc == 0
  assert "FRAMES is an evaluation benchmark" in err and "--exclude-ids" in err and "eval_data" in err
  assert out.startswith(f"wrote 3 records to {tmp_path / 'f.jsonl'}: 3 qa; 3 with alias_map, 3 with a preference")


def test_tau2_mock_records_carry_the_domain_tools(tmp_path, capsys):
  rc, out, err = data(capsys, "convert", "--source", "tau2-mock", "--out", tmp_path / "mock.jsonl")
  assert rc == 0 and err == ""  # mock is no benchmark: no warning
  samples = read_jsonl(tmp_path / "mock.jsonl")
  domain = Domain.load("mock")
  assert len(samples) == len(domain.tasks) and "9 tau2/mock" in out
  for s in samples:
    assert s.kind == "tau2" and s.domain == "mock" and s.task["id"]
    assert s.tools[:len(domain.tool_names)] == list(domain.tool_names)
    assert set(s.tools[len(domain.tool_names):]) == set(s.alias_map)
    assert all(a.startswith("expert-") for a in s.alias_map)


def test_tau2_split_and_benchmark_warning(tmp_path, capsys):
  rc, out, err = data(capsys, "convert", "--source", "tau2-airline", "--split", "train", "--out", tmp_path / "a.jsonl")
  assert rc == 0 and err == ""
  train_ids = [t.id for t in Domain.load("airline").split("train")]
  assert [s.task["id"] for s in read_jsonl(tmp_path / "a.jsonl")] == train_ids
  rc, out, err = data(capsys, "convert", "--source", "tau2-airline", "--out", tmp_path / "all.jsonl")
  assert rc == 0 and "evaluation benchmark" in err and "--split train" in err


def test_exclude_ids_then_limit(tmp_path, frames20, capsys):
  # an eval set as records (JSONL) and as plain ids: both keep those questions out
  first5 = [s.id for s in read_jsonl(frames20 / "plain.jsonl")][:5]
  (tmp_path / "ids.txt").write_text("# held out\n" + "\n".join(first5[3:]) + "\n")
  (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"id": i, "correct": True}) + "\n" for i in first5[:3]))
  for exclude in ("eval.jsonl", "ids.txt"):
    rc, out, _ = data(capsys, "convert", "--source", "frames", "--exclude-ids", tmp_path / exclude, "--limit", "4",
                      "--no-randomize", "--out", tmp_path / f"train-{exclude}.jsonl")
    assert rc == 0 and "excluded" in out
  ids = [s.id for s in read_jsonl(tmp_path / "train-eval.jsonl.jsonl")]
  assert len(ids) == 4 and ids[0] == first5[3] and not set(ids) & set(first5[:3])
  assert not {s.id for s in read_jsonl(tmp_path / "train-ids.txt.jsonl")} & set(first5[3:])
  # ids that match nothing (no 'frames/' prefix) are a warning, not silence
  (tmp_path / "bare.txt").write_text("0\n1\n")
  rc, _, err = data(capsys, "convert", "--source", "frames", "--exclude-ids", tmp_path / "bare.txt", "--limit", "1",
                    "--out", tmp_path / "x.jsonl")
  assert rc == 0 and "none of the 2 ids" in err and "'frames/" in err


# --- toolscale (a domain synthesised by `orchestra synth` against the scripted LLM of tests/test_synth.py) ---------
@pytest.fixture(scope="module")
def bank_dir(synth_bank_dir):
  return synth_bank_dir


def test_toolscale_records_find_their_domain_from_any_folder(tmp_path, bank_dir, capsys, monkeypatch):
  from orchestra_jax.task_families import load_task_records
  monkeypatch.chdir(bank_dir.parent)  # --domain-dir relative to the working directory, as a user types it
  out = tmp_path / "data" / "bank.jsonl"
  rc, stdout, _ = data(capsys, "convert", "--source", "toolscale", "--toolscale-file",
                       FIXTURES / "toolscale_bank.jsonl", "--domain-dir", "bank", "--out", out)
  assert rc == 0 and "2 toolscale/bank" in stdout
  samples = read_jsonl(out)
  domain = sample_domain(samples[0], base_dir=out.parent)
  assert domain.name == "bank" and not Path(samples[0].metadata["domain_dir"]).is_absolute()
  for s in samples:
    assert s.kind == "toolscale" and s.tools[:len(domain.tool_names)] == list(domain.tool_names) and s.alias_map
  # merged and split into other folders, the records still lead training to the same directory
  assert data(capsys, "merge", out, "--out", tmp_path / "m" / "all.jsonl")[0] == 0
  assert data(capsys, "split", tmp_path / "m" / "all.jsonl", "--eval-count", "1", "--train", tmp_path / "t.jsonl",
              "--eval", tmp_path / "e" / "f" / "e.jsonl")[0] == 0
  for path in (out, tmp_path / "m" / "all.jsonl", tmp_path / "t.jsonl", tmp_path / "e" / "f" / "e.jsonl"):
    assert {t["domain_dir"] for t in load_task_records([str(path)])} == {str(bank_dir.resolve())}


def test_toolscale_argument_errors(tmp_path, bank_dir, capsys):
  rows = FIXTURES / "toolscale_bank.jsonl"
  assert_one_line_error(*data(capsys, "convert", "--source", "toolscale", "--toolscale-file", rows, "--out",
                              tmp_path / "x.jsonl")[::2], "--domain-dir")
  assert_one_line_error(*data(capsys, "convert", "--source", "toolscale", "--toolscale-file", rows, "--domain-dir",
                              bank_dir, "--domain", "railway", "--out", tmp_path / "x.jsonl")[::2],
                        "'railway'", "'bank'")
  assert_one_line_error(*data(capsys, "convert", "--source", "frames", "--domain-dir", bank_dir, "--out",
                              tmp_path / "x.jsonl")[::2], "--domain-dir applies to --source toolscale only")


# --- split / merge / stats ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed(tmp_path_factory, frames20):
  """20 FRAMES + 9 tau2-mock records in one file."""
  d = tmp_path_factory.mktemp("mixed")
  assert cli.main(["data", "convert", "--source", "tau2-mock", "--seed", "1", "--out", str(d / "mock.jsonl")]) == 0
  inputs = [str(frames20 / "a.jsonl"), str(d / "mock.jsonl")]
  assert cli.main(["data", "merge", *inputs, "--out", str(d / "all.jsonl")]) == 0
  return d / "all.jsonl"


def _split(capsys, src, tmp_path, name, *args):
  train, ev = tmp_path / f"{name}-train.jsonl", tmp_path / f"{name}-eval.jsonl"
  rc, out, err = data(capsys, "split", src, *args, "--train", train, "--eval", ev)
  assert rc == 0, err
  return [s.id for s in read_jsonl(train)], [s.id for s in read_jsonl(ev)], out


def test_split_is_disjoint_complete_stratified_and_seeded(mixed, tmp_path, capsys):
  all_ids = [s.id for s in read_jsonl(mixed)]
  train, ev, out = _split(capsys, mixed, tmp_path, "a", "--eval-fraction", "0.2", "--seed", "4")
  assert len(ev) == round(0.2 * 29) and not set(train) & set(ev) and set(train) | set(ev) == set(all_ids)
  assert train == [i for i in all_ids if i in set(train)]  # input order kept
  assert {i.split("/")[0] for i in ev} == {"frames", "tau2"}  # every kind/domain is evaluated
  assert f"{len(train)} training records" in out and f"{len(ev)} evaluation records" in out
  assert _split(capsys, mixed, tmp_path, "b", "--eval-fraction", "0.2", "--seed", "4")[:2] == (train, ev)
  assert _split(capsys, mixed, tmp_path, "c", "--eval-fraction", "0.2", "--seed", "5")[1] != ev
  assert len(_split(capsys, mixed, tmp_path, "d", "--eval-count", "7")[1]) == 7
  assert_one_line_error(*data(capsys, "split", mixed, "--eval-count", "29", "--train", tmp_path / "x.jsonl", "--eval",
                              tmp_path / "y.jsonl")[::2], "none for training")


def test_merge_refuses_duplicate_ids(mixed, frames20, tmp_path, capsys):
  rc, _, err = data(capsys, "merge", mixed, frames20 / "c.jsonl", "--out", tmp_path / "m.jsonl")
  assert_one_line_error(rc, err, "duplicate id 'frames/", str(mixed), str(frames20 / "c.jsonl"))
  assert not (tmp_path / "m.jsonl").exists()


def test_stats_table_counts_match_the_file(mixed, frames20, capsys):
  rc, out, _ = data(capsys, "stats", mixed, frames20 / "plain.jsonl")
  assert rc == 0
  rows = {}
  for line in out.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if line.startswith("| ") and cells[1][:1].isdigit():
      rows.setdefault(cells[0], []).append(cells)
  samples = read_jsonl(mixed)
  assert rows["qa"][0][1] == "20" and rows["tau2/mock"][0][1] == "9" and rows["**total**"][0][1] == "29"
  assert rows["**total**"][0][3].startswith("29 ") and rows["qa"][1][3].startswith("0 ")  # with alias_map
  cost = sum(bool(s.preference.get("-cost")) for s in samples)
  assert rows["-cost"][0][1] == str(cost) and rows["outcome"][0][1] == "29"
  mean_q = sum(len(s.question) for s in samples) / 29
  assert rows["**total**"][0][5] == f"{mean_q:.0f}"
  assert f"## {mixed}: 29 records" in out and "no record has a preference" in out


def test_stats_names_the_bad_line(tmp_path, capsys):
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"id": "q1", "kind": "qa", "question": "2+2?", "answer": "4"}) + "\n"
                 + json.dumps({"id": "q2", "kind": "qa", "question": "3+3?"}) + "\n")
  assert_one_line_error(*data(capsys, "stats", bad)[::2], f"{bad}:2", "'answer'")


# --- errors and help ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,needles", [
    (["convert", "--source", "wiki"], ["unknown --source 'wiki'", "tau2-airline"]),
    (["convert", "--source", "hle"], ["HLE is evaluation-only"]),
    (["convert", "--source", "tau2-mock", "--split", "train"], ["--split", "no split 'train'"]),
    (["convert", "--source", "frames", "--split", "train"], ["--split applies to tau2 sources only"]),
    (["convert", "--source", "frames", "--no-randomize", "--keep-prob", "0.5"], ["--keep-prob only applies"]),
    (["convert", "--source", "frames", "--keep-prob", "0"], ["--keep-prob must be in (0, 1]"]),
    (["convert", "--source", "frames", "--exclude-ids", "/no/such/ids.txt"], ["/no/such/ids.txt"]),
    (["convert", "--source", "frames", "--catalog", "/no/such/catalog.json"], ["/no/such/catalog.json"]),
    (["merge", "/no/such/file.jsonl"], ["not found: /no/such/file.jsonl"]),
    (["split", "/no/such/file.jsonl", "--eval-count", "1", "--train", "{tmp}/t.jsonl", "--eval", "{tmp}/t.jsonl"],
     ["same file"]),
])
def test_one_line_errors(tmp_path, capsys, args, needles):
  args = [a.replace("{tmp}", str(tmp_path)) for a in args]
  if args[0] in ("convert", "merge"):
    args += ["--out", str(tmp_path / "out.jsonl")]
  assert_one_line_error(*data(capsys, *args)[::2], *needles)
  assert not (tmp_path / "out.jsonl").exists()


def test_existing_out_is_refused_unless_force(frames20, capsys):
  before = (frames20 / "c.jsonl").read_bytes()
  rc, _, err = data(capsys, "convert", "--source", "frames", "--limit", "20", "--seed", "1", "--out",
                    frames20 / "c.jsonl")
  assert_one_line_error(rc, err, "already exists", "--force")
  assert (frames20 / "c.jsonl").read_bytes() == before
  rc, _, _ = data(capsys, "convert", "--source", "frames", "--limit", "20", "--seed", "2", "--force", "--out",
                  frames20 / "c.jsonl")
  assert rc == 0 and (frames20 / "c.jsonl").read_bytes() == before  # seed 2 again: the same bytes


def test_every_option_has_help():
  import argparse
  sub = argparse.ArgumentParser().add_subparsers()
  data_parser = add_data_parser(sub)
  actions = data_parser._subparsers._group_actions[0].choices  # convert, split, merge, stats
  assert set(actions) == {"convert", "split", "merge", "stats"}
  for name, parser in actions.items():
    for action in parser._actions:
      assert action.help and len(action.help) > 10, (name, action.dest)


def test_real_command_line(tmp_path):
  """As a user runs it: a fresh interpreter (one only: each costs ~3 s, as `cli.main` imports jax via configs)."""
  proc = subprocess.run([sys.executable, "-m", "orchestra_jax.cli", "data", "convert", "--source", "tau2-mock",
                         "--out", str(tmp_path / "mock.jsonl")], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and proc.stderr == "", proc.stderr
  assert proc.stdout.startswith(f"wrote 9 records to {tmp_path / 'mock.jsonl'}: 9 tau2/mock; 9 with alias_map")
  assert [s.kind for s in read_jsonl(tmp_path / "mock.jsonl")] == ["tau2"] * 9
