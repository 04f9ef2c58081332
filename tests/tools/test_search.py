"""Retrieval: offline BM25 over a JSONL corpus, whitelists, and the /retrieve client against a real server."""

import json
import socket

import pytest
import requests

from orchestra_jax.errors import UserError
from orchestra_jax.tools.search import (BM25Retriever, CorpusError, Doc, RemoteRetriever, RetrievalError,
                                        RetrieverUnavailable, serve_retriever, server_url)

CORPUS = [
    {"id": "eiffel", "contents": "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889."},
    {"id": "everest", "contents": "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."},
    {"id": "louvre", "contents": "The Louvre in Paris is the world's most-visited art museum."},
    {"id": "nile", "contents": "The Nile is a major north-flowing river in northeastern Africa."},
    {"id": "python", "contents": "Python is a high-level programming language created by Guido van Rossum."},
    {"id": "amazon", "contents": "The Amazon river in South America is the largest river by discharge volume."},
]


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
  with open(path, "w") as f:
    for doc in CORPUS:
      f.write(json.dumps(doc) + "\n")
  return path


@pytest.fixture(scope="module")
def bm25(corpus_path):
  return BM25Retriever.from_jsonl(corpus_path)


@pytest.fixture()
def server(bm25):
  srv = serve_retriever(bm25)  # 127.0.0.1, free port
  yield srv
  srv.shutdown()
  srv.server_close()


def _session():
  s = requests.Session()
  s.trust_env = False  # never route the local test server through a proxy from the environment
  return s


def test_bm25_ranks_the_right_document_first(bm25):
  queries = ["who created the Python programming language", "highest mountain on Earth",
             "lattice tower completed 1889", "largest river by discharge"]
  results = bm25.retrieve(queries, topk=3)
  assert [r[0].id for r in results] == ["python", "everest", "eiffel", "amazon"]
  for docs in results:
    assert all(isinstance(d, Doc) for d in docs) and len(docs) <= 3
    assert [d.score for d in docs] == sorted((d.score for d in docs), reverse=True)
  assert results[0][0].contents == CORPUS[4]["contents"]


def test_bm25_whitelists_per_query(bm25):
  allowed = [{"louvre", "nile"}, None, set()]
  results = bm25.retrieve(["Paris tower", "Paris tower", "Paris tower"], topk=5, allowed_ids=allowed)
  assert [d.id for d in results[0]] == ["louvre"]  # eiffel scores higher but is not allowed
  assert [d.id for d in results[1]][:2] == ["eiffel", "louvre"]
  assert results[2] == []
  assert bm25.retrieve(["zzzz qqqq"], topk=5) == [[]]  # no overlap: nothing, not junk
  with pytest.raises(ValueError, match="one entry per query"):
    bm25.retrieve(["a", "b"], topk=1, allowed_ids=[None])


def test_corpus_errors_name_line_and_field(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"id": "a", "contents": "x"}\n{"id": "b"}\n')
  with pytest.raises(CorpusError, match=r"bad.jsonl:2: missing field 'contents'") as err:
    BM25Retriever.from_jsonl(path)
  assert isinstance(err.value, UserError)
  path.write_text('{"id": "a", "contents": "x"}\n{"id": "a", "contents": "y"}\n')
  with pytest.raises(CorpusError, match="duplicate id"):
    BM25Retriever.from_jsonl(path)
  with pytest.raises(CorpusError, match="not found"):
    BM25Retriever.from_jsonl(tmp_path / "missing.jsonl")


def test_remote_client_against_a_real_server(bm25, server):
  url = server_url(server)
  assert url.startswith("http://127.0.0.1:")
  client = RemoteRetriever(url, timeout_s=10, session=_session())
  queries = ["highest mountain on Earth", "Paris tower", "Paris tower"]
  remote = client.retrieve(queries, topk=2, allowed_ids=[None, None, {"louvre"}])
  local = bm25.retrieve(queries, topk=2, allowed_ids=[None, None, {"louvre"}])
  assert [[d.id for d in r] for r in remote] == [[d.id for d in r] for r in local]
  assert remote[0][0] == local[0][0]
  assert [d.id for d in remote[2]] == ["louvre"]


def test_remote_client_reads_reference_format_and_filters(server):
  # A FAISS server in the reference's format that ignores whitelists: the client still filters.
  class Faiss:
    def retrieve(self, queries, topk, allowed_ids=None):
      return [[Doc("d1", "one", 2.0), Doc("d2", "two", 1.0)] for _ in queries]

  srv = serve_retriever(Faiss())
  try:
    body = requests.post(server_url(srv), json={"queries": ["q"], "topk": 2}, timeout=10).json()
    assert body == [[{"id": "d1", "contents": "one", "score": 2.0}, {"id": "d2", "contents": "two", "score": 1.0}]]
    client = RemoteRetriever(server_url(srv), session=_session())
    assert [d.id for d in client.retrieve(["q"], 2, allowed_ids=[{"d2"}])[0]] == ["d2"]
  finally:
    srv.shutdown()
    srv.server_close()


def test_unreachable_endpoint_names_the_url():
  with socket.socket() as s:  # a port that nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}/retrieve"
  with pytest.raises(RetrieverUnavailable, match=f"cannot reach retriever at {url}") as err:
    RemoteRetriever(url, timeout_s=2, session=_session()).retrieve(["anything"], topk=1)
  assert isinstance(err.value, UserError)


def test_bad_server_answers(server):
  base = server_url(server).rsplit("/", 1)[0]
  with pytest.raises(RetrievalError, match="HTTP 404"):
    RemoteRetriever(base + "/nope", session=_session()).retrieve(["q"], 1)
  resp = requests.post(server_url(server), json={"topk": 1}, timeout=10)
  assert resp.status_code == 400 and "queries" in resp.json()["error"]
