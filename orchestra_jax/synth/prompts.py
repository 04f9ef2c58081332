"""Prompt templates of the synthesis stages. Each returns (header, prompt).

The header is the first line of the user message, `[synth:STAGE domain=NAME ...]`: it names the request
uniquely, so logs stay readable and a scripted test server can answer each request by a substring rule
(retries repeat the header followed by " (attempt k)").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["tables_prompt", "schema_prompt", "data_model_prompt", "rows_prompt", "tools_prompt", "intents_prompt",
           "task_prompt", "evolve_prompt", "header"]


def header(stage: str, domain: str, **parts: Any) -> str:
  extra = "".join(f" {k}={v}" for k, v in parts.items())
  return f"[synth:{stage} domain={domain}{extra}]"


def _dump(value: Any) -> str:
  return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def tables_prompt(domain: str, max_tables: int) -> tuple[str, str]:
  return header("tables", domain), f"""\
Design the database of a customer-service environment for the domain "{domain}". An AI agent will serve
users of this business with tools that read and change the database.
List between 2 and {max_tables} tables, with snake_case plural names (e.g. "customers", "orders").
Reply with JSON only, in this shape:
{{"description": "<one paragraph: the business and what users ask the agent to do>",
 "tables": [{{"name": "customers", "description": "<what one row is>"}}, ...]}}"""


def schema_prompt(domain: str, description: str, tables: Sequence[Mapping[str, str]]) -> tuple[str, str]:
  listing = "\n".join(f"- {t['name']}: {t.get('description', '')}" for t in tables)
  return header("schema", domain), f"""\
Domain "{domain}": {description}
Tables:
{listing}
Write the JSON schema of one row of each table. Column types: string, integer, number, boolean, object, or
array (with "items": {{"type": ...}}). Give every column a "description"; use "enum" for columns with a fixed
set of values (statuses, tiers); list in "required" the columns every row has. Each table needs one identifier
column (e.g. "customer_id", a string), and a column that refers to another table holds that table's identifier.
Reply with JSON only, in this shape:
{{"tables": {{"customers": {{"type": "object", "properties": {{"customer_id": {{"type": "string", "description": "..."}},
  "tier": {{"type": "string", "enum": ["basic", "gold"], "description": "..."}}}}, "required": ["customer_id", "tier"]}}, ...}}}}"""


def data_model_prompt(domain: str, schemas: Mapping[str, Any]) -> tuple[str, str]:
  return header("data_model", domain), f"""\
Domain "{domain}". Row schemas of its tables:
{_dump(schemas)}
Define the typed data model: for every table its primary key (a required string or integer column whose value
identifies the row) and its foreign keys (columns whose values are primary keys of another table; for an array
column, each item is one).
Reply with JSON only, in this shape:
{{"tables": {{"accounts": {{"primary_key": "account_id", "foreign_keys": {{"customer_id": "customers"}}}},
  "customers": {{"primary_key": "customer_id", "foreign_keys": {{}}}}}}}}"""


def rows_prompt(domain: str, table_schema: Mapping[str, Any], table: str, batch: int, count: int,
                existing_keys: Sequence[str], references: Mapping[str, Sequence[str]]) -> tuple[str, str]:
  refs = "".join(f"\n- {t}: {_dump(list(keys))}" for t, keys in references.items())
  taken = f"\nThese {table} keys are taken already: {_dump(list(existing_keys))}." if existing_keys else ""
  return header("rows", domain, table=table, batch=batch), f"""\
Domain "{domain}". Row schema of table "{table}":
{_dump(table_schema)}
Write {count} realistic, varied rows for "{table}". Primary key values must be unique.{taken}
Foreign keys must use existing keys{':' + refs if refs else ' (this table has none)'}
Use every column of the schema; optional columns may be null.
Reply with JSON only, in this shape: {{"rows": [{{...}}, ...]}}"""


def tools_prompt(domain: str, description: str, model_json: Mapping[str, Any], min_tools: int,
                 max_tools: int) -> tuple[str, str]:
  return header("tools", domain), f"""\
Domain "{domain}": {description}
Data model:
{_dump(model_json)}
Design between {min_tools} and {max_tools} tools for the agent, and the policy it must follow. Tools are
declarative operations over one table; their arguments are named after the table's columns:
- "get": read one row by its primary key.
- "list": the rows matching equality filters; "filters": columns usable as arguments, "required": filters that
  must be given, optional "limit".
- "update": change one row found by its primary key; "fields": columns the caller may set, "set": constant
  values written on every call (e.g. {{"status": "cancelled"}}), "required": fields that must be given.
- "create": add a row; "fields", "set" as for update, "id_prefix": prefix of generated ids when the primary key
  is not among the fields.
- "delete": remove one row by its primary key.
- "calculate": evaluate arithmetic (argument "expression"); "transfer": hand the user to a human (argument "summary").
Include both read tools and tools that change the database. The policy (markdown) states the rules: what the
agent must verify before a change, what it must refuse, when to transfer.
Reply with JSON only, in this shape:
{{"tools": [{{"name": "get_account", "description": "...", "operation": "get", "table": "accounts"}},
  {{"name": "freeze_account", "description": "...", "operation": "update", "table": "accounts", "set": {{"status": "frozen"}}}}, ...],
 "policy": "# {domain} agent policy\\n..."}}"""


def _type_text(schema: Mapping[str, Any]) -> str:
  kind = schema.get("type", "any")
  if kind == "array":
    return f"array of {_type_text(schema.get('items') or {})}"
  if "enum" in schema:
    return f"{kind} ({' | '.join(json.dumps(v) for v in schema['enum'])})"
  return str(kind)


def _tool_lines(tools: Sequence[Mapping[str, Any]]) -> str:
  out = []
  for t in tools:
    fn = t["function"]
    params = fn["parameters"]
    args = ", ".join(f"{n}{'' if n in params['required'] else '?'}: {_type_text(p)}"
                     for n, p in params["properties"].items())
    out.append(f"- {fn['name']}({args}): {fn['description']}")
  return "\n".join(out)


def _rows_block(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
  return "\n".join(f"{table}: {_dump(list(r))}" for table, r in rows.items())


def intents_prompt(domain: str, description: str, tool_schemas: Sequence[Mapping[str, Any]],
                   rows: Mapping[str, Sequence[Mapping[str, Any]]], count: int) -> tuple[str, str]:
  return header("intents", domain), f"""\
Domain "{domain}": {description}
Tools:
{_tool_lines(tool_schemas)}
Some rows of the database:
{_rows_block(rows)}
Write {count} distinct intents of users who contact the agent: what each user wants done. Mix requests that
only need information (requires_write false) with requests that change the database (requires_write true),
and refer to the entities in the rows above.
Reply with JSON only, in this shape:
{{"intents": [{{"intent": "<one sentence>", "requires_write": true}}, ...]}}"""


_TASK_SHAPE = """\
{"user_scenario": {"persona": null, "instructions": {"task_instructions": "<how the user behaves>",
   "reason_for_call": "<what the user wants>", "known_info": "<ids and facts the user knows>",
   "unknown_info": "<what the user does not know, or null>"}},
 "initial_state": null,
 "evaluation_criteria": {"actions": [{"name": "<tool>", "arguments": {...}}, ...],
   "communicate_info": ["<exact value from a tool result the agent must tell the user>"],
   "reward_basis": ["DB", "COMMUNICATE"]},
 "requires_write": true}"""


def task_prompt(domain: str, n: int, intent: str, requires_write: bool, policy: str,
                tool_schemas: Sequence[Mapping[str, Any]], rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, str]:
  return header("task", domain, n=n), f"""\
Domain "{domain}". Policy of the agent:
{policy.strip()}
Tools:
{_tool_lines(tool_schemas)}
Rows of the database:
{_rows_block(rows)}
User intent: {intent} (requires_write: {str(requires_write).lower()})
Write one task in the tau2-bench format for this intent: the user's instructions, and the gold tool calls a
perfect agent makes on this database, in order. Gold calls must use tools from the list with valid arguments
and existing ids, must follow the policy, and must change the database exactly when the intent requires a
write. communicate_info holds short values the agent must tell the user, copied exactly from tool results.
Reply with JSON only, in this shape:
{_TASK_SHAPE}"""


def evolve_prompt(domain: str, task_id: str, task: Mapping[str, Any], policy: str,
                  tool_schemas: Sequence[Mapping[str, Any]], rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, str]:
  shown = {k: v for k, v in task.items() if k in ("user_scenario", "initial_state", "evaluation_criteria")}
  return header("evolve", domain, task=task_id), f"""\
Domain "{domain}". Policy of the agent:
{policy.strip()}
Tools:
{_tool_lines(tool_schemas)}
Rows of the database:
{_rows_block(rows)}
A task:
{_dump(shown)}
Write a harder version of this task: add one or two steps or conditions (a check before a change, a second
entity, a conditional request, information the user must be told), keep it solvable with these tools on this
database and consistent with the policy, and update the gold actions and communicate_info to match.
Reply with JSON only, in the same shape:
{_TASK_SHAPE}"""
