"""The data readers (orchestra_jax/data/format.py, converters.py) on files that are not text: one line naming the
file and line, never a UnicodeDecodeError traceback."""

import gzip

import pytest

from orchestra_jax import cli
from orchestra_jax.data import converters
from orchestra_jax.data.format import DataFormatError, read_jsonl

GOOD = '{"id": "a", "kind": "qa", "question": "q?", "answer": "4"}\n'
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\xc3\x28"  # a PNG header: not UTF-8


def _binary_after_good_line(path):
  path.write_bytes(GOOD.encode() + BINARY + b"\n")
  return path


def test_data_stats_on_binary_file_is_one_line(tmp_path, capsys):
  path = _binary_after_good_line(tmp_path / "train.jsonl")
  assert cli.main(["data", "stats", str(path)]) == 2
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and "Traceback" not in err, err
  assert lines[0].startswith("orchestra: error: ") and f"{path}:2" in lines[0] and "UTF-8" in lines[0], lines[0]


def test_read_jsonl_names_the_binary_line(tmp_path):
  path = _binary_after_good_line(tmp_path / "train.jsonl")
  with pytest.raises(DataFormatError, match=rf"^{path}:2: not UTF-8 text"):
    read_jsonl(path)


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json", "rows.jsonl.gz"])
def test_toolscale_reader_on_binary_file_names_it(tmp_path, name):
  path = tmp_path / name
  payload = GOOD.encode() + BINARY + b"\n"
  path.write_bytes(gzip.compress(payload) if name.endswith(".gz") else payload)
  with pytest.raises(DataFormatError, match="not UTF-8 text") as e:
    converters.convert_toolscale(path, domain="bank")
  assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_gz_that_is_not_gzip_names_it(tmp_path):
  path = tmp_path / "rows.jsonl.gz"
  path.write_bytes(GOOD.encode())
  with pytest.raises(DataFormatError, match="not a gzip file") as e:
    converters.read_rows(path)
  assert str(path) in str(e.value)
