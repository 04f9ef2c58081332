"""`orchestra eval`: run an orchestrator on a benchmark, grade it, report accuracy, cost, latency and tool use.

    orchestra eval --config orchestrator_8b --benchmark frames --model runs/ckpt --limit 100 \\
        --judge-endpoint http://127.0.0.1:8200 --judge-model Qwen/Qwen3-32B --out runs/eval/frames-ckpt

Benchmarks (`BENCHMARKS`):

* `frames`: FRAMES (`data.converters.convert_frames`, the shipped 824 questions), QA tools of the catalog
  (`tools.qa_env.QAEnvironment`). `search` needs `--corpus FILE` (BM25 over `{id, contents}` JSONL) or
  `--retriever-url URL`; without either, search answers with an error and the orchestrator must do without.
* `hle`: Humanity's Last Exam, ONLY from the user's own copy (`--hle-path FILE`; never shipped, never trained on).
* `tau2-airline`, `tau2-retail`, `tau2-mock`: tau2 domains (`tools.tau2_env.Tau2Environment`); the customer is an
  LLM user simulator behind `--user-endpoint URL --user-model NAME`. Split: `eval.tau2_split` (default "base",
  every task). NL assertions (no shipped airline/retail task has them) are skipped.
* `--tasks FILE` replaces the benchmark's items with records of the training-data format (`data.format`), e.g. with
  `alias_map`, `preference_text` and `preference` per item.

Orchestrators:

* `--model DIR`: our checkpoint (or an HF Qwen3 directory) through the continuous-batching `Sampler` and the
  multi-turn `AgentLoop`, as `orchestra train` evaluates (greedy unless `eval.temperature` says otherwise). Items
  stream: each is graded and written the moment its row ends, while other rows keep decoding.
* `--orchestrator-endpoint URL --orchestrator-model NAME`: any OpenAI-compatible model as the orchestrator
  (baselines): the episode's messages and tool schemas go out, the reply's `tool_calls` are checked against the
  schemas (`chat_format.validate_tool_calls`) and run with `Episode.call`, results go back as `tool` messages,
  until a call ends the episode, the reply has no tool call, or `eval.max_turns`. Items run `eval.workers` at a time.

Grading (QA, `orchestra_jax.grading`): exact match after SQuAD normalisation (`exact_match`), then numeric equality
(`numeric_match`), then, with `--judge-endpoint/--judge-model`, an LLM judge through `ChatClient` with one of two
prompts (`--judge-prompt`; default `hle` for hle, `reference` otherwise):

* `hle`: the HLE judge: extract the response's final answer, reason, then `correct: yes|no`;
* `reference`: "is the response equivalent to the gold answer? yes or no".

An item without a final answer is wrong ("no_answer"); an unparseable judge reply is wrong ("judge_unparsed").
A judge call that FAILS (endpoint down) writes nothing for that item, so a rerun retries it. tau2 items are graded
by `Tau2Episode.grade_info` (tau2's reward; correct = reward 1).

Per item, `OUT/results.jsonl` gets one line: id, prediction, gold, correct, score, judged_by (exact | numeric |
judge | judge_unparsed | no_answer | none | tau2), the judge's reply, cost_usd (tools + the orchestrator's own
tokens, priced by the catalog's `orchestrator` prices, or for an endpoint orchestrator by the catalog alias serving
that model if any), tool_cost_usd, orchestrator_cost_usd, latency_s (tool latency + the endpoint orchestrator's
call latency; for `--model` the shared batched decode has no per-item latency, so tools only), wall_s, tool_counts
(by alias), tool_calls, turns, finish_reason, the calls made, and the item's preference when it has one.

Resumable: each line is written with one write, flushed and fsynced; a rerun with the same --out skips items
already there (a torn last line from a crash is cut off first); `run.json` pins the benchmark and orchestrator of
the directory, so results of different runs never mix.

Report: accuracy, mean cost, mean latency, tool-call shares, and where items carry a preference the mean
preference reward (`reward.rewards.preference_reward`, over the group of evaluated items sharing that preference:
the min-max normalisation is relative to this run), as a markdown table on stdout, `OUT/summary.json` and
`OUT/accuracy_vs_cost.png` (one point per run; `--compare DIR ...` adds other runs' summaries to table and plot).

Settings come from the config file: an optional `eval` section (keys of `EvalSettings`), else `rollout` (sampler
and loop sizes; not temperature or max_turns) and `generate.max_new_tokens`, else the defaults of `EvalSettings`.
`mesh` and `tokenizer_dir` are used as in training.

Modules: `tasks` (benchmarks, items, `EvalSettings`, the environment), `orchestrators` (checkpoint and endpoint),
`results` (the output directory, results.jsonl, per-item records), `report` (summary, table, plot), `run`
(`EvalRequest`, `run_eval`), `cli` (the parser and `main`; the only one that sees argparse). The judge and the
grading cascade live in `orchestra_jax.grading`, shared with training.
"""

from orchestra_jax.evaluate.cli import add_eval_parser, main
from orchestra_jax.evaluate.report import format_table, plot_accuracy_cost, preference_reward_mean, summarize
from orchestra_jax.evaluate.results import ResultsFile
from orchestra_jax.evaluate.run import EvalRequest, run_eval
from orchestra_jax.evaluate.tasks import BENCHMARKS, EvalSettings, load_tasks, settings_from_config
from orchestra_jax.grading import (HLE_JUDGE_PROMPT, JUDGE_PROMPTS, REFERENCE_JUDGE_PROMPT, EvalError,
                                   JudgeUnavailable, JudgeVerdict, LLMJudge, grade_answer, judge_messages,
                                   parse_judge_reply)

__all__ = ["BENCHMARKS", "JUDGE_PROMPTS", "EvalError", "EvalRequest", "EvalSettings", "settings_from_config",
           "load_tasks", "LLMJudge", "JudgeUnavailable", "JudgeVerdict", "judge_messages", "parse_judge_reply",
           "grade_answer", "ResultsFile", "summarize", "preference_reward_mean", "format_table", "plot_accuracy_cost",
           "add_eval_parser", "run_eval", "main", "HLE_JUDGE_PROMPT", "REFERENCE_JUDGE_PROMPT"]
