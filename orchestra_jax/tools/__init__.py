"""Tools the orchestrator calls: the priced catalog, the cost ledger, the code sandbox and retrieval.

Import the submodules directly (`from orchestra_jax.tools.catalog import Catalog`); this package file
imports nothing so that `import orchestra_jax.tools` stays cheap.
"""
