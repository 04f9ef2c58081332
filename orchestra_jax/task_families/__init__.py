"""The task families `orchestra train` trains on (`config.env.name`), one module each, each yielding an `EnvSetup`.

* `demo` (demo.py): the CPU demo's questions and three scripted priced tools; local, no network.
* `data` (data.py): the paper's setting; records of the training-data format routed to QA, tau2 and ToolScale
  environments.
What they share (the `EnvSetup` they yield, the "task_family" registry `ENVIRONMENTS`, `ENV_SECTIONS`) is in
base.py. Importing this package registers both families.
"""

from orchestra_jax.task_families.base import (ENV_SECTIONS, ENVIRONMENTS, EnvSetup, GradingUnavailable,
                                              register_task_family)
from orchestra_jax.task_families.data import (DATA_ENV_DEFAULTS, DataEnvSection, RecordEnvironment, data_env_config,
                                              data_environment, eval_group, load_task_records, parse_preference)
from orchestra_jax.task_families.demo import DemoEnvSection, demo_environment

__all__ = ["EnvSetup", "GradingUnavailable", "ENVIRONMENTS", "ENV_SECTIONS", "DATA_ENV_DEFAULTS", "DataEnvSection",
           "DemoEnvSection", "RecordEnvironment", "demo_environment", "data_environment", "data_env_config",
           "load_task_records", "eval_group", "parse_preference", "register_task_family"]
