"""What a user gets with the repository alone or with the installed wheel: packaged data and configs, found from
any directory; ORCHESTRA_DATA_DIR as an override; saved run configs; licences; nothing read from outside the repo.
(.ci/wheel_smoke.sh runs the built wheel from /.)"""

import gzip
import os
import shutil
import stat
import tomllib
from pathlib import Path

import pytest

from orchestra_jax import resources
from orchestra_jax.configs import ConfigFileError, load_config, save_config
from orchestra_jax.tau2.domain import DOMAINS, Domain

REPO = Path(__file__).resolve().parents[1]


def test_wheel_lists_every_package_and_carries_configs():
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
  on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "orchestra_jax").rglob("__init__.py")}
  assert set(project["packages"]) == on_disk | {"orchestra_jax.resources.configs"}
  assert project["package-dir"] == {"orchestra_jax.resources.configs": "configs"}
  assert resources.configs_dir().resolve() == (REPO / "configs").resolve()  # the top-level folder, not a copy


def test_named_configs_load_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert set(resources.config_names()) >= {"demo", "tiny", "orchestrator_8b"}
  for name in ("demo", "tiny", "orchestrator_8b"):
    by_name = load_config(name)
    by_path = load_config(REPO / "configs" / f"{name}.py")
    assert by_name.to_dict() == by_path.to_dict()
  assert load_config("tiny.py").to_dict() == load_config("tiny").to_dict()
  with pytest.raises(ConfigFileError, match=r"config file tinny does not exist.*demo, orchestrator_8b, tiny"):
    load_config("tinny")
  with pytest.raises(ConfigFileError, match="configs/tiny.py does not exist"):  # a path is a path
    load_config("configs/tiny.py")


def test_an_existing_path_wins_over_a_packaged_name(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tiny.py").write_text("import ml_collections\n\ndef get_config():\n"
                                 "  return ml_collections.ConfigDict({'mine': 1})\n")
  assert load_config("tiny.py").to_dict() == {"mine": 1}
  assert load_config("tiny").to_dict() != {"mine": 1}  # a bare name is the packaged config


def test_saved_config_reloads_equal_and_takes_overrides(tmp_path):
  cfg = load_config("demo", ["--config.steps=7", "--config.env.preferences=cheap,expert"])
  path = save_config(cfg, tmp_path / "run_config.json")
  assert stat.S_IMODE(path.stat().st_mode) == 0o644
  again = load_config(path)
  assert again.to_dict() == cfg.to_dict()  # tuples stay tuples
  assert again.env.preferences == ("cheap", "expert")
  assert load_config(path, ["--config.steps=3"]).steps == 3
  with pytest.raises(ConfigFileError, match="unknown config key 'stepz'"):
    load_config(path, ["--config.stepz=3"])
  (tmp_path / "bad.json").write_text("[1, 2]")
  with pytest.raises(ConfigFileError, match="must hold a JSON object"):
    load_config(tmp_path / "bad.json")


def test_packaged_data_is_found_without_the_override(monkeypatch):
  monkeypatch.delenv(resources.DATA_ENV_VAR, raising=False)
  root = resources.data_dir()
  assert root == resources.packaged_data_dir()
  assert root.is_relative_to(REPO / "orchestra_jax")
  for name in DOMAINS:
    assert Domain.load(name).tasks
  assert (root / "tau2" / "telecom" / "main_policy.md").is_file()  # shipped for the domain to come
  assert resources.find_data_file(root / "tau2" / "airline" / "db.json").name == "db.json.gz"


def test_a_users_own_copy_overrides_plain_or_gzipped(tmp_path, monkeypatch):
  packaged = resources.packaged_data_dir() / "tau2" / "mock"
  own = tmp_path / "tau2" / "mock"
  shutil.copytree(packaged, own)
  tasks = (own / "tasks.json").read_bytes()
  (own / "tasks.json").unlink()
  (own / "tasks.json.gz").write_bytes(gzip.compress(tasks))
  (own / "policy.md").write_text("my own policy")
  monkeypatch.setenv(resources.DATA_ENV_VAR, str(tmp_path))
  mine = Domain.load("mock")
  assert mine.policy == "my own policy"
  assert [t.id for t in mine.tasks] == [t.id for t in Domain.load("mock", resources.packaged_data_dir()).tasks]
  monkeypatch.setenv(resources.DATA_ENV_VAR, str(tmp_path / "empty"))
  with pytest.raises(resources.DataNotFoundError, match="not found at .*empty/tau2/airline"):
    Domain.load("airline")


def test_licences_and_notices_ship():
  assert "Apache License" in (REPO / "LICENSE").read_text()
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  assert project["license"] == "Apache-2.0"
  assert set(project["license-files"]) == {"LICENSE", "THIRD_PARTY_NOTICES.md"}
  notices = (REPO / "THIRD_PARTY_NOTICES.md").read_text()
  data = resources.packaged_data_dir()
  assert "MIT License" in (data / "tau2" / "LICENSE").read_text()
  for folder in ("tau2", "frames"):
    assert f"orchestra_jax/resources/data/{folder}/" in notices
  assert "Qwen3 tokenizer" in notices


def _text_files():
  skip = {".git", ".venv", "__pycache__", ".pytest_cache", "runs", ".hypothesis", "build"}
  for dirpath, dirnames, filenames in os.walk(REPO):
    dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info")]
    for name in filenames:
      path = Path(dirpath) / name
      if path.suffix not in (".gz", ".png", ".pyc"):
        yield path


def test_nothing_refers_outside_the_repository():
  outside = ".." + "/shared"  # split so this file does not match itself
  internal_doc = "DESIGN" + ".md"
  offenders = [str(p.relative_to(REPO)) for p in _text_files()
               if outside in (text := p.read_text(errors="replace")) or internal_doc in text]
  assert offenders == []
