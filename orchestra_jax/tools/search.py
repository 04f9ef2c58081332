"""Retrieval for the `search` tool: offline BM25 over a JSONL corpus, or a remote `/retrieve` endpoint.

Interface (both retrievers):

    retrieve(queries: list[str], topk: int, allowed_ids: list[set[str] | None] | None = None)
        -> list[list[Doc]]            # per query, best first, at most topk

`allowed_ids[i]` restricts query i to those document ids (the reference restricts HLE retrieval per
question); None (for the whole list or one query) means the whole corpus.

- `BM25Retriever`: `bm25s` (Lucene-style BM25, sparse scores) over `{"id", "contents"}` JSONL lines.
- `RemoteRetriever`: POST `{"queries": [...], "topk": k[, "allowed_ids": [[...] | null, ...]]}` to
  `<url>` (e.g. http://host:8000/retrieve) and read per-query lists of `{"id", "contents", "score"}`.
  Also accepted: the reference FAISS server's `{"result": [[{"document": {"id", "contents"|"content"},
  "score"}]]}`. Whitelists are re-applied on the client, so a server that ignores them is still safe.
- `serve_retriever(retriever)`: a small threaded HTTP server exposing any retriever at `/retrieve`
  (127.0.0.1 by default), so the same client code talks to BM25 in tests and to FAISS at scale.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import threading
from typing import Any, Iterable, Protocol, Sequence

import numpy as np
import requests

from orchestra_jax.errors import UserError


class CorpusError(UserError, ValueError):
  """A corpus file or record that cannot be indexed; the message names the file, line and field."""


class RetrieverUnavailable(UserError, ConnectionError):
  """The remote retriever cannot be reached (wrong URL, server down, timeout); the message names the URL."""


class RetrievalError(RuntimeError):
  """The remote retriever answered, but not with a valid result."""


@dataclasses.dataclass(frozen=True)
class Doc:
  id: str
  contents: str
  score: float

  def to_dict(self) -> dict[str, Any]:
    return {"id": self.id, "contents": self.contents, "score": self.score}


class Retriever(Protocol):
  def retrieve(self, queries: Sequence[str], topk: int = 10,
               allowed_ids: Sequence[Iterable[str] | None] | None = None) -> list[list[Doc]]:
    ...


def _check_args(queries: Sequence[str], topk: int, allowed_ids) -> list[set[str] | None]:
  if isinstance(queries, str):
    raise TypeError("queries must be a list of strings, not one string")
  if not all(isinstance(q, str) for q in queries):
    raise TypeError("every query must be a string")
  if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
    raise ValueError(f"topk must be a positive int, got {topk!r}")
  if allowed_ids is None:
    return [None] * len(queries)
  if len(allowed_ids) != len(queries):
    raise ValueError(f"allowed_ids must have one entry per query ({len(queries)}), got {len(allowed_ids)}")
  return [None if a is None else {str(x) for x in a} for a in allowed_ids]


def load_jsonl_corpus(path: str | os.PathLike) -> list[dict[str, str]]:
  """Read `{"id", "contents"}` lines (extra fields ignored; `title` is prepended to contents if present
  and contents does not start with it). Errors name the file, line and missing field."""
  docs: list[dict[str, str]] = []
  seen: set[str] = set()
  try:
    f = open(path, encoding="utf-8")
  except FileNotFoundError:
    raise CorpusError(f"corpus not found: {path}") from None
  with f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise CorpusError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
      if not isinstance(rec, dict):
        raise CorpusError(f"{path}:{lineno}: each line must be a JSON object")
      for field in ("id", "contents"):
        if field not in rec:
          raise CorpusError(f"{path}:{lineno}: missing field '{field}'")
      if not isinstance(rec["contents"], str):
        raise CorpusError(f"{path}:{lineno}: 'contents' must be a string")
      doc_id = str(rec["id"])
      if doc_id in seen:
        raise CorpusError(f"{path}:{lineno}: duplicate id {doc_id!r}")
      seen.add(doc_id)
      contents = rec["contents"]
      title = rec.get("title")
      if isinstance(title, str) and title and not contents.startswith(title):
        contents = f"{title}\n{contents}"
      docs.append({"id": doc_id, "contents": contents})
  if not docs:
    raise CorpusError(f"{path}: the corpus is empty")
  return docs


class BM25Retriever:
  """Offline BM25 (bm25s, Lucene variant) with per-query document whitelists. Thread-safe for reads."""

  def __init__(self, docs: Iterable[dict[str, Any] | Doc], *, k1: float = 1.5, b: float = 0.75,
               method: str = "lucene", stopwords: str | list[str] | None = "en", stemmer: Any = None,
               keep_zero_scores: bool = False):
    import bm25s  # noqa: PLC0415  late: importing it takes seconds, and only this retriever needs it

    self._bm25s = bm25s
    ids, contents = [], []
    for i, d in enumerate(docs):
      if isinstance(d, Doc):
        ids.append(d.id)
        contents.append(d.contents)
        continue
      if not isinstance(d, dict) or "id" not in d or "contents" not in d:
        raise CorpusError(f"document {i} must be an object with 'id' and 'contents'")
      ids.append(str(d["id"]))
      contents.append(str(d["contents"]))
    if not ids:
      raise CorpusError("cannot index an empty corpus")
    if len(set(ids)) != len(ids):
      raise CorpusError("document ids must be unique")
    self.ids = ids
    self.contents = contents
    self._index_of = {doc_id: i for i, doc_id in enumerate(ids)}
    self._stopwords = stopwords
    self._stemmer = stemmer
    self.keep_zero_scores = keep_zero_scores
    tokens = bm25s.tokenize(contents, stopwords=stopwords, stemmer=stemmer, return_ids=False, show_progress=False)
    self._bm25 = bm25s.BM25(k1=k1, b=b, method=method)
    self._bm25.index(tokens, show_progress=False)

  @classmethod
  def from_jsonl(cls, path: str | os.PathLike, **kwargs: Any) -> "BM25Retriever":
    return cls(load_jsonl_corpus(path), **kwargs)

  def __len__(self) -> int:
    return len(self.ids)

  def scores(self, query: str) -> Any:
    """BM25 score of every document for one query (numpy array aligned with `self.ids`)."""
    tokens = self._bm25s.tokenize([query], stopwords=self._stopwords, stemmer=self._stemmer, return_ids=False,
                                  show_progress=False)[0]
    token_ids = self._bm25.get_tokens_ids(tokens)
    if not token_ids:
      return np.zeros(len(self.ids), dtype=np.float32)
    return self._bm25.get_scores_from_ids(token_ids)

  def retrieve(self, queries: Sequence[str], topk: int = 10,
               allowed_ids: Sequence[Iterable[str] | None] | None = None) -> list[list[Doc]]:
    allowed = _check_args(queries, topk, allowed_ids)
    out: list[list[Doc]] = []
    for query, whitelist in zip(queries, allowed):
      scores = self.scores(query)
      if whitelist is None:
        candidates = np.arange(len(self.ids))
      else:
        candidates = np.array(sorted(self._index_of[d] for d in whitelist if d in self._index_of), dtype=np.int64)
      if candidates.size == 0:
        out.append([])
        continue
      cand_scores = scores[candidates]
      if not self.keep_zero_scores:
        keep = cand_scores > 0
        candidates, cand_scores = candidates[keep], cand_scores[keep]
      k = min(topk, candidates.size)
      if k < candidates.size:
        part = np.argpartition(-cand_scores, k - 1)[:k]
        candidates, cand_scores = candidates[part], cand_scores[part]
      order = np.lexsort((candidates, -cand_scores))  # best score first, ties by corpus order
      out.append([Doc(self.ids[i], self.contents[i], float(s)) for i, s in zip(candidates[order], cand_scores[order])])
    return out


class RemoteRetriever:
  """Client of a `/retrieve` endpoint (`url` is the full endpoint URL)."""

  def __init__(self, url: str, timeout_s: float = 30.0, session: Any = None, send_allowed_ids: bool = True):
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
      raise ValueError(f"retriever url must start with http:// or https://, got {url!r}")
    self.url = url
    self.timeout_s = timeout_s
    self.session = session or requests.Session()
    self.send_allowed_ids = send_allowed_ids

  def retrieve(self, queries: Sequence[str], topk: int = 10,
               allowed_ids: Sequence[Iterable[str] | None] | None = None) -> list[list[Doc]]:
    allowed = _check_args(queries, topk, allowed_ids)
    payload: dict[str, Any] = {"queries": list(queries), "topk": topk}
    if allowed_ids is not None and self.send_allowed_ids:
      payload["allowed_ids"] = [None if a is None else sorted(a) for a in allowed]
    try:
      resp = self.session.post(self.url, json=payload, timeout=self.timeout_s)
    except requests.exceptions.Timeout:
      raise RetrieverUnavailable(f"retriever at {self.url} did not answer within {self.timeout_s} s") from None
    except requests.exceptions.RequestException as e:
      raise RetrieverUnavailable(f"cannot reach retriever at {self.url}: {type(e).__name__}: {e}") from None
    if resp.status_code != 200:
      raise RetrievalError(f"retriever at {self.url} answered HTTP {resp.status_code}: {resp.text[:300]}")
    try:
      body = resp.json()
    except ValueError:
      raise RetrievalError(f"retriever at {self.url} answered with non-JSON: {resp.text[:300]!r}") from None
    results = body.get("result", body.get("results")) if isinstance(body, dict) else body
    if not isinstance(results, list) or len(results) != len(queries):
      raise RetrievalError(f"retriever at {self.url} must answer one list per query ({len(queries)}), got "
                           f"{str(body)[:300]}")
    out = []
    for hits, whitelist in zip(results, allowed):
      if not isinstance(hits, list):
        raise RetrievalError(f"retriever at {self.url}: each query's result must be a list, got {str(hits)[:200]}")
      docs = [_parse_hit(h, self.url) for h in hits]
      if whitelist is not None:
        docs = [d for d in docs if d.id in whitelist]
      out.append(docs[:topk])
    return out


def _parse_hit(hit: Any, url: str) -> Doc:
  if not isinstance(hit, dict):
    raise RetrievalError(f"retriever at {url}: a hit must be an object, got {str(hit)[:200]}")
  src = hit.get("document", hit)
  if not isinstance(src, dict):
    raise RetrievalError(f"retriever at {url}: 'document' must be an object, got {str(src)[:200]}")
  contents = src.get("contents", src.get("content"))
  if "id" not in src or not isinstance(contents, str):
    raise RetrievalError(f"retriever at {url}: a hit needs 'id' and 'contents', got keys {sorted(src)}")
  score = hit.get("score", src.get("score", 0.0))
  try:
    score = float(score)
  except (TypeError, ValueError):
    raise RetrievalError(f"retriever at {url}: 'score' must be a number, got {score!r}") from None
  return Doc(str(src["id"]), contents, score)


class _Handler(http.server.BaseHTTPRequestHandler):
  retriever: Retriever
  max_topk = 1000

  def log_message(self, format: str, *args: Any) -> None:  # quiet by default
    pass

  def _reply(self, code: int, body: Any) -> None:
    data = json.dumps(body).encode()
    self.send_response(code)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_POST(self) -> None:
    if self.path.rstrip("/") != "/retrieve":
      self._reply(404, {"error": f"unknown path {self.path}; POST /retrieve"})
      return
    try:
      length = int(self.headers.get("Content-Length", "0"))
      req = json.loads(self.rfile.read(length) or b"{}")
      queries, topk = req["queries"], int(req.get("topk", 10))
      if topk > self.max_topk:
        raise ValueError(f"topk must be at most {self.max_topk}")
      results = self.retriever.retrieve(queries, topk, req.get("allowed_ids"))
    except (KeyError, TypeError, ValueError) as e:
      self._reply(400, {"error": f"{type(e).__name__}: {e}"})
      return
    self._reply(200, [[d.to_dict() for d in docs] for docs in results])


def serve_retriever(retriever: Retriever, host: str = "127.0.0.1", port: int = 0) -> http.server.ThreadingHTTPServer:
  """Serve `retriever` at http://host:port/retrieve from a daemon thread; returns the server (its
  `server_address` has the bound port; call `.shutdown()` then `.server_close()` to stop)."""
  handler = type("RetrieveHandler", (_Handler,), {"retriever": retriever})
  server = http.server.ThreadingHTTPServer((host, port), handler)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, name="retrieve-server", daemon=True).start()
  return server


def server_url(server: http.server.ThreadingHTTPServer) -> str:
  host, port = server.server_address[:2]
  return f"http://{host}:{port}/retrieve"
