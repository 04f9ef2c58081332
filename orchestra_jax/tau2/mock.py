"""The tau2 `mock` domain: users with to-do tasks (a tiny domain for testing the machinery)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from orchestra_jax.tau2.records import field
from orchestra_jax.tau2.tools import ToolError, TransferTool, assertion, tool

TaskStatus = Literal["pending", "completed"]


@dataclasses.dataclass(kw_only=True)
class Task:
  task_id: str
  title: str
  description: str | None = None
  status: TaskStatus


@dataclasses.dataclass(kw_only=True)
class User:
  user_id: str
  name: str
  tasks: list[str] = field("Ids of the user's tasks.")


TABLES = {"tasks": Task, "users": User}


class MockTools(TransferTool):
  """Tools of the mock domain."""

  def _user(self, user_id: str) -> User:
    user = self.db.get("users", user_id)
    if user is None:
      raise ToolError(f"User {user_id} not found")
    return user

  def _task(self, task_id: str) -> Task:
    task = self.db.get("tasks", task_id)
    if task is None:
      raise ToolError(f"Task {task_id} not found")
    return task

  @tool("Create a new task for a user.", writes=True,
        args={"user_id": "The id of the user creating the task.", "title": "The title of the task.",
              "description": "An optional description of the task."})
  def create_task(self, user_id: str, title: str, description: str | None = None) -> Task:
    self._user(user_id)
    if not title.strip():
      raise ToolError("Each task must have a title")
    n = len(self.db.rows("tasks")) + 1
    while self.db.has("tasks", f"task_{n}"):
      n += 1
    task = Task(task_id=f"task_{n}", title=title, description=description, status="pending")
    self.db.put("tasks", task.task_id, task)
    self.db.edit("users", user_id).tasks.append(task.task_id)
    return task

  @tool("Get all users in the database.")
  def get_users(self) -> list[User]:
    return list(self.db.rows("users").values())

  @tool("Update the status of a task.", writes=True,
        args={"task_id": "The id of the task to update.", "status": "The new status of the task."})
  def update_task_status(self, task_id: str, status: TaskStatus) -> Task:
    self._task(task_id)
    task = self.db.edit("tasks", task_id)
    task.status = status
    return task

  @assertion
  def assert_task_status(self, task_id: str, expected_status: str) -> bool:
    task = self.db.get("tasks", task_id)
    return task is not None and task.status == expected_status
