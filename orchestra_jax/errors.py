"""`UserError`: bad input a person can fix (config, paths, files). The CLI prints these as one line, no traceback."""


class UserError(Exception):
  """Base of every error caused by the user's input rather than a bug in orchestra-jax."""
