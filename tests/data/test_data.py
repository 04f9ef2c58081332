"""Training-data format, converters, randomisation and the grain pipeline (orchestra_jax.data)."""

import json
import random

import pytest

from conftest import FIXTURES
from orchestra_jax.data import (DataFormatError, MissingDependencyError, Sample, alias_map_to_remap, convert_frames,
                                convert_hle, convert_tau2, convert_toolscale, load_iterator_state, make_dataset,
                                make_iterator, preference_array, preference_text, random_preference, randomize_sample,
                                randomize_samples, read_jsonl, sample_domain, save_iterator_state, write_jsonl)
from orchestra_jax.errors import UserError

FIXTURES = FIXTURES / "synth"


def _qa(i: int, **kw) -> Sample:
  return Sample(id=f"q{i}", kind="qa", question=f"What is {i} + {i}?", answer=str(2 * i), **kw)


@pytest.fixture(scope="module")
def frames():
  return convert_frames()


# --- conversion -----------------------------------------------------------------------------------------------
def test_frames_conversion_of_the_real_file(frames):
  assert len(frames) == 824
  assert len({s.id for s in frames}) == 824
  for s in frames:
    assert s.kind == "qa" and s.id.startswith("frames/")
    assert s.question.strip() and isinstance(s.answer, str) and s.answer.strip()
    assert s.domain is None and s.task is None
    assert s.metadata["source"] == "frames"
  first = frames[0]
  assert first.id == "frames/wiki____0" and first.answer == "Jane Ballou"
  assert set(first.to_json()) == {"id", "kind", "question", "answer", "domain", "task", "tools", "alias_map",
                                  "preference", "preference_text", "metadata"}


def test_hle_from_a_users_copy(tmp_path):
  # A tiny made-up file in the HLE layout (NOT real HLE, which is never shipped).
  rows = [
      {"id": "x1", "question": "Toy question one?", "answer": "A", "answer_type": "multipleChoice",
       "category": "Toy", "canary": "SHOULD-NOT-BE-COPIED", "image": ""},
      {"id": "x2", "question": "Toy question two?", "answer": 42, "answer_type": "exactMatch", "category": "Toy"},
      {"id": "x3", "question": "Toy question with a picture?", "answer": "B", "image": "data:image/png;base64,AAAA"},
  ]
  path = tmp_path / "my_hle_copy.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  samples = convert_hle(path)
  assert [s.id for s in samples] == ["hle/x1", "hle/x2"]
  assert samples[1].answer == "42"
  for s in samples:
    assert s.metadata["eval_only"] is True and "canary" not in json.dumps(s.to_json())
  with_images = convert_hle(path, include_images=True)
  assert len(with_images) == 3 and with_images[2].metadata["had_image"] is True
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"id": "y", "question": "q?"}) + "\n")
  with pytest.raises(DataFormatError, match=r"bad.jsonl:1: field 'answer'"):
    convert_hle(bad)


def test_parquet_needs_pyarrow_or_reads(tmp_path):
  try:
    import pyarrow as pa
    import pyarrow.parquet as pq
  except ImportError:
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(MissingDependencyError, match="pip install pyarrow"):
      convert_hle(path)
    return
  path = tmp_path / "rows.parquet"
  pq.write_table(pa.Table.from_pylist([{"id": "p1", "question": "Toy?", "answer": "yes"}]), path)
  assert [s.answer for s in convert_hle(path)] == ["yes"]


def test_tau2_conversion():
  samples = convert_tau2("airline")
  assert len(samples) == 50
  s = samples[0]
  assert s.kind == "tau2" and s.domain == "airline" and s.task["id"] == "0"
  assert "EHGLP3" in s.question and "get_user_details" in s.tools
  domain = sample_domain(s)
  assert domain.name == "airline" and domain.task("0") is not None
  from orchestra_jax.tau2.domain import Domain
  retail = convert_tau2("retail", "test")
  assert len(retail) == len(Domain.load("retail").split("test")) > 0
  assert all(s.metadata["split"] == "test" for s in retail)


def test_toolscale_layout():
  samples = convert_toolscale(FIXTURES / "toolscale_bank.jsonl")
  assert [s.id for s in samples] == ["toolscale/bank/101", "toolscale/bank/102"]
  a, b = samples
  assert a.kind == "toolscale" and a.domain == "bank"
  # the parquet-style union of argument names is reduced to the arguments actually given
  assert a.task["evaluation_criteria"]["actions"][0]["arguments"] == {"account_id": "acc_2"}
  # nested fields stored as JSON strings are parsed
  assert [x["name"] for x in b.task["evaluation_criteria"]["actions"]] == ["get_customer", "freeze_account"]
  assert b.task["description"]["purpose"] == "freeze"
  assert "acc_1" in b.question
  with pytest.raises(DataFormatError, match="sample_domain|built-in|domain_dir"):
    sample_domain(a)


# --- format ---------------------------------------------------------------------------------------------------
def test_round_trip(tmp_path, frames):
  samples = randomize_samples(frames[:20], seed=3) + randomize_samples(convert_tau2("mock")[:5], seed=3)
  path = write_jsonl(tmp_path / "mixed.jsonl", samples)
  back = read_jsonl(path)
  assert [s.to_json() for s in back] == [s.to_json() for s in samples]
  assert back == samples
  for s in samples:
    assert Sample.from_json(json.loads(s.to_line())) == s


@pytest.mark.parametrize("record, field", [
    ({"id": "a", "kind": "qa", "question": "q?"}, "answer"),
    ({"id": "a", "kind": "quiz", "question": "q?", "answer": "x"}, "kind"),
    ({"id": "", "kind": "qa", "question": "q?", "answer": "x"}, "id"),
    ({"id": "a", "kind": "qa", "answer": "x"}, "question"),
    ({"id": "a", "kind": "tau2", "question": "q?", "domain": "airline"}, "task"),
    ({"id": "a", "kind": "qa", "question": "q?", "answer": "x", "alias_map": {"answer-1": {"price_in": -1}}},
     "alias_map.answer-1.price_in"),
    ({"id": "a", "kind": "qa", "question": "q?", "answer": "x", "alias_map": {"answer-1": {"speed": 1}}},
     "alias_map.answer-1.speed"),
    ({"id": "a", "kind": "qa", "question": "q?", "answer": "x", "preference": {"-cost": "high"}}, "preference.-cost"),
    ({"id": "a", "kind": "qa", "question": "q?", "answer": "x", "tools": ["search-1", "search-1"]}, "tools"),
    ({"id": "a", "kind": "qa", "question": "q?", "answer": "x", "colour": "red"}, "colour"),
])
def test_bad_record_names_field_and_line(tmp_path, record, field):
  path = tmp_path / "train.jsonl"
  good = _qa(1).to_line()
  path.write_text(good + "\n\n" + json.dumps(record) + "\n")
  with pytest.raises(DataFormatError) as err:
    read_jsonl(path)
  assert f"train.jsonl:3: field '{field}'" in str(err.value)
  assert isinstance(err.value, UserError)


def test_bad_json_and_duplicate_ids_name_the_line(tmp_path):
  path = tmp_path / "t.jsonl"
  path.write_text(_qa(1).to_line() + "\n{not json\n")
  with pytest.raises(DataFormatError, match=r"t.jsonl:2: not valid JSON"):
    read_jsonl(path)
  path.write_text(_qa(1).to_line() + "\n" + _qa(2).to_line() + "\n" + _qa(1).to_line() + "\n")
  with pytest.raises(DataFormatError, match=r"t.jsonl:3: field 'id': 'q1' repeats the record on line 1"):
    read_jsonl(path)


# --- preferences ----------------------------------------------------------------------------------------------
def test_preference_text():
  assert preference_text({"outcome": 1.0, "-cost": 0.5, "expert-1": -0.5}) == "Prefer cheap tools; avoid expert-1."
  assert preference_text({"outcome": 1.0}) == "Just get the answer right; cost and latency do not matter."
  assert preference_text({"outcome": 1, "-cost": 1.0, "-latency": 1.0}) == "Strongly prefer cheap and fast tools."
  assert preference_text({"outcome": 1, "-cost": 1.0, "-latency": 0.5, "search-2": 1.0, "answer-1": 0.5,
                          "answer-math-1": 0.5}) == \
      "Strongly prefer cheap tools; prefer fast tools; strongly prefer search-2; prefer answer-1 and answer-math-1."
  assert preference_text({"outcome": 1, "-cost": -0.5}) == "Prefer capable tools even when they cost more."
  # deterministic and independent of dict order
  a = {"outcome": 1, "b-2": 0.5, "a-1": 0.5}
  assert preference_text(a) == preference_text(dict(reversed(list(a.items())))) == "Prefer a-1 and b-2."


def test_preference_array_matches_reward_layout():
  from orchestra_jax.reward.features import preference_vector
  tools = ["search-1", "answer-2", "expert-1"]
  pref = {"outcome": 1.0, "-cost": 0.5, "-latency": 1.0, "answer-2": -0.5}
  expected = preference_vector(tools, outcome=1.0, cost=0.5, latency=1.0, tools={"answer-2": -0.5})
  assert preference_array(pref, tools).tolist() == expected.tolist()
  with pytest.raises(ValueError, match="search-9"):
    preference_array({"search-9": 1.0}, tools)


def test_randomisation_is_seeded_per_sample(frames):
  from orchestra_jax.tools.catalog import Catalog
  catalog = Catalog.default()
  picked = frames[:30]
  a = randomize_samples(picked, seed=7, catalog=catalog)
  b = randomize_samples(list(reversed(picked)), seed=7, catalog=catalog)[::-1]
  assert [s.to_json() for s in a] == [s.to_json() for s in b]  # order does not matter
  c = randomize_samples(picked, seed=8, catalog=catalog)
  assert [s.alias_map for s in a] != [s.alias_map for s in c]
  tool_of = {al: t.name for t in catalog.tools.values() for al in t.aliases}
  for s in a:
    assert {tool_of[t] for t in s.tools} == {"search", "enhance_reasoning", "answer"}  # every function offered
    assert set(s.alias_map) == set(s.tools)
    assert s.preference["outcome"] == 1.0 and set(s.preference) <= set(s.tools) | {"outcome", "-cost", "-latency"}
    assert s.preference_text == preference_text(s.preference)
    remapped = catalog.remap(alias_map_to_remap(s.alias_map, catalog))  # a valid per-sample catalog
    for alias, spec in s.alias_map.items():
      b_ = remapped.backend(alias)
      assert (b_.model, b_.price_in, b_.price_out, b_.latency_s) == (spec["model"], spec["price_in"],
                                                                     spec["price_out"], spec["latency"])
      assert b_.base_url == next(x.base_url for x in catalog.backends.values() if x.model == spec["model"])
  env = randomize_sample(convert_tau2("mock")[0], seed=1, catalog=catalog)
  assert "create_task" in env.tools and any(t.startswith("expert-") for t in env.tools)
  prefs = [random_preference(random.Random(i), ["x", "y"]) for i in range(200)]
  assert any("-cost" in p for p in prefs) and any(p.get("x", 0) < 0 for p in prefs)


# --- grain pipeline -------------------------------------------------------------------------------------------
def _ids(batch):
  return [s.id for s in batch]


def test_iterator_state_resumes_exactly(tmp_path):
  samples = [_qa(i) for i in range(23)]
  path = write_jsonl(tmp_path / "d.jsonl", samples)

  def build():
    return make_dataset(path, seed=5, shuffle=True, num_epochs=3, batch_size=4)

  full = [_ids(b) for b in make_iterator(build())]
  assert sum(len(b) for b in full) == 69 and len(full) == 18
  it = make_iterator(build())
  head = [_ids(next(it)) for _ in range(7)]
  state_file = save_iterator_state(it, tmp_path / "state.json")
  rest = [_ids(b) for b in it]
  assert head + rest == full
  resumed = make_iterator(build())
  load_iterator_state(resumed, state_file)
  assert [_ids(b) for b in resumed] == rest
  # the same with the in-memory state
  it2 = make_iterator(build())
  for _ in range(11):
    next(it2)
  state = it2.get_state()
  json.dumps(state)
  it3 = make_iterator(build())
  it3.set_state(state)
  assert [_ids(b) for b in it3] == full[11:]


def test_shuffling_is_deterministic_by_seed():
  samples = [_qa(i) for i in range(50)]

  def order(seed, epochs=1):
    return [s.id for s in make_iterator(make_dataset(samples, seed=seed, num_epochs=epochs))]

  assert order(1) == order(1)
  assert order(1) != order(2)
  assert sorted(order(1)) == sorted(s.id for s in samples)
  two = order(1, epochs=2)
  assert two[:50] == order(1) and sorted(two[50:]) == sorted(two[:50]) and two[50:] != two[:50]
  assert [s.id for s in make_dataset(samples, shuffle=False)] == [s.id for s in samples]


def test_sharding_and_dict_records():
  samples = [_qa(i) for i in range(10)]
  shards = [[s.id for s in make_dataset(samples, seed=0, shard_index=i, shard_count=3)] for i in range(3)]
  assert sorted(sum(shards, [])) == sorted(s.id for s in samples)
  batch = next(make_iterator(make_dataset(samples, batch_size=4, as_dict=True, shuffle=False)))
  assert [r["id"] for r in batch] == ["q0", "q1", "q2", "q3"] and isinstance(batch[0], dict)
  with pytest.raises(ValueError, match="num_epochs"):
    make_dataset(samples, num_epochs=0)


def test_forever_and_parquet_values():
  import datetime
  import decimal

  from orchestra_jax.data.converters import _jsonable
  it = make_iterator(make_dataset([_qa(i) for i in range(3)], seed=0, num_epochs=None, batch_size=2))
  assert sum(len(next(it)) for _ in range(10)) == 20  # num_epochs=None repeats forever
  row = {"d": datetime.datetime(2024, 5, 1), "t": datetime.datetime(2024, 5, 1, 9, 30), "x": decimal.Decimal("1.5"),
         "img": b"\x89PNG", "nested": [{"day": datetime.date(2024, 1, 2)}]}
  assert _jsonable(row) == {"d": "2024-05-01", "t": "2024-05-01T09:30:00", "x": 1.5, "img": None,
                            "nested": [{"day": "2024-01-02"}]}
