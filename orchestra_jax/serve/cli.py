"""`orchestra serve` on the command line: the sub-command's parser and the run until Ctrl-C.

Wired into the main CLI with `add_serve_parser(subparsers)` and `run_serve(args)`. This is the only module that
sees the argparse Namespace; the library (`http.open_server`) takes plain values.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from orchestra_jax.serve.engine import DEFAULT_MAX_BATCH, DEFAULT_MAX_LEN
from orchestra_jax.serve.http import ModelServer, open_server


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
  """Adds `serve` to the `orchestra` sub-command parsers; returns its parser."""
  p = subparsers.add_parser(
      "serve", help="serve a checkpoint over an OpenAI-compatible HTTP API",
      formatter_class=argparse.RawDescriptionHelpFormatter,
      description="Serve one model over an OpenAI-compatible HTTP API (POST /v1/chat/completions, "
                  "POST /v1/completions, GET /v1/models, GET /health). Concurrent requests share one "
                  "continuously batched decode. Tool calls in the model's hermes output "
                  "(<tool_call>{json}</tool_call>) come back as OpenAI tool_calls, the <think> block as "
                  "reasoning_content. No streaming, n=1 only.",
      epilog="example:\n  orchestra serve --model runs/tiny --port 8000\n"
             "  curl -s 127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
             "    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 16}'")
  p.add_argument("--model", required=True, metavar="DIR",
                 help="orchestra checkpoint, HF Qwen3 directory or orchestra train WORKDIR[/checkpoints/STEP] to serve")
  p.add_argument("--port", type=int, default=8000, metavar="P",
                 help="TCP port to listen on; 0 picks a free one (default 8000)")
  p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                 help="address to bind (default 127.0.0.1, this machine only; the server has no authentication, "
                      "so think twice before 0.0.0.0)")
  p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, metavar="N",
                 help=f"requests decoded together (KV-cache rows); more wait in a queue (default {DEFAULT_MAX_BATCH})")
  p.add_argument("--max-len", type=int, default=None, metavar="L",
                 help=f"tokens per request, prompt plus completion (KV-cache row length); longer prompts get "
                      f"HTTP 400 (default: the smaller of {DEFAULT_MAX_LEN} and the model's max_position_embeddings)")
  p.add_argument("--served-model-name", default=None, metavar="NAME",
                 help="model name clients send and /v1/models lists; other names get 404 "
                      "(default: the model directory's name; for a training run, WORKDIR or "
                      "WORKDIR/checkpoints/N, '<workdir name>-step<N>')")
  p.add_argument("--tokenizer", default=None, metavar="DIR",
                 help="tokenizer directory (default: the model directory if it has tokenizer files, else the "
                      "bundled Qwen3 tokenizer)")
  p.add_argument("--no-warmup", action="store_true",
                 help="skip compiling the greedy path before listening (the first request then pays for it)")
  p.add_argument("--quiet", action="store_true", help="do not log one line per HTTP request to stderr")
  return p


def build_server(args: argparse.Namespace, log_requests: bool | None = None) -> ModelServer:
  """The `ModelServer` that `orchestra serve` ARGS describes (model loaded, socket bound, nothing running yet)."""
  return open_server(args.model, port=args.port, host=args.host, max_batch=args.max_batch, max_len=args.max_len,
                     served_model_name=args.served_model_name, tokenizer_dir=args.tokenizer,
                     log_requests=not args.quiet if log_requests is None else log_requests)


def run_serve(args: argparse.Namespace) -> None:
  """Runs `orchestra serve` until Ctrl-C. Raises UserError subclasses for problems a user can fix."""
  server = build_server(args)
  previous = None
  if threading.current_thread() is threading.main_thread():  # SIGTERM (docker stop, kill) stops like Ctrl-C

    def on_term(signum, frame):
      raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
  try:
    if not args.no_warmup:
      print("orchestra serve: compiling (warm-up) ...", file=sys.stderr, flush=True)
      print(f"orchestra serve: warm-up took {server.warmup():.1f}s", file=sys.stderr, flush=True)
    print(f"orchestra serve: serving {server.model_name!r} at {server.base_url}/v1 (max batch "
          f"{server.engine.batch_size}, max len {server.max_len}); Ctrl-C stops", flush=True)
    server.serve_forever()
  except KeyboardInterrupt:
    print("orchestra serve: stopping", file=sys.stderr)
  finally:
    server.close()
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
