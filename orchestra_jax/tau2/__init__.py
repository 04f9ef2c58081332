"""The tau2 simulation: tau2-bench-style domains (mock, airline, retail, synthesised ones) with their databases,
tools, grading by gold replay, and user simulators.

Quick start::

  from orchestra_jax.tau2 import Domain, ScriptedUser, run_episode, evaluate_episode
  domain = Domain.load("airline")                  # parsed once per process
  env = domain.new_episode(domain.task("7"))       # private copy of the database
  env.call("get_user_details", {"user_id": "..."}) # JSON text, or "Error: ..."
  tools = domain.tool_schemas(include_call_expert=True)

Names are imported lazily, so importing this package costs nothing until one is used.
"""

from orchestra_jax.lazy import lazy_exports

_EXPORTS = {
  # domain.py
  "Domain": "domain", "Environment": "domain", "Task": "domain", "Action": "domain", "EnvAssertion": "domain",
  "EvaluationCriteria": "domain", "ToolCallRecord": "domain", "DataNotFoundError": "domain",
  "data_dir": "domain", "tau2_dir": "domain", "DOMAINS": "domain", "DATA_ENV_VAR": "domain",
  # tools.py
  "ToolError": "tools", "CALL_EXPERT_SCHEMA": "tools", "EXPERT_NAMES": "tools", "Toolkit": "tools",
  "tool": "tools",
  # db.py / records.py
  "Database": "db", "ValidationError": "records", "canonical_json": "records",
  # evaluation.py
  "evaluate": "evaluation", "RewardInfo": "evaluation", "MissingJudgeError": "evaluation",
  "pass_hat_k": "evaluation", "pass_hat_k_tasks": "evaluation",
  # user.py
  "UserSimulator": "user", "ScriptedUser": "user", "LLMUserSimulator": "user", "UserSimulatorError": "user",
  "STOP_TOKEN": "user", "TRANSFER_TOKEN": "user", "OUT_OF_SCOPE_TOKEN": "user", "stop_token": "user",
  # runner.py
  "run_episode": "runner", "gold_agent": "runner", "evaluate_episode": "runner", "ToolCallRequest": "runner",
  "AgentMessage": "runner", "EpisodeResult": "runner",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
